#pragma once
/// \file gemm.hpp
/// GEMM kernel family front: row-major (strided-batched) GEMM with transposes, alpha and beta,
/// and the bias epilogues of linear / channel_linear, on the device of the operands (CPU:
/// OpenBLAS through src/exec/gemm_cpu_blas.cpp; CUDA: cuBLAS, with TF32 only when the context's
/// ExecSettings::allow_tf32 is set). Host-pointer code (the CPU conv engine) may keep calling
/// shard::gemm of exec/blas.hpp directly.
#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard {

/// Whether a GEMM operand is used as stored (no) or transposed (yes).
enum class Trans : bool { no = false, yes = true };

namespace exec {

/// A GEMM's options: C = alpha * op(A) * op(B) + beta * C.
struct GemmGeometry {
  Trans ta = Trans::no, tb = Trans::no;
  double alpha = 1.0, beta = 0.0;
};

/// Row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C (f32 or f64, all operands on the
/// context's device). Each operand is a Block holding the STORED matrix: rank 2 [rows, cols] with
/// unit column stride (its row stride is the BLAS leading dimension), or rank 3 [batch, rows, cols]
/// (strided batched: matrix i starts strides[0] * i elements after the first; a stride of 0 shares
/// one matrix). C's batch is the GEMM's; a rank-2 (or batch-1) A or B is shared by every matrix.
void gemm(const GemmGeometry& g, const Block& a, const Block& b, const Block& c, ExecContext& ctx);

/// The [A, C, S] view of a contiguous block of the bias epilogues (C = the channels).
struct BiasGeometry {
  index_t A = 0, channels = 0, S = 0;
};

/// y[a, o, s] += bias[o] for a contiguous y[A, C, S] and bias[C].
void add_bias(const BiasGeometry& g, const Block& bias, const Block& y, ExecContext& ctx);

/// db[o] = sum over a, s of gy[a, o, s] (contiguous gy[A, C, S], db[C]), accumulated in double in
/// a fixed order (per a: the sum over s, then added in a order) and rounded once to the dtype.
void bias_grad(const BiasGeometry& g, const Block& gy, const Block& db, ExecContext& ctx);

}  // namespace exec
}  // namespace shard
