#pragma once
/// \file conv_local.hpp
/// Single-rank N-d convolution for S = 1, 2, 3 spatial dims on Tensor<T, S + 2> in N, C, spatial
/// layout (T = float or double), on the host or a CUDA device: forward, gradients with respect
/// to input, weight and bias, and the transposed convolution with its gradients (the unsharded
/// oracle of F::conv, and a local conv for users). Hyper-parameters are F::ConvOptions with zero
/// padding (conv_options.hpp). These typed functions check shapes and call the conv kernel family
/// (exec/conv.hpp) on the calling thread's current context for the operands' device (its
/// ExecSettings choose the CPU kernel, threading and budget, or cuDNN's determinism and TF32);
/// outputs live on that device.
///
/// Padding is zero padding given EXPLICITLY PER SIDE (pad_lo, pad_hi): the domain-parallel layer
/// calls these kernels on halo-extended local blocks, where one side of a block has halo data
/// (pad 0) and the other the global padding. Output extent per spatial dim:
///   out = (in + pad_lo + pad_hi - dilation * (kernel - 1) - 1) / stride + 1   (must be >= 1).
///
/// CPU implementation (see ConvKernel in runtime/context.hpp): every stride-1 gather — the stride-1 forward conv and weight
/// gradient, every input gradient (computed one stride phase at a time: for stride s, the input
/// positions with the same residue mod s share one sub-kernel, so it is a stride-1 gather with
/// no multiply-by-zero work and no atomics) and the transposed conv — runs on a direct
/// implicit-GEMM path: each tile of output rows copies its input block once, zero-padded, and
/// AVX-512 / AVX2 register-blocked micro-kernels read the shifted rows of that block directly.
/// Strided forward / weight-gradient convs (and CPUs without AVX2) use im2col + GEMM (OpenBLAS),
/// tiled over the output positions so the column buffer stays within
/// ExecSettings::conv_column_budget bytes per thread (<= 32 MiB for all threads). Both parallelise with OpenMP over
/// (batch, group, tile) work units with per-thread buffers (gemm.hpp has the measured
/// threading policy). The weight gradient sums per-tile partials in double per thread and
/// reduces the threads in a fixed order (deterministic for a given thread count).
/// CUDA implementation: cuDNN (src/cuda/conv_cuda.cpp), algorithms found once per problem and
/// cached, deterministic ones under ExecSettings::deterministic, TF32 only with allow_tf32.
#include <optional>
#include <type_traits>
#include <utility>

#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/exec/conv.hpp"
#include "shardtensor/nn/functional/conv_options.hpp"
#include "shardtensor/tensor/tensor.hpp"
#include "shardtensor/tensor/tensor_block.hpp"

