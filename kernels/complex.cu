// Complex elementwise CUDA kernels over interleaved (re, im) pairs (c64: float, c128: double):
// the complex pointwise ops of the pointwise family (cx_map, forward and backward of
// nn/functional/complex.hpp, host glue in src/cuda/pointwise_cuda.cpp) and Tensor's complex
// device entry points (cx_axpby, cx_sum, and mul through cx_map; src/cuda/tensor_ops_cuda.cpp).
// The arithmetic is the CPU table's (src/exec/pointwise_cpu.cpp) written out on the parts:
// (a+ib)(c+id) = (ac-bd) + i(ad+bc), |z| = max sqrt(1 + (min/max)^2), in the part type T; the sum accumulates
// in double like the CPU's. Results agree with the CPU to rounding (no bitwise promise: the CPU's
// std::complex product and the device's FMA contraction may round differently).
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_api/complex.hpp"

namespace shard::kernels {
namespace {

using namespace cu;

/// The op codes (= shard::exec::ComplexOp).
enum Op : int {
  k_real,
  k_imag,
  k_make,
  k_conj,
  k_abs_squared,
  k_abs,
  k_scale,
  k_add,
  k_mul,
  k_mul_conj,
  k_mul_real,
  k_re_mul_conj,
  k_abs_backward,
  k_count
};

template <class T>
struct Cx {
  T re, im;
};
template <class T>
__device__ __forceinline__ Cx<T> cmul(Cx<T> x, Cx<T> y) {
  return {x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re};
}
template <class T>
__device__ __forceinline__ Cx<T> cconj(Cx<T> x) {
  return {x.re, -x.im};
}
/// |z| without overflow or underflow in the squares: max(|re|, |im|) sqrt(1 + (min / max)^2) (the
/// CPU's std::abs is hypot; this agrees to rounding). Written out rather than calling hypot: in the
/// GPU simulator the CUDA math library's hypot gave wrong values (inf, or off by O(1)) for the
/// complex abs kernels (tests/gpusim/cuda_sim_complex.cpp, 2026-11-28).
template <class T>
__device__ __forceinline__ T cabs(T re, T im) {
  const T a = fabs(re), b = fabs(im);
  const T m = a > b ? a : b, n = a > b ? b : a;
  if (m == T(0) || m != m || n != n) return m == T(0) ? T(0) : a + b;  // 0; NaN propagates
  if (m > T(0) && m == m + m) return m;                               // inf
  const T q = n / m;
  return m * sqrt(T(1) + q * q);
}
template <class T>
__device__ __forceinline__ Cx<T> load(const T* p, gidx i) {
  return {p[2 * i], p[2 * i + 1]};
}
template <class T>
__device__ __forceinline__ void store(T* p, gidx i, Cx<T> v) {
  p[2 * i] = v.re;
  p[2 * i + 1] = v.im;
}

template <class T, int OP>
__global__ void cx_map_kernel(gidx n, Cx<T> s, const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out) {
  SHARD_GRID_STRIDE(i, n) {
    if constexpr (OP == k_real) {
      out[i] = a[2 * i];
    } else if constexpr (OP == k_imag) {
      out[i] = a[2 * i + 1];
    } else if constexpr (OP == k_make) {
      store(out, i, Cx<T>{a ? a[i] : T(0), b ? b[i] : T(0)});
    } else if constexpr (OP == k_conj) {
      store(out, i, cmul(s, cconj(load(a, i))));
    } else if constexpr (OP == k_abs_squared) {
      const Cx<T> z = load(a, i);
      out[i] = s.re * (z.re * z.re + z.im * z.im);
    } else if constexpr (OP == k_abs) {
      const Cx<T> z = load(a, i);
      out[i] = cabs(z.re, z.im);
    } else if constexpr (OP == k_scale) {
      store(out, i, cmul(s, load(a, i)));
    } else if constexpr (OP == k_add) {
      const Cx<T> x = load(a, i), y = cmul(s, load(b, i));
      store(out, i, Cx<T>{x.re + y.re, x.im + y.im});
    } else if constexpr (OP == k_mul) {
      store(out, i, cmul(s, cmul(load(a, i), load(b, i))));
    } else if constexpr (OP == k_mul_conj) {
      store(out, i, cmul(s, cmul(load(a, i), cconj(load(b, i)))));
    } else if constexpr (OP == k_mul_real) {
      const Cx<T> z = load(a, i);
      const T r = b[i];
      store(out, i, cmul(s, Cx<T>{z.re * r, z.im * r}));
    } else if constexpr (OP == k_re_mul_conj) {
      out[i] = cmul(s, cmul(load(a, i), cconj(load(b, i)))).re;
    } else if constexpr (OP == k_abs_backward) {
      const Cx<T> z = load(a, i);
      const T m = cabs(z.re, z.im);
      if (m > T(0)) {
        const T f = b[i] / m;
        store(out, i, Cx<T>{z.re * f, z.im * f});
      } else {
        store(out, i, Cx<T>{T(0), T(0)});
      }
    }
  }
}

template <class T>
__global__ void cx_axpby_kernel(gidx n, Cx<T> alpha, const T* __restrict__ x, Cx<T> beta, T* y) {
  SHARD_GRID_STRIDE(i, n) {
    const Cx<T> u = cmul(alpha, load(x, i)), v = cmul(beta, load(y, i));
    store(y, i, Cx<T>{u.re + v.re, u.im + v.im});
  }
}

constexpr gidx kSumBlocks = 1024;  ///< partial sums of cx_sum: at most this many blocks

template <class T>
__global__ void cx_sum_partial_kernel(gidx n, const T* x, double* part) {
  __shared__ double bre[kThreads];
  __shared__ double bim[kThreads];
  double re = 0, im = 0;
  SHARD_GRID_STRIDE(i, n) {
    re += static_cast<double>(x[2 * i]);
    im += static_cast<double>(x[2 * i + 1]);
  }
  bre[threadIdx.x] = re;
  bim[threadIdx.x] = im;
  block_tree(bre);
  block_tree(bim);
  if (threadIdx.x == 0) {
    part[2 * blockIdx.x] = bre[0];
    part[2 * blockIdx.x + 1] = bim[0];
  }
}
__global__ void cx_sum_final_kernel(gidx parts, const double* part, double* out) {
  __shared__ double bre[kThreads];
  __shared__ double bim[kThreads];
  double re = 0, im = 0;
  for (gidx i = threadIdx.x; i < parts; i += blockDim.x) {
    re += part[2 * i];
    im += part[2 * i + 1];
  }
  bre[threadIdx.x] = re;
  bim[threadIdx.x] = im;
  block_tree(bre);
  block_tree(bim);
  if (threadIdx.x == 0) {
    out[0] = bre[0];
    out[1] = bim[0];
  }
}

}  // namespace

int cx_map(int is_f64, int op, double s_re, double s_im, cx_idx n, const void* a, const void* b, void* out,
           void* stream) {
  if (op < 0 || op >= k_count || is_f64 < 0 || is_f64 > 1) return invalid();
  if (n == 0) return 0;
  by_float_type(is_f64, [&](auto t) {
    using T = decltype(t);
    const Cx<T> s{static_cast<T>(s_re), static_cast<T>(s_im)};
    by_op<k_count>(op, [&](auto o) {
      constexpr int OP = decltype(o)::value;
      cx_map_kernel<T, OP><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
          n, s, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out));
    });
    return 0;
  });
  return last_error();
}

