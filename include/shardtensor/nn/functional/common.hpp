#pragma once
/// \file common.hpp
/// Shared vocabulary of the domain-parallel functional ops (shard::nn::functional, alias F):
/// spec checks, gradient alignment, sub-communicators over sets of mesh dims, and F::resolve.
///
/// Conventions that every op in nn/functional follows:
///  - Activations are N, C, spatial...; any tensor dim may be sharded unless an op says otherwise
///    (channel-mixing ops and norms need C unsharded). Parameters are Replicate.
///  - Specs (mesh, placements, global shape, layouts) are the same on every rank, so every check
///    made on specs alone throws shard::Error on every rank, before any collective is entered.
///  - The gradient of a value with a Partial placement is the gradient of its *resolved* value
///    (Replicate on that mesh dim). Op backward closures first align the incoming gradient with
///    autograd::gradient_as (PartialGrad::resolve: laid out as grad_spec(value spec), so their
///    local maths sees a gradient laid out exactly like the value, with Replicate where the value
///    is Partial; PartialGrad::keep where the op's gradient placements follow the upstream's).
///  - A replicated operand whose local contribution covers only this rank's part of a sharded
///    result gets a gradient Partial(sum) on those mesh dims; Var's leaf finalisation (or the next
///    op's alignment) reduces it.
#include <algorithm>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "shardtensor/autograd/comm_ops.hpp"
#include "shardtensor/autograd/variable.hpp"
#include "shardtensor/dist/dist_tensor.hpp"
#include "shardtensor/tensor/tensor_block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::nn::functional {

using autograd::Var;

