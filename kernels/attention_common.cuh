#pragma once
// Device helpers shared by the attention kernel sets (kernels/attention.cu: row and tiled kernels;
// kernels/attention_tc.cu: the tensor-core kernels): storage <-> accumulation conversion, the
// mask (bias, causal end), operand rows, and the per-device dynamic shared-memory opt-in.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "kernels_api/attention.hpp"

namespace shard::kernels::attention::detail {

__device__ inline float to_acc(float x) { return x; }
__device__ inline double to_acc(double x) { return x; }
__device__ inline float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_acc(__half x) { return __half2float(x); }
template <class T>
__device__ inline T from_acc(float x);
template <>
__device__ inline float from_acc<float>(float x) { return x; }
template <>
__device__ inline __nv_bfloat16 from_acc<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ inline __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <class T>
__device__ inline T from_acc(double x) { return static_cast<T>(x); }

__device__ inline float exp_acc(float x) { return expf(x); }
__device__ inline double exp_acc(double x) { return exp(x); }
__device__ inline float log_acc(float x) { return logf(x); }
__device__ inline double log_acc(double x) { return log(x); }
template <class A>
__device__ inline A neg_inf() { return -static_cast<A>(INFINITY); }

template <class T, class A>
__device__ inline A bias_at(const Mask& m, idx b, idx h, idx i, idx j) {
  return m.bias ? to_acc(static_cast<const T*>(m.bias)[b * m.bias_sb + h * m.bias_sh + i * m.bias_sq + j * m.bias_sk])
                : A(0);
}

/// Exclusive end of the keys visible to any query in [0, rows_end).
__device__ inline idx key_end(const Geom& g, const Mask& m, idx rows_end) {
  if (!m.causal) return g.Nk;
  const idx e = m.q_pos0 + rows_end - m.k_pos0;
  return e < 0 ? 0 : (e > g.Nk ? g.Nk : e);
}

/// Operand x's rows for (batch b, head h).
template <class T>
__device__ inline const T* head_rows(In x, idx b, idx h) {
  return static_cast<const T*>(x.p) + b * x.sb + h * x.sh;
}

/// Launchers: kDeclined when a kernel set does not take a call (nothing enqueued), else the
/// launch's error code.
constexpr int kDeclined = -1;

/// Whether `kernel` may use `bytes` of dynamic shared memory (above the 48 KiB default) on the
/// current device: the attribute is set once per device. A device whose opt-in limit is lower
/// (sm_86 / sm_89: 99 KiB, against 137 KiB for dK / dV at DM 128) refuses it; the (non-sticky)
/// error is cleared and the caller runs another kernel set instead. The answer is kept per device
/// (state[0]: granted, state[1]: refused; devices 0..31).
template <class K>
inline bool smem_granted(K kernel, std::size_t bytes, unsigned (&state)[2]) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const unsigned bit = dev < 32 ? 1u << dev : 0u;
  if (bit && (__atomic_load_n(&state[0], __ATOMIC_ACQUIRE) & bit)) return true;
  if (bit && (__atomic_load_n(&state[1], __ATOMIC_ACQUIRE) & bit)) return false;
  const bool ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)) == cudaSuccess;
  if (!ok) cudaGetLastError();
  if (bit) __atomic_fetch_or(&state[ok ? 0 : 1], bit, __ATOMIC_RELEASE);
  return ok;
}

}  // namespace shard::kernels::attention::detail
