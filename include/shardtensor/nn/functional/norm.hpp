#pragma once
/// \file norm.hpp
/// Differentiable normalisations with GLOBAL statistics on sharded N, C, spatial... activations:
///  - batch_norm: per channel over N and all spatial dims (training: batch statistics, allreduced
///    over every mesh dim that shards x, running stats updated; eval: running statistics);
///  - group_norm: per (sample, group) over the group's channels and all spatial dims (allreduced
///    over the mesh dims that shard spatial dims; N may be sharded over a data-parallel mesh dim);
///  - instance_norm: group_norm with one group per channel (no running statistics);
///  - layer_norm: per position over the channels (dim 1; or any unsharded dim, e.g. -1 for
///    tokens), purely local.
/// The channel (normalised-over for layer_norm) dim must not be sharded. Optional affine weight and
/// bias [C] must be Replicate. Statistics accumulate in double for every dtype and read x once:
/// each rank's local sum, mean and squared deviation M2 (shifted sums, exec::norm_moments); one
/// allreduce of K doubles gives the global mean, each rank moves its M2 to that mean (+ n_r (m_r -
/// mean)^2), and a second allreduce of K doubles gives the variance (K = number of statistics).
/// The backward needs the global sums of dxhat and dxhat * xhat (one allreduce of 2K doubles;
/// BatchNorm adds its 2C weight/bias sums to the same message, so its dW and db come back
/// Replicate). Other norms return dW and db as local sums, Partial(sum) over the mesh dims that shard
/// x (reduced by Var's leaf finalisation). Normalisation uses the biased variance; BatchNorm's
/// running variance uses the unbiased one (as PyTorch). The local work runs in the norm kernel
/// family (exec/norm.hpp) on the input's device; the statistics are small host arrays of doubles,
/// reduced across ranks here.
/// Each norm takes an optional fused activation (`act`: NormAct::silu, gelu, relu, ...): y =
/// act(norm(x)) in one op, the activation applied in the norm's own apply pass, its derivative in
/// the norm's backward passes, all in double. It equals the norm followed by the activation op
/// (to the rounding of the intermediate, which the fused op does not store), reads and writes the
/// activation tensor once less each way, and saves only x for the backward (the unfused pair also
/// keeps the norm's output for the activation's backward). A `residual` (a tensor of x's shape and
/// layout) may be added before the activation: y = act(norm(x) + residual), the epilogue of a
/// residual block, whose backward also writes the residual's gradient; it saves the sum that
/// add-then-activation keeps for the activation's backward.
#include <memory>
#include <optional>
#include <type_traits>

#include "shardtensor/exec/norm.hpp"
#include "shardtensor/nn/functional/common.hpp"
#include "shardtensor/tensor/tensor_block.hpp"

