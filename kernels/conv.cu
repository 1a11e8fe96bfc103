// The conv family's helper kernels next to cuDNN (src/kernels_api/conv.hpp): bias add, bias
// gradient (two fixed-order passes in double: bitwise reproducible), zero-padded shifted copy.
// Templated on the storage type (f32, f64, bf16 / f16 bits computed in float, one rounding).
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_api/conv.hpp"

namespace shard::kernels::conv {
namespace {

using namespace cu;
constexpr idx kMaxSplits = 64;  // partial sums per channel in bias_grad

template <class T>
__global__ void bias_add_kernel(idx n, idx channels, idx positions, const T* __restrict__ bias, T* __restrict__ y) {
  using St = Storage<T>;
  SHARD_GRID_STRIDE(i, n) y[i] = St::store(St::load(y[i]) + St::load(bias[(i / positions) % channels]));
}

/// Block (c, s) sums the elements s, s + splits, ... of channel c's (batch x positions) rows in
/// a fixed order: per-thread strided sums, then a shared-memory tree.
template <class T>
__global__ void bias_partial_kernel(idx batch, idx channels, idx positions, idx splits, const T* __restrict__ gy,
                                    double* __restrict__ partial) {
  __shared__ double sh[kThreads];
  const idx c = blockIdx.x, s = blockIdx.y;
  const idx per_split = (positions + splits - 1) / splits;
  const idx lo = s * per_split, hi = lo + per_split < positions ? lo + per_split : positions;
  double acc = 0;
  for (idx n = 0; n < batch; ++n) {
    const T* row = gy + (n * channels + c) * positions;
    for (idx p = lo + threadIdx.x; p < hi; p += kThreads) acc += wide(row[p]);
  }
  sh[threadIdx.x] = acc;
  block_tree(sh);
  if (threadIdx.x == 0) partial[c * splits + s] = sh[0];
}

template <class T>
__global__ void bias_final_kernel(idx channels, idx splits, const double* __restrict__ partial, T* __restrict__ gb) {
  SHARD_GRID_STRIDE(c, channels) {
    double acc = 0;
    for (idx s = 0; s < splits; ++s) acc += partial[c * splits + s];
    gb[c] = narrow<T>(acc);
  }
}

struct Ext {
  idx src[3], dst[3], off[3];
};

template <class T>
__global__ void shift_copy_kernel(idx n, Ext e, const T* __restrict__ src, T* __restrict__ dst) {
  SHARD_GRID_STRIDE(i, n) {
    idx r = i;
    const idx j2 = r % e.dst[2];
    r /= e.dst[2];
    const idx j1 = r % e.dst[1];
    r /= e.dst[1];
    const idx j0 = r % e.dst[0];
    const idx m = r / e.dst[0];
    const idx i0 = j0 + e.off[0], i1 = j1 + e.off[1], i2 = j2 + e.off[2];
    const bool in = i0 >= 0 && i0 < e.src[0] && i1 >= 0 && i1 < e.src[1] && i2 >= 0 && i2 < e.src[2];
    dst[i] = in ? src[((m * e.src[0] + i0) * e.src[1] + i1) * e.src[2] + i2] : T{};
  }
}

idx splits_for(idx batch, idx positions) {
  const idx work = batch * positions;
  idx s = work / (kThreads * 64);
  return s < 1 ? 1 : (s > kMaxSplits ? kMaxSplits : (s > positions ? positions : s));
}

}  // namespace

int bias_add(int dtype, idx batch, idx channels, idx positions, const void* bias, void* y, void* stream) {
  const idx n = batch * channels * positions;
  if (n == 0) return 0;
  return by_storage(dtype, [&](auto t) {
    using T = decltype(t);
    bias_add_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(n, channels, positions,
                                                                        static_cast<const T*>(bias), static_cast<T*>(y));
    return last_error();
  });
}

idx bias_grad_scratch(idx channels) { return channels * kMaxSplits; }

int bias_grad(int dtype, idx batch, idx channels, idx positions, const void* gy, void* gb, double* scratch,
              void* stream) {
  if (channels == 0) return 0;
  if (channels > 0x7fffffff) return invalid();  // gridDim.x limit
  const idx splits = positions == 0 ? 1 : splits_for(batch, positions);
  // Block (c, s) of the partial pass: channels on x (up to 2^31 - 1 blocks), splits (<= 64) on y.
  const dim3 grid(static_cast<unsigned>(channels), static_cast<unsigned>(splits));
  return by_storage(dtype, [&](auto t) {
    using T = decltype(t);
    bias_partial_kernel<T><<<grid, kThreads, 0, as_stream(stream)>>>(batch, channels, positions, splits,
                                                                     static_cast<const T*>(gy), scratch);
    bias_final_kernel<T><<<grid_for(channels), kThreads, 0, as_stream(stream)>>>(channels, splits, scratch,
                                                                                 static_cast<T*>(gb));
    return last_error();
  });
}

int shift_copy(int dtype, idx planes, const idx src_ext[3], const idx dst_ext[3], const idx offset[3], const void* src,
               void* dst, void* stream) {
  Ext e{};
  for (int d = 0; d < 3; ++d) {
    e.src[d] = src_ext[d];
    e.dst[d] = dst_ext[d];
    e.off[d] = offset[d];
  }
  const idx n = planes * dst_ext[0] * dst_ext[1] * dst_ext[2];
  if (n == 0) return 0;
  return by_storage(dtype, [&](auto t) {
    using T = decltype(t);
    shift_copy_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(n, e, static_cast<const T*>(src),
                                                                          static_cast<T*>(dst));
    return last_error();
  });
}

}  // namespace shard::kernels::conv