int cx_axpby(int is_f64, cx_idx n, double a_re, double a_im, const void* x, double b_re, double b_im, void* y,
             void* stream) {
  if (is_f64 < 0 || is_f64 > 1) return invalid();
  if (n == 0) return 0;
  by_float_type(is_f64, [&](auto t) {
    using T = decltype(t);
    cx_axpby_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
        n, Cx<T>{static_cast<T>(a_re), static_cast<T>(a_im)}, static_cast<const T*>(x),
        Cx<T>{static_cast<T>(b_re), static_cast<T>(b_im)}, static_cast<T*>(y));
    return 0;
  });
  return last_error();  // stream-ordered, like the real axpby (kernels/elementwise.cu)
}

int cx_sum(int is_f64, cx_idx n, const void* x, double* host_out, void* stream) {
  host_out[0] = host_out[1] = 0;
  if (is_f64 < 0 || is_f64 > 1) return invalid();
  if (n == 0) return 0;
  cudaStream_t st = as_stream(stream);
  const unsigned blocks = grid_for(n, kThreads, kSumBlocks);
  const std::size_t bytes = (static_cast<std::size_t>(blocks) + 1) * 2 * sizeof(double);
  return with_stream_scratch(bytes, st, [&](void* scratch) {
    auto* ws = static_cast<double*>(scratch);
    by_float_type(is_f64, [&](auto t) {
      using T = decltype(t);
      cx_sum_partial_kernel<T><<<blocks, kThreads, 0, st>>>(n, static_cast<const T*>(x), ws);
      return 0;
    });
    cx_sum_final_kernel<<<1, kThreads, 0, st>>>(blocks, ws, ws + 2 * blocks);
    const int rc = last_error();
    return rc ? rc
              : static_cast<int>(
                    cudaMemcpyAsync(host_out, ws + 2 * blocks, 2 * sizeof(double), cudaMemcpyDeviceToHost, st));
  });
}

}  // namespace shard::kernels
