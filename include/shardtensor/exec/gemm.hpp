#pragma once
/// \file gemm.hpp
/// GEMM kernel family front: row-major (strided-batched) GEMM with transposes, alpha and beta,
/// and the bias epilogues of linear / channel_linear, on the device of the operands (CPU:
/// OpenBLAS through src/tensor/gemm.cpp; CUDA: cuBLAS, with TF32 only when the context's
/// ExecSettings::allow_tf32 is set). Host-pointer code (the CPU conv engine) may keep calling
/// shard::gemm of tensor/gemm.hpp directly.
#include "shardtensor/core/device.hpp"
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/exec/context.hpp"

namespace shard {

/// Whether a GEMM operand is used as stored (no) or transposed (yes).
enum class Trans : bool { no = false, yes = true };

namespace exec {

/// Row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C (dt = f32 or f64; leading
/// dimensions are the row strides of the stored matrices; all operands on `dev`).
void gemm(DType dt, Trans ta, Trans tb, index_t m, index_t n, index_t k, double alpha, const void* a, index_t lda,
          const void* b, index_t ldb, double beta, void* c, index_t ldc, Device dev, ExecContext& ctx);

/// `batch` GEMMs as gemm(); matrix i of A, B, C starts stride_a * i, stride_b * i, stride_c * i
/// elements after the first (a stride of 0 shares one matrix, e.g. a weight).
void gemm_strided_batched(DType dt, Trans ta, Trans tb, index_t m, index_t n, index_t k, double alpha, const void* a,
                          index_t lda, index_t stride_a, const void* b, index_t ldb, index_t stride_b, double beta,
                          void* c, index_t ldc, index_t stride_c, index_t batch, Device dev, ExecContext& ctx);

/// y[a, o, s] += bias[o] for a contiguous y[A, cout, S].
void add_bias(DType dt, index_t A, index_t cout, index_t S, const void* bias, void* y, Device dev, ExecContext& ctx);

/// db[o] = sum over a, s of g[a, o, s] (contiguous g[A, cout, S]), accumulated in double in a
/// fixed order (per a: the sum over s, then added in a order) and rounded once to dt.
void bias_grad(DType dt, index_t A, index_t cout, index_t S, const void* g, void* db, Device dev, ExecContext& ctx);

}  // namespace exec
}  // namespace shard
