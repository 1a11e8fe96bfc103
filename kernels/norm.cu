// Norm kernel family on CUDA (f32, f64, and bf16 / f16 storage): per-statistic sums, apply,
// backward sums and dx for batch / group / layer normalisation of a contiguous [A, C, S] block
// (see src/kernels_api/norm.hpp). Every sum accumulates in double; one block per statistic (or
// per channel) reduces with a fixed-order shared-memory tree, so results are deterministic. The
// kernels are templated on the storage type: elements are widened to double as they are read
// (wide) and results rounded through the storage's compute type as they are written (narrow):
// double -> float -> bf16 / f16, the two roundings of the f32 working-copy route, bit for bit.
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_api/norm.hpp"

namespace shard::kernels::norm {
namespace {

using namespace cu;
constexpr int kBlock = kThreads;

/// Number of elements of statistic k.
__host__ __device__ inline idx stat_len(const Geom& g) {
  if (g.kind == 0) return g.A * g.S;
  if (g.kind == 1) return (g.C / g.G) * g.S;
  return g.C;
}
__host__ __device__ inline idx stat_count(const Geom& g) {
  if (g.kind == 0) return g.C;
  if (g.kind == 1) return g.A * g.G;
  return g.A * g.S;
}
/// Offset and channel of element j of statistic k.
__device__ inline idx stat_elem(const Geom& g, idx k, idx j, idx* c) {
  if (g.kind == 0) {
    const idx a = j / g.S, s = j % g.S;
    *c = k;
    return (a * g.C + k) * g.S + s;
  }
  if (g.kind == 1) {
    const idx cg = g.C / g.G;
    *c = (k % g.G) * cg + j / g.S;
    return k * cg * g.S + j;
  }
  const idx a = k / g.S, s = k % g.S;
  *c = j;
  return (a * g.C + j) * g.S + s;
}
/// Statistic of the element at offset off (channel c).
__device__ inline idx stat_of(const Geom& g, idx off, idx* c) {
  const idx s = off % g.S, r = off / g.S, cc = r % g.C, a = r / g.C;
  *c = cc;
  if (g.kind == 0) return cc;
  if (g.kind == 1) return a * g.G + cc / (g.C / g.G);
  return a * g.S + s;
}

/// Fixed-order tree reduction of two values over the block; thread 0 gets the totals.
__device__ inline void block_reduce2(double& u, double& v) {
  __shared__ double su[kBlock], sv[kBlock];
  u = block_sum(u, su);
  v = block_sum(v, sv);
}

template <class T>
__global__ void sums_kernel(Geom g, const T* __restrict__ x, const double* __restrict__ mean, double* out) {
  const idx K = stat_count(g), n = stat_len(g);
  for (idx k = blockIdx.x; k < K; k += gridDim.x) {
    double acc = 0, unused = 0;
    for (idx j = threadIdx.x; j < n; j += blockDim.x) {
      idx c;
      const double v = wide(x[stat_elem(g, k, j, &c)]);
      if (mean) {
        const double d = v - mean[k];
        acc += d * d;
      } else {
        acc += v;
      }
    }
    block_reduce2(acc, unused);
    if (threadIdx.x == 0) out[k] = acc;
  }
}

template <class T>
__global__ void backward_stat_kernel(Geom g, const T* __restrict__ x, const T* __restrict__ gy,
                                     const double* __restrict__ mean, const double* __restrict__ invstd,
                                     const T* __restrict__ w, double* sg, double* sgx) {
  const idx K = stat_count(g), n = stat_len(g);
  for (idx k = blockIdx.x; k < K; k += gridDim.x) {
    double a1 = 0, a2 = 0;
    for (idx j = threadIdx.x; j < n; j += blockDim.x) {
      idx c;
      const idx off = stat_elem(g, k, j, &c);
      const double wc = w ? wide(w[c]) : 1.0;
      const double d = wide(gy[off]) * wc;
      a1 += d;
      a2 += d * (wide(x[off]) - mean[k]) * invstd[k];
    }
    block_reduce2(a1, a2);
    if (threadIdx.x == 0) {
      sg[k] = a1;
      sgx[k] = a2;
    }
  }
}

template <class T>
__global__ void backward_channel_kernel(Geom g, const T* __restrict__ x, const T* __restrict__ gy,
                                        const double* __restrict__ mean, const double* __restrict__ invstd, double* dw,
                                        double* db) {
  const idx n = g.A * g.S;
  for (idx c = blockIdx.x; c < g.C; c += gridDim.x) {
    double aw = 0, ab = 0;
    for (idx j = threadIdx.x; j < n; j += blockDim.x) {
      const idx a = j / g.S, s = j % g.S, off = (a * g.C + c) * g.S + s;
      idx cc;
      const idx k = stat_of(g, off, &cc);
      const double gv = wide(gy[off]);
      aw += gv * (wide(x[off]) - mean[k]) * invstd[k];
      ab += gv;
    }
    block_reduce2(aw, ab);
    if (threadIdx.x == 0) {
      if (dw) dw[c] = aw;
      if (db) db[c] = ab;
    }
  }
}

template <class T>
__global__ void apply_kernel(Geom g, idx total, const T* __restrict__ x, const double* __restrict__ mean,
                             const double* __restrict__ invstd, const T* __restrict__ w, const T* __restrict__ b,
                             T* __restrict__ y) {
  SHARD_GRID_STRIDE(i, total) {
    idx c;
    const idx k = stat_of(g, i, &c);
    const double wc = w ? wide(w[c]) : 1.0, bc = b ? wide(b[c]) : 0.0;
    y[i] = narrow<T>((wide(x[i]) - mean[k]) * invstd[k] * wc + bc);
  }
}

template <class T>
__global__ void dx_kernel(Geom g, idx total, const T* __restrict__ x, const T* __restrict__ gy,
                          const double* __restrict__ mean, const double* __restrict__ invstd, const T* __restrict__ w,
                          const double* __restrict__ sg, const double* __restrict__ sgx, double inv_count,
                          T* __restrict__ dx) {
  SHARD_GRID_STRIDE(i, total) {
    idx c;
    const idx k = stat_of(g, i, &c);
    const double wc = w ? wide(w[c]) : 1.0;
    const double d = wide(gy[i]) * wc;
    if (!sg) {
      dx[i] = narrow<T>(d * invstd[k]);
      continue;
    }
    const double xhat = (wide(x[i]) - mean[k]) * invstd[k];
    dx[i] = narrow<T>(invstd[k] * (d - sg[k] * inv_count - xhat * sgx[k] * inv_count));
  }
}

template <class T>
__global__ void to_f64_kernel(idx n, const T* __restrict__ src, double* __restrict__ dst) {
  SHARD_GRID_STRIDE(i, n) dst[i] = wide(src[i]);
}
template <class T>
__global__ void from_f64_kernel(idx n, const double* __restrict__ src, T* __restrict__ dst) {
  SHARD_GRID_STRIDE(i, n) dst[i] = narrow<T>(src[i]);
}

/// norm_finish (src/exec/norm_cpu.cpp's finish_impl, operation for operation).
__global__ void finish_kernel(Finish f) {
  bool bad = false;
  if (f.check) {  // exact: P * S2 == S1^2 in 128 bits
    const auto s1 = static_cast<unsigned long long>(f.check[0]);
    const auto s2 = static_cast<unsigned long long>(f.check[1]);
    const auto p = static_cast<unsigned long long>(f.P);
    bad = __umul64hi(s1, s1) != __umul64hi(p, s2) || s1 * s1 != p * s2;
  }
  const double nan = __longlong_as_double(0x7ff8000000000000LL);
  const double cnt = static_cast<double>(f.count);
  auto get = [](const void* r, bool f64, idx k) {
    return f64 ? static_cast<const double*>(r)[k] : static_cast<double>(static_cast<const float*>(r)[k]);
  };
  auto put = [](void* r, bool f64, idx k, double v) {
    if (f64) static_cast<double*>(r)[k] = v;
    else static_cast<float*>(r)[k] = __double2float_rn(v);
  };
  SHARD_GRID_STRIDE(k, f.K) {
    switch (f.mode) {
      case 3:
        if (bad) f.v[k] = nan;
        break;
      case 0: f.v[k] = bad ? nan : __ddiv_rn(f.v[k], cnt); break;
      case 2:
        f.mean[k] = bad ? nan : get(f.rm, f.rm_f64, k);
        f.v[k] = bad ? nan : __ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(get(f.rv, f.rv_f64, k), f.eps)));
        break;
      default: {
        const double var = bad ? nan : __ddiv_rn(f.v[k], cnt);
        const double unbiased = f.count > 1 ? __ddiv_rn(__dmul_rn(var, cnt), static_cast<double>(f.count - 1)) : var;
        const double m = f.momentum, m1 = __dsub_rn(1.0, m);
        if (f.rm) put(f.rm, f.rm_f64, k, __dadd_rn(__dmul_rn(m1, get(f.rm, f.rm_f64, k)), __dmul_rn(m, f.mean[k])));
        if (f.rv) put(f.rv, f.rv_f64, k, __dadd_rn(__dmul_rn(m1, get(f.rv, f.rv_f64, k)), __dmul_rn(m, unbiased)));
        f.v[k] = __ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(var, f.eps)));
      }
    }
  }
}

