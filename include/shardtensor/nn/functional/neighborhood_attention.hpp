#pragma once
/// \file neighborhood_attention.hpp
/// Domain-parallel neighbourhood (windowed) attention in 1, 2 or 3 spatial dims, forward and
/// backward on the autograd tape. This header holds the checks' entry points, the plan and the
/// tape node; the spec algebra and the schedule (halo exchanges, kernels, the overlap of the halo
/// adjoint with the dq kernel) are src/nn/neighborhood_attention.cpp, the communication the halo
/// plan of dist/halo.hpp, the kernels the nbhd_attention family (exec/neighborhood.hpp).
///
/// q, k, v are `[B, S_1..S_k, H, Dh]` (k = R - 3 spatial dims; v may have its own head dim Dv);
/// the spatial dims may be sharded over any mesh dims, unevenly (empty shards included), B may be
/// sharded over a data-parallel mesh dim, H and Dh must not be sharded. q and k have the same spec;
/// v the same except its last extent. The result has q's spec with Dh replaced by Dv.
///
/// Window semantics, per spatial dim d with window w_d and dilation l_d: the query at x attends to
/// the keys at x + l_d * o for o in [-(w_d - 1)/2, (w_d - 1)/2] (odd w_d) or [-w_d/2, w_d/2 - 1]
/// (even w_d) — the product of these offset sets over the dims. Boundary per dim:
///  - zero (default): keys outside the global domain are EXCLUDED from the softmax (they are not
///    zero keys); near the edge a query sees fewer keys. Requires w_d <= S_d.
///  - periodic: positions wrap around the global domain. Requires l_d * (w_d - 1) < S_d, so the
///    w_d window sites are distinct keys (otherwise the window would see a key twice).
/// scale = 0 means 1 / sqrt(Dh). The query's own key (offset 0) is always in its window, so no
/// query has an empty window.
///
/// Distribution: k and v are extended by halo exchanges (dist/halo.hpp) of l_d * (w_d / 2) cells
/// below and l_d * (w_d - 1 - w_d / 2) above along every sharded spatial dim (zero or periodic
/// mode; zero-mode widths are clipped to the extent, since keys further out are outside the
/// domain anyway). The halo machinery gathers ghost cells from further ranks when a halo is wider
/// than a neighbour's shard (multi-hop), so any window that passes the checks above works at any
/// rank count. Unsharded spatial dims are not exchanged: the local kernel clips (zero) or wraps
/// (periodic) them. The local kernel (exec/neighborhood.hpp) excludes keys outside the global
/// domain by a valid range per dim. Backward: dq is local; dk and dv of the extended blocks go
/// back through the halo ADJOINT (ghost gradients added on their owners), which is in flight
/// while the dq kernel runs. The forward exchanges k and v together (no compute overlap yet).
///
/// Bad input (shard::Error on every rank, before any communication): option vectors of the wrong
/// length, non-positive window or dilation, a window larger than the domain (see above), q/k/v with
/// different meshes, placements, shard sizes, shapes, heads or head dims, sharded H or Dh, q/k/v on
/// different devices.
#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

#include "shardtensor/autograd/comm_ops.hpp"
#include "shardtensor/dist/halo.hpp"
#include "shardtensor/exec/neighborhood.hpp"
#include "shardtensor/nn/functional/autocast.hpp"
#include "shardtensor/nn/functional/common.hpp"
#include "shardtensor/tensor/tensor_block.hpp"

