#pragma once
// The tensor-core neighbourhood-attention kernels (kernels/neighborhood_tc.cu), called by
// kernels/neighborhood.cu's launchers before the warp-per-row kernels. Each returns kDeclined
// (nothing enqueued) when it does not take the call: no tensor-core form for the dtype (f64; f32
// without kAllowTF32; bf16 / f16 without kLowpTensorCores), the device is too old (f16: compute
// capability 7.0; bf16 and TF32: 8.0), a head dim exceeds 128, SHARDTENSOR_NBHD_TC=0, or the
// device cannot give the shared memory.
#include <cuda_runtime.h>

#include "kernels_api/neighborhood.hpp"

namespace shard::kernels::nbhd::tc {

constexpr int kDeclined = -1;

/// out and lse (float), as kernels_api's forward.
int forward(int dtype, int flags, const Geom& g, const Operand& q, const Operand& k, const Operand& v,
            const Operand& out, float* lse, cudaStream_t s);
/// Overwrites dq, dk, dv (null data: skipped) and writes delta (float scratch), as kernels_api's backward.
int backward(int dtype, int flags, const Geom& g, const Operand& q, const Operand& k, const Operand& v,
             const Operand& out, const Operand& dout, const float* lse, const Operand& dq, const Operand& dk,
             const Operand& dv, float* delta, cudaStream_t s);
/// Whether forward (backward = false) or backward would run here.
bool takes(int dtype, int flags, const Geom& g, bool backward);

}  // namespace shard::kernels::nbhd::tc
