#pragma once
// The tensor-core attention kernels (kernels/attention_tc.cu), called by kernels/attention.cu's
// launchers before the SIMT tiled kernels. Each returns detail::kDeclined (nothing enqueued) when
// it does not take the call: the storage type has no tensor-core form here (f64; f32 without
// kAllowTF32; bf16 / f16 without kLowpTensorCores), the device is too old (f16: compute capability 7.0; bf16 and TF32: 8.0), a head
// dim exceeds 128, SHARDTENSOR_ATTENTION_TC=0, or the device cannot give the shared memory.
#include <cuda_runtime.h>

#include "kernels_api/attention.hpp"

namespace shard::kernels::attention::tc {

/// out and lse (float) of the forward; `flags` as kernels_api's forward.
int forward(int dtype, int flags, const Geom& g, In q, In k, In v, const Mask& m, Out out, float* lse,
            cudaStream_t s);
/// Adds dq, dk, dv (null pointers skipped) from the forward's lse and delta = rowsum(dout * out).
int backward(int dtype, int flags, const Geom& g, In q, In k, In v, In dout, const float* lse, const float* delta,
             const Mask& m, Out dq, Out dk, Out dv, cudaStream_t s);
/// Whether forward (backward = false) or backward with dq / dk-or-dv wanted would run here.
bool takes(int dtype, int flags, const Geom& g, bool backward, bool dq, bool dkv);

}  // namespace shard::kernels::attention::tc