unsigned blocks_for(idx n) { return grid_for(n, kBlock); }
unsigned grid_for_stats(idx K) { return blocks_per_item(K); }
int done() { return last_error(); }

template <class T>
int sums_t(Geom g, const void* x, const double* mean, double* out, void* stream) {
  const idx K = stat_count(g);
  if (K == 0) return 0;
  sums_kernel<T><<<grid_for_stats(K), kBlock, 0, as_stream(stream)>>>(g, static_cast<const T*>(x), mean, out);
  return done();
}
template <class T>
int apply_t(Geom g, const void* x, const double* mean, const double* invstd, const void* w, const void* b, void* y,
            void* stream) {
  const idx total = g.A * g.C * g.S;
  if (total == 0) return 0;
  apply_kernel<T><<<blocks_for(total), kBlock, 0, as_stream(stream)>>>(
      g, total, static_cast<const T*>(x), mean, invstd, static_cast<const T*>(w), static_cast<const T*>(b),
      static_cast<T*>(y));
  return done();
}
template <class T>
int backward_sums_t(Geom g, const void* x, const void* gy, const double* mean, const double* invstd, const void* w,
                    double* sg, double* sgx, double* dw, double* db, void* stream) {
  const auto s = as_stream(stream);
  if ((dw || db) && g.C > 0)
    backward_channel_kernel<T><<<grid_for_stats(g.C), kBlock, 0, s>>>(g, static_cast<const T*>(x),
                                                                       static_cast<const T*>(gy), mean, invstd, dw, db);
  const idx K = stat_count(g);
  if (sg && sgx && K > 0)
    backward_stat_kernel<T><<<grid_for_stats(K), kBlock, 0, s>>>(g, static_cast<const T*>(x), static_cast<const T*>(gy),
                                                                  mean, invstd, static_cast<const T*>(w), sg, sgx);
  return done();
}
template <class T>
int backward_dx_t(Geom g, const void* x, const void* gy, const double* mean, const double* invstd, const void* w,
                  const double* sg, const double* sgx, double inv_count, void* dx, void* stream) {
  const idx total = g.A * g.C * g.S;
  if (total == 0) return 0;
  dx_kernel<T><<<blocks_for(total), kBlock, 0, as_stream(stream)>>>(
      g, total, static_cast<const T*>(x), static_cast<const T*>(gy), mean, invstd, static_cast<const T*>(w), sg, sgx,
      inv_count, static_cast<T*>(dx));
  return done();
}

}  // namespace

