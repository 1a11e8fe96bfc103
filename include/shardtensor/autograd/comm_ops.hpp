#pragma once
/// \file comm_ops.hpp
/// Differentiable communication: `redistribute` and `with_halo` (the building block of every op
/// that needs neighbours' data: conv, pooling, upsampling).
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
/// ## with_halo: one node for an op that needs ghost cells
/// Design decision: the extended block is NOT a DistTensor (local+lo+hi per part is not a
/// partition of any global tensor). An op that needs a halo records ONE node with
///
///     auto y = autograd::with_halo(x, {.name = "conv2d", .halo = h},
///         [&](HaloExchange<T,R>& hx) -> DistTensor<T,R> {   // forward
///           ... compute the interior that needs no halo from x.local() (overlap) ...
///           Tensor<T,R> ext = hx.finish();                  // x's block + ghosts
///           ... compute the rest; return the sharded output DistTensor ...
///         },
///         [=](const DistTensor<T,R>& grad_out, const Tensor<T,R>& ext) -> Tensor<T,R> {
///           w.accumulate_grad(...);                         // parameters' gradients (Partial(sum))
///           return grad_ext;                                // gradient of the extended block
///         },
///         w, b);                                            // extra inputs recorded on the node
///
/// with_halo starts the exchange, runs `forward`, and records a node whose backward
///  1. re-represents the upstream gradient in the output's placements (a Partial(sum) upstream
///     stays Partial(sum) where the output is Replicate; everything else is redistributed), so
///     `grad_out.local()` has the output's local shape;
///  2. calls `backward(grad_out, ext)` (`ext` is the saved extended block, or an empty tensor
///     with `.save_extended = false`, for ops whose backward does not read the input);
///  3. if x requires grad, runs the halo adjoint on the returned block (shape of the extended
///     block on every rank, checked collectively) and accumulates it into x. Its placements: x's
///     Shard(d) stay; a Partial x gets Replicate; a Replicate x gets Replicate only where the
///     output and upstream are Replicate too, else Partial(sum) (per-rank contributions).
/// `backward` may return an empty Tensor when x does not require grad; the block it returns is
/// handed over (the adjoint works in it in place), so it must not alias data used elsewhere.
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
/// placements and the (normalised) upstream gradient's: the with_halo rule in the file comment.
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

/// Options of with_halo.
struct HaloOp {
  const char* name = "with_halo";  ///< node name (shows in errors)
  HaloSpec halo;                   ///< ghost widths and boundary modes per tensor dim
  bool save_extended = true;       ///< keep the extended block for backward (conv: yes; avg pool: no)
};

/// Records one node for an op that reads x's block plus ghost cells (see the file comment).
/// `forward(HaloExchange<T,R>&) -> DistTensor<TO,RO>`; `backward(const DistTensor<TO,RO>&
/// grad_out, const Tensor<T,R>& ext) -> Tensor<T,R>` (gradient of the extended block, or empty
/// when x does not require grad). `extra_inputs` are further Vars the op reads (weights, bias);
/// `backward` pushes their gradients itself with accumulate_grad.
template <class T, int R, class Forward, class Backward, class... Extra>
auto with_halo(const Var<T, R>& x, const HaloOp& op, Forward&& forward, Backward&& backward,
               const Extra&... extra_inputs) {
  using Out = std::remove_cvref_t<std::invoke_result_t<Forward&, HaloExchange<T, R>&>>;
  using TO = typename Out::value_type;
  constexpr int RO = Out::rank;
  static_assert(std::is_same_v<Out, DistTensor<TO, RO>>, "with_halo: forward must return a DistTensor");
  HaloExchange<T, R> hx = halo_exchange_start(x.value(), op.halo);
  Out out = forward(hx);
  Tensor<T, R> ext = op.save_extended ? hx.finish() : (hx.finish(), Tensor<T, R>());
  DistSpec out_spec = out.spec();
  return Var<TO, RO>::make(
      std::move(out), op.name, {x.ref(), extra_inputs.ref()...},
      [x, halo = op.halo, out_spec, ext, bwd = std::forward<Backward>(backward)](const DistTensor<TO, RO>& g) {
        DistTensor<TO, RO> gn = gradient_as(out_spec, g);
        Tensor<T, R> gext = bwd(gn, ext);
        if (!x.requires_grad()) return;
        const DistSpec& xs = x.value().spec();
        Tensor<T, R> gx = halo_exchange_adjoint(xs, gext, halo, /*overwrite_grad_ext=*/true);
        DistSpec gs = xs.with_placements(
            local_op_input_grad_placements(xs.placements(), out_spec.placements(), gn.placements()), xs.sizes());
        x.accumulate_grad(DistTensor<T, R>(gs, gx));
      });
}

}  // namespace shard::autograd
