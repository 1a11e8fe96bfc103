#include <atomic>
#include <cstdint>

#include "shardtensor/autograd/variable.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::autograd {
namespace {
thread_local bool t_grad_enabled = true;
thread_local std::vector<std::function<void()>>* t_finalizers = nullptr;
thread_local std::vector<std::function<void()>> t_outside;  // leaves touched outside run_backward
}  // namespace

bool grad_enabled() noexcept { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }

void at_backward_end(std::function<void()> f) {
  if (t_finalizers) t_finalizers->push_back(std::move(f));
  else t_outside.push_back(std::move(f));
}

std::string Node::saved_version_error() const {
  std::uint64_t now = 0;
  const SavedVersion* v = saved.first_changed(now);
  if (!v) return {};
  const std::string which = v->index < 0 ? std::string("its output") : fmt::format("its input {}", v->index);
  return fmt::format(
      "a tensor saved for the gradient of '{}' ({}) was modified in place after the op recorded it: its storage "
      "is at version {}, expected {}. Run the forward again after modifying it, or modify a copy",
      name, which, now, v->version);
}

void run_backward(const std::shared_ptr<Node>& root, Communicator* comm) {
  if (!root) {
    std::vector<std::function<void()>> fs;
    std::swap(fs, t_outside);
    for (auto& f : fs) f();
    return;
  }
  SHARD_PROFILE_SCOPE("autograd", "backward", "", nullptr);
  // Iterative post-order DFS gives a topological order (parents after children when reversed).
  // Visited nodes carry this traversal's stamp (no hash set); the work vectors are reused.
  thread_local std::vector<Node*> t_order;
  thread_local std::vector<std::pair<Node*, std::size_t>> t_stack;
  thread_local bool t_busy = false;
  std::vector<Node*> own_order;
  std::vector<std::pair<Node*, std::size_t>> own_stack;
  const bool reuse = !t_busy;  // a backward started from inside a backward step gets its own
  auto& order = reuse ? t_order : own_order;
  auto& stack = reuse ? t_stack : own_stack;
  struct Busy {
    bool on;
    ~Busy() {
      if (on) {
        t_order.clear();
        t_stack.clear();
        t_busy = false;
      }
    }
  } busy{reuse};
  t_busy = true;
  // Stamps are unique across threads, so a graph walked from two threads is not confused.
  static std::atomic<std::uint64_t> g_stamps{0};
  const std::uint64_t stamp = g_stamps.fetch_add(1, std::memory_order_relaxed) + 1;
  order.clear();
  stack.clear();
  stack.emplace_back(root.get(), 0);
  root->visit = stamp;
  while (!stack.empty()) {
    auto& [n, i] = stack.back();
    if (i < n->parents.size()) {
      Node* p = n->parents[i++].get();
      if (p->visit != stamp) {
        p->visit = stamp;
        stack.emplace_back(p, 0);
      }
    } else {
      order.push_back(n);
      stack.pop_back();
    }
  }
  // Saved-tensor safety: every node's recorded versions are checked before the first node runs,
  // and with a communicator the verdict is agreed on (one allgather): a tensor modified on one
  // rank makes every rank throw the same error instead of leaving the others in the graph's
  // collectives.
  std::string err;
  for (Node* n : order) {
    if (n->released) continue;
    err = n->saved_version_error();
    if (!err.empty()) break;
  }
  if (comm && comm->size() > 1) comm->check_all(err.empty(), "backward", err);
  else SHARD_CHECK(err.empty(), "backward", "{}", err);
  std::vector<std::function<void()>> finalizers;
  std::swap(finalizers, t_outside);  // the seed's leaf registration, if the loss is a leaf
  auto* prev_finalizers = t_finalizers;
  t_finalizers = &finalizers;
  struct Reset {
    std::vector<std::function<void()>>* prev;
    ~Reset() { t_finalizers = prev; }
  } reset{prev_finalizers};
  NoGradGuard no_grad;  // backward steps are not recorded
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    SHARD_CHECK(!n->released, "backward", "node '{}' was already freed by an earlier backward()", n->name);
    n->apply();
    n->release_closure();
    n->released = true;
  }
  for (auto& f : finalizers) f();
  // Free the graph: drop parent links so memory is returned now.
  for (Node* n : order) n->parents.clear();
}

}  // namespace shard::autograd
