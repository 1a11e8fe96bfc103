#pragma once
// Launch helpers shared by every kernels/*.cu (nvcc only; never included by a public header):
// the launch geometry (threads per block, grid size with one cap), the grid-stride loop, the
// stream cast, error codes, dtype dispatch over (float, double) and raw element widths, and the
// fixed-order shared-memory tree sum that keeps block reductions deterministic (no atomics).
//
// Launchers in kernels/*.cu return a cudaError_t as int (0 on success) and do not synchronise
// (the host glue in src/cuda/*_cuda.cpp decides when a stream must be waited for), except
// elementwise.cu's Tensor entry points, which are synchronous by contract, and the reductions
// that return a value to the host.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels_api/convert_ops.hpp"

namespace shard::kernels::cu {

using gidx = std::int64_t;  ///< every kernels_api index type is std::int64_t

/// Threads per block of the one-thread-per-element kernels (a multiple of the warp size).
constexpr int kThreads = 256;
/// Most blocks a 1-D grid gets. The kernels are grid-stride loops, so any cap is correct; 65535
/// blocks of 256 threads is ~60x the threads an H100 keeps resident, so a larger grid buys
/// nothing, and 65535 is also the limit of gridDim.y / gridDim.z.
constexpr gidx kMaxBlocks = 65535;

/// Blocks for n elements at `threads` per block: at least 1, at most `cap`.
inline unsigned grid_for(gidx n, int threads = kThreads, gidx cap = kMaxBlocks) {
  const gidx b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}
/// Blocks for one block per item (statistic, channel, position) with a grid-stride loop over
/// items: at least 1, at most `cap`.
inline unsigned blocks_per_item(gidx items, gidx cap = kMaxBlocks) {
  return static_cast<unsigned>(items < 1 ? 1 : (items > cap ? cap : items));
}

/// The launchers' opaque stream handle (0 / nullptr: the legacy default stream).
inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
/// The last launch error as the launchers' int code (0: success); clears it.
inline int last_error() { return static_cast<int>(cudaGetLastError()); }
/// The launchers' code for a bad argument (rank too large, unknown dtype or op).
inline int invalid() { return static_cast<int>(cudaErrorInvalidValue); }

/// Calls f(double{}) or f(float{}) and returns its result (the fp64 / fp32 kernel families).
template <class F>
inline int by_float_type(int is_f64, F&& f) {
  if (is_f64) return f(double{});
  return f(float{});
}

/// bf16 / f16 elements held as their bits in device memory; kernels templated on the storage
/// type compute them in float (Storage<S>).
struct Bf16Bits {
  std::uint16_t bits;
};
struct F16Bits {
  std::uint16_t bits;
};
/// A storage type S and its compute type C: load widens (exactly), store rounds once to nearest
/// even (the roundings of kernels_api/convert_ops.hpp, bit for bit those of the CPU's convert).
/// float and double are their own compute types.
template <class S>
struct Storage {
  using C = S;
  static __device__ __forceinline__ C load(S v) { return v; }
  static __device__ __forceinline__ S store(C v) { return v; }
};
template <>
struct Storage<Bf16Bits> {
  using C = float;
  static __device__ __forceinline__ float load(Bf16Bits v) { return cvt::bf16_to_f32(v.bits); }
  static __device__ __forceinline__ Bf16Bits store(float v) { return {cvt::bf16_bits(v)}; }
};
template <>
struct Storage<F16Bits> {
  using C = float;
  static __device__ __forceinline__ float load(F16Bits v) { return cvt::f16_to_f32(v.bits); }
  static __device__ __forceinline__ F16Bits store(float v) { return {cvt::f16_bits(v)}; }
};
/// A stored element as double (exact for every storage type).
template <class S>
__device__ __forceinline__ double wide(S v) {
  return static_cast<double>(Storage<S>::load(v));
}
/// A double result stored as S through S's compute type: double -> float -> bf16 / f16, the two
/// roundings of the f32 working-copy route (a plain cast for float and double).
template <class S>
__device__ __forceinline__ S narrow(double v) {
  return Storage<S>::store(static_cast<typename Storage<S>::C>(v));
}
/// Calls f(S{}) for a storage dtype code (0 f32, 1 f64, 2 bf16, 3 f16) and returns its result;
/// invalid() for another code.
template <class F>
inline int by_storage(int code, F&& f) {
  switch (code) {
    case 0: return f(float{});
    case 1: return f(double{});
    case 2: return f(Bf16Bits{});
    case 3: return f(F16Bits{});
    default: return invalid();
  }
}

/// A trivially-copyable element of N raw bytes with the element's own alignment (at most 8):
/// copies and fills move bytes, whatever the dtype (complex included).
template <int N>
struct alignas(N < 8 ? N : 8) Bytes {
  unsigned char b[N];
};
/// Calls f(Bytes<w>{}) for an element width of 1, 2, 4, 8 or 16 bytes; invalid() otherwise.
template <class F>
inline int by_width(int bytes, F&& f) {
  switch (bytes) {
    case 1: return f(Bytes<1>{});
    case 2: return f(Bytes<2>{});
    case 4: return f(Bytes<4>{});
    case 8: return f(Bytes<8>{});
    case 16: return f(Bytes<16>{});
    default: return invalid();
  }
}

/// Calls f(std::integral_constant<int, K>{}) for the K == op in [0, Count); invalid() when op is
/// out of range, else f's launch error.
template <class F, int... K>
inline void by_op_impl(int op, F& f, std::integer_sequence<int, K...>) {
  ((op == K ? (f(std::integral_constant<int, K>{}), 0) : 0), ...);
}
template <int Count, class F>
inline int by_op(int op, F&& f) {
  if (op < 0 || op >= Count) return invalid();
  by_op_impl(op, f, std::make_integer_sequence<int, Count>{});
  return last_error();
}

/// Fixed-order tree reduction over the block of buf[0 .. blockDim.x) (blockDim.x a power of
/// two), each thread having written its own slot; buf[0] holds the total after it. `join` is the
/// reduction (a + b by default). Starts and ends with a __syncthreads(), so buf can be reused.
template <class T, class Join>
__device__ __forceinline__ void block_tree(T* buf, Join join) {
  __syncthreads();
  for (int w = static_cast<int>(blockDim.x) / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) buf[threadIdx.x] = join(buf[threadIdx.x], buf[threadIdx.x + w]);
    __syncthreads();
  }
}
template <class T>
__device__ __forceinline__ void block_tree(T* buf) {
  block_tree(buf, [](T a, T b) { return a + b; });
}
/// Block sum of each thread's v (fixed order): every thread gets the total. `buf` is shared
/// memory of blockDim.x elements.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* buf) {
  buf[threadIdx.x] = v;
  block_tree(buf);
  const T total = buf[0];
  __syncthreads();
  return total;
}

