#pragma once
// Oracle harness for nn modules and whole models (DESIGN.md §5): build a module on a mesh (its
// parameters are initialised from the seed, identical at every rank count), feed a deterministic
// global input laid out by a Layout, take the MSE against a deterministic target, run backward and
// optionally one Adam step, and return the loss, the full output, the input gradient, every
// parameter gradient and every parameter value afterwards as flat vectors. The same body runs
// unsharded (one rank) and sharded; results are compared at tol<T>().
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/layers.hpp>
#include <shardtensor/shardtensor.hpp>

#include "support/tolerance.hpp"

namespace shard::test::mod {

using autograd::Var;

/// How activations lie on a mesh.
struct Layout {
  std::string name;
  std::vector<int> mesh_shape;
  std::vector<Placement> act;
  ShardSizes sizes;  ///< explicit sizes (empty: balanced)
};

/// The unsharded reference layout.
inline Layout reference_layout() { return {"reference", {1}, {Replicate()}, {}}; }

/// Activation layouts at P ranks for inputs of global shape `shape` (N, C, spatial...): H over a
/// 1-D mesh (uneven where P does not divide), H with an empty first shard, and at 4 ranks a 2x2
/// mesh sharding H and W and a data x domain mesh (N over mesh dim 0, H over mesh dim 1); at 2
/// ranks the 2x1 data x domain mesh.
template <int R>
std::vector<Layout> layouts(int P, const Shape<R>& shape, bool with_empty = true) {
  std::vector<Layout> out{{"1d-H", {P}, {Shard(2)}, {}}};
  if (with_empty && P >= 3) {
    std::vector<index_t> s(static_cast<std::size_t>(P), 0);
    for (int i = 1; i < P; ++i) s[static_cast<std::size_t>(i)] = balanced_size(shape[2], P - 1, i - 1);
    ShardSizes sz(static_cast<std::size_t>(R));
    sz[2] = s;
    out.push_back({"1d-H-empty-first", {P}, {Shard(2)}, sz});
  }
  if (P == 4) {
    out.push_back({"2x2-HW", {2, 2}, {Shard(2), Shard(R >= 4 ? 3 : 2)}, {}});
    out.push_back({"2x2-data-domain", {2, 2}, {Shard(0), Shard(2)}, {}});
  }
  if (P == 2) out.push_back({"2x1-data-domain", {2, 1}, {Shard(0), Shard(2)}, {}});
  return out;
}

/// Flattens a tensor (on any device) to host doubles.
template <class T, int R>
std::vector<double> flatten(const Tensor<T, R>& t) {
  auto c = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu());
  std::vector<double> v(static_cast<std::size_t>(c.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(c.data()[i]);
  return v;
}

/// What one run produced.
struct Result {
  double loss = 0;
  std::vector<double> y, gx;
  std::vector<std::string> names;                 ///< every parameter, registration order
  std::vector<std::vector<double>> grads;         ///< per parameter (empty: no gradient)
  std::vector<std::vector<double>> values;        ///< per parameter, after the optional step
};

/// How to run a module.
struct RunOptions {
  bool adam_step = false;   ///< one Adam step after backward
  double lr = 1e-2;
  std::uint64_t seed = 11;  ///< input seed (target: seed + 1)
  double in_lo = -1, in_hi = 1;
  Device device = Device::cpu();  ///< where the model, input and target live
};

template <class T, int R>
using Builder = std::function<std::shared_ptr<nn::UnaryModule<T, R>>(const DeviceMesh&)>;

/// Explicit sizes of `L` for a tensor of global shape `shape` (only dims whose sizes add up).
template <int R>
ShardSizes sizes_for(const Layout& L, const Shape<R>& shape) {
  if (L.sizes.empty()) return {};
  ShardSizes s(static_cast<std::size_t>(R));
  for (int d = 0; d < R && d < static_cast<int>(L.sizes.size()); ++d) {
    const auto& v = L.sizes[static_cast<std::size_t>(d)];
    index_t tot = 0;
    for (auto e : v) tot += e;
    if (!v.empty() && tot == shape[d]) s[static_cast<std::size_t>(d)] = v;
  }
  return s;
}

/// Builds the module on `mesh`, runs forward, MSE loss against a random target laid out like the
/// output, backward and (optionally) one Adam step. Collective over the mesh.
template <class T, int R>
Result run(const DeviceMesh& mesh, const Layout& L, const Shape<R>& in_shape, const Builder<T, R>& build,
           const RunOptions& o = {}) {
  auto model = build(mesh);
  model->to(o.device);
  Var<T, R> x(DistTensor<T, R>::random(in_shape, mesh, L.act, o.seed, RandomInit::uniform(o.in_lo, o.in_hi),
                                       sizes_for<R>(L, in_shape))
                  .to(o.device),
              true);
  auto y = model->forward(x);
  const auto& ys = y.value().spec();
  Var<T, R> target(DistTensor<T, R>::random(y.value().global_shape(), mesh, ys.placements(), o.seed + 1,
                                            RandomInit::uniform(-1, 1), ys.sizes())
                       .to(o.device),
                   false);
  // The loss in f32 for bf16 / f16 models (the precision policy; F::cast<T> of a Var<T> is itself).
  auto loss = F::mse_loss(F::cast<master_t<T>>(y), F::cast<master_t<T>>(target));
  loss.backward();
  Result r;
  r.loss = flatten(loss.local())[0];
  r.y = flatten(y.value().full_tensor());
  if (x.has_grad()) r.gx = flatten(x.grad().full_tensor());
  if (o.adam_step) {
    optim::Adam<master_t<T>> adam(model->parameters(), {.lr = o.lr});
    adam.step();
  }
  for (const auto& np : model->named_parameters()) {
    r.names.push_back(np.name);
    const auto g = np.param->full_grad_host();  // whole parameter (gathered when sharded)
    r.grads.push_back(g.numel() ? flatten(g) : std::vector<double>{});
    r.values.push_back(flatten(np.param->full_value_host()));
  }
  return r;
}

/// max|a - b| / max|b| (0 for two empty vectors; inf on a size mismatch or NaN).
inline double rel_diff(const std::vector<double>& a, const std::vector<double>& b) { return diff_of(a, b).rel(); }

/// Largest relative difference require_match has seen (reported with SHARD_TEST_VERBOSE=1).
inline double& worst_seen() {
  static double w = 0;
  return w;
}

/// Compares a sharded run with the reference: loss, output, input gradient, every parameter's
/// gradient (present exactly where the reference has one) and value. CHECK only (no rank aborts
/// alone).
inline void require_match(const Result& got, const Result& ref, double rel) {
  const DTol tol = dtol_of_rel(rel);  // mixed rule (support/tolerance.hpp)
  double mag = std::max(diff_of(ref.y, ref.y).max_ref, diff_of(ref.gx, ref.gx).max_ref);
  for (const auto& g : ref.grads) mag = std::max(mag, diff_of(g, g).max_ref);
  auto close = [&](const std::vector<double>& a, const std::vector<double>& b) {
    return diff_of(a, b) <= tol.at(b.size(), mag);
  };
  auto& w = worst_seen();
  w = std::max({w, std::abs(got.loss - ref.loss) / std::max(1.0, std::abs(ref.loss)), rel_diff(got.y, ref.y),
                rel_diff(got.gx, ref.gx)});
  for (std::size_t i = 0; i < std::min(got.grads.size(), ref.grads.size()); ++i)
    w = std::max({w, rel_diff(got.grads[i], ref.grads[i]), rel_diff(got.values[i], ref.values[i])});
  CHECK(std::abs(got.loss - ref.loss) <= rel * std::max(1.0, std::abs(ref.loss)));
  CHECK(!ref.y.empty());
  CHECK(diff_of(got.y, ref.y) <= tol.at(ref.y.size(), mag));
  CHECK(!ref.gx.empty());
  CHECK(diff_of(got.gx, ref.gx) <= tol.at(ref.gx.size(), mag));
  REQUIRE(got.names == ref.names);
  for (std::size_t i = 0; i < ref.names.size(); ++i) {
    INFO("parameter " << ref.names[i]);
    CHECK(got.grads[i].empty() == ref.grads[i].empty());
    CHECK(diff_of(got.grads[i], ref.grads[i]) <= tol.at(ref.grads[i].size(), mag));
    CHECK(close(got.values[i], ref.values[i]));
  }
}

/// Number of parameters of `r` that received a gradient.
inline std::size_t with_grad(const Result& r) {
  std::size_t n = 0;
  for (const auto& g : r.grads) n += g.empty() ? 0 : 1;
  return n;
}

/// Unsharded reference run on a one-rank SelfComm mesh.
template <class T, int R>
Result reference(const Shape<R>& in_shape, const Builder<T, R>& build, const RunOptions& o = {}) {
  DeviceMesh m1(std::make_shared<SelfComm>(), {1});
  return run<T, R>(m1, reference_layout(), in_shape, build, o);
}

}  // namespace shard::test::mod
