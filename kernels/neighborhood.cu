// Neighbourhood-attention kernel family on CUDA (fp32, fp64, bf16 and f16 with fp32 accumulation; see
// src/kernels_api/neighborhood.hpp and include/shardtensor/exec/neighborhood.hpp). One warp per
// row: lane l holds head-dim elements l, l + 32, ... in registers; dot products are warp
// reductions (butterfly shuffles, so every lane has the same value in the same order); the
// forward runs an online softmax over the window in offset order. Backward: a dq kernel per query
// (also writes delta = dout . out), then a dk/dv kernel per key that gathers over the queries that
// see the key, in offset order. No atomics: results are deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_api/neighborhood.hpp"
#include "neighborhood_tc.cuh"

namespace shard::kernels::nbhd {
namespace {

using namespace cu;
constexpr int kWarp = 32;
constexpr int kBlock = kThreads;
constexpr int kPer = static_cast<int>(kMaxHeadDim / kWarp);

template <class T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

__device__ inline float ld(const float* p) { return *p; }
__device__ inline double ld(const double* p) { return *p; }
__device__ inline float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ inline float ld(const __half* p) { return __half2float(*p); }
__device__ inline void st(float* p, float x) { *p = x; }
__device__ inline void st(double* p, double x) { *p = x; }
__device__ inline void st(__nv_bfloat16* p, float x) { *p = __float2bfloat16(x); }
__device__ inline void st(__half* p, float x) { *p = __float2half_rn(x); }
__device__ inline float ex(float x) { return expf(x); }
__device__ inline double ex(double x) { return exp(x); }
__device__ inline float lg(float x) { return logf(x); }
__device__ inline double lg(double x) { return log(x); }

template <class A>
__device__ inline A warp_sum(A x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ inline idx key_of(const Geom& g, int d, idx i, idx o) {
  idx e = g.qoff[d] + i + g.dilation[d] * (o - g.window[d] / 2);
  if (g.wrap[d]) {
    e %= g.nk[d];
    if (e < 0) e += g.nk[d];
  }
  return (e >= g.valid_lo[d] && e < g.valid_hi[d]) ? e : -1;
}

__device__ inline idx query_of(const Geom& g, int d, idx e, idx o) {
  idx i = e - g.qoff[d] - g.dilation[d] * (o - g.window[d] / 2);
  if (g.wrap[d]) {
    i %= g.nk[d];
    if (i < 0) i += g.nk[d];
  }
  return (i >= 0 && i < g.nq[d]) ? i : -1;
}

__device__ inline idx at(const Operand& a, idx b, idx i0, idx i1, idx i2, idx h) {
  return b * a.sb + i0 * a.ss[0] + i1 * a.ss[1] + i2 * a.ss[2] + h * a.sh;
}

template <class T, class A>
__device__ inline void load_row(const T* p, idx n, int lane, A (&r)[kPer]) {
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const idx d = lane + t * kWarp;
    r[t] = d < n ? static_cast<A>(ld(p + d)) : A(0);
  }
}

template <class T, class A>
__device__ inline A dot_row(const A (&r)[kPer], const T* p, idx n, int lane) {
  A s = 0;
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const idx d = lane + t * kWarp;
    if (d < n) s += r[t] * static_cast<A>(ld(p + d));
  }
  return warp_sum(s);
}

/// acc[t] += p * row element (lane + 32 t) of P, for elements < n.
template <class T, class A>
__device__ inline void axpy_row(A (&acc)[kPer], A p, const T* P, idx n, int lane) {
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const idx d = lane + t * kWarp;
    if (d < n) acc[t] += p * static_cast<A>(ld(P + d));
  }
}

/// Stores the lane's elements of r (< n) to row P.
template <class T, class A>
__device__ inline void store_row(T* P, const A (&r)[kPer], idx n, int lane) {
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const idx d = lane + t * kWarp;
    if (d < n) st(P + d, r[t]);
  }
}

