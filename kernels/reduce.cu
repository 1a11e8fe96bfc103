// CUDA kernels of the reduce family (launchers: src/kernels_api/reduce.hpp). Deterministic:
// every sum is a per-thread strided sum followed by a fixed shared-memory tree, and multi-block
// sums finish in a fixed-order final pass; no floating-point atomics. Sums accumulate in double.
#include <cuda_runtime.h>

#include <cmath>

#include "common.cuh"
#include "kernels_api/reduce.hpp"

namespace shard::kernels {
namespace {

using idx = rd_idx;
using namespace cu;
constexpr int kMaxRank = 8;
constexpr idx kMaxGlobalBlocks = 1024;
constexpr idx kMaxRowChunks = 64;


/// A tensor x and its keepdim reduction k: kept dims (enumerated by k's linear index) and
/// reduced dims, with x's contiguous strides; kstride maps an x index to k's offset.
struct Dims {
  int nk, nr, rank;
  idx kshape[kMaxRank], kx[kMaxRank];
  idx rshape[kMaxRank], rx[kMaxRank];
  idx xshape[kMaxRank], kstride[kMaxRank];
  idx npos, nred, n;
};
Dims make_dims(int rank, const idx* xs, const idx* ks) {
  Dims d{};
  d.rank = rank;
  idx xst[kMaxRank], kst[kMaxRank];
  idx ax = 1, ak = 1;
  for (int k = rank - 1; k >= 0; --k) {
    xst[k] = ax;
    kst[k] = ak;
    ax *= xs[k];
    ak *= ks[k];
  }
  d.npos = ak;
  d.n = ax;
  d.nred = 1;
  for (int k = 0; k < rank; ++k) {
    d.xshape[k] = xs[k];
    const bool red = ks[k] == 1 && xs[k] != 1;
    d.kstride[k] = red ? 0 : kst[k];
    if (red) {
      d.rshape[d.nr] = xs[k];
      d.rx[d.nr] = xst[k];
      ++d.nr;
      d.nred *= xs[k];
    } else {
      d.kshape[d.nk] = xs[k];
      d.kx[d.nk] = xst[k];
      ++d.nk;
    }
  }
  return d;
}
__device__ __forceinline__ idx kept_x_offset(const Dims& d, idx pos) {
  idx off = 0;
  for (int k = d.nk - 1; k >= 0; --k) {
    off += (pos % d.kshape[k]) * d.kx[k];
    pos /= d.kshape[k];
  }
  return off;
}
__device__ __forceinline__ idx red_x_offset(const Dims& d, idx r) {
  idx off = 0;
  for (int k = d.nr - 1; k >= 0; --k) {
    off += (r % d.rshape[k]) * d.rx[k];
    r /= d.rshape[k];
  }
  return off;
}
__device__ __forceinline__ idx k_offset(const Dims& d, idx lin) {
  idx off = 0;
  for (int k = d.rank - 1; k >= 0; --k) {
    off += (lin % d.xshape[k]) * d.kstride[k];
    lin /= d.xshape[k];
  }
  return off;
}

/// Reduction operators over the reduced dims of one kept position.
template <class T> struct SumOp {
  using Acc = double;
  const T* x;
  __device__ Acc init() const { return 0.0; }
  __device__ Acc load(idx off, idx) const { return static_cast<double>(x[off]); }
  __device__ Acc join(Acc a, Acc b) const { return a + b; }
};
template <class T> struct MaxOp {
  using Acc = T;
  const T* x;
  __device__ Acc init() const { return -INFINITY; }
  __device__ Acc load(idx off, idx) const { return x[off]; }
  __device__ Acc join(Acc a, Acc b) const { return a < b ? b : a; }
};
template <class T> struct TieOp {
  using Acc = double;
  const T* x;
  const T* m;
  __device__ Acc init() const { return 0.0; }
  __device__ Acc load(idx off, idx pos) const { return x[off] == m[pos] ? 1.0 : 0.0; }
  __device__ Acc join(Acc a, Acc b) const { return a + b; }
};

template <class Op, class Store>
__global__ void reduce_thread_kernel(Dims d, Op op, Store st) {
  SHARD_GRID_STRIDE(pos, d.npos) {
    const idx base = kept_x_offset(d, pos);
    auto acc = op.init();
    for (idx r = 0; r < d.nred; ++r) acc = op.join(acc, op.load(base + red_x_offset(d, r), pos));
    st(pos, acc);
  }
}
template <class Op, class Store>
__global__ void reduce_block_kernel(Dims d, Op op, Store st) {
  using Acc = typename Op::Acc;
  __shared__ Acc buf[kThreads];
  for (idx pos = blockIdx.x; pos < d.npos; pos += gridDim.x) {
    const idx base = kept_x_offset(d, pos);
    Acc acc = op.init();
    for (idx r = threadIdx.x; r < d.nred; r += blockDim.x) acc = op.join(acc, op.load(base + red_x_offset(d, r), pos));
    buf[threadIdx.x] = acc;
    block_tree(buf, [&](Acc a, Acc b) { return op.join(a, b); });
    if (threadIdx.x == 0) st(pos, buf[0]);
    __syncthreads();
  }
}
template <class Op, class Store> int run_reduce(const Dims& d, Op op, Store st, void* stream) {
  if (d.npos <= 0) return 0;
  if (d.nred <= 32)
    reduce_thread_kernel<<<grid_for(d.npos), kThreads, 0, as_stream(stream)>>>(d, op, st);
  else
    reduce_block_kernel<<<blocks_per_item(d.npos), kThreads, 0, as_stream(stream)>>>(d, op, st);
  return last_error();
}

template <class T> struct StoreScaled {
  T* out;
  double scale;
  __device__ void operator()(idx pos, double v) const { out[pos] = static_cast<T>(v * scale); }
};
template <class T> struct StoreT {
  T* out;
  __device__ void operator()(idx pos, T v) const { out[pos] = v; }
};
struct StoreD {
  double* out;
  __device__ void operator()(idx pos, double v) const { out[pos] = v; }
};

template <class T> __global__ void broadcast_scaled_kernel(Dims d, const T* __restrict__ g, T* __restrict__ gx, T f) {
  SHARD_GRID_STRIDE(i, d.n) gx[i] = g[k_offset(d, i)] * f;
}
template <class T>
__global__ void max_backward_kernel(Dims d, const T* __restrict__ x, const T* __restrict__ m, const T* __restrict__ g,
                                    const double* __restrict__ ties, T* __restrict__ gx) {
  SHARD_GRID_STRIDE(i, d.n) {
    const idx j = k_offset(d, i);
    gx[i] = x[i] == m[j] ? static_cast<T>(g[j] / ties[j]) : T(0);
  }
}

template <class T> __device__ __forceinline__ double term(int kind, const T* a, const T* b, idx i) {
  if (kind == 0) return static_cast<double>(a[i]);
  if (kind == 1) return static_cast<double>(a[i]) * static_cast<double>(b[i]);
  const double dd = static_cast<double>(a[i]) - static_cast<double>(b[i]);
  return dd * dd;
}
template <class T>
__global__ void global_partial_kernel(int kind, idx n, const T* __restrict__ a, const T* __restrict__ b,
                                      double* __restrict__ part) {
  __shared__ double buf[kThreads];
  double s = 0;
  SHARD_GRID_STRIDE(i, n) s += term(kind, a, b, i);
  buf[threadIdx.x] = s;
  block_tree(buf);
  if (threadIdx.x == 0) part[blockIdx.x] = buf[0];
}
__global__ void final_sum_kernel(idx parts, const double* __restrict__ part, double* __restrict__ out) {
  __shared__ double buf[kThreads];
  double s = 0;
  for (idx i = threadIdx.x; i < parts; i += blockDim.x) s += part[i];
  buf[threadIdx.x] = s;
  block_tree(buf);
  if (threadIdx.x == 0) *out = buf[0];
}

/// The final pass of global_sum_into: out[0] = T(scale * sum of the block partials), in the same
/// fixed order as final_sum_kernel.
template <class T>
__global__ void final_store_kernel(idx parts, const double* __restrict__ part, double scale, T* __restrict__ out) {
  __shared__ double buf[kThreads];
  double s = 0;
  for (idx i = threadIdx.x; i < parts; i += blockDim.x) s += part[i];
  buf[threadIdx.x] = s;
  block_tree(buf);
  if (threadIdx.x == 0) *out = static_cast<T>(__dmul_rn(buf[0], scale));
}

/// gp = c (p - t), gt = -gp; c = T(scale * g[0]) read here when g is set (the upstream gradient
/// stays on the device), else the host's c.
template <class T>
__global__ void mse_backward_kernel(idx n, T c, double scale, const T* __restrict__ g, const T* p, const T* t, T* gp,
                                    T* gt) {
  if (g) c = static_cast<T>(__dmul_rn(scale, static_cast<double>(*g)));
  SHARD_GRID_STRIDE(i, n) {
    const T v = c * (p[i] - t[i]);
    gp[i] = v;
    if (gt) gt[i] = -v;
  }
}

idx row_chunks(idx inner) {
  const idx c = (inner + kThreads - 1) / kThreads;
  return c < 1 ? 1 : (c > kMaxRowChunks ? kMaxRowChunks : c);
}
template <class T>
__global__ void rel_l2_partial_kernel(idx samples, idx inner, idx chunks, const T* __restrict__ p,
                                      const T* __restrict__ t, double* __restrict__ part) {
  __shared__ double ba[kThreads], bb[kThreads];
  for (idx s = blockIdx.y; s < samples; s += gridDim.y) {
    double a = 0, b = 0;
    const T* pp = p + s * inner;
    const T* pt = t + s * inner;
    for (idx i = blockIdx.x * static_cast<idx>(kThreads) + threadIdx.x; i < inner; i += chunks * kThreads) {
      const double d = static_cast<double>(pp[i]) - static_cast<double>(pt[i]);
      a += d * d;
      b += static_cast<double>(pt[i]) * static_cast<double>(pt[i]);
    }
    a = block_sum(a, ba);
    b = block_sum(b, bb);
    if (threadIdx.x == 0) {
      part[2 * (s * chunks + blockIdx.x)] = a;
      part[2 * (s * chunks + blockIdx.x) + 1] = b;
    }
  }
}
__global__ void rel_l2_final_kernel(idx samples, idx chunks, const double* __restrict__ part, double* __restrict__ out) {
  SHARD_GRID_STRIDE(s, samples) {
    double a = 0, b = 0;
    for (idx c = 0; c < chunks; ++c) {
      a += part[2 * (s * chunks + c)];
      b += part[2 * (s * chunks + c) + 1];
    }
    out[2 * s] = a;
    out[2 * s + 1] = b;
  }
}
template <class T>
__global__ void rel_l2_backward_kernel(idx n, idx inner, const T* p, const T* t, const double* coef, T* gp, T* gt) {
  SHARD_GRID_STRIDE(i, n) {
    const idx s = i / inner;
    const double cp = coef[2 * s], ct = coef[2 * s + 1];
    const double d = static_cast<double>(p[i]) - static_cast<double>(t[i]);
    gp[i] = static_cast<T>(cp * d);
    gt[i] = static_cast<T>(-cp * d - ct * static_cast<double>(t[i]));
  }
}

/// One thread: the samples' ratios added in order, as the host loop does.
template <class T>
__global__ void rel_l2_value_kernel(idx samples, idx global, const double* __restrict__ sums,
                                    const double* __restrict__ check, idx P, T* __restrict__ out) {
  double loss = 0;
  for (idx s = 0; s < samples; ++s)
    loss = __dadd_rn(loss, __ddiv_rn(__dsqrt_rn(sums[2 * s]), __dsqrt_rn(sums[2 * s + 1])));
  loss = stats_check_failed(check, P) ? __longlong_as_double(0x7ff8000000000000LL)
                                 : __ddiv_rn(loss, static_cast<double>(global));
  *out = static_cast<T>(loss);
}
template <class T>
__global__ void rel_l2_coef_kernel(idx samples, idx global, const double* __restrict__ sums,
                                   const double* __restrict__ check, idx P, const T* __restrict__ g,
                                   double* __restrict__ coef) {
  const double gv = __ddiv_rn(static_cast<double>(*g), static_cast<double>(global));
  const bool bad = stats_check_failed(check, P);
  const double nan = __longlong_as_double(0x7ff8000000000000LL);
  SHARD_GRID_STRIDE(s, samples) {
    const double a = __dsqrt_rn(sums[2 * s]), b = __dsqrt_rn(sums[2 * s + 1]);
    coef[2 * s] = bad ? nan : a > 0 ? __ddiv_rn(gv, __dmul_rn(a, b)) : 0.0;
    coef[2 * s + 1] = bad ? nan : __ddiv_rn(__dmul_rn(gv, a), __dmul_rn(__dmul_rn(b, b), b));
  }
}

int copy_to_host(double* host, const double* dev, idx count, void* stream) {
  cudaError_t e = cudaMemcpyAsync(host, dev, static_cast<size_t>(count) * sizeof(double), cudaMemcpyDeviceToHost,
                                  as_stream(stream));
  if (e != cudaSuccess) return static_cast<int>(e);
  return static_cast<int>(cudaStreamSynchronize(as_stream(stream)));
}

}  // namespace

int rd_reduce_dims(int is_f64, int kind, int rank, const idx* x_shape, const idx* k_shape, const void* x, void* out,
                   double scale, void* stream) {
  if (rank < 0 || rank > kMaxRank) return invalid();
  const Dims d = make_dims(rank, x_shape, k_shape);
  return by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    if (kind == 0) return run_reduce(d, SumOp<T>{static_cast<const T*>(x)}, StoreScaled<T>{static_cast<T*>(out), scale},
                                     stream);
    return run_reduce(d, MaxOp<T>{static_cast<const T*>(x)}, StoreT<T>{static_cast<T*>(out)}, stream);
  });
}

