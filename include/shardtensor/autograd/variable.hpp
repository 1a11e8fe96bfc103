#pragma once
/// \file variable.hpp
/// A tiny reverse-mode tape over DistTensor. Var<T,Rank> is a shared handle to a value, its
/// gradient and the Node that produced it; nodes hold backward closures; backward() walks the
/// graph in reverse topological order and frees it.
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtensor/dist/dist_tensor.hpp"
#include "shardtensor/tensor/ops.hpp"

namespace shard::autograd {

struct Node;

/// The parents of a Node: a small vector of shared node handles with room for two inline (most
/// ops have one or two differentiable inputs, so recording them allocates nothing).
class NodeParents {
 public:
  using value_type = std::shared_ptr<Node>;
  using iterator = value_type*;
  using const_iterator = const value_type*;
  NodeParents() = default;
  NodeParents(const NodeParents&) = delete;
  NodeParents& operator=(const NodeParents&) = delete;
  iterator begin() { return n_ <= kInline ? inline_.data() : heap_.data(); }
  iterator end() { return begin() + n_; }
  const_iterator begin() const { return n_ <= kInline ? inline_.data() : heap_.data(); }
  const_iterator end() const { return begin() + n_; }
  std::size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  value_type& operator[](std::size_t i) { return begin()[i]; }
  const value_type& operator[](std::size_t i) const { return begin()[i]; }
  void push_back(value_type p) {
    if (n_ < kInline) {
      inline_[n_++] = std::move(p);
      return;
    }
    if (n_ == kInline) {
      heap_.reserve(2 * kInline);
      for (auto& q : inline_) heap_.push_back(std::move(q));
    }
    heap_.push_back(std::move(p));
    ++n_;
  }
  void clear() {
    for (auto& q : inline_) q.reset();
    heap_.clear();
    n_ = 0;
  }

 private:
  static constexpr std::size_t kInline = 2;
  std::array<value_type, kInline> inline_;
  std::vector<value_type> heap_;  // every entry once there are more than kInline
  std::size_t n_ = 0;
};

/// The version of one tensor's storage when an op recorded it (see Node::saved).
struct SavedVersion {
  std::weak_ptr<void> storage;                         ///< the storage (expired: freed, nothing to check)
  const std::atomic<std::uint64_t>* counter = nullptr;  ///< its version counter (in the control block)
  std::uint64_t version = 0;                           ///< the version at record time
  int index = -1;                                      ///< input index, or -1 for the op's output
};

/// The versions an op recorded: two inline (most ops), more on the heap.
class SavedVersions {
 public:
  void record(const std::shared_ptr<void>& storage, int index) {
    if (!storage) return;
    auto* c = shard::detail::version_counter(storage);
    if (!c) return;
    SavedVersion v{storage, c, c->load(std::memory_order_relaxed), index};
    if (n_ < kInline) inline_[n_] = std::move(v);
    else heap_.push_back(std::move(v));
    ++n_;
  }
  /// The first record whose storage is alive and changed, or null.
  const SavedVersion* first_changed(std::uint64_t& now) const {
    for (std::size_t i = 0; i < n_; ++i) {
      const SavedVersion& v = i < kInline ? inline_[i] : heap_[i - kInline];
      if (auto alive = v.storage.lock()) {
        now = v.counter->load(std::memory_order_relaxed);
        if (now != v.version) return &v;
      }
    }
    return nullptr;
  }
  void clear() {
    for (auto& v : inline_) v = {};
    heap_.clear();
    n_ = 0;
  }

