#pragma once
/// \file loss.hpp
/// Differentiable losses over sharded predictions, returning a scalar Var<T,1> of global shape {1},
/// Replicate (already resolved: backward() can start from it on every rank):
///  - mse_loss: mean (or sum) of (pred - target)^2 over the GLOBAL element count;
///  - rel_l2_loss: relative L2 error ||pred - target||_2 / ||target||_2, either per sample (norms
///    over each sample's dims 1.., then the mean over the global batch: the usual neural-operator
///    "LpLoss" and the default) or over the whole global tensor.
/// pred and target must have identical specs (no Partial). Sums accumulate in double. The
/// gradient of rel_l2_loss is taken as 0 where ||pred - target|| = 0 (a subgradient); a zero target
/// norm gives inf/nan as the formula does.
///
/// Recipe: checks and spec algebra here; the schedule in src/nn/reduction.cpp; the reduce exec
/// family.
#include <cmath>

#include "shardtensor/nn/functional/common.hpp"

namespace shard::nn::functional {

/// How mse_loss reduces the squared errors.
enum class Reduction { mean, sum };
/// Which norms rel_l2_loss compares.
enum class RelL2Mode { per_sample, global };

namespace detail {

template <class T, int R>
void check_loss_args(const Var<T, R>& pred, const Var<T, R>& target, const char* op) {
  check_same_device(pred.value(), target.value(), op);
  check_no_partial(pred.value().spec(), op, "pred");
  check_same_spec(pred.value().spec(), target.value().spec(), op, "pred", "target");
}

/// Scalar spec over x's mesh: Partial(sum) on the mesh dims in `mdims`, Replicate elsewhere.
inline DistSpec scalar_spec(const DistSpec& xs, const std::vector<int>& mdims) {
  std::vector<Placement> p(static_cast<std::size_t>(xs.mesh().ndim()), Replicate());
  return DistSpec(xs.mesh(), with_partial(p, mdims, ReduceOp::sum), {1});
}

/// The schedule (src/nn/reduction.cpp). mse: out[0] = scale * this rank's sum of squared
/// differences, written on p's device (no host read); its backward gp = c (p - t), gt = -gp with
/// c = coef * g[0], g the loss gradient left on the device (gt may be an empty Block).
void mse_forward(const Block& p, const Block& t, double scale, const Block& out, ExecContext& ctx);
void mse_backward(double coef, const Block& g, const Block& p, const Block& t, const Block& gp, const Block& gt,
                  ExecContext& ctx);
/// rel_l2: sums (f64, 2 + 2 * samples, on the device: [2 check values | per sample ||p_n - t_n||^2,
/// ||t_n||^2]) over `samples` local samples, allreduced over `comm` (the mesh dims sharding a
/// sample; null: none); out[0] = this rank's part of the loss (sum over its samples of the norm
/// ratios / global_samples), written on the device.
void rel_l2_forward(const CommPtr& comm, std::uint64_t key, const Block& p, const Block& t, index_t samples,
                    index_t global_samples, const Block& sums, const Block& out, ExecContext& ctx);
/// The gradients for the loss gradient g (one element on the device), from the saved sums.
void rel_l2_backward(const Block& g, const Block& sums, index_t samples, index_t global_samples, const CommPtr& comm,
                     const Block& p, const Block& t, const Block& gp, const Block& gt, ExecContext& ctx);

}  // namespace detail

/// Mean (default) or sum of (pred - target)^2 over the global tensor: a Replicate scalar {1}.
template <class T, int R>
Var<T, 1> mse_loss(const Var<T, R>& pred, const Var<T, R>& target, Reduction reduction = Reduction::mean) {
  static_assert(is_float_type<T>, "losses support float, double, bf16 and f16");
  const char* op = "mse_loss";
  detail::check_loss_args(pred, target, op);
  const DistSpec& xs = pred.value().spec();
  const index_t count = numel(pred.value().global_shape());
  SHARD_CHECK(reduction == Reduction::sum || count > 0, op, "mean over an empty tensor");
  const double scale = reduction == Reduction::mean ? 1.0 / static_cast<double>(count) : 1.0;
  // Strided local views (e.g. interiors of halo-padded user arrays) are read in place by the
  // exec kernels and saved as they are (Var's saved-tensor policy applies).
  const auto pl = pred.local(), tl = target.local();
  const Device dev = pl.device();
  // The value and, in backward, the loss gradient stay on the device: no host read, no sync (a
  // training step reads the loss back only where it logs it).
  auto v = Tensor<T, 1>::empty({1}, dev);
  detail::mse_forward(as_block(pl), as_block(tl), scale, as_block(v), current_context(dev));
  const DistSpec ss = detail::scalar_spec(xs, detail::mesh_dims_sharding(xs, [](int) { return true; }));
  auto part = Var<T, 1>::make(DistTensor<T, 1>(ss, v), op, {pred.ref(), target.ref()},
                              [pred, target, pl, tl, xs, ss, scale](const DistTensor<T, 1>& gin) {
                                const auto g = autograd::gradient_as(ss, gin, autograd::PartialGrad::resolve).local();
                                const Device gdev = pl.device();
                                SHARD_CHECK(g.device() == gdev, "mse_loss_backward",
                                            "the loss gradient is on {}, the prediction on {}", g.device(), gdev);
                                const auto gc = g.is_contiguous() ? g : g.contiguous();
                                auto gp = Tensor<T, R>::empty(pl.shape(), gdev);
                                Tensor<T, R> gt;
                                if (target.requires_grad()) gt = Tensor<T, R>::empty(pl.shape(), gdev);
                                detail::mse_backward(2.0 * scale, as_block(gc), as_block(pl), as_block(tl),
                                                     as_block(gp), target.requires_grad() ? as_block(gt) : Block{},
                                                     current_context(gdev));
                                const DistSpec gs = detail::grad_spec(xs);
                                if (pred.requires_grad()) pred.accumulate_grad(DistTensor<T, R>(gs, gp));
                                if (target.requires_grad()) target.accumulate_grad(DistTensor<T, R>(gs, gt));
                              });
  return resolve(part);
}

/// Relative L2 error: per_sample (default) = mean over the global batch of ||p_n - t_n|| / ||t_n||
/// (norms over dims 1..; dim 0 is the sample dim); global = ||p - t|| / ||t|| over the whole tensor.
/// Returns a Replicate scalar {1}.
template <class T, int R>
Var<T, 1> rel_l2_loss(const Var<T, R>& pred, const Var<T, R>& target, RelL2Mode mode = RelL2Mode::per_sample) {
  static_assert(is_float_type<T>, "losses support float, double, bf16 and f16");
  const char* op = "rel_l2_loss";
  detail::check_loss_args(pred, target, op);
  const DistSpec& xs = pred.value().spec();
  const auto gshape = pred.value().global_shape();
  const bool per_sample = mode == RelL2Mode::per_sample;
  SHARD_CHECK(!per_sample || R >= 2, op, "per-sample mode needs a batch dim and at least one more (rank {})", R);
  const index_t nglobal = per_sample ? gshape[0] : 1;
  SHARD_CHECK(nglobal > 0, op, "empty batch (global shape {})", gshape);
  // Norms reduce over the mesh dims that shard a sample's dims; the mean over samples is Partial
  // over the mesh dims that shard the batch.
  auto in_sample = [per_sample](int d) { return !per_sample || d > 0; };
  const CommPtr comm = detail::comm_over(xs.mesh(), detail::mesh_dims_sharding(xs, in_sample));
  const auto batch_mdims = per_sample ? detail::mesh_dims_sharding(xs, [](int d) { return d == 0; })
                                      : std::vector<int>{};
  const auto pl = pred.local(), tl = target.local();  // strided views are read in place
  const index_t nl = per_sample ? pl.size(0) : 1;
  // The value, the sums and the backward's coefficients stay on the device (no host read).
  const Device dev = pl.device();
  const Block sums = Block::allocate(DType::f64, dev, {2 + 2 * nl});
  const std::uint64_t key = shard::detail::CallKey(op).add(mode).add(xs).add(target.value().spec()).value();
  auto v = Tensor<T, 1>::empty({1}, dev);
  detail::rel_l2_forward(comm, key, as_block(pl), as_block(tl), nl, nglobal, sums, as_block(v), current_context(dev));
  const DistSpec ss = detail::scalar_spec(xs, batch_mdims);
  auto part = Var<T, 1>::make(
      DistTensor<T, 1>(ss, v), op, {pred.ref(), target.ref()},
      [pred, target, pl, tl, xs, ss, sums, comm, nl, nglobal](const DistTensor<T, 1>& gin) {
        const auto g = autograd::gradient_as(ss, gin, autograd::PartialGrad::resolve).local();
        const Device gdev = pl.device();
        SHARD_CHECK(g.device() == gdev, "rel_l2_loss_backward", "the loss gradient is on {}, the prediction on {}",
                    g.device(), gdev);
        const auto gc = g.is_contiguous() ? g : g.contiguous();
        auto gp = Tensor<T, R>::empty(pl.shape(), gdev);
        auto gt = Tensor<T, R>::empty(pl.shape(), gdev);
        detail::rel_l2_backward(as_block(gc), sums, nl, nglobal, comm, as_block(pl), as_block(tl), as_block(gp),
                                as_block(gt), current_context(gdev));
        const DistSpec gs = detail::grad_spec(xs);
        if (pred.requires_grad()) pred.accumulate_grad(DistTensor<T, R>(gs, gp));
        if (target.requires_grad()) target.accumulate_grad(DistTensor<T, R>(gs, gt));
      });
  return resolve(part);
}

}  // namespace shard::nn::functional