namespace shard::nn::functional {

/// Options of neighborhood_attention (one entry per spatial dim for each vector).
struct NeighborhoodOptions {
  std::vector<index_t> window;    ///< window size per spatial dim (>= 1, odd or even)
  std::vector<index_t> dilation;  ///< dilation per spatial dim (empty: all 1)
  std::vector<bool> periodic;     ///< periodic boundary per spatial dim (empty: all zero boundary)
  double scale = 0;               ///< score scale; 0 means 1 / sqrt(Dh)
};

namespace detail {

/// The schedule of one neighbourhood attention on this rank: the k/v halo, the kernel geometry
/// (sizes, window, valid ranges; no pointers) and the output spec.
struct NbhdPlan {
  HaloSpec halo;           ///< k/v halo (R dims; nonzero only on sharded spatial dims)
  bool exchange = false;   ///< some width is nonzero (else k/v blocks are used as they are)
  exec::NbhdGeom geom;     ///< local kernel geometry
  DistSpec out_spec;       ///< q's spec with Dh replaced by Dv
};

/// Checks the options alone (lengths, positivity) for `spatial` spatial dims: identical on every
/// rank, so it throws on every rank alike.
void check_nbhd_options(const char* op, int spatial, const NeighborhoodOptions& o);

/// Checks q/k/v specs against each other and the options against the domain and builds this
/// rank's plan (pure algebra: no communication; every check depends on specs only).
NbhdPlan make_nbhd_plan(const char* op, const DistSpec& qs, const DistSpec& ks, const DistSpec& vs,
                        const NeighborhoodOptions& o);

/// What the forward schedule keeps for the backward: the operands as the kernels read them
/// (q and the halo-extended k/v blocks).
struct NbhdSaved {
  Block q, kx, vx;
};

/// The forward schedule (src/nn/neighborhood_attention.cpp): the k/v halo exchanges (both in
/// flight together), then the local kernel. q, k, v are this rank's blocks (any strides); writes
/// out (contiguous, q's block shape with Dv) and lse (contiguous [B, nq..., H]).
NbhdSaved neighborhood_attention_forward(const NbhdPlan& p, const DistSpec& ks, const DistSpec& vs, const Block& q,
                                         const Block& k, const Block& v, const Block& out, const Block& lse,
                                         ExecContext& ctx);

/// Gradients of this rank's q, k, v blocks (empty Blocks where not asked for).
struct NbhdGrads {
  Block dq, dk, dv;
};

/// The backward schedule: dk/dv kernels of the extended blocks, their halo adjoints in flight
/// while the dq kernel runs; dout contiguous, out's shape.
NbhdGrads neighborhood_attention_backward(const NbhdPlan& p, const DistSpec& ks, const DistSpec& vs,
                                          const NbhdSaved& saved, const Block& out, const Block& lse, const Block& dout,
                                          bool need_dq, bool need_dk, bool need_dv, ExecContext& ctx);

}  // namespace detail

/// Domain-parallel neighbourhood attention of q, k, v [B, S..., H, Dh] (see the file comment).
template <class T, int R>
Var<T, R> neighborhood_attention(const Var<T, R>& q_in, const Var<T, R>& k_in, const Var<T, R>& v_in,
                                 const NeighborhoodOptions& opt) {
  constexpr int S = R - 3;
  static_assert(S >= 1 && S <= 3 && is_float_type<T>,
                "neighborhood_attention: [B, S..., H, Dh] with 1-3 spatial dims, float, double, bf16 or f16");
  if (auto y = detail::autocast([](const auto&... a) { return neighborhood_attention(a...); }, q_in, k_in, v_in, opt))
    return *y;
  const char* op = "neighborhood_attention";
  detail::check_nbhd_options(op, S, opt);
  SHARD_CHECK(q_in.value().device() == k_in.value().device() && q_in.value().device() == v_in.value().device(), op,
              "q, k, v on different devices: {}, {}, {}", q_in.value().device(), k_in.value().device(),
              v_in.value().device());
  const auto q = resolve(q_in), k = resolve(k_in), v = resolve(v_in);
  const Device dev = q.value().device();
  auto plan = std::make_shared<const detail::NbhdPlan>(
      detail::make_nbhd_plan(op, q.value().spec(), k.value().spec(), v.value().spec(), opt));
  const Tensor<T, R>& ql = q.value().local();
  Shape<R> oshape = ql.shape();
  oshape[R - 1] = plan->geom.Dv;
  Tensor<T, R> out = Tensor<T, R>::empty(oshape, dev);
  Shape<R - 1> lshape{};
  for (int d = 0; d < R - 1; ++d) lshape[d] = ql.size(d);
  // The softmax statistics in the accumulation type: f64 for f64, else f32 (bf16 / f16 too).
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  Tensor<Acc, R - 1> lse = Tensor<Acc, R - 1>::empty(lshape, dev);
  const auto saved = std::make_shared<const detail::NbhdSaved>(detail::neighborhood_attention_forward(
      *plan, k.value().spec(), v.value().spec(), as_block(ql), as_block(k.value().local()),
      as_block(v.value().local()), as_block(out), as_block(lse), current_context(dev)));
  const DistSpec out_spec = plan->out_spec;
  return Var<T, R>::make(
      DistTensor<T, R>(out_spec, out), op, {q.ref(), k.ref(), v.ref()},
      [q, k, v, plan, saved, out, lse, dev](const DistTensor<T, R>& g) {
        const DistTensor<T, R> gn = autograd::gradient_as(plan->out_spec, g);
        const Tensor<T, R> gout = gn.local().contiguous();
        const bool gq = q.requires_grad(), gk = k.requires_grad(), gv = v.requires_grad();
        const detail::NbhdGrads d =
            detail::neighborhood_attention_backward(*plan, k.value().spec(), v.value().spec(), *saved, as_block(out),
                                                    as_block(lse), as_block(gout), gq, gk, gv, current_context(dev));
        const DistSpec& xs = q.value().spec();
        const DistSpec gs = xs.with_placements(
            autograd::local_op_input_grad_placements(xs.placements(), plan->out_spec.placements(), gn.placements()),
            xs.sizes());
        if (gq) q.accumulate_grad(DistTensor<T, R>(gs, tensor_of<T, R>(d.dq)));
        if (gk) k.accumulate_grad(DistTensor<T, R>(gs, tensor_of<T, R>(d.dk)));
        if (gv) {
          const DistSpec& vs = v.value().spec();
          v.accumulate_grad(DistTensor<T, R>(vs.with_placements(gs.placements(), vs.sizes()), tensor_of<T, R>(d.dv)));
        }
      });
}

}  // namespace shard::nn::functional
