#pragma once
// Kernel firewall of the neighbourhood-attention family (kernels/neighborhood.cu): plain C++17,
// no shardtensor headers. Launchers enqueue on `stream`, return a cudaError_t code (0 = success)
// and do not synchronise. Device pointers; element strides. Semantics and geometry as
// include/shardtensor/exec/neighborhood.hpp. One warp per (batch, query, head) row (forward, dq)
// or per (batch, key, head) (dk/dv, gathered over the queries that see the key in offset order):
// no atomics, deterministic. Head dims up to kMaxHeadDim.
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

/// out and lse ([B, nq..., H] contiguous; double for f64, float otherwise).
int forward(int dtype, const Geom& g, const Operand& q, const Operand& k, const Operand& v, const Operand& out,
            void* lse, void* stream);

/// Overwrites dq (null data: skipped), dk, dv (null data: skipped); `delta` is device scratch of
/// B * nq0 * nq1 * nq2 * H accumulation-type values.
int backward(int dtype, const Geom& g, const Operand& q, const Operand& k, const Operand& v, const Operand& out,
             const Operand& dout, const void* lse, const Operand& dq, const Operand& dk, const Operand& dv,
             void* delta, void* stream);

}  // namespace shard::kernels::nbhd