/// The warp's row: head h, batch b, and position (i0, i1, i2) in a grid of extents n
/// (rows enumerate (b, i0, i1, i2, h), h fastest); false past the last row (whole warps).
struct Row {
  idx w, b, h, i[3];
};
__device__ inline bool warp_row(const Geom& g, const idx (&n)[3], Row& r) {
  r.w = (static_cast<idx>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const idx np = n[0] * n[1] * n[2];
  if (r.w >= g.B * np * g.H) return false;
  r.h = r.w % g.H;
  const idx rest = r.w / g.H, pi = rest % np;
  r.b = rest / np;
  r.i[2] = pi % n[2];
  r.i[1] = (pi / n[2]) % n[1];
  r.i[0] = pi / (n[2] * n[1]);
  return true;
}

/// Calls f(e0, e1, e2) for every window offset of query (i0, i1, i2) whose key is valid, in
/// offset order (the CPU kernel's order).
template <class F>
__device__ inline void for_each_key(const Geom& g, const idx (&i)[3], F&& f) {
  for (idx o0 = 0; o0 < g.window[0]; ++o0) {
    const idx e0 = key_of(g, 0, i[0], o0);
    if (e0 < 0) continue;
    for (idx o1 = 0; o1 < g.window[1]; ++o1) {
      const idx e1 = key_of(g, 1, i[1], o1);
      if (e1 < 0) continue;
      for (idx o2 = 0; o2 < g.window[2]; ++o2) {
        const idx e2 = key_of(g, 2, i[2], o2);
        if (e2 >= 0) f(e0, e1, e2);
      }
    }
  }
}
/// Calls f(i0, i1, i2) for every query that sees key (e0, e1, e2), in offset order.
template <class F>
__device__ inline void for_each_query(const Geom& g, const idx (&e)[3], F&& f) {
  for (idx o0 = 0; o0 < g.window[0]; ++o0) {
    const idx i0 = query_of(g, 0, e[0], o0);
    if (i0 < 0) continue;
    for (idx o1 = 0; o1 < g.window[1]; ++o1) {
      const idx i1 = query_of(g, 1, e[1], o1);
      if (i1 < 0) continue;
      for (idx o2 = 0; o2 < g.window[2]; ++o2) {
        const idx i2 = query_of(g, 2, e[2], o2);
        if (i2 >= 0) f(i0, i1, i2);
      }
    }
  }
}

template <class T, class A>
__global__ void forward_kernel(Geom g, Operand q, Operand k, Operand v, Operand out, A* lse) {
  Row r;
  if (!warp_row(g, g.nq, r)) return;  // whole warps exit together
  const int lane = threadIdx.x % kWarp;
  const idx b = r.b, h = r.h;
  const T* K = static_cast<const T*>(k.data);
  const T* V = static_cast<const T*>(v.data);
  A qr[kPer], acc[kPer];
  load_row(static_cast<const T*>(q.data) + at(q, b, r.i[0], r.i[1], r.i[2], h), g.D, lane, qr);
#pragma unroll
  for (int t = 0; t < kPer; ++t) acc[t] = 0;
  const A scale = static_cast<A>(g.scale);
  A m = -INFINITY, l = 0;
  for_each_key(g, r.i, [&](idx e0, idx e1, idx e2) {
    const A s = scale * dot_row(qr, K + at(k, b, e0, e1, e2, h), g.D, lane);
    if (s > m) {
      const A c = m == -INFINITY ? A(0) : ex(m - s);
      l *= c;
#pragma unroll
      for (int t = 0; t < kPer; ++t) acc[t] *= c;
      m = s;
    }
    const A p = ex(s - m);
    l += p;
    axpy_row(acc, p, V + at(v, b, e0, e1, e2, h), g.Dv, lane);
  });
#pragma unroll
  for (int t = 0; t < kPer; ++t) acc[t] = l > 0 ? acc[t] / l : A(0);
  store_row(static_cast<T*>(const_cast<void*>(out.data)) + at(out, b, r.i[0], r.i[1], r.i[2], h), acc, g.Dv, lane);
  if (lane == 0) lse[r.w] = l > 0 ? m + lg(l) : A(-INFINITY);
}

template <class T, class A>
__global__ void dq_kernel(Geom g, Operand q, Operand k, Operand v, Operand out, Operand dout, const A* lse,
                          Operand dq, A* delta) {
  Row r;
  if (!warp_row(g, g.nq, r)) return;
  const int lane = threadIdx.x % kWarp;
  const idx b = r.b, h = r.h, w = r.w, i0 = r.i[0], i1 = r.i[1], i2 = r.i[2];
  const T* K = static_cast<const T*>(k.data);
  const T* V = static_cast<const T*>(v.data);
  A dor[kPer], qr[kPer], acc[kPer];
  load_row(static_cast<const T*>(dout.data) + at(dout, b, i0, i1, i2, h), g.Dv, lane, dor);
  const A dl = dot_row(dor, static_cast<const T*>(out.data) + at(out, b, i0, i1, i2, h), g.Dv, lane);
  if (lane == 0) delta[w] = dl;
  if (!dq.data) return;
  load_row(static_cast<const T*>(q.data) + at(q, b, i0, i1, i2, h), g.D, lane, qr);
#pragma unroll
  for (int t = 0; t < kPer; ++t) acc[t] = 0;
  const A scale = static_cast<A>(g.scale), L = lse[w];
  if (L != A(-INFINITY)) {
    for_each_key(g, r.i, [&](idx e0, idx e1, idx e2) {
      const T* kp = K + at(k, b, e0, e1, e2, h);
      const A p = ex(scale * dot_row(qr, kp, g.D, lane) - L);
      const A ds = p * (dot_row(dor, V + at(v, b, e0, e1, e2, h), g.Dv, lane) - dl) * scale;
      axpy_row(acc, ds, kp, g.D, lane);
    });
  }
  store_row(static_cast<T*>(const_cast<void*>(dq.data)) + at(dq, b, i0, i1, i2, h), acc, g.D, lane);
}

template <class T, class A>
__global__ void dkdv_kernel(Geom g, Operand q, Operand k, Operand v, Operand dout, const A* lse, const A* delta,
                            Operand dk, Operand dv) {
  Row r;
  if (!warp_row(g, g.nk, r)) return;
  const int lane = threadIdx.x % kWarp;
  const idx nqt = g.nq[0] * g.nq[1] * g.nq[2];
  const idx b = r.b, h = r.h;
  const idx (&e)[3] = r.i;
  const T* Q = static_cast<const T*>(q.data);
  const T* dO = static_cast<const T*>(dout.data);
  A kr[kPer], vr[kPer], ak[kPer], av[kPer];
  load_row(static_cast<const T*>(k.data) + at(k, b, e[0], e[1], e[2], h), g.D, lane, kr);
  load_row(static_cast<const T*>(v.data) + at(v, b, e[0], e[1], e[2], h), g.Dv, lane, vr);
#pragma unroll
  for (int t = 0; t < kPer; ++t) ak[t] = av[t] = 0;
  const A scale = static_cast<A>(g.scale);
  bool valid = true;
  for (int d = 0; d < 3; ++d) valid = valid && e[d] >= g.valid_lo[d] && e[d] < g.valid_hi[d];
  if (valid) {
    for_each_query(g, e, [&](idx i0, idx i1, idx i2) {
      const idx row = ((b * nqt + (i0 * g.nq[1] + i1) * g.nq[2] + i2) * g.H) + h;
      const A L = lse[row];
      if (L == A(-INFINITY)) return;
      const T* qp = Q + at(q, b, i0, i1, i2, h);
      const T* dop = dO + at(dout, b, i0, i1, i2, h);
      const A p = ex(scale * dot_row(kr, qp, g.D, lane) - L);
      const A ds = p * (dot_row(vr, dop, g.Dv, lane) - delta[row]) * scale;
      axpy_row(av, p, dop, g.Dv, lane);
      axpy_row(ak, ds, qp, g.D, lane);
    });
  }
  if (dk.data) store_row(static_cast<T*>(const_cast<void*>(dk.data)) + at(dk, b, e[0], e[1], e[2], h), ak, g.D, lane);
  if (dv.data) store_row(static_cast<T*>(const_cast<void*>(dv.data)) + at(dv, b, e[0], e[1], e[2], h), av, g.Dv, lane);
}

/// One warp per row (not grid-stride: the grid covers every row; gridDim.x allows 2^31 - 1).
constexpr idx kMaxRows = static_cast<idx>(0x7fffffff) * (kBlock / kWarp);
unsigned blocks_for_rows(idx rows) { return grid_for(rows * kWarp, kBlock, 0x7fffffff); }

template <class T>
int forward_t(const Geom& g, const Operand& q, const Operand& k, const Operand& v, const Operand& out, void* lse,
              cudaStream_t s) {
  using A = typename AccOf<T>::type;
  const idx rows = g.B * g.nq[0] * g.nq[1] * g.nq[2] * g.H;
  if (rows > 0) forward_kernel<T, A><<<blocks_for_rows(rows), kBlock, 0, s>>>(g, q, k, v, out, static_cast<A*>(lse));
  return last_error();
}

template <class T>
int backward_t(const Geom& g, const Operand& q, const Operand& k, const Operand& v, const Operand& out,
               const Operand& dout, const void* lse, const Operand& dq, const Operand& dk, const Operand& dv,
               void* delta, cudaStream_t s) {
  using A = typename AccOf<T>::type;
  const idx qrows = g.B * g.nq[0] * g.nq[1] * g.nq[2] * g.H, krows = g.B * g.nk[0] * g.nk[1] * g.nk[2] * g.H;
  const A* L = static_cast<const A*>(lse);
  A* dl = static_cast<A*>(delta);
  if (qrows > 0) dq_kernel<T, A><<<blocks_for_rows(qrows), kBlock, 0, s>>>(g, q, k, v, out, dout, L, dq, dl);
  if (krows > 0 && (dk.data || dv.data))
    dkdv_kernel<T, A><<<blocks_for_rows(krows), kBlock, 0, s>>>(g, q, k, v, dout, L, dl, dk, dv);
  return last_error();
}

}  // namespace

