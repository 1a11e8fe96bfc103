#pragma once
// Kernel firewall of the neighbourhood-attention family (kernels/neighborhood.cu): plain C++17,
// no shardtensor headers. Launchers enqueue on `stream`, return a cudaError_t code (0 = success)
// and do not synchronise. Device pointers; element strides. Semantics and geometry as
// include/shardtensor/exec/neighborhood.hpp. One warp per (batch, query, head) row (forward, dq)
// or per (batch, key, head) (dk/dv, gathered over the queries that see the key in offset order):
// no atomics, deterministic. Head dims up to kMaxHeadDim. With `flags`, f16 / bf16 / f32 (TF32)
// calls with head dims <= 128 run on the tensor-core kernels (kernels/neighborhood_tc.cu: 64-query
// patches against the union of their windows; also deterministic).
#include <cstdint>

namespace shard::kernels::nbhd {

using idx = std::int64_t;

/// Largest q/k and v head dim the kernels accept (8 values per lane of a warp).
constexpr idx kMaxHeadDim = 256;

/// dtype codes of the launchers.
enum Dtype : int { f32 = 0, f64 = 1, bf16 = 2, f16 = 3 };

struct Geom {
  idx B, H, D, Dv;
  idx nq[3], nk[3], qoff[3], window[3], dilation[3], valid_lo[3], valid_hi[3];
  int wrap[3];
  double scale;
};

/// Strided [B, S0, S1, S2, H, D] operand (d stride 1).
struct Operand {
  const void* data;
  idx sb, ss[3], sh;
};

/// Bits of the launchers' `flags` (the same as the attention family's).
constexpr int kAllowTF32 = 1;        ///< f32 may run on TF32 tensor cores (ExecSettings::allow_tf32)
constexpr int kLowpTensorCores = 2;  ///< bf16 / f16 may run on the tensor cores, which round P and dS to
                                     ///< the storage type (ExecSettings::native_low_precision)

/// out and lse ([B, nq..., H] contiguous; double for f64, float otherwise).
int forward(int dtype, const Geom& g, const Operand& q, const Operand& k, const Operand& v, const Operand& out,
            void* lse, void* stream, int flags = 0);

/// Overwrites dq (null data: skipped), dk, dv (null data: skipped); `delta` is device scratch of
/// B * nq0 * nq1 * nq2 * H accumulation-type values.
int backward(int dtype, const Geom& g, const Operand& q, const Operand& k, const Operand& v, const Operand& out,
             const Operand& dout, const void* lse, const Operand& dq, const Operand& dk, const Operand& dv,
             void* delta, void* stream, int flags = 0);

/// Whether forward (backward = false) or backward runs on the tensor-core kernels
/// (kernels/neighborhood_tc.cu: f16 on compute capability 7.0+ and bf16 on 8.0+ with
/// kLowpTensorCores, f32 on 8.0+ with kAllowTF32; head dims <= 128; SHARDTENSOR_NBHD_TC not 0;
/// the shared memory granted) rather than the warp-per-row kernels; for the profiler rows.
bool takes_tensor_cores(int dtype, const Geom& g, bool backward, int flags = 0);

}  // namespace shard::kernels::nbhd
