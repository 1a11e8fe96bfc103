#pragma once
// GEMM kernel family (private interface; see include/shardtensor/exec/gemm.hpp for the contract).
// Sizes are checked by the front.
#include "shardtensor/exec/gemm.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct GemmKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::gemm;
  virtual ~GemmKernels() = default;
  // native_storage (KernelTable): gemm_strided_batched (KernelPass::forward), add_bias (forward) and
  // bias_grad (backward_bias) take bf16 / f16 operands themselves (f32 arithmetic and
  // accumulation, each result rounded once; C read in dt when beta != 0): CUDA yes, CPU no.
  virtual void gemm_strided_batched(DType dt, Trans ta, Trans tb, index_t m, index_t n, index_t k, double alpha,
                                    const void* a, index_t lda, index_t stride_a, const void* b, index_t ldb,
                                    index_t stride_b, double beta, void* c, index_t ldc, index_t stride_c,
                                    index_t batch, ExecContext& ctx) const = 0;
  virtual void add_bias(DType dt, index_t A, index_t cout, index_t S, const void* bias, void* y,
                        ExecContext& ctx) const = 0;
  virtual void bias_grad(DType dt, index_t A, index_t cout, index_t S, const void* g, void* db,
                         ExecContext& ctx) const = 0;
};


}  // namespace shard::exec
