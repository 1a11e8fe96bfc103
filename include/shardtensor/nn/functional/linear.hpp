#pragma once
/// \file linear.hpp
/// Differentiable channel mixing with replicated weights, on the GEMM kernel family (exec/gemm.hpp:
/// OpenBLAS on the host, cuBLAS on CUDA), on the device of the operands:
///  - channel_linear: 1x1 "pointwise convolution" on N, C, spatial... activations,
///    y[n,o,s...] = sum_c W[o,c] x[n,c,s...] + b[o];
///  - linear: on the last dim of token-like tensors [..., C] (torch.nn.functional.linear),
///    y[..., o] = sum_c W[o,c] x[..., c] + b[o].
/// The mixed dim must not be sharded; every other dim may be (spatial, and N over a data-parallel
/// mesh dim). W [Cout, Cin] and b [Cout] must be Replicate. The result has the input's placements
/// and layouts. Gradients: dx sharded like x; dW and db are local sums, Partial(sum) on every mesh
/// dim that shards x (reduced by Var's leaf finalisation), Replicate elsewhere.
#include <algorithm>
#include <optional>
#include <type_traits>
#include <vector>

#include "shardtensor/nn/functional/autocast.hpp"
#include "shardtensor/nn/functional/common.hpp"
#include "shardtensor/tensor/tensor_block.hpp"

namespace shard::nn::functional {

namespace detail {

/// Validates x / W / b of a channel-mixing op along tensor dim `cdim`; returns Cout.
template <class T, int R>
index_t check_linear_args(const Var<T, R>& x, const Var<T, 2>& w, const std::optional<Var<T, 1>>& b, int cdim,
                          const char* op) {
  const Device dev = x.value().device();
  SHARD_CHECK(w.value().device() == dev, op, "operands on different devices: weight on {} but the input on {}",
              w.value().device(), dev);
  const DistSpec& xs = x.value().spec();
  check_no_partial(xs, op, "input");
  check_unsharded(xs, cdim, op, "input");
  SHARD_CHECK(w.value().mesh() == xs.mesh(), op, "weight and input live on different meshes: {}",
              mesh_mismatch(w.value().mesh(), xs.mesh()));
  check_replicated(w.value().spec(), op, "weight");
  const auto ws = w.value().global_shape();
  const index_t cin = xs.global_shape()[static_cast<std::size_t>(cdim)];
  SHARD_CHECK(ws[1] == cin, op, "weight of shape {} expects {} input channels but the input {} has {} along dim {}", ws,
              ws[1], xs.global_shape(), cin, cdim);
  if (b) {
    SHARD_CHECK(b->value().device() == dev, op, "operands on different devices: bias on {} but the input on {}",
                b->value().device(), dev);
    SHARD_CHECK(b->value().mesh() == xs.mesh(), op, "bias and input live on different meshes: {}",
                mesh_mismatch(b->value().mesh(), xs.mesh()));
    check_replicated(b->value().spec(), op, "bias");
    SHARD_CHECK(b->value().global_shape()[0] == ws[0], op, "bias of shape {} for a weight of shape {} ({} outputs)",
                b->value().global_shape(), ws, ws[0]);
  }
  return ws[0];
}

// The schedule (src/nn/linear.cpp): the GEMMs and bias epilogues on one rank's local block,
// viewed as [A, C, S] along the channel dim cdim (1: channel_linear; the last dim: linear). x is
// contiguous, or a strided view that the GEMMs read in place through leading dimensions.

/// True when the GEMMs can read x (channel dim cdim) as it is; else the caller passes a
/// contiguous copy.
bool mix_reads_in_place(const Block& x, int cdim);
/// y[A, cout, S] = W[cout, cin] x + b (b may be null).
void mix_forward(const Block& x, const Block& w, const Block* b, int cdim, const Block& y, ExecContext& ctx);
/// dx (overwritten), dw (accumulated; zero on entry) and db (overwritten, rounded from double sums)
/// from the output gradient gy; each may be null.
void mix_backward(const Block& x, const Block& w, const Block& gy, int cdim, const Block* dx, const Block* dw,
                  const Block* db, ExecContext& ctx);

/// Shared front of channel_linear (cdim = 1) and linear (cdim = R - 1).
template <class T, int R>
Var<T, R> mix_channels(const Var<T, R>& x, const Var<T, 2>& w, const std::optional<Var<T, 1>>& b, int cdim,
                       const char* op) {
  static_assert(is_float_type<T>, "linear supports float, double, bf16 and f16");
  const index_t cout = check_linear_args(x, w, b, cdim, op);
  const DistSpec& xs = x.value().spec();
  const index_t cin = xs.global_shape()[static_cast<std::size_t>(cdim)];
  auto og = xs.global_shape();
  og[static_cast<std::size_t>(cdim)] = cout;
  const DistSpec out_spec = derived_spec(xs, xs.placements(), og);
  // x as it is where the GEMMs can read it in place through leading dimensions (a strided view
  // of user memory, e.g. the interior of a halo-padded array: saved as it is when stable; a
  // snapshot view was copied by local()); else one contiguous copy.
  const Tensor<T, R> xv = x.local();
  const Tensor<T, R> xl = mix_reads_in_place(as_block(xv), cdim) ? xv : xv.contiguous();
  const auto wl = w.local().contiguous();
  const Tensor<T, 1> bl = b ? b->local().contiguous() : Tensor<T, 1>();
  const Device dev = xl.device();
  auto y = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(out_spec.local_box().len), dev);
  const Block bias = as_block(bl);
  mix_forward(as_block(xl), as_block(wl), b ? &bias : nullptr, cdim, as_block(y), current_context(dev));
  std::optional<Var<T, 1>> bb = b;
  return Var<T, R>::make(
      DistTensor<T, R>(out_spec, y), op, {x.ref(), w.ref(), b ? b->ref() : autograd::VarRef{}},
      [x, w, bb, xs, xl, wl, out_spec, cin, cout, cdim, dev](const DistTensor<T, R>& gin) {
        const auto g = autograd::gradient_as(out_spec, gin, autograd::PartialGrad::resolve).local().contiguous();
        const bool need_b = bb && bb->requires_grad();
        Tensor<T, R> dx;
        if (x.requires_grad()) dx = Tensor<T, R>::empty(xl.shape(), dev);
        Tensor<T, 2> dw;
        if (w.requires_grad()) dw = Tensor<T, 2>::zeros({cout, cin}, dev);
        Tensor<T, 1> db;
        if (need_b) db = Tensor<T, 1>::empty({cout}, dev);
        const Block bdx = as_block(dx), bdw = as_block(dw), bdb = as_block(db);
        mix_backward(as_block(xl), as_block(wl), as_block(g), cdim, x.requires_grad() ? &bdx : nullptr,
                     w.requires_grad() ? &bdw : nullptr, need_b ? &bdb : nullptr, current_context(dev));
        if (x.requires_grad()) x.accumulate_grad(DistTensor<T, R>(xs, dx));
        if (w.requires_grad()) w.accumulate_grad(DistTensor<T, 2>(param_grad_spec(w.value().spec(), xs), dw));
        if (need_b) bb->accumulate_grad(DistTensor<T, 1>(param_grad_spec(bb->value().spec(), xs), db));
      });
}

}  // namespace detail