 private:
  static constexpr std::size_t kInline = 3;
  std::array<SavedVersion, kInline> inline_;
  std::vector<SavedVersion> heap_;
  std::size_t n_ = 0;
};

/// A recorded operation: its parents (nodes of inputs that require grad) and its backward step.
/// Var::make records a typed node: the output's gradient slot and the op's closure live inside it
/// (one allocation per recorded op).
struct Node {
  explicit Node(const char* n) : name(n) {}
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  std::string name;
  NodeParents parents;
  bool released = false;    ///< set once backward ran (the closure is freed)
  std::uint64_t visit = 0;  ///< traversal stamp of the engine
  /// Versions of the op's inputs' and output's storages when it was recorded. backward refuses to
  /// run (shard::Error, on every rank) when any of them changed since: the op may have saved the
  /// tensor, and a gradient computed from modified data would be silently wrong.
  SavedVersions saved;
  /// The message for a changed saved tensor, or empty.
  std::string saved_version_error() const;
  /// Pulls the output's gradient and pushes input gradients (nothing once released).
  virtual void apply() = 0;
  /// Frees the backward closure and what it captured.
  virtual void release_closure() noexcept = 0;
};

/// True while gradients are being recorded (thread-local; see NoGradGuard).
bool grad_enabled() noexcept;
/// Turns recording off for its lifetime (evaluation, optimiser steps, data generation).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// Runs the recorded graph below `root` (may be null for a leaf loss) in reverse topological
/// order, finalises the leaves' gradients, then frees the graph.
/// Before running any node, the versions every node recorded are checked (see Node::saved); with
/// `comm` the check is collective over it (every rank throws the same shard::Error, no rank is left
/// in the graph's collectives), without it a mismatch throws on this rank only.
void run_backward(const std::shared_ptr<Node>& root, Communicator* comm = nullptr);
/// Registers a step to run once the current backward pass has finished (leaf finalisation).
void at_backward_end(std::function<void()> f);

/// A lightweight reference to a Var's place in the graph (used to record an op's inputs).
struct VarRef {
  bool requires_grad = false;
  std::shared_ptr<Node> node;                      ///< null for leaves
  const std::shared_ptr<void>* storage = nullptr;  ///< the value's local storage (for its version)
};

/// Differentiable handle over a DistTensor. Copies share state.
template <class T, int Rank>
class Var {
 public:
  using Value = DistTensor<T, Rank>;
  Var() = default;
  /// A leaf (a parameter or an input). Leaves that require grad receive .grad() in backward().
  explicit Var(Value value, bool requires_grad = false)
      : s_(std::make_shared<State>(std::move(value), requires_grad)) {}

  /// The value. A view of user memory that shardtensor cannot watch (Tensor::view not declared
  /// stable) is snapshotted here the first time it is read while gradients are recorded: ops then
  /// compute from, and save, the copy, so the user may overwrite the array before backward.
  const Value& value() const {
    if (s_->snapshot_pending) snapshot_user_view();
    return s_->value;
  }
  /// Replaces a leaf's value (same spec; e.g. moving a parameter to another device). Every copy
  /// of this Var sees the new value. Refused for non-leaves (recorded results).
  void replace_value(Value v) const {
    SHARD_CHECK(is_leaf(), "Var::replace_value", "only leaves can be replaced");
    SHARD_CHECK(v.spec() == s_->value.spec(), "Var::replace_value", "spec {} differs from the current {}", v.spec(),
                s_->value.spec());
    s_->value = std::move(v);
    s_->snapshot_pending = s_->value.local().snapshot_on_save();
  }
  /// The local block of the value (shorthand; snapshots like value()).
  const Tensor<T, Rank>& local() const { return value().local(); }
  bool requires_grad() const { return s_ && s_->requires_grad; }
  bool is_leaf() const { return !s_->node; }
  bool has_grad() const { return box().grad.has_value(); }
  /// The accumulated gradient (same global shape; sharded placements like the value's).
  const Value& grad() const {
    const auto& b = box();
    SHARD_CHECK(b.grad.has_value(), "Var::grad", "no gradient (not reached by backward, or zeroed)");
    return *b.grad;
  }
  void zero_grad() const { box().grad.reset(); }
  /// Replaces the value in place (optimisers; the graph is not affected).
  void set_value(Value v) const {
    s_->value = std::move(v);
    s_->snapshot_pending = s_->value.local().snapshot_on_save();
  }
  VarRef ref() const {
    if (!s_) return {};
    return {requires_grad(), s_->node, &value().local().storage()};
  }
  const std::shared_ptr<Node>& node() const { return s_->node; }
  /// Same value, cut from the graph.
  Var detach() const { return Var(s_->value, false); }

  /// Adds `g` to the gradient (redistributed to the existing gradient's placements if needed).
  void accumulate_grad(const Value& g) const {
    if (!requires_grad()) return;
    SHARD_CHECK(g.global_shape() == s_->value.global_shape(), "Var::accumulate_grad",
                "gradient of global shape {} for a value of global shape {}", g.global_shape(),
                s_->value.global_shape());
    auto& box = this->box();
    if (!box.grad) {
      box.grad = g;
      box.owned = false;  // may alias another tensor: copied before the first in-place add
      if (is_leaf()) register_leaf_finalize();
      return;
    }
    Value add = g.spec() == box.grad->spec() ? g : g.redistribute(box.grad->spec());
    if (!box.owned) {
      box.grad = Value(box.grad->spec(), box.grad->local().clone());
      box.owned = true;
    }
    axpy(T(1), add.local(), box.grad->local());
  }

