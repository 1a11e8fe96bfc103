#pragma once
/// \file exec/conv.hpp
/// The convolution kernel family, type-erased front: forward, input gradient, weight gradient and
/// bias gradient of 1/2/3-D convolutions on N, C, spatial blocks (f32, f64), on the host (direct
/// AVX-512/AVX2 kernels, im2col + BLAS: src/exec/conv_cpu.cpp, conv_cpu_engine.cpp,
/// conv_cpu_direct.cpp) or on a CUDA device (cuDNN; src/cuda/conv_cuda.cpp). One calling
/// convention: (ConvGeometry, Blocks, ExecContext&); the table is the one of ctx.device(). The
/// schedule of the domain-parallel conv (src/nn/conv.cpp) and the typed single-rank conv
/// (nn/functional/conv_local.hpp) call these. A transposed conv is the input gradient used as a
/// forward op (its adjoints are forward and weight gradient with the roles of x and y swapped).
#include <array>

#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard {

/// One convolution problem as the kernel family sees it (the family's one geometry struct): 3
/// spatial dims with leading extents 1 for fewer (spatial_dims says how many are real). Output
/// position o of a dim reads input positions o * stride + k * dilation - pad_lo for taps k in
/// [0, kernel); positions outside [0, in) read zero. The high-side padding is implied by `out`
/// (every output must be listed there), so a problem may pad its two sides differently (the
/// halo-extended blocks of the distributed conv).
struct ConvGeometry {
  int spatial_dims = 3;  ///< 1, 2 or 3: how many of the trailing spatial entries are real
  index_t batch = 1, in_channels = 1, out_channels = 1, groups = 1;
  std::array<index_t, 3> in{1, 1, 1}, out{1, 1, 1}, kernel{1, 1, 1}, stride{1, 1, 1}, dilation{1, 1, 1},
      pad_lo{0, 0, 0};
  /// Element strides of the input x (N, C, the 3 spatial entries) for a table that reads strided
  /// inputs in place; all zero (the default) = contiguous. Callers leave it zero: the exec front
  /// sets it from x's Block (see conv_forward).
  std::array<index_t, 5> x_strides{0, 0, 0, 0, 0};
};

/// The direct-path kernel family that `kernel` (ExecSettings::conv_kernel) selects on this CPU:
/// "direct_avx512", "direct_avx2" or "im2col_blas" (follows shard::cpu_isa()).
const char* conv_kernel_isa(ConvKernel kernel = ConvKernel::automatic) noexcept;

namespace exec {

/// y[N, Cout, out] = conv(x[N, Cin, in], w[Cout, Cin/groups, kernel]) (+ bias[Cout] if non-null).
/// Every block on ctx.device(), of one dtype (f32 or f64); ordered on ctx's stream. w, bias and y are
/// contiguous. x is either contiguous (any rank, in's element count) or a strided view of rank
/// 2 + spatial_dims with x's N, C, spatial shape, e.g. the interior of a halo-padded array: the
/// CPU table reads it in place when its innermost stride is 1 (direct kernels and im2col gather
/// from it); otherwise, and on CUDA (cuDNN takes packed NCHW here), the front makes one contiguous
/// copy first. conv_backward_weight takes x the same way.
void conv_forward(const ConvGeometry& g, const Block& x, const Block& w, const Block* bias, const Block& y,
                  ExecContext& ctx);
/// gx[N, Cin, in] = conv^T(gy[N, Cout, out], w) (+ bias[Cin] if non-null: the transposed conv's bias).
/// Every gx element is written (positions no output reads get 0, or the bias).
void conv_backward_input(const ConvGeometry& g, const Block& gy, const Block& w, const Block* bias, const Block& gx,
                         ExecContext& ctx);
/// gw[Cout, Cin/groups, kernel] = d<conv(x, w), gy>/dw (overwritten).
void conv_backward_weight(const ConvGeometry& g, const Block& x, const Block& gy, const Block& gw, ExecContext& ctx);
/// gb[C] = sum of gy[N, C, ...] over the batch and all positions (overwritten).
void conv_backward_bias(const Block& gy, const Block& gb, ExecContext& ctx);

}  // namespace exec
}  // namespace shard