namespace detail {

/// The spec a gradient of a value with spec `s` has: Partial placements become Replicate.
inline DistSpec grad_spec(const DistSpec& s) {
  if (!s.has_partial()) return s;
  auto p = s.placements();
  for (auto& x : p)
    if (x.is_partial()) x = Replicate();
  return s.with_placements(p, s.sizes());
}

/// The first element of `t`, read on the host (copied from the device when t is not on the host).
template <class T, int R>
T first_value(const Tensor<T, R>& t) {
  if (t.device().is_cpu()) return t.data()[0];
  return t.to(Device::cpu()).data()[0];
}

/// Throws unless a and b live on one device ("operands on different devices").
template <class T, int Ra, int Rb>
void check_same_device(const DistTensor<T, Ra>& a, const DistTensor<T, Rb>& b, const char* op) {
  SHARD_CHECK(a.device() == b.device(), op, "operands on different devices: {} and {}", a.device(), b.device());
}

/// Throws unless `s` has no Partial placement (nonlinear ops need resolved inputs).
inline void check_no_partial(const DistSpec& s, const char* op, const char* what) {
  SHARD_CHECK(!s.has_partial(), op, "{} has a Partial placement ({}); resolve it first (F::resolve)", what, s);
}

/// Throws unless every placement of `s` is Replicate (parameters).
inline void check_replicated(const DistSpec& s, const char* op, const char* what) {
  for (const auto& p : s.placements())
    SHARD_CHECK(p.is_replicate(), op, "{} must be Replicate on every mesh dim (parameters are replicated); got {}",
                what, s);
}

/// Throws unless a and b live on the same mesh with equal placements, global shapes and layouts.
inline void check_same_spec(const DistSpec& a, const DistSpec& b, const char* op, const char* wa, const char* wb) {
  SHARD_CHECK(a.mesh() == b.mesh(), op, "{} and {} live on different meshes: {}", wa, wb,
              mesh_mismatch(a.mesh(), b.mesh()));
  SHARD_CHECK(a == b, op, "{} and {} must have the same global shape, placements and shard sizes: {} {} vs {} {}", wa,
              wb, a, a.sizes(), b, b.sizes());
}

/// Throws unless tensor dim d of `s` is not sharded by any mesh dim.
inline void check_unsharded(const DistSpec& s, int d, const char* op, const char* what) {
  SHARD_CHECK(s.sharding_mesh_dims(d).empty(), op,
              "{} must not be sharded along tensor dim {} (this op mixes or normalises along it); got {}", what, d, s);
}

/// Mesh dims m whose placement is Shard(d) with pred(d) true, ascending.
template <class Pred>
std::vector<int> mesh_dims_sharding(const DistSpec& s, Pred pred) {
  std::vector<int> out;
  for (int m = 0; m < s.mesh().ndim(); ++m)
    if (s.placement(m).is_shard() && pred(s.placement(m).dim)) out.push_back(m);
  return out;
}

/// The communicator over the ranks that differ only in `mdims` (null when `mdims` is empty).
/// Collective on first use of a set of several dims (every rank of the mesh must call it).
inline CommPtr comm_over(const DeviceMesh& mesh, const std::vector<int>& mdims) {
  if (mdims.empty()) return nullptr;
  if (mdims.size() == 1) return mesh.dim_comm(mdims[0]);
  return mesh.dims_comm(mdims);
}

/// In-place sum-allreduce of `n` doubles over `comm` (no-op without a comm or with one rank): the
/// statistics of the norms and losses. With collective consistency checking on (the CPU context's
/// setting: the buffer is host memory) the element count is agreed first. Always, `key` (a
/// CallKey of the op's arguments: layout and parameters) rides along as two extra doubles, h and
/// h^2 of a short hash: all ranks passed the same key exactly when P * sum(h^2) == sum(h)^2, so
/// ranks that disagree throw shard::Error on every rank of `comm`, naming `op` (the cheap check
/// that stays on without the consistency mode; src/nn/reduction.cpp).
void allreduce_sum(const CommPtr& comm, double* buf, index_t n, std::uint64_t key, const char* op);
/// The same over a statistics buffer `buf` (f64, contiguous, n + 2 elements on ctx's device) whose
/// first two elements receive the check values h and h^2 (filled on the device) and whose
/// elements [2, n + 2) are summed. Nothing waits for the device: the check values are returned
/// (a pointer into buf, in device memory) for exec::norm_finish to verify, which turns the
/// statistics into NaN when the ranks disagreed. Returns null when nothing was reduced (no comm or
/// one rank). A CPU context takes allreduce_sum's path (shard::Error at once) and returns null.
const double* allreduce_sum_on_device(const CommPtr& comm, const Block& buf, index_t n, std::uint64_t key,
                                      const char* op, ExecContext& ctx);

/// `s`'s placements with Partial(op) on each mesh dim in `mdims`.
inline std::vector<Placement> with_partial(std::vector<Placement> p, const std::vector<int>& mdims, ReduceOp op) {
  for (int m : mdims) p[static_cast<std::size_t>(m)] = Partial(op);
  return p;
}

/// Spec on the mesh of `like` with `placements` and `global`, reusing `like`'s shard sizes for
/// every tensor dim that stays sharded by the same mesh dims with the same extent (dist_spec.hpp).
using shard::derived_spec;

/// Product of the global extents of the dims d with pred(d).
template <int R, class Pred>
index_t global_count(const Shape<R>& g, Pred pred) {
  index_t n = 1;
  for (int d = 0; d < R; ++d)
    if (pred(d)) n *= g[static_cast<std::size_t>(d)];
  return n;
}

/// Var::make for a variable number of inputs: records `value` with every input in `refs` as parent.
template <class T, int R>
Var<T, R> make_var_n(DistTensor<T, R> value, const char* name, const std::vector<autograd::VarRef>& refs,
                     std::function<void(const DistTensor<T, R>&)> fn) {
  autograd::VarRef first{};
  for (const auto& r : refs)
    if (r.requires_grad) { first = r; break; }
  auto out = Var<T, R>::make(std::move(value), name, {first}, std::move(fn));
  if (out.requires_grad() && out.node()) {
    auto& parents = out.node()->parents;
    parents.clear();
    for (const auto& r : refs)
      if (r.requires_grad && r.node &&
          std::find(parents.begin(), parents.end(), r.node) == parents.end())
        parents.push_back(r.node);
  }
  return out;
}

/// Spec of a parameter gradient whose local values are sums over this rank's part of x.
inline DistSpec param_grad_spec(const DistSpec& param, const DistSpec& xs) {
  auto p = param.placements();
  for (int m = 0; m < xs.mesh().ndim(); ++m)
    if (xs.placement(m).is_shard()) p[static_cast<std::size_t>(m)] = Partial(ReduceOp::sum);
  return param.with_placements(p);
}

/// Local block as a contiguous tensor (a view when already contiguous).
template <class T, int R>
Tensor<T, R> contig(const DistTensor<T, R>& x) {
  return x.local().contiguous();
}

}  // namespace detail

/// Differentiable Partial -> Replicate: every Partial placement of x is resolved by a collective
/// reduction (allreduce with the Partial's op) over that mesh dim; Shard and Replicate dims are
/// kept. Returns x itself when it has no Partial placement. Backward is the identity (the
/// gradient of a Partial value is the gradient of its resolved value, see common.hpp).
template <class T, int R>
Var<T, R> resolve(const Var<T, R>& x) {
  const DistSpec in_spec = x.value().spec();
  if (!in_spec.has_partial()) return x;
  const DistSpec out_spec = detail::grad_spec(in_spec);
  auto y = x.value().redistribute(out_spec);
  return Var<T, R>::make(std::move(y), "resolve", {x.ref()}, [x, out_spec](const DistTensor<T, R>& g) {
    x.accumulate_grad(autograd::gradient_as(out_spec, g, autograd::PartialGrad::resolve));
  });
}

}  // namespace shard::nn::functional

namespace shard {
/// Short alias: `F::relu(x)`, `F::batch_norm(...)`.
namespace F = nn::functional;
}  // namespace shard