/// The statistics allreduce's cheap check (nn/functional/common.hpp, allreduce_sum_on_device):
/// `check` holds the sums over P ranks of h and h^2 (integers below 2^53); the ranks disagreed
/// when P * S2 != S1^2. Compared exactly as double-double products (hi = rn(x y), lo = fma(x, y,
/// -hi) is x y - hi exactly, so equal pairs mean equal products): doubles and fma only. (The
/// simulator lacks mul.hi.u64, and a 64-bit-integer version from 32-bit limbs missed a mismatch
/// there, cause not found.) Null: no check.
__device__ __forceinline__ bool stats_check_failed(const double* check, long long P) {
  if (!check) return false;
  const double s1 = check[0], s2 = check[1], p = static_cast<double>(P);
  const double h1 = __dmul_rn(s1, s1), l1 = __fma_rn(s1, s1, -h1);
  const double h2 = __dmul_rn(p, s2), l2 = __fma_rn(p, s2, -h2);
  return h1 != h2 || l1 != l2;
}

/// Runs `body(scratch)` with `bytes` of stream-ordered device scratch (cudaMallocAsync; a plain
/// cudaMalloc where stream-ordered pools are unsupported), then synchronises `st` and frees it
/// (queued before the synchronisation when pooled, after it otherwise). `body` queues work on `st`
/// and returns a launcher code; the result is body's code, else the synchronisation's.
template <class Body>
int with_stream_scratch(std::size_t bytes, cudaStream_t st, Body&& body) {
  void* ws = nullptr;
  bool pooled = true;
  cudaError_t e = cudaMallocAsync(&ws, bytes, st);
  if (e != cudaSuccess) {
    cudaGetLastError();
    pooled = false;
    e = cudaMalloc(&ws, bytes);
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  const int rc = body(ws);
  if (pooled) cudaFreeAsync(ws, st);
  const int rs = static_cast<int>(cudaStreamSynchronize(st));
  if (!pooled) cudaFree(ws);
  return rc ? rc : rs;
}

}  // namespace shard::kernels::cu

/// Grid-stride loop over i in [0, n) (i of type shard::kernels::cu::gidx).
#define SHARD_GRID_STRIDE(i, n)                                                                          \
  for (::shard::kernels::cu::gidx i = blockIdx.x * static_cast<::shard::kernels::cu::gidx>(blockDim.x) + \
                                      threadIdx.x;                                                       \
       i < (n); i += static_cast<::shard::kernels::cu::gidx>(gridDim.x) * blockDim.x)