int rd_broadcast_scaled(int is_f64, int rank, const idx* x_shape, const idx* k_shape, const void* g, void* gx,
                        double scale, void* stream) {
  if (rank < 0 || rank > kMaxRank) return invalid();
  const Dims d = make_dims(rank, x_shape, k_shape);
  if (d.n <= 0) return 0;
  return by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    broadcast_scaled_kernel<T><<<grid_for(d.n), kThreads, 0, as_stream(stream)>>>(
        d, static_cast<const T*>(g), static_cast<T*>(gx), static_cast<T>(scale));
    return last_error();
  });
}

int rd_max_ties(int is_f64, int rank, const idx* x_shape, const idx* k_shape, const void* x, const void* m,
                double* ties, void* stream) {
  if (rank < 0 || rank > kMaxRank) return invalid();
  const Dims d = make_dims(rank, x_shape, k_shape);
  return by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    return run_reduce(d, TieOp<T>{static_cast<const T*>(x), static_cast<const T*>(m)}, StoreD{ties}, stream);
  });
}

int rd_max_backward(int is_f64, int rank, const idx* x_shape, const idx* k_shape, const void* x, const void* m,
                    const void* g, const double* ties, void* gx, void* stream) {
  if (rank < 0 || rank > kMaxRank) return invalid();
  const Dims d = make_dims(rank, x_shape, k_shape);
  if (d.n <= 0) return 0;
  return by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    max_backward_kernel<T><<<grid_for(d.n), kThreads, 0, as_stream(stream)>>>(
        d, static_cast<const T*>(x), static_cast<const T*>(m), static_cast<const T*>(g), ties, static_cast<T*>(gx));
    return last_error();
  });
}

