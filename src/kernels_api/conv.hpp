#pragma once
// Kernel firewall for kernels/conv.cu: the conv family's helper kernels next to cuDNN (bias add,
// bias gradient, the zero-padded shifted copy that turns asymmetric padding into cuDNN's
// symmetric one). Plain C++17; launchers are asynchronous on `stream` (a cudaStream_t) and
// return a cudaError_t as int (0 = success).
#include <cstdint>

namespace shard::kernels::conv {

using idx = std::int64_t;

/// y[n, c, p] += bias[c] for y of [batch, channels, positions]. dtype (every launcher): 0 f32,
/// 1 f64, 2 bf16, 3 f16 (bf16 / f16 computed in float, each result rounded once).
int bias_add(int dtype, idx batch, idx channels, idx positions, const void* bias, void* y, void* stream);

/// Doubles of scratch bias_grad needs for `channels` channels (device memory, passed in).
idx bias_grad_scratch(idx channels);
/// gb[c] = sum over n, p of gy[n, c, p] (overwritten), accumulated in double in a fixed order
/// (bitwise reproducible). `scratch` holds bias_grad_scratch(channels) doubles on the device.
int bias_grad(int dtype, idx batch, idx channels, idx positions, const void* gy, void* gb, double* scratch,
              void* stream);

/// dst[m, j] = src[m, j + offset] where 0 <= j + offset < src_ext (per spatial dim), else 0, for
/// m in [0, planes) and j over the 3-D extent dst_ext (src: [planes, src_ext], dst: [planes,
/// dst_ext], contiguous). Pads (offset = -pad_lo) or crops (offset = +pad_lo) a conv operand.
int shift_copy(int dtype, idx planes, const idx src_ext[3], const idx dst_ext[3], const idx offset[3], const void* src,
               void* dst, void* stream);

}  // namespace shard::kernels::conv