int sums(int dtype, Geom g, const void* x, const double* mean, double* out, void* stream) {
  return by_storage(dtype, [&](auto t) { return sums_t<decltype(t)>(g, x, mean, out, stream); });
}
int apply(int dtype, Geom g, const void* x, const double* mean, const double* invstd, const void* w, const void* b,
          void* y, void* stream) {
  return by_storage(dtype, [&](auto t) { return apply_t<decltype(t)>(g, x, mean, invstd, w, b, y, stream); });
}
int backward_sums(int dtype, Geom g, const void* x, const void* gy, const double* mean, const double* invstd,
                  const void* w, double* sg, double* sgx, double* dw, double* db, void* stream) {
  return by_storage(dtype, [&](auto t) {
    return backward_sums_t<decltype(t)>(g, x, gy, mean, invstd, w, sg, sgx, dw, db, stream);
  });
}
int backward_dx(int dtype, Geom g, const void* x, const void* gy, const double* mean, const double* invstd,
                const void* w, const double* sg, const double* sgx, double inv_count, void* dx, void* stream) {
  return by_storage(dtype, [&](auto t) {
    return backward_dx_t<decltype(t)>(g, x, gy, mean, invstd, w, sg, sgx, inv_count, dx, stream);
  });
}
int to_f64(int dtype, idx n, const void* src, double* dst, void* stream) {
  if (n == 0) return 0;
  return by_storage(dtype, [&](auto t) {
    using T = decltype(t);
    to_f64_kernel<T><<<blocks_for(n), kBlock, 0, as_stream(stream)>>>(n, static_cast<const T*>(src), dst);
    return done();
  });
}
int from_f64(int dtype, idx n, const double* src, void* dst, void* stream) {
  if (n == 0) return 0;
  return by_storage(dtype, [&](auto t) {
    using T = decltype(t);
    from_f64_kernel<T><<<blocks_for(n), kBlock, 0, as_stream(stream)>>>(n, src, static_cast<T*>(dst));
    return done();
  });
}

int finish(const Finish& f, void* stream) {
  if (f.K <= 0) return 0;
  finish_kernel<<<blocks_for(f.K), kBlock, 0, as_stream(stream)>>>(f);
  return done();
}

}  // namespace shard::kernels::norm