idx rd_global_sum_workspace(idx) { return kMaxGlobalBlocks + 1; }

int rd_global_sum(int is_f64, int kind, idx n, const void* a, const void* b, double* ws, double* host_out,
                  void* stream) {
  *host_out = 0;
  if (n <= 0) return 0;
  idx blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxGlobalBlocks) blocks = kMaxGlobalBlocks;
  const int rc = by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    global_partial_kernel<T><<<static_cast<int>(blocks), kThreads, 0, as_stream(stream)>>>(
        kind, n, static_cast<const T*>(a), static_cast<const T*>(b), ws);
    return last_error();
  });
  if (rc) return rc;
  final_sum_kernel<<<1, kThreads, 0, as_stream(stream)>>>(blocks, ws, ws + kMaxGlobalBlocks);
  if (const int e = last_error()) return e;
  return copy_to_host(host_out, ws + kMaxGlobalBlocks, 1, stream);
}

int rd_global_sum_into(int is_f64, int kind, idx n, const void* a, const void* b, double* ws, double scale, void* out,
                       void* stream) {
  idx blocks = n > 0 ? (n + kThreads - 1) / kThreads : 0;
  if (blocks > kMaxGlobalBlocks) blocks = kMaxGlobalBlocks;
  return by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    if (blocks > 0) {
      global_partial_kernel<T><<<static_cast<int>(blocks), kThreads, 0, as_stream(stream)>>>(
          kind, n, static_cast<const T*>(a), static_cast<const T*>(b), ws);
      if (const int e = last_error()) return e;
    }
    // blocks = 0 (n = 0): the final pass sums no partials and stores T(0 * scale).
    final_store_kernel<T><<<1, kThreads, 0, as_stream(stream)>>>(blocks, ws, scale, static_cast<T*>(out));
    return last_error();
  });
}