namespace shard::nn::functional {

/// The activation a norm can fuse (exec/norm.hpp): none, relu, gelu, gelu_tanh, silu, tanh, sigmoid.
using NormAct = exec::NormAct;

namespace detail {

using exec::NormGeom;
using exec::NormKind;

/// Checks an optional per-channel parameter of a norm op.
template <class T>
void check_channel_param(const std::optional<Var<T, 1>>& p, index_t C, const DistSpec& xs, Device xs_dev,
                         const char* op, const char* what) {
  if (!p) return;
  SHARD_CHECK(p->value().device() == xs_dev, op, "operands on different devices: {} on {} but the input on {}", what,
              p->value().device(), xs_dev);
  SHARD_CHECK(p->value().mesh() == xs.mesh(), op, "{} and input live on different meshes: {}", what,
              mesh_mismatch(p->value().mesh(), xs.mesh()));
  check_replicated(p->value().spec(), op, what);
  SHARD_CHECK(p->value().global_shape()[0] == C, op, "{} has {} entries but the input {} has {} channels", what,
              p->value().global_shape()[0], xs.global_shape(), C);
}

/// Running statistics of batch_norm (plain Replicate tensors updated in place; may be null).
template <class T>
struct RunningStats {
  DistTensor<T, 1>* mean = nullptr;
  DistTensor<T, 1>* var = nullptr;
  double momentum = 0.1;
};

// The schedule (src/nn/norm.cpp): the norm kernels and the statistics' allreduces over `comm`
// (the mesh dims that shard the reduced dims; null: none) for one rank's local block x (dense, or
// a strided view read in place). The statistics stay in the device memory of x's context: a norm
// on a GPU queues its kernels and device allreduces and never waits for the device.

/// The K statistics of one norm call (f64, in the context's device memory): [2 check values |
/// mean K | 2 check values | invstd K], filled by norm_forward, read by norm_backward.
struct NormStats {
  Block buf;
  index_t K = 0;
  double* mean() const { return static_cast<double*>(buf.data) + 2; }
  double* invstd() const { return static_cast<double*>(buf.data) + K + 4; }
};

/// Training (run_mean, run_var null or the running statistics to update in place with `momentum`):
/// global statistics over `count` elements (one pass over x, two allreduces), then y; eval (batch_eval): y from the running
/// statistics (both given). Fills `stats`.
void norm_forward(const NormGeom& geo, const Block& x, const Block* w, const Block* b, const Block* res,
                  const Block* run_mean,
                  const Block* run_var, double momentum, double eps, bool batch_eval, index_t count,
                  const CommPtr& comm, std::uint64_t key, const char* op, NormStats& stats, const Block& y,
                  ExecContext& ctx);
/// Gradients from gy: dx (stats_grad: through the global statistics, else with them fixed), dw and
/// db [C] (local sums; with reduce_params summed over `comm` with the statistics' sums). Each of
/// dx, dw, db may be null.
void norm_backward(const NormGeom& geo, const Block& x, const Block& gy, const Block* w, const Block* b,
                   const Block* res, const NormStats& stats,
                   index_t count, bool stats_grad, bool reduce_params,
                   const CommPtr& comm, std::uint64_t key, const char* op, const Block* dx, const Block* dw,
                   const Block* db, const Block* dres, ExecContext& ctx);

/// The shared front of all norms. `training` only matters for batch (eval uses `rs`).
template <class T, int R, class S = T>
Var<T, R> normalize(const Var<T, R>& x, NormKind kind, index_t groups, int cdim, const std::optional<Var<T, 1>>& w,
                    const std::optional<Var<T, 1>>& b, double eps, const char* op, const RunningStats<S>& rs = {},
                    bool training = true, NormAct act = NormAct::none, const std::optional<Var<T, R>>& res = std::nullopt) {
  static_assert(is_float_type<T>, "norms support float, double, bf16 and f16");
  const Device dev = x.value().device();
  const DistSpec& xs = x.value().spec();
  check_no_partial(xs, op, "input");
  SHARD_CHECK(cdim >= 0 && cdim < R, op, "dim {} out of range for a rank-{} input", cdim, R);
  check_unsharded(xs, cdim, op, "input");
  const auto gshape = x.value().global_shape();
  const index_t C = gshape[static_cast<std::size_t>(cdim)];
  check_channel_param(w, C, xs, dev, op, "weight");
  check_channel_param(b, C, xs, dev, op, "bias");
  SHARD_CHECK(eps >= 0, op, "eps must be >= 0 (got {})", eps);
  if (kind == NormKind::group)
    SHARD_CHECK(groups >= 1 && C % groups == 0, op, "{} channels cannot be split into {} groups", C, groups);
  const bool batch_eval = kind == NormKind::batch && !training;
  for (DistTensor<S, 1>* r : {rs.mean, rs.var}) {
    if (!r) continue;
    SHARD_CHECK(r->device() == dev, op, "operands on different devices: running statistic on {} but the input on {}",
                r->device(), dev);
    check_replicated(r->spec(), op, "running statistic");
    SHARD_CHECK(r->global_shape()[0] == C, op, "running statistic of shape {} for {} channels", r->global_shape(), C);
  }
  SHARD_CHECK(!batch_eval || (rs.mean && rs.var), op, "evaluation mode needs running_mean and running_var");
  if (res) {  // added before the activation, element by element: the same global shape and layout
    SHARD_CHECK(res->value().device() == dev, op, "operands on different devices: residual on {} but the input on {}",
                res->value().device(), dev);
    SHARD_CHECK(res->value().mesh() == xs.mesh(), op, "residual and input live on different meshes: {}",
                mesh_mismatch(res->value().mesh(), xs.mesh()));
    SHARD_CHECK(res->value().spec() == xs, op,
                "the residual (global shape {}, placements {}) must have the input's shape and layout (global shape {}, "
                "placements {}); redistribute_like it first",
                res->value().global_shape(), res->value().placements(), xs.global_shape(), xs.placements());
  }

  // Statistics: which dims they reduce over, globally.
  auto reduced = [&](int d) {
    if (kind == NormKind::batch) return d != cdim;
    if (kind == NormKind::group) return d > cdim;
    return false;
  };
  index_t count = global_count<R>(gshape, reduced);
  if (kind == NormKind::group) count *= C / groups;
  if (kind == NormKind::layer) count = C;
  SHARD_CHECK(batch_eval || count > 0, op, "statistics over an empty extent (global shape {})", gshape);
  const CommPtr comm = comm_over(xs.mesh(), mesh_dims_sharding(xs, reduced));
  // The cheap check carried by the statistics allreduces (allreduce_sum): every argument that
  // must agree between the ranks.
  const std::uint64_t key = shard::detail::CallKey(op).add(kind).add(groups).add(cdim).add(eps).add(count).add(xs)
                                .add(batch_eval).add(w.has_value()).add(b.has_value()).add(rs.momentum)
                                .add(static_cast<int>(act)).add(res.has_value()).value();

  // A strided local view (e.g. the interior of a halo-padded user array) is read in place by the
  // norm kernels and saved as it is.
  const auto xl = x.local();
  NormGeom geo{kind, 1, C, 1, kind == NormKind::group ? groups : 1};
  geo.cdim = cdim;
  geo.act = act;
  for (int d = 0; d < cdim; ++d) geo.A *= xl.size(d);
  for (int d = cdim + 1; d < R; ++d) geo.S *= xl.size(d);
  auto stats = std::make_shared<NormStats>();
  const auto wl = w ? w->local().contiguous() : Tensor<T, 1>();
  const auto bl = b ? b->local().contiguous() : Tensor<T, 1>();
  // Running statistics: read as contiguous copies in eval, updated in place in training.
  // (S: the statistics' dtype; f32 buffers of a bf16 / f16 model, read and written through f64.)
  const Tensor<S, 1> rm = rs.mean ? (batch_eval ? rs.mean->local().contiguous() : rs.mean->local()) : Tensor<S, 1>();
  const Tensor<S, 1> rv = rs.var ? (batch_eval ? rs.var->local().contiguous() : rs.var->local()) : Tensor<S, 1>();
  auto y = Tensor<T, R>::empty(xl.shape(), dev);
  const auto rl = res ? res->local().contiguous() : Tensor<T, R>();
  const Block bw = as_block(wl), bb = as_block(bl), brm = as_block(rm), brv = as_block(rv), br = as_block(rl);
  norm_forward(geo, as_block(xl), w ? &bw : nullptr, b ? &bb : nullptr, res ? &br : nullptr, rs.mean ? &brm : nullptr,
               rs.var ? &brv : nullptr, rs.momentum, eps, batch_eval, count, comm, key, op, *stats, as_block(y),
               current_context(dev));

  const bool stats_grad = !batch_eval;
  const bool reduce_params = kind == NormKind::batch && training;  // dW, db ride on the stats allreduce
  return Var<T, R>::make(
      DistTensor<T, R>(xs, y), op,
      {x.ref(), w ? w->ref() : autograd::VarRef{}, b ? b->ref() : autograd::VarRef{},
       res ? res->ref() : autograd::VarRef{}},
      [x, w, b, res, xs, xl, wl, bl, rl, geo, stats, comm, key, op, count, stats_grad, reduce_params](const DistTensor<T, R>& gin) {
        const auto g = autograd::gradient_as(xs, gin, autograd::PartialGrad::resolve).local().contiguous();
        const index_t C = geo.C;
        const Device dev = xl.device();
        const bool need_x = x.requires_grad(), need_w = w && w->requires_grad(), need_b = b && b->requires_grad();
        const bool need_r = res && res->requires_grad();
        Tensor<T, R> dx, dr;
        if (need_x) dx = Tensor<T, R>::empty(xl.shape(), dev);
        if (need_r) dr = Tensor<T, R>::empty(xl.shape(), dev);
        Tensor<T, 1> dw, db;
        if (need_w) dw = Tensor<T, 1>::empty({C}, dev);
        if (need_b) db = Tensor<T, 1>::empty({C}, dev);
        const Block bw = as_block(wl), bb = as_block(bl), br = as_block(rl), bdx = as_block(dx), bdw = as_block(dw),
                    bdb = as_block(db), bdr = as_block(dr);
        norm_backward(geo, as_block(xl), as_block(g), w ? &bw : nullptr, b ? &bb : nullptr, res ? &br : nullptr, *stats,
                      count, stats_grad, reduce_params, comm, key, op, need_x ? &bdx : nullptr, need_w ? &bdw : nullptr,
                      need_b ? &bdb : nullptr, need_r ? &bdr : nullptr, current_context(dev));
        if (need_x) x.accumulate_grad(DistTensor<T, R>(xs, dx));
        if (need_r) res->accumulate_grad(DistTensor<T, R>(xs, dr));
        auto push = [&](const std::optional<Var<T, 1>>& p, const Tensor<T, 1>& t) {
          const DistSpec& ps = p->value().spec();
          p->accumulate_grad(DistTensor<T, 1>(reduce_params ? ps : param_grad_spec(ps, xs), t));
        };
        if (need_w) push(w, dw);
        if (need_b) push(b, db);
      });
}

}  // namespace detail

/// Batch normalisation of N, C, spatial... (C unsharded). training: normalise with the global batch
/// statistics over N and all spatial dims and, if given, update running_mean / running_var in place
/// (momentum as PyTorch: r = (1 - m) r + m stat; unbiased variance). eval (training = false):
/// normalise with running_mean / running_var (both required). weight, bias: optional [C] Replicate.
template <class T, int R, class S = master_t<T>>
Var<T, R> batch_norm(const Var<T, R>& x, std::type_identity_t<DistTensor<S, 1>>* running_mean,
                     std::type_identity_t<DistTensor<S, 1>>* running_var,
                     const std::type_identity_t<std::optional<Var<T, 1>>>& weight, const std::type_identity_t<std::optional<Var<T, 1>>>& bias, bool training,
                     double momentum = 0.1, double eps = 1e-5, NormAct act = NormAct::none,
                     const std::type_identity_t<std::optional<Var<T, R>>>& residual = std::nullopt) {
  static_assert(R >= 2, "batch_norm needs N, C, ... inputs");
  return detail::normalize(x, detail::NormKind::batch, 1, 1, weight, bias, eps, "batch_norm",
                           detail::RunningStats<S>{running_mean, running_var, momentum}, training, act, residual);
}

/// Group normalisation: C channels in `groups` groups; statistics per (sample, group) over the
/// group's channels and all spatial dims (global). weight, bias: optional [C] Replicate.
template <class T, int R>
Var<T, R> group_norm(const Var<T, R>& x, index_t groups, const std::type_identity_t<std::optional<Var<T, 1>>>& weight = std::nullopt,
                     const std::type_identity_t<std::optional<Var<T, 1>>>& bias = std::nullopt, double eps = 1e-5,
                     NormAct act = NormAct::none,
                     const std::type_identity_t<std::optional<Var<T, R>>>& residual = std::nullopt) {
  static_assert(R >= 2, "group_norm needs N, C, ... inputs");
  return detail::normalize(x, detail::NormKind::group, groups, 1, weight, bias, eps, "group_norm",
                           detail::RunningStats<T>{}, true, act, residual);
}

/// Instance normalisation: statistics per (sample, channel) over all spatial dims (global); no
/// running statistics (PyTorch's default track_running_stats=False). weight, bias optional [C].
template <class T, int R>
Var<T, R> instance_norm(const Var<T, R>& x, const std::type_identity_t<std::optional<Var<T, 1>>>& weight = std::nullopt,
                        const std::type_identity_t<std::optional<Var<T, 1>>>& bias = std::nullopt, double eps = 1e-5,
                        NormAct act = NormAct::none,
                        const std::type_identity_t<std::optional<Var<T, R>>>& residual = std::nullopt) {
  static_assert(R >= 2, "instance_norm needs N, C, ... inputs");
  return detail::normalize(x, detail::NormKind::group, x.value().global_shape()[1], 1, weight, bias, eps,
                           "instance_norm", detail::RunningStats<T>{}, true, act, residual);
}

/// Layer normalisation over one unsharded dim (default 1: the channels of N, C, spatial...;
/// -1: the features of tokens [..., C]): per position, purely local. weight, bias optional [C].
template <class T, int R>
Var<T, R> layer_norm(const Var<T, R>& x, const std::type_identity_t<std::optional<Var<T, 1>>>& weight = std::nullopt,
                     const std::type_identity_t<std::optional<Var<T, 1>>>& bias = std::nullopt, double eps = 1e-5, int dim = 1,
                     NormAct act = NormAct::none,
                     const std::type_identity_t<std::optional<Var<T, R>>>& residual = std::nullopt) {
  SHARD_CHECK(dim >= -R && dim < R, "layer_norm", "dim {} out of range for a rank-{} input", dim, R);
  return detail::normalize(x, detail::NormKind::layer, 1, dim < 0 ? dim + R : dim, weight, bias, eps, "layer_norm",
                           detail::RunningStats<T>{}, true, act, residual);
}

}  // namespace shard::nn::functional
