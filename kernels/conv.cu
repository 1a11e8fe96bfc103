// The conv family's helper kernels next to cuDNN (src/kernels_api/conv.hpp): bias add, bias
// gradient (two fixed-order passes in double: bitwise reproducible), zero-padded shifted copy.
#include <cuda_runtime.h>

#include "kernels_api/conv.hpp"

namespace shard::kernels::conv {
namespace {

constexpr int kThreads = 256;
constexpr idx kMaxSplits = 64;  // partial sums per channel in bias_grad

#define SHARD_CONV_GRID_LOOP(i, n) \
  for (idx i = blockIdx.x * static_cast<idx>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<idx>(gridDim.x) * blockDim.x)

int grid_for(idx n) {
  const idx b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

template <class T>
__global__ void bias_add_kernel(idx n, idx channels, idx positions, const T* __restrict__ bias, T* __restrict__ y) {
  SHARD_CONV_GRID_LOOP(i, n) y[i] += bias[(i / positions) % channels];
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
    for (idx p = lo + threadIdx.x; p < hi; p += kThreads) acc += static_cast<double>(row[p]);
  }
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[c * splits + s] = sh[0];
}

template <class T>
__global__ void bias_final_kernel(idx channels, idx splits, const double* __restrict__ partial, T* __restrict__ gb) {
  SHARD_CONV_GRID_LOOP(c, channels) {
    double acc = 0;
    for (idx s = 0; s < splits; ++s) acc += partial[c * splits + s];
    gb[c] = static_cast<T>(acc);
  }
}

struct Ext {
  idx src[3], dst[3], off[3];
};

template <class T>
__global__ void shift_copy_kernel(idx n, Ext e, const T* __restrict__ src, T* __restrict__ dst) {
  SHARD_CONV_GRID_LOOP(i, n) {
    idx r = i;
    const idx j2 = r % e.dst[2];
    r /= e.dst[2];
    const idx j1 = r % e.dst[1];
    r /= e.dst[1];
    const idx j0 = r % e.dst[0];
    const idx m = r / e.dst[0];
    const idx i0 = j0 + e.off[0], i1 = j1 + e.off[1], i2 = j2 + e.off[2];
    const bool in = i0 >= 0 && i0 < e.src[0] && i1 >= 0 && i1 < e.src[1] && i2 >= 0 && i2 < e.src[2];
    dst[i] = in ? src[((m * e.src[0] + i0) * e.src[1] + i1) * e.src[2] + i2] : T(0);
  }
}

idx splits_for(idx batch, idx positions) {
  const idx work = batch * positions;
  idx s = work / (kThreads * 64);
  return s < 1 ? 1 : (s > kMaxSplits ? kMaxSplits : (s > positions ? positions : s));
}

}  // namespace

int bias_add(int is_f64, idx batch, idx channels, idx positions, const void* bias, void* y, void* stream) {
  const idx n = batch * channels * positions;
  if (n == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  if (is_f64)
    bias_add_kernel<double><<<grid_for(n), kThreads, 0, st>>>(n, channels, positions, static_cast<const double*>(bias),
                                                              static_cast<double*>(y));
  else
    bias_add_kernel<float><<<grid_for(n), kThreads, 0, st>>>(n, channels, positions, static_cast<const float*>(bias),
                                                             static_cast<float*>(y));
  return static_cast<int>(cudaGetLastError());
}

idx bias_grad_scratch(idx channels) { return channels * kMaxSplits; }

int bias_grad(int is_f64, idx batch, idx channels, idx positions, const void* gy, void* gb, double* scratch,
              void* stream) {
  if (channels == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  const idx splits = positions == 0 ? 1 : splits_for(batch, positions);
  const dim3 grid(static_cast<unsigned>(channels), static_cast<unsigned>(splits));
  if (is_f64) {
    bias_partial_kernel<double><<<grid, kThreads, 0, st>>>(batch, channels, positions, splits,
                                                           static_cast<const double*>(gy), scratch);
    bias_final_kernel<double><<<grid_for(channels), kThreads, 0, st>>>(channels, splits, scratch,
                                                                       static_cast<double*>(gb));
  } else {
    bias_partial_kernel<float><<<grid, kThreads, 0, st>>>(batch, channels, positions, splits,
                                                          static_cast<const float*>(gy), scratch);
    bias_final_kernel<float><<<grid_for(channels), kThreads, 0, st>>>(channels, splits, scratch,
                                                                      static_cast<float*>(gb));
  }
  return static_cast<int>(cudaGetLastError());
}

int shift_copy(int is_f64, idx planes, const idx src_ext[3], const idx dst_ext[3], const idx offset[3], const void* src,
               void* dst, void* stream) {
  Ext e{};
  for (int d = 0; d < 3; ++d) {
    e.src[d] = src_ext[d];
    e.dst[d] = dst_ext[d];
    e.off[d] = offset[d];
  }
  const idx n = planes * dst_ext[0] * dst_ext[1] * dst_ext[2];
  if (n == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  if (is_f64)
    shift_copy_kernel<double><<<grid_for(n), kThreads, 0, st>>>(n, e, static_cast<const double*>(src),
                                                                static_cast<double*>(dst));
  else
    shift_copy_kernel<float><<<grid_for(n), kThreads, 0, st>>>(n, e, static_cast<const float*>(src),
                                                               static_cast<float*>(dst));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace shard::kernels::conv
