#pragma once
// Kernel firewall of the GEMM family's epilogues (kernels/gemm.cu; the GEMM itself is cuBLAS,
// called from src/cuda/gemm_cuda.cpp): plain C++17, no shardtensor headers. Launchers enqueue on
// `stream`, return a cudaError_t code (0 = success), do not synchronise. Device pointers. dtype:
// 0 f32, 1 f64, 2 bf16, 3 f16 (bf16 / f16 computed in float, each result rounded once).
#include <cstdint>

namespace shard::kernels::gemm {

using idx = std::int64_t;

/// y[a, o, s] += bias[o] for contiguous y[A, cout, S].
int add_bias(int dtype, idx A, idx cout, idx S, const void* bias, void* y, void* stream);
/// db[o] = (T) sum over a, s of g[a, o, s] in double (through float for bf16 / f16): one block per o,
/// fixed-order tree (no atomics).
int bias_grad(int dtype, idx A, idx cout, idx S, const void* g, void* db, void* stream);

}  // namespace shard::kernels::gemm