/// 1x1 channel mixing of N, C, spatial... activations: y[n,o,...] = sum_c W[o,c] x[n,c,...] + b[o].
/// W [Cout, Cin] and b [Cout] Replicate; C unsharded; any other dim may be sharded.
template <class T, int R>
Var<T, R> channel_linear(const Var<T, R>& x, const Var<T, 2>& weight,
                         const std::type_identity_t<std::optional<Var<T, 1>>>& bias = std::nullopt) {
  static_assert(R >= 2, "channel_linear needs N, C, ... inputs");
  if (auto y = detail::autocast([](const auto&... a) { return channel_linear(a...); }, x, weight, bias)) return *y;
  return detail::mix_channels(x, weight, bias, 1, "channel_linear");
}

/// Linear map of the last dim (tokens [..., Cin] -> [..., Cout]): y = x W^T + b, as
/// torch.nn.functional.linear. The last dim must be unsharded; W, b Replicate.
template <class T, int R>
Var<T, R> linear(const Var<T, R>& x, const Var<T, 2>& weight, const std::type_identity_t<std::optional<Var<T, 1>>>& bias = std::nullopt) {
  static_assert(R >= 1, "linear needs a rank >= 1 input");
  if (auto y = detail::autocast([](const auto&... a) { return linear(a...); }, x, weight, bias)) return *y;
  return detail::mix_channels(x, weight, bias, R - 1, "linear");
}

}  // namespace shard::nn::functional
