#pragma once
// Oracle harness for the functional ops (DESIGN.md §5): a test body builds its inputs through a
// Ctx (deterministic global tensors from a seed, laid out by the current Layout), runs ops and
// registers outputs. The harness seeds a scalar loss sum_i <resolve(y_i), r_i> with fixed random
// r_i, runs backward, and returns every output's and every input gradient's FULL tensor, so one
// body runs unsharded (SelfComm, 1 rank) and sharded on any mesh, and the results are compared.
// Finite differences perturb one element of one input's global tensor at a time. MPI-free.
#include <catch2/catch_test_macros.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

#include "support/tolerance.hpp"

namespace shard::test::fn {

using autograd::Var;

/// How activations lie on a mesh: mesh shape, placements of activation tensors, explicit sizes.
struct Layout {
  std::string name;
  std::vector<int> mesh_shape;
  std::vector<Placement> act;
  ShardSizes sizes;  ///< explicit shard sizes for activations (empty: balanced)
};

/// The unsharded reference layout (one rank, everything Replicate).
inline Layout reference_layout() { return {"reference", {1}, {Replicate()}, {}}; }

/// One perturbed element for finite differences.
struct Perturb {
  int input = -1;
  index_t index = 0;
  double delta = 0;
};

/// Outputs (full tensors, flattened), gradients of the inputs that require grad, and the loss.
struct Result {
  std::vector<std::vector<double>> outputs, grads;
  std::vector<std::string> grad_names;
  double loss = 0;
  bool grad_specs_ok = true;  ///< every leaf gradient ended with its value's spec
};

template <class T, int R>
std::vector<double> flatten(const Tensor<T, R>& t) {
  auto c = t.contiguous();
  std::vector<double> v(static_cast<std::size_t>(c.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(c.data()[i]);
  return v;
}

/// What a test body sees: the mesh and layout, and factories for inputs.
template <class T>
class Ctx {
 public:
  Ctx(DeviceMesh mesh, Layout layout, std::uint64_t seed, const Perturb* p)
      : mesh_(std::move(mesh)), layout_(std::move(layout)), seed_(seed), perturb_(p) {}

  const DeviceMesh& mesh() const { return mesh_; }
  const Layout& layout() const { return layout_; }
  /// True for the unsharded reference run.
  bool is_reference() const { return layout_.name == "reference"; }

  /// An input laid out like the layout's activations (rank must match the layout's tensors).
  template <int R>
  Var<T, R> act(const Shape<R>& shape, bool requires_grad = true, RandomInit init = {}) {
    return input<R>(shape, layout_.act, sizes_for<R>(shape), requires_grad, init);
  }
  /// A Replicate input (a parameter).
  template <int R>
  Var<T, R> param(const Shape<R>& shape, bool requires_grad = true, RandomInit init = {}) {
    return input<R>(shape, std::vector<Placement>(static_cast<std::size_t>(mesh_.ndim()), Replicate()), {},
                    requires_grad, init);
  }
  /// An input with explicit placements and sizes.
  template <int R>
  Var<T, R> input(const Shape<R>& shape, std::vector<Placement> pl, const ShardSizes& sizes, bool requires_grad,
                  RandomInit init = {}) {
    const int id = static_cast<int>(numels_.size());
    auto full = Tensor<T, R>::empty(shape);
    full.fill_random(seed_ + 7919u * static_cast<std::uint64_t>(id + 1), init);
    if (perturb_ && perturb_->input == id) full.data()[perturb_->index] += static_cast<T>(perturb_->delta);
    auto v = Var<T, R>(DistTensor<T, R>::distribute(full, mesh_, std::move(pl), -1, sizes), requires_grad);
    numels_.push_back(full.numel());
    rg_.push_back(requires_grad);
    if (requires_grad) {
      grads_.push_back([v, id](Result& r) {
        r.grad_names.push_back("grad of input " + std::to_string(id));
        if (!v.has_grad()) {
          r.grads.emplace_back();
          return;
        }
        r.grad_specs_ok = r.grad_specs_ok && v.grad().spec() == v.value().spec();
        r.grads.push_back(flatten(v.grad().full_tensor()));
      });
    }
    return v;
  }
  /// Registers an output: compared in full and weighted into the loss.
  template <int R>
  void output(Var<T, R> y) {
    y = F::resolve(y);
    outs_.push_back(flatten(y.value().full_tensor()));
    const auto& s = y.value().spec();
    const auto id = static_cast<std::uint64_t>(outs_.size());
    Var<T, R> w(DistTensor<T, R>::random(y.value().global_shape(), mesh_, s.placements(), 1000003u * id,
                                         RandomInit::uniform(-1, 1), s.sizes()),
                false);
    auto term = F::resolve(F::sum(F::mul(y, w)));
    loss_ = loss_defined_ ? F::add(loss_, term) : term;
    loss_defined_ = true;
  }

  // ---- used by the harness
  std::vector<index_t> numels_;
  std::vector<bool> rg_;
  std::vector<std::function<void(Result&)>> grads_;
  std::vector<std::vector<double>> outs_;
  Var<T, 1> loss_;
  bool loss_defined_ = false;

 private:
  template <int R>
  ShardSizes sizes_for(const Shape<R>& shape) const {
    if (layout_.sizes.empty()) return {};
    ShardSizes s(static_cast<std::size_t>(R));
    for (int d = 0; d < R && d < static_cast<int>(layout_.sizes.size()); ++d) {
      const auto& v = layout_.sizes[static_cast<std::size_t>(d)];
      index_t tot = 0;
      for (auto e : v) tot += e;
      if (!v.empty() && tot == shape[d]) s[static_cast<std::size_t>(d)] = v;
    }
    return s;
  }
  DeviceMesh mesh_;
  Layout layout_;
  std::uint64_t seed_;
  const Perturb* perturb_;
};

template <class T>
using Body = std::function<void(Ctx<T>&)>;

/// Runs `body` on `mesh` under `layout`: outputs, loss, and (if `grads`) the input gradients.
template <class T>
Result run_case(const DeviceMesh& mesh, const Layout& layout, const Body<T>& body, bool grads = true,
                const Perturb* p = nullptr, std::uint64_t seed = 12345) {
  Ctx<T> c(mesh, layout, seed, p);
  Result r;
  {
    std::optional<autograd::NoGradGuard> ng;
    if (!grads) ng.emplace();
    body(c);
    REQUIRE(c.loss_defined_);  // a body without outputs is a bug in the test (same on every rank)
    r.outputs = c.outs_;
    r.loss = static_cast<double>(c.loss_.local().data()[0]);
    if (grads) {
      c.loss_.backward();
      for (auto& g : c.grads_) g(r);
    }
  }
  return r;
}

/// Checks that `got` equals `ref` within the mixed tolerance `tol` (outputs, gradients, loss;
/// support/tolerance.hpp: the absolute floor of each tensor scales with the largest reference
/// value of the whole result) and that leaf gradients ended with their values' specs. CHECK only
/// (never aborts one rank alone: no MPI hang).
inline void require_match(const Result& got, const Result& ref, const DTol& tol) {
  CHECK(got.outputs.size() == ref.outputs.size());
  CHECK(got.grads.size() == ref.grads.size());
  double mag = 0;
  for (const auto* set : {&ref.outputs, &ref.grads})
    for (const auto& v : *set) mag = std::max(mag, diff_of(v, v).max_ref);
  for (std::size_t i = 0; i < std::min(got.outputs.size(), ref.outputs.size()); ++i) {
    INFO("output " << i);
    CHECK(!ref.outputs[i].empty());
    CHECK(diff_of(got.outputs[i], ref.outputs[i]) <= tol.at(ref.outputs[i].size(), mag));
  }
  for (std::size_t i = 0; i < std::min(got.grads.size(), ref.grads.size()); ++i) {
    INFO(ref.grad_names[i]);
    CHECK(!ref.grads[i].empty());
    CHECK(diff_of(got.grads[i], ref.grads[i]) <= tol.at(ref.grads[i].size(), mag));
  }
  CHECK(std::abs(got.loss - ref.loss) <= tol.rel * std::max(1.0, std::abs(ref.loss)));
  CHECK(got.grad_specs_ok);
}

/// The same with a relative tolerance alone (its dtype inferred: < 1e-7 is fp64).
inline void require_match(const Result& got, const Result& ref, double tol) {
  require_match(got, ref, dtol_of_rel(tol));
}

/// Unsharded reference on a one-rank SelfComm mesh.
template <class T>
Result reference(const Body<T>& body) {
  DeviceMesh m1(std::make_shared<SelfComm>(), {1});
  return run_case<T>(m1, reference_layout(), body);
}

/// Central finite differences of the loss against the gradients, for up to `points` elements of
/// every input that requires grad (fp64). Collective over mesh when it has several ranks.
inline void check_finite_differences(const DeviceMesh& mesh, const Layout& layout, const Body<double>& body,
                                     int points = 12, double h = 1e-6, double tol = 1e-6) {
  const Result base = run_case<double>(mesh, layout, body);
  Ctx<double> probe(mesh, layout, 12345, nullptr);
  {
    autograd::NoGradGuard ng;
    body(probe);
  }
  int gi = 0;
  for (std::size_t i = 0; i < probe.numels_.size(); ++i) {
    if (!probe.rg_[i]) continue;
    const auto& g = base.grads[static_cast<std::size_t>(gi++)];
    INFO("input " << i << " on " << layout.name);
    CHECK(static_cast<index_t>(g.size()) == probe.numels_[i]);
    if (static_cast<index_t>(g.size()) != probe.numels_[i]) continue;
    double gmax = 0;
    for (double v : g) gmax = std::max(gmax, std::abs(v));
    const index_t n = probe.numels_[i];
    const index_t m = std::min<index_t>(n, points);
    for (index_t k = 0; k < m; ++k) {
      const index_t idx = m == n ? k : (k * n) / m + (k % 3);
      Perturb pp{static_cast<int>(i), std::min(idx, n - 1), h}, pm{static_cast<int>(i), std::min(idx, n - 1), -h};
      const double lp = run_case<double>(mesh, layout, body, false, &pp).loss;
      const double lm = run_case<double>(mesh, layout, body, false, &pm).loss;
      const double fd = (lp - lm) / (2 * h);
      INFO("element " << pp.index << ": fd " << fd << " vs backward " << g[static_cast<std::size_t>(pp.index)]);
      CHECK(std::abs(fd - g[static_cast<std::size_t>(pp.index)]) <= tol * std::max(1.0, gmax));
    }
  }
}

/// Activation layouts of rank-R N, C, spatial... tensors with global shape `shape` at P ranks:
/// 1-D meshes sharding each spatial dim (uneven where the extent does not divide), one with an
/// empty first shard, 2-D meshes (both spatial dims; data x domain with N sharded on mesh dim 0;
/// two mesh dims sharding one dim) at 4 ranks and 1x2 / 2x1 at 2 ranks.
template <int R>
std::vector<Layout> activation_layouts(int P, const Shape<R>& shape) {
  static_assert(R >= 3);
  std::vector<Layout> out;
  for (int d = 2; d < R; ++d) out.push_back({fmt::format("1d-Shard({})", d), {P}, {Shard(d)}, {}});
  if (P >= 2 && shape[2] >= P - 1) {
    std::vector<index_t> s(static_cast<std::size_t>(P), 0);
    for (int i = 1; i < P; ++i) s[static_cast<std::size_t>(i)] = balanced_size(shape[2], P - 1, i - 1);
    ShardSizes sz(static_cast<std::size_t>(R));
    sz[2] = s;
    out.push_back({"1d-Shard(2)-empty-first", {P}, {Shard(2)}, sz});
  }
  if (P == 2) out.push_back({"1d-Shard(0)", {P}, {Shard(0)}, {}});
  const int d2 = R >= 4 ? 3 : 2;
  if (P == 4) {
    out.push_back({"2x2-spatial", {2, 2}, {Shard(2), Shard(d2)}, {}});
    out.push_back({"2x2-data-domain", {2, 2}, {Shard(0), Shard(2)}, {}});
    out.push_back({"2x2-same-dim", {2, 2}, {Shard(2), Shard(2)}, {}});
  }
  if (P == 2) {
    out.push_back({"1x2-spatial", {1, 2}, {Shard(2), Shard(d2)}, {}});
    out.push_back({"2x1-data-domain", {2, 1}, {Shard(0), Shard(2)}, {}});
  }
  return out;
}

/// Tolerance of attention comparisons (softmax sums in another order): fp64 1e-10, fp32 1e-4.
template <class T>
constexpr double attn_tol() {
  return std::is_same_v<T, double> ? 1e-10 : 1e-4;
}

/// One conv with its weight (and bias) as fresh inputs of the body.
template <class T, int R>
void conv_out(Ctx<T>& c, const Var<T, R>& x, const Shape<R>& ws, const F::ConvOptions<R - 2>& o, bool bias = true) {
  auto w = c.template param<R>(ws);
  if (bias) c.output(F::conv(x, w, c.template param<1>({ws[0]}), o));
  else c.output(F::conv(x, w, std::nullopt, o));
}

#ifdef SHARD_FN_ORACLE_MPI
/// Compares `body` sharded under every activation layout of every communicator size 1..world with
/// the unsharded reference, at tolerance tol<T>() (fp64 1e-10, fp32 1e-5).
template <class T, int R>
void check_sharded(const Body<T>& body, const Shape<R>& act_shape) {
  const Result ref = reference<T>(body);
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& L : activation_layouts<R>(comm->size(), act_shape)) {
      INFO("layout " << L.name << " on " << comm->size() << " ranks");
      DeviceMesh mesh(comm, L.mesh_shape);
      require_match(run_case<T>(mesh, L, body), ref, tol<T>());
    }
  });
}

/// Finite differences (fp64) on the unsharded reference and on the sharded layouts of the
/// largest communicator whose names are in `names` (all layouts if empty).
template <int R>
void check_fd_sharded(const Body<double>& body, const Shape<R>& act_shape, std::vector<std::string> names = {}) {
  check_finite_differences(DeviceMesh(std::make_shared<SelfComm>(), {1}), reference_layout(), body);
  for_each_comm_size(
      [&](CommPtr comm) {
        for (const auto& L : activation_layouts<R>(comm->size(), act_shape)) {
          if (!names.empty() && std::find(names.begin(), names.end(), L.name) == names.end()) continue;
          check_finite_differences(DeviceMesh(comm, L.mesh_shape), L, body);
        }
      },
      world_size());
}
#endif

}  // namespace shard::test::fn
