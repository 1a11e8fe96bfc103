#pragma once
/// \file comm_ops.hpp
/// Differentiable communication: `redistribute`, and the gradient-placement rules of the tape
/// (including the one of ops that read ghost cells: conv, pooling, upsampling, neighbourhood
/// attention; their halo exchange and its adjoint are dist/ plans, dist/halo_transport.hpp).
///
/// ## What a gradient's placements mean (the rule used by the whole tape)
/// A Var's gradient is a DistTensor that represents the gradient with respect to the *global*
/// value; its placements only say how that global gradient is stored. So
///  - Shard(d): each rank holds its block of the gradient;
///  - Replicate: every rank holds the whole gradient (it is NOT summed over ranks again);
///  - Partial(sum): the gradient is the sum of the ranks' parts (per-rank contributions whose
///    reduction is deferred, e.g. a replicated weight used on every shard).
/// The gradient of a Partial value is Replicate: d(sum of parts)/d(part) = 1, so every part gets
/// the whole upstream gradient (the loss seed in Var::backward follows this rule).
///
/// ## redistribute
/// y = redistribute(x) does not change the global value, so its adjoint is the identity on the
/// global gradient and only re-represents it. grad_x gets, per mesh dim m:
///  - x Shard(d)      -> Shard(d) with x's layout (the gradient of a sharded activation is sharded
///                       the same way; an upstream Partial becomes a reduce-scatter, an upstream
///                       Replicate a local slice, an upstream Shard(e) an all-to-all);
///  - x Partial(any)  -> Replicate (an upstream Partial(sum) is allreduced; Replicate passes as is);
///  - x Replicate     -> Partial(sum) if the upstream gradient is Partial(sum) on m (the allreduce
///                       is deferred to whoever needs the value: accumulate_grad, leaf finalisation
///                       or the next adjoint, which is then a reduce-scatter), else Replicate.
/// So Shard->Replicate (allgather) has a reduce-scatter adjoint when the upstream gradient is a
/// sum of contributions, Partial->Replicate (allreduce) has the identity adjoint, Replicate->Shard
/// (slice) an allgather, Replicate->Partial an identity, Shard(i)->Shard(j) an all-to-all back.
///
/// ## Ops that read ghost cells (halo ops)
/// Such an op records ONE node for "halo exchange + local kernel" (Var::make with its closure);
/// the extended block is NOT a DistTensor (local+lo+hi per part is not a partition of any global
/// tensor). Its backward re-represents the upstream gradient in the output's placements
/// (gradient_as), computes the local adjoint, and sends the ghost cells' gradients home through
/// the halo plan's adjoint (dist/halo_transport.hpp). The input gradient's placements
/// (local_op_input_grad_placements): x's Shard(d) stay; a Partial x gets Replicate; a Replicate x
/// gets Replicate only where the output and upstream are Replicate too, else Partial(sum)
/// (per-rank contributions).
#include <type_traits>
#include <utility>

#include "shardtensor/autograd/variable.hpp"
#include "shardtensor/dist/halo.hpp"

namespace shard::autograd {

/// What the gradient of a Replicate value gets on a mesh dim where the upstream gradient is
/// Partial(sum). `keep`: Partial(sum) (the allreduce is deferred to whoever needs the value; for
/// backward code whose gradients' placements follow the upstream gradient's, and for redistribute's
/// adjoint). `resolve`: Replicate (allreduced now; for backward code that lays its gradients out
/// like the value and reads the gradient's values, e.g. a loss's scalar or a norm's sums).
/// Every other placement follows the same rule in both modes.
enum class PartialGrad : bool { keep, resolve };

/// Placements of the gradient of a value laid out by `value`, re-representing an upstream
/// gradient laid out by `upstream` (same mesh): the redistribute rule in the file comment
/// (`mode` as PartialGrad says).
std::vector<Placement> gradient_placements(const std::vector<Placement>& value, const std::vector<Placement>& upstream,
                                           PartialGrad mode = PartialGrad::keep);

/// Placements of the gradient of a halo op's input laid out by `input`, given the op's output
/// placements and the (normalised) upstream gradient's: the halo-op rule in the file comment.
std::vector<Placement> local_op_input_grad_placements(const std::vector<Placement>& input,
                                                      const std::vector<Placement>& output,
                                                      const std::vector<Placement>& grad_out);

/// `g` re-represented as the gradient of a value laid out by `value_spec` (see gradient_placements
/// and PartialGrad); returns `g` itself when nothing changes. Collective over the mesh when data
/// moves. The one helper every backward closure uses to align its upstream gradient.
template <class T, int R>
DistTensor<T, R> gradient_as(const DistSpec& value_spec, const DistTensor<T, R>& g,
                             PartialGrad mode = PartialGrad::keep) {
  DistSpec target = value_spec.with_placements(gradient_placements(value_spec.placements(), g.placements(), mode),
                                               value_spec.sizes());
  return target == g.spec() ? g : g.redistribute(target);
}

/// Differentiable redistribute to `target` (same mesh and global shape).
template <class T, int R>
Var<T, R> redistribute(const Var<T, R>& x, const DistSpec& target) {
  DistTensor<T, R> y = x.value().redistribute(target);
  return Var<T, R>::make(std::move(y), "redistribute", {x.ref()}, [x](const DistTensor<T, R>& g) {
    x.accumulate_grad(gradient_as(x.value().spec(), g));
  });
}
/// Differentiable redistribute to `placements` (layouts balanced unless `sizes` given).
template <class T, int R>
Var<T, R> redistribute(const Var<T, R>& x, std::vector<Placement> placements, const ShardSizes& sizes = {}) {
  return redistribute(x, x.value().spec().with_placements(std::move(placements), sizes));
}

}  // namespace shard::autograd