  /// Reverse-mode sweep from this scalar (global numel 1) with seed gradient 1.
  void backward() const {
    SHARD_CHECK(numel(s_->value.global_shape()) == 1, "backward",
                "backward() needs a scalar loss; got global shape {}", s_->value.global_shape());
    SHARD_CHECK(requires_grad(), "backward", "the loss does not require grad (no parameter reached it)");
    SHARD_CHECK(!s_->node || !s_->node->released, "backward",
                "the graph below this loss was already freed by an earlier backward()");
    auto placements = s_->value.placements();
    for (auto& p : placements)
      if (p.is_partial()) p = Replicate();  // d(sum of partials)/d(partial) = 1 everywhere
    DistSpec spec = s_->value.spec().with_placements(placements);
    Value seed(spec, Tensor<T, Rank>::full(DistTensor<T, Rank>::from_vec(spec.local_box().len), T(1),
                                           s_->value.device()));
    accumulate_grad(seed);
    run_backward(s_->node, s_->value.mesh().comm().get());
  }

  /// Records the result of an op. `fn(grad_out)` must push gradients into the inputs with
  /// accumulate_grad. Without grad mode or without an input that requires grad, nothing is recorded.
  /// `fn` is kept inside the node as its own type (no std::function, no separate allocation).
  template <class Fn>
  static Var make(Value value, const char* name, std::initializer_list<VarRef> inputs, Fn&& fn) {
    Var out(std::move(value), false);
    if (!grad_enabled()) return out;
    bool any = false;
    for (auto& r : inputs) any = any || r.requires_grad;
    if (!any) return out;
    out.s_->requires_grad = true;
    // The node holds the output's gradient slot, not the output itself: no reference cycle, and
    // the node can run after every handle to the output is gone.
    auto node = std::make_shared<OpNode<std::decay_t<Fn>>>(name, std::forward<Fn>(fn));
    int i = 0;
    for (auto& r : inputs) {
      if (r.requires_grad && r.node) node->parents.push_back(r.node);
      if (r.storage) node->saved.record(*r.storage, i);
      ++i;
    }
    node->saved.record(out.s_->value.local().storage(), -1);
    out.s_->node = std::move(node);
    return out;
  }

 private:
  struct GradBox {
    std::optional<Value> grad;
    bool owned = false;
  };
  /// A node recorded by make: its output's gradient slot.
  struct ValueNode : Node {
    using Node::Node;
    GradBox box;
  };
  /// ... and the op's backward closure.
  template <class Fn>
  struct OpNode final : ValueNode {
    template <class F>
    OpNode(const char* n, F&& f) : ValueNode(n), fn(std::in_place, std::forward<F>(f)) {}
    std::optional<Fn> fn;
    void apply() override {
      if (!fn || !this->box.grad) return;  // released, or the output did not reach the loss
      Value g = std::move(*this->box.grad);
      this->box.grad.reset();  // intermediate gradients are freed as soon as they are consumed
      (*fn)(g);
    }
    void release_closure() noexcept override {
      fn.reset();
      this->saved.clear();
    }
  };
  struct State {
    State(Value v, bool rg)
        : value(std::move(v)), requires_grad(rg), snapshot_pending(value.local().snapshot_on_save()) {}
    Value value;
    GradBox leaf_box;  ///< a leaf's gradient (a recorded output's lives in its node)
    bool requires_grad = false;
    bool snapshot_pending = false;  ///< the value views user memory not declared stable
    std::shared_ptr<Node> node;
  };
  /// Replaces a user-memory view by a copy in library memory while gradients are recorded.
  void snapshot_user_view() const {
    if (!grad_enabled()) return;
    // The copy keeps declared ghost layers (copied with the block; dist/ghosts.hpp).
    s_->value = s_->value.snapshot();
    s_->snapshot_pending = false;
  }
  GradBox& box() const { return s_->node ? static_cast<ValueNode&>(*s_->node).box : s_->leaf_box; }
  void register_leaf_finalize() const {
    std::weak_ptr<State> w = s_;
    at_backward_end([w] {
      auto s = w.lock();
      if (!s || !s->leaf_box.grad) return;
      // A replicated parameter's gradient ends reduced and replicated like its value.
      auto& box = s->leaf_box;
      if (!(box.grad->spec() == s->value.spec())) {
        box.grad = box.grad->redistribute(s->value.spec());
        box.owned = true;
      }
    });
  }
  std::shared_ptr<State> s_;
};

}  // namespace shard::autograd
