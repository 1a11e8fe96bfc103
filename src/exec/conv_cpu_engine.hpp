#pragma once
// Private to the conv family's CPU table (src/exec/conv_cpu*.cpp): the tiled im2col + GEMM engine and the
// entry points of the direct SIMD path.
//
// Every convolution-like product here is a "gather conv" on a 3-D grid (1-D and 2-D problems
// have leading extents 1): output position o (a dense grid of extent `out`) of channel co reads
// input positions  i_d = o_d * stride_d + off_d[t_d]  for each tap t = (t0, t1, t2), zero where
// i_d falls outside [0, in_d), and computes  y[co, o] = sum_{c, t} w[co, c, t] * x[c, i(o, t)].
// The output is stored at  y_step * o + y_base  inside a grid of extent y_ext (dense for the
// forward conv; strided for one phase of the backward-input / transposed conv).
//
// The output positions are cut into tiles so that one tile's column buffer [cin * taps, tile]
// stays within the context's conv_column_budget bytes (Problem::cfg); (batch, group, tile) work units run in parallel
// with OpenMP, each with a per-thread column buffer and single-threaded BLAS.
#include <array>
#include <vector>

#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::detail::conv_engine {

using Ext3 = std::array<index_t, 3>;

/// Smallest and largest working-set budget per thread (all threads' buffers stay <= kColumnCap).
inline constexpr std::size_t kMinColumnBudget = 4096;
inline constexpr std::size_t kColumnCap = std::size_t{32} << 20;

/// The engine's knobs, taken from ExecSettings by the caller (src/exec/conv_cpu.cpp).
struct EngineSettings {
  std::size_t column_budget = std::size_t{1} << 20;  ///< working set per thread in bytes
  ConvThreading threading = ConvThreading::tiles;
  ConvKernel kernel = ConvKernel::automatic;
  bool native_low_precision = true;  ///< ExecSettings::native_low_precision
};

/// Tap offsets per dim: input index = o * stride + off[t].
struct Taps {
  Ext3 stride{1, 1, 1};
  std::array<std::vector<index_t>, 3> off;
  /// Number of taps (product over dims).
  index_t count() const {
    return static_cast<index_t>(off[0].size() * off[1].size() * off[2].size());
  }
};

/// One gather-conv problem (see the file comment).
struct Problem {
  index_t batch = 1, groups = 1, cin_g = 1, cout_g = 1;
  Ext3 in{1, 1, 1}, out{1, 1, 1};
  Taps taps;
  Ext3 y_ext{1, 1, 1}, y_step{1, 1, 1}, y_base{0, 0, 0};
  index_t x_batch_stride = 0, y_batch_stride = 0;  ///< elements between samples
  /// Elements between x's channels and between its positions along dims 0 and 1 (dim 2 has unit
  /// stride). x_channel_stride == 0 (the default) means x is dense per sample (vol(in), in[1] *
  /// in[2], in[2]); otherwise x may be any view with a unit innermost stride, e.g. the interior of
  /// a halo-padded array (read in place: im2col and the direct path's block fill gather from it).
  index_t x_channel_stride = 0;
  std::array<index_t, 2> x_spatial_stride{0, 0};
  EngineSettings cfg{};                             ///< kernel choice, threading, budget
};

/// x's layout in elements: channel stride and the strides of spatial dims 0 and 1.
struct XLayout {
  index_t c = 0, s0 = 0, s1 = 0;
  /// True when the positions of one channel are dense (one GEMM row per channel can read x).
  bool dense_positions(const Ext3& in) const { return s1 == in[2] && s0 == in[1] * in[2]; }
};
inline XLayout x_layout(const Problem& p) {
  if (p.x_channel_stride == 0) return {p.in[0] * p.in[1] * p.in[2], p.in[1] * p.in[2], p.in[2]};
  return {p.x_channel_stride, p.x_spatial_stride[0], p.x_spatial_stride[1]};
}

/// y = gather_conv(x, w) (+ bias[co]); w is [groups * cout_g][cin_g * taps] with taps
/// row-major (t0, t1, t2). Writes every y position the problem maps to; leaves others alone.
template <class T>
void gather_conv(const Problem& p, const T* x, const T* w, const T* bias, T* y);

/// gw[co, c, t] = sum_{n, o} gy[n, co, o] * x[n, c, i(o, t)] (overwrites gw). Needs a dense y
/// placement (y_ext == out, step 1, base 0). Deterministic for a given thread count.
template <class T>
void weight_grad(const Problem& p, const T* x, const T* gy, T* gw);

/// The direct SIMD path (conv_cpu_direct.cpp) for stride-1 problems; false if it does not apply
/// (strides > 1, no AVX2/AVX-512, or ConvKernel::im2col_blas selected in p.cfg): use the im2col path.
/// S is the storage dtype of x and y: T itself, or bf16 / f16 with T = float (widened as the
/// padded input block is filled, rounded once as y is stored; bit-identical to converting x to
/// f32, running the f32 path and rounding y).
template <class S, class T>
bool fast_gather_conv(const Problem& p, const S* x, const T* w, const T* bias, S* y);
/// The direct SIMD path for the weight gradient of a stride-1 problem with dense y; false if not
/// applicable. gw in the compute dtype T.
template <class S, class T>
bool fast_weight_grad(const Problem& p, const S* x, const S* gy, T* gw);
/// True when the direct path runs p (the bf16 / f16 storage path has no im2col fallback: the CPU
/// table asks this before it takes a bf16 / f16 call without f32 working copies).
bool storage_path_applies(const Problem& p);

/// The direct-path kernel family `kernel` selects on this CPU: "direct_avx512", "direct_avx2" or
/// "im2col_blas".
const char* kernel_isa(ConvKernel kernel) noexcept;

}  // namespace shard::detail::conv_engine