namespace shard {

namespace detail {

/// Checks stride/dilation >= 1, pads >= 0, groups >= 1 and zero padding (the padding modes are
/// F::conv's, through its halo).
template <int S>
void check_conv_params(const char* op, const nn::functional::ConvOptions<S>& p) {
  for (int d = 0; d < S; ++d) {
    SHARD_CHECK(p.stride[d] >= 1 && p.dilation[d] >= 1, op, "stride {} and dilation {} must be >= 1", p.stride,
                p.dilation);
    SHARD_CHECK(p.pad_lo[d] >= 0 && p.pad_hi[d] >= 0, op, "padding lo {} hi {} must be >= 0", p.pad_lo, p.pad_hi);
    SHARD_CHECK(p.padding_mode[static_cast<std::size_t>(d)] == Boundary::zero, op,
                "padding mode {} in dim {}: the single-rank conv pads with zeros only (F::conv takes every mode)",
                p.padding_mode[static_cast<std::size_t>(d)], d);
  }
  SHARD_CHECK(p.groups >= 1, op, "groups {} must be >= 1", p.groups);
}

/// Geometry for batch/channels/extents of one conv (S -> 3 dims, leading 1s).
template <int S>
ConvGeometry conv_geometry(index_t batch, index_t cin, index_t cout, const Shape<S>& in, const Shape<S>& out,
                           const Shape<S>& kernel, const nn::functional::ConvOptions<S>& p) {
  ConvGeometry g;
  g.spatial_dims = S;
  g.batch = batch;
  g.in_channels = cin;
  g.out_channels = cout;
  g.groups = p.groups;
  for (int d = 0; d < S; ++d) {
    const int e = 3 - S + d;
    g.in[e] = in[d];
    g.out[e] = out[d];
    g.kernel[e] = kernel[d];
    g.stride[e] = p.stride[d];
    g.dilation[e] = p.dilation[d];
    g.pad_lo[e] = p.pad_lo[d];
  }
  return g;
}

/// Spatial part of a shape.
template <int S, std::size_t R>
Shape<S> spatial_of(const std::array<index_t, R>& s) {
  Shape<S> r{};
  for (int d = 0; d < S; ++d) r[d] = s[2 + d];
  return r;
}
}  // namespace detail

/// Output extent of one dim: (in + lo + hi - dil*(k-1) - 1) / stride + 1, or <= 0 if the
/// (padded) input is shorter than the dilated kernel.
constexpr index_t conv_output_extent(index_t in, index_t kernel, index_t stride, index_t dilation, index_t pad_lo,
                                     index_t pad_hi) {
  const index_t span = in + pad_lo + pad_hi - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

/// Input range [first, last + 1) that the outputs [out_lo, out_lo + out_len) of a conv read in one
/// dim, in input coordinates (first < 0 or last >= in means the range reaches into the padding):
/// first = out_lo * stride - pad_lo, last = (out_lo + out_len - 1) * stride + dilation * (kernel - 1) - pad_lo.
/// A block holding the in-range part [clamp(first, 0, in), clamp(last + 1, 0, in)) (possibly
/// empty), with local pads (first < 0 ? min(last + 1, 0) - first : 0) and
/// (last + 1 > in ? last + 1 - max(first, in) : 0), yields exactly those outputs (the halo rule
/// of the distributed conv; tests/tensor/test_conv_blocks.cpp).
constexpr std::pair<index_t, index_t> conv_input_range(index_t out_lo, index_t out_len, index_t kernel, index_t stride,
                                                       index_t dilation, index_t pad_lo) {
  return {out_lo * stride - pad_lo, (out_lo + out_len - 1) * stride + dilation * (kernel - 1) - pad_lo + 1};
}

/// Spatial output shape of a conv; throws shard::Error naming the shapes if any extent < 1.
template <int S>
Shape<S> conv_output_shape(const Shape<S>& in, const Shape<S>& kernel, const nn::functional::ConvOptions<S>& p,
                           const char* op = "conv_output_shape") {
  detail::check_conv_params(op, p);
  Shape<S> out{};
  for (int d = 0; d < S; ++d) {
    SHARD_CHECK(kernel[d] >= 1, op, "kernel extent {} must be >= 1 (kernel {})", kernel[d], kernel);
    out[d] = conv_output_extent(in[d], kernel[d], p.stride[d], p.dilation[d], p.pad_lo[d], p.pad_hi[d]);
    SHARD_CHECK(out[d] >= 1, op,
                "empty output in spatial dim {}: input {} with padding lo {} hi {} is shorter than kernel {} "
                "dilated by {}",
                d, in, p.pad_lo, p.pad_hi, kernel, p.dilation);
  }
  return out;
}

/// Spatial output shape of a transposed conv:
///   (in - 1) * stride - lo - hi + dilation * (kernel - 1) + output_padding + 1,
/// with 0 <= output_padding < max(stride, dilation); throws if any extent < 1.
template <int S>
Shape<S> conv_transpose_output_shape(const Shape<S>& in, const Shape<S>& kernel, const nn::functional::ConvOptions<S>& p,
                                     const Shape<S>& output_padding, const char* op = "conv_transpose_output_shape") {
  detail::check_conv_params(op, p);
  Shape<S> out{};
  for (int d = 0; d < S; ++d) {
    SHARD_CHECK(kernel[d] >= 1, op, "kernel extent {} must be >= 1 (kernel {})", kernel[d], kernel);
    SHARD_CHECK(output_padding[d] >= 0 && output_padding[d] < std::max(p.stride[d], p.dilation[d]), op,
                "output_padding {} must be >= 0 and < max(stride {}, dilation {})", output_padding, p.stride,
                p.dilation);
    out[d] = (in[d] - 1) * p.stride[d] - p.pad_lo[d] - p.pad_hi[d] + p.dilation[d] * (kernel[d] - 1) +
             output_padding[d] + 1;
    SHARD_CHECK(in[d] >= 1 && out[d] >= 1, op, "empty output in spatial dim {}: input {} kernel {} padding lo {} hi {}",
                d, in, kernel, p.pad_lo, p.pad_hi);
  }
  return out;
}

namespace detail {
/// Common shape checks of x[N, Cin, *] against w[Cout, Cin/groups, k*] (conv_forward layout).
template <class T, int R>
void check_conv_operands(const char* op, const Tensor<T, R>& x, const Tensor<T, R>& w, index_t groups) {
  static_assert(is_float_type<T>, "conv supports float, double, bf16 and f16");
  static_assert(R >= 3 && R <= 5, "conv needs rank 3, 4 or 5 (N, C, 1-3 spatial dims)");
  SHARD_CHECK(x.device() == w.device(), op, "operands on different devices: input {} on {}, weight {} on {}",
              x.shape(), x.device(), w.shape(), w.device());
  SHARD_CHECK(w.size(0) % groups == 0, op, "out channels {} (weight {}) not divisible by groups {}", w.size(0),
              w.shape(), groups);
  SHARD_CHECK(x.size(1) == w.size(1) * groups, op,
              "input channels {} (input {}) != weight in-channels {} x groups {} (weight {})", x.size(1), x.shape(),
              w.size(1), groups, w.shape());
}

/// Contiguous block of an optional bias (or nothing).
template <class T>
std::optional<Block> bias_block(const std::optional<Tensor<T, 1>>& bias) {
  if (!bias) return std::nullopt;
  return as_block(bias->contiguous());
}
}  // namespace detail

/// y[N, Cout, out] = conv(x[N, Cin, in], w[Cout, Cin/groups, k...]) + bias[Cout] (bias optional).
template <class T, int R>
Tensor<T, R> conv_forward(const Tensor<T, R>& x, const Tensor<T, R>& w,
                          const std::type_identity_t<std::optional<Tensor<T, 1>>>& bias,
                          const nn::functional::ConvOptions<R - 2>& p) {
  constexpr int S = R - 2;
  detail::check_conv_operands("conv_forward", x, w, p.groups);
  const auto in = detail::spatial_of<S>(x.shape()), k = detail::spatial_of<S>(w.shape());
  const auto out = conv_output_shape<S>(in, k, p, "conv_forward");
  if (bias) SHARD_CHECK(bias->numel() == w.size(0), "conv_forward",
                        "bias shape {} != [{}] (out channels of weight {})", bias->shape(), w.size(0), w.shape());
  Shape<R> ys{};
  ys[0] = x.size(0);
  ys[1] = w.size(0);
  for (int d = 0; d < S; ++d) ys[2 + d] = out[d];
  auto y = Tensor<T, R>::empty(ys, x.device());
  const auto bb = detail::bias_block(bias);
  exec::conv_forward(detail::conv_geometry<S>(x.size(0), x.size(1), w.size(0), in, out, k, p), as_block(x.contiguous()),
                     as_block(w.contiguous()), bb ? &*bb : nullptr, as_block(y), current_context(x.device()));
  return y;
}

/// gx[N, Cin, in] = gradient of <conv_forward(x, w, p), gy> with respect to x, for an input of
/// spatial shape `in` (needed: with stride > 1 several input extents give one output extent).
template <class T, int R>
Tensor<T, R> conv_backward_input(const Tensor<T, R>& gy, const Tensor<T, R>& w, const Shape<R - 2>& in,
                                 const nn::functional::ConvOptions<R - 2>& p) {
  constexpr int S = R - 2;
  static_assert(is_float_type<T>, "conv supports float, double, bf16 and f16");
  const auto k = detail::spatial_of<S>(w.shape());
  const auto out = conv_output_shape<S>(in, k, p, "conv_backward_input");
  SHARD_CHECK(w.size(0) % p.groups == 0 && gy.size(1) == w.size(0) && detail::spatial_of<S>(gy.shape()) == out,
              "conv_backward_input",
              "output gradient {} does not match weight {} and input extent {} (expected [N, {}, {}], groups {})",
              gy.shape(), w.shape(), in, w.size(0), out, p.groups);
  Shape<R> xs{};
  xs[0] = gy.size(0);
  xs[1] = w.size(1) * p.groups;
  for (int d = 0; d < S; ++d) xs[2 + d] = in[d];
  auto gx = Tensor<T, R>::empty(xs, gy.device());
  exec::conv_backward_input(detail::conv_geometry<S>(gy.size(0), xs[1], w.size(0), in, out, k, p),
                           as_block(gy.contiguous()), as_block(w.contiguous()), nullptr, as_block(gx),
                           current_context(gy.device()));
  return gx;
}

/// gw[Cout, Cin/groups, kernel] = gradient of <conv_forward(x, w, p), gy> with respect to w.
template <class T, int R>
Tensor<T, R> conv_backward_weight(const Tensor<T, R>& x, const Tensor<T, R>& gy, const Shape<R - 2>& kernel,
                                  const nn::functional::ConvOptions<R - 2>& p) {
  constexpr int S = R - 2;
  static_assert(is_float_type<T>, "conv supports float, double, bf16 and f16");
  const auto in = detail::spatial_of<S>(x.shape());
  const auto out = conv_output_shape<S>(in, kernel, p, "conv_backward_weight");
  SHARD_CHECK(x.size(1) % p.groups == 0 && gy.size(1) % p.groups == 0 && gy.size(0) == x.size(0) &&
                  detail::spatial_of<S>(gy.shape()) == out,
              "conv_backward_weight",
              "input {} and output gradient {} do not match kernel {} (expected spatial {}, channels divisible by "
              "groups {})",
              x.shape(), gy.shape(), kernel, out, p.groups);
  Shape<R> ws{};
  ws[0] = gy.size(1);
  ws[1] = x.size(1) / p.groups;
  for (int d = 0; d < S; ++d) ws[2 + d] = kernel[d];
  auto gw = Tensor<T, R>::empty(ws, x.device());
  exec::conv_backward_weight(detail::conv_geometry<S>(x.size(0), x.size(1), gy.size(1), in, out, kernel, p),
                             as_block(x.contiguous()), as_block(gy.contiguous()), as_block(gw),
                             current_context(x.device()));
  return gw;
}

/// gb[C] = sum of gy[N, C, ...] over batch and positions (the bias gradient).
template <class T, int R>
Tensor<T, 1> conv_backward_bias(const Tensor<T, R>& gy) {
  static_assert(is_float_type<T> && R >= 2, "conv_backward_bias: float/double/bf16/f16, rank >= 2");
  auto gb = Tensor<T, 1>::empty({gy.size(1)}, gy.device());
  exec::conv_backward_bias(as_block(gy.contiguous()), as_block(gb), current_context(gy.device()));
  return gb;
}

/// Transposed conv: y[N, Cout, out] from x[N, Cin, in] with w[Cin, Cout/groups, k...] (PyTorch's
/// ConvTranspose layout) and optional bias[Cout]; equals conv_backward_input of the conv that
/// maps y-space to x-space with the same params. Output extent: conv_transpose_output_shape.
template <class T, int R>
Tensor<T, R> conv_transpose_forward(const Tensor<T, R>& x, const Tensor<T, R>& w,
                                    const std::type_identity_t<std::optional<Tensor<T, 1>>>& bias,
                                    const nn::functional::ConvOptions<R - 2>& p, const Shape<R - 2>& output_padding = {}) {
  constexpr int S = R - 2;
  static_assert(is_float_type<T>, "conv supports float, double, bf16 and f16");
  SHARD_CHECK(x.size(1) == w.size(0) && w.size(0) % p.groups == 0, "conv_transpose_forward",
              "input channels {} (input {}) != weight dim 0 (weight {}) or not divisible by groups {}", x.size(1),
              x.shape(), w.shape(), p.groups);
  const auto in = detail::spatial_of<S>(x.shape()), k = detail::spatial_of<S>(w.shape());
  const auto out = conv_transpose_output_shape<S>(in, k, p, output_padding, "conv_transpose_forward");
  const index_t cout = w.size(1) * p.groups;
  if (bias) SHARD_CHECK(bias->numel() == cout, "conv_transpose_forward", "bias shape {} != [{}] (weight {}, groups {})",
                        bias->shape(), cout, w.shape(), p.groups);
  Shape<R> ys{};
  ys[0] = x.size(0);
  ys[1] = cout;
  for (int d = 0; d < S; ++d) ys[2 + d] = out[d];
  auto y = Tensor<T, R>::empty(ys, x.device());
  const auto bb = detail::bias_block(bias);
  // The conv from y-space (extent `out`, cout channels) to x-space (extent `in`, Cin channels).
  exec::conv_backward_input(detail::conv_geometry<S>(x.size(0), cout, x.size(1), out, in, k, p),
                           as_block(x.contiguous()), as_block(w.contiguous()), bb ? &*bb : nullptr, as_block(y),
                           current_context(x.device()));
  return y;
}

/// Gradient of <conv_transpose_forward(x, w, p, op), gy> with respect to x (= a conv of gy);
/// `in` is x's spatial shape.
template <class T, int R>
Tensor<T, R> conv_transpose_backward_input(const Tensor<T, R>& gy, const Tensor<T, R>& w, const Shape<R - 2>& in,
                                           const nn::functional::ConvOptions<R - 2>& p) {
  constexpr int S = R - 2;
  detail::check_conv_operands("conv_transpose_backward_input", gy, w, p.groups);
  const auto k = detail::spatial_of<S>(w.shape()), ys = detail::spatial_of<S>(gy.shape());
  const auto full = conv_output_shape<S>(ys, k, p, "conv_transpose_backward_input");
  for (int d = 0; d < S; ++d)
    SHARD_CHECK(in[d] >= 1 && in[d] <= full[d], "conv_transpose_backward_input",
                "input extent {} inconsistent with output gradient {} and kernel {}", in, gy.shape(), k);
  Shape<R> xs{};
  xs[0] = gy.size(0);
  xs[1] = w.size(0);
  for (int d = 0; d < S; ++d) xs[2 + d] = in[d];
  auto gx = Tensor<T, R>::empty(xs, gy.device());
  exec::conv_forward(detail::conv_geometry<S>(gy.size(0), gy.size(1), w.size(0), ys, in, k, p),
                     as_block(gy.contiguous()), as_block(w.contiguous()), nullptr, as_block(gx),
                     current_context(gy.device()));
  return gx;
}

/// Gradient of <conv_transpose_forward(x, w, p, op), gy> with respect to w[Cin, Cout/groups, kernel].
template <class T, int R>
Tensor<T, R> conv_transpose_backward_weight(const Tensor<T, R>& x, const Tensor<T, R>& gy, const Shape<R - 2>& kernel,
                                            const nn::functional::ConvOptions<R - 2>& p) {
  constexpr int S = R - 2;
  static_assert(is_float_type<T>, "conv supports float, double, bf16 and f16");
  const auto in = detail::spatial_of<S>(x.shape()), ys = detail::spatial_of<S>(gy.shape());
  const auto full = conv_output_shape<S>(ys, kernel, p, "conv_transpose_backward_weight");
  for (int d = 0; d < S; ++d)
    SHARD_CHECK(in[d] >= 1 && in[d] <= full[d], "conv_transpose_backward_weight",
                "input {} inconsistent with output gradient {} and kernel {}", x.shape(), gy.shape(), kernel);
  SHARD_CHECK(x.size(0) == gy.size(0) && x.size(1) % p.groups == 0 && gy.size(1) % p.groups == 0,
              "conv_transpose_backward_weight", "input {} and output gradient {} batch/channels mismatch (groups {})",
              x.shape(), gy.shape(), p.groups);
  Shape<R> ws{};
  ws[0] = x.size(1);
  ws[1] = gy.size(1) / p.groups;
  for (int d = 0; d < S; ++d) ws[2 + d] = kernel[d];
  auto gw = Tensor<T, R>::empty(ws, x.device());
  exec::conv_backward_weight(detail::conv_geometry<S>(gy.size(0), gy.size(1), x.size(1), ys, in, kernel, p),
                             as_block(gy.contiguous()), as_block(x.contiguous()), as_block(gw),
                             current_context(x.device()));
  return gw;
}

}  // namespace shard