int rd_mse_backward(int is_f64, idx n, double scale, const void* g, const void* p, const void* t, void* gp, void* gt,
                    void* stream) {
  if (n <= 0) return 0;
  return by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    mse_backward_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
        n, static_cast<T>(scale), scale, static_cast<const T*>(g), static_cast<const T*>(p), static_cast<const T*>(t),
        static_cast<T*>(gp), static_cast<T*>(gt));
    return last_error();
  });
}

idx rd_rel_l2_workspace(idx samples, idx inner) { return 2 * samples * row_chunks(inner) + 2 * samples; }

int rd_rel_l2_sums(int is_f64, idx samples, idx inner, const void* p, const void* t, double* ws, double* sums,
                   void* stream) {
  if (samples <= 0) return 0;
  const idx chunks = row_chunks(inner);
  double* out = sums;
  const dim3 grid(static_cast<unsigned>(chunks), blocks_per_item(samples));
  const int rc = by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    rel_l2_partial_kernel<T><<<grid, kThreads, 0, as_stream(stream)>>>(samples, inner, chunks,
                                                                        static_cast<const T*>(p),
                                                                        static_cast<const T*>(t), ws);
    return last_error();
  });
  if (rc) return rc;
  rel_l2_final_kernel<<<grid_for(samples), kThreads, 0, as_stream(stream)>>>(samples, chunks, ws, out);
  return last_error();
}

int rd_rel_l2_value(int is_f64, idx samples, idx global, const double* sums, const double* check, idx P, void* out,
                    void* stream) {
  return by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    rel_l2_value_kernel<T><<<1, 1, 0, as_stream(stream)>>>(samples, global, sums, check, P, static_cast<T*>(out));
    return last_error();
  });
}

int rd_rel_l2_coefficients(int is_f64, idx samples, idx global, const double* sums, const double* check, idx P,
                           const void* g, double* coef, void* stream) {
  if (samples <= 0) return 0;
  return by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    rel_l2_coef_kernel<T><<<grid_for(samples), kThreads, 0, as_stream(stream)>>>(samples, global, sums, check, P,
                                                                                static_cast<const T*>(g), coef);
    return last_error();
  });
}

int rd_rel_l2_backward(int is_f64, idx samples, idx inner, const void* p, const void* t, const double* coef, void* gp,
                       void* gt, void* stream) {
  const idx n = samples * inner;
  if (n <= 0) return 0;
  return by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    rel_l2_backward_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
        n, inner, static_cast<const T*>(p), static_cast<const T*>(t), coef, static_cast<T*>(gp), static_cast<T*>(gt));
    return last_error();
  });
}

}  // namespace shard::kernels