int forward(int dtype, const Geom& g, const Operand& q, const Operand& k, const Operand& v, const Operand& out,
            void* lse, void* stream, int flags) {
  const auto s = as_stream(stream);
  if (g.D > kMaxHeadDim || g.Dv > kMaxHeadDim) return invalid();
  if (g.B * g.nq[0] * g.nq[1] * g.nq[2] * g.H == 0) return 0;
  if (dtype != f64)
    if (const int r = tc::forward(dtype, flags, g, q, k, v, out, static_cast<float*>(lse), s); r != tc::kDeclined)
      return r;
  if (g.B * g.nq[0] * g.nq[1] * g.nq[2] * g.H > kMaxRows || g.B * g.nk[0] * g.nk[1] * g.nk[2] * g.H > kMaxRows)
    return invalid();  // more rows than one grid covers
  switch (dtype) {
    case f32: return forward_t<float>(g, q, k, v, out, lse, s);
    case f64: return forward_t<double>(g, q, k, v, out, lse, s);
    case bf16: return forward_t<__nv_bfloat16>(g, q, k, v, out, lse, s);
    case f16: return forward_t<__half>(g, q, k, v, out, lse, s);
    default: return invalid();
  }
}

int backward(int dtype, const Geom& g, const Operand& q, const Operand& k, const Operand& v, const Operand& out,
             const Operand& dout, const void* lse, const Operand& dq, const Operand& dk, const Operand& dv,
             void* delta, void* stream, int flags) {
  const auto s = as_stream(stream);
  if (g.D > kMaxHeadDim || g.Dv > kMaxHeadDim) return invalid();
  if (dtype != f64 && g.B * g.H > 0)
    if (const int r = tc::backward(dtype, flags, g, q, k, v, out, dout, static_cast<const float*>(lse), dq, dk, dv,
                                   static_cast<float*>(delta), s);
        r != tc::kDeclined)
      return r;
  if (g.B * g.nq[0] * g.nq[1] * g.nq[2] * g.H > kMaxRows || g.B * g.nk[0] * g.nk[1] * g.nk[2] * g.H > kMaxRows)
    return invalid();  // more rows than one grid covers
  switch (dtype) {
    case f32: return backward_t<float>(g, q, k, v, out, dout, lse, dq, dk, dv, delta, s);
    case f64: return backward_t<double>(g, q, k, v, out, dout, lse, dq, dk, dv, delta, s);
    case bf16: return backward_t<__nv_bfloat16>(g, q, k, v, out, dout, lse, dq, dk, dv, delta, s);
    case f16: return backward_t<__half>(g, q, k, v, out, dout, lse, dq, dk, dv, delta, s);
    default: return invalid();
  }
}

bool takes_tensor_cores(int dtype, const Geom& g, bool backward, int flags) {
  return dtype != f64 && tc::takes(dtype, flags, g, backward);
}

}  // namespace shard::kernels::nbhd
