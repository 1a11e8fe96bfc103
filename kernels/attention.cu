// Attention kernel family on CUDA (float, double, bfloat16 and half with float accumulation): the blockwise
// (FlashAttention-style) forward with an online softmax, the backward from the final out / lse,
// and the lse merge (see src/kernels_api/attention.hpp and include/shardtensor/exec/attention.hpp).
//
// A kernel of the project's own, on CUDA cores (cuDNN's fused SDPA needs the cudnn_frontend
// graph API, whose headers are not installed with the toolkit here). Layout of the work:
//  - forward: one thread per query row (kRows rows per block); the block stages a tile of BK keys
//    and values in shared memory (converted to the accumulation type); each thread keeps its
//    (scaled) query, running max / sum and its output accumulator in registers. Memory O(N * D).
//  - backward: delta_i = dout_i . out_i (one thread per row), then two gather kernels without
//    atomics (deterministic): dQ with one thread per query walking the key tiles, and dK / dV with
//    one thread per key walking the query tiles (P recomputed from lse in both).
//  - merge: one thread per query row.
// Head dims up to 256 (template DM = 64 / 128 / 256 bounds the per-thread register arrays).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "common.cuh"
#include "kernels_api/attention.hpp"

namespace shard::kernels::attention {
namespace {

using namespace cu;
constexpr int kRows = 128;  ///< threads (query or key rows) per block

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

/// Keys per shared-memory tile: two tiles of BK x DM accumulation values, 32 KiB.
template <class A, int DM>
struct KeyTile {
  static constexpr int value = 16384 / (DM * static_cast<int>(sizeof(A)));
};

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

/// Sets the register row to zero.
template <class A, int DM>
__device__ inline void zero_row(A (&r)[DM]) {
#pragma unroll
  for (int d = 0; d < DM; ++d) r[d] = A(0);
}

/// Loads row r's first n elements of X (row stride sn), scaled, into registers; zero beyond n
/// or when !valid.
template <class T, class A, int DM>
__device__ inline void load_row(A (&r)[DM], const T* X, idx sn, idx row, idx n, bool valid, A scale) {
#pragma unroll
  for (int d = 0; d < DM; ++d) r[d] = valid && d < n ? to_acc(X[row * sn + d]) * scale : A(0);
}

/// The block stages rows [r0, r0 + nr) of two operands into shared tiles (a: width na of X,
/// b: width nb of Y), zero-padded to the tile's N rows and DM columns. Starts with a barrier (the
/// previous tile may still be read) and ends with one (the tile is complete).
template <class T, class A, int N, int DM>
__device__ inline void stage_tiles(A (&a)[N][DM], A (&b)[N][DM], const T* X, idx sx, idx na, const T* Y, idx sy,
                                   idx nb, idx r0, int nr) {
  __syncthreads();
  for (int e = threadIdx.x; e < N * DM; e += blockDim.x) {
    const int rr = e / DM, d = e % DM;
    a[rr][d] = rr < nr && d < na ? to_acc(X[(r0 + rr) * sx + d]) : A(0);
    b[rr][d] = rr < nr && d < nb ? to_acc(Y[(r0 + rr) * sy + d]) : A(0);
  }
  __syncthreads();
}

/// Adds acc[0, n) to row `row` of gradient operand o (for (b, h)).
template <class T, class A, int DM>
__device__ inline void add_row(Out o, idx b, idx h, idx row, const A (&acc)[DM], idx n) {
  T* G = static_cast<T*>(o.p) + b * o.sb + h * o.sh + row * o.sn;
#pragma unroll
  for (int d = 0; d < DM; ++d)
    if (d < n) G[d] = from_acc<T>(to_acc(G[d]) + acc[d]);
}

template <class T, class A, int DM>
__global__ void __launch_bounds__(kRows) forward_kernel(Geom g, In q, In k, In v, Mask m, Out out, A* lse) {
  constexpr int BK = KeyTile<A, DM>::value;
  __shared__ A ks[BK][DM];
  __shared__ A vs[BK][DM];
  const idx b = blockIdx.z, h = blockIdx.y, i0 = static_cast<idx>(blockIdx.x) * kRows, i = i0 + threadIdx.x;
  const bool valid = i < g.Nq;
  const T* K = head_rows<T>(k, b, h);
  const T* V = head_rows<T>(v, b, h);
  const A scale = static_cast<A>(m.scale);
  A qr[DM], acc[DM];
  load_row(qr, head_rows<T>(q, b, h), q.sn, i, g.D, valid, scale);
  zero_row(acc);
  A mx = neg_inf<A>(), l = A(0);
  const idx rows_end = i0 + kRows < g.Nq ? i0 + kRows : g.Nq;
  const idx kend = key_end(g, m, rows_end);
  for (idx j0 = 0; j0 < kend; j0 += BK) {
    const int nk = static_cast<int>(kend - j0 < BK ? kend - j0 : BK);
    stage_tiles(ks, vs, K, k.sn, g.D, V, v.sn, g.Dv, j0, nk);
    if (!valid) continue;
    for (int jj = 0; jj < nk; ++jj) {
      const idx j = j0 + jj;
      if (m.causal && m.k_pos0 + j > m.q_pos0 + i) break;  // later keys are masked too
      A s = A(0);
#pragma unroll
      for (int d = 0; d < DM; ++d) s += qr[d] * ks[jj][d];
      s += bias_at<T, A>(m, b, h, i, j);
      if (s == neg_inf<A>()) continue;
      if (s > mx) {
        const A c = mx == neg_inf<A>() ? A(0) : exp_acc(mx - s);
        l *= c;
#pragma unroll
        for (int d = 0; d < DM; ++d) acc[d] *= c;
        mx = s;
      }
      const A p = exp_acc(s - mx);
      l += p;
#pragma unroll
      for (int d = 0; d < DM; ++d) acc[d] += p * vs[jj][d];
    }
  }
  if (!valid) return;
  T* O = static_cast<T*>(out.p) + b * out.sb + h * out.sh + i * out.sn;
  const idx r = (b * g.H + h) * g.Nq + i;
  if (l == A(0)) {
    for (idx d = 0; d < g.Dv; ++d) O[d] = from_acc<T>(A(0));
    lse[r] = neg_inf<A>();
  } else {
    const A inv = A(1) / l;
#pragma unroll
    for (int d = 0; d < DM; ++d)
      if (d < g.Dv) O[d] = from_acc<T>(acc[d] * inv);
    lse[r] = mx + log_acc(l);
  }
}

template <class T, class A>
__global__ void delta_kernel(Geom g, In out, In dout, A* delta) {
  const idx n = g.B * g.H * g.Nq;
  SHARD_GRID_STRIDE(r, n) {
    const idx bh = r / g.Nq, b = bh / g.H, h = bh % g.H, i = r % g.Nq;
    const T* o = static_cast<const T*>(out.p) + b * out.sb + h * out.sh + i * out.sn;
    const T* d = static_cast<const T*>(dout.p) + b * dout.sb + h * dout.sh + i * dout.sn;
    A s = A(0);
    for (idx e = 0; e < g.Dv; ++e) s += to_acc(o[e]) * to_acc(d[e]);
    delta[r] = s;
  }
}

/// dQ: one thread per query, walking the key tiles.
template <class T, class A, int DM>
__global__ void __launch_bounds__(kRows) dq_kernel(Geom g, In q, In k, In v, In dout, const A* lse, const A* delta,
                                                   Mask m, Out dq) {
  constexpr int BK = KeyTile<A, DM>::value;
  __shared__ A ks[BK][DM];
  __shared__ A vs[BK][DM];
  const idx b = blockIdx.z, h = blockIdx.y, i0 = static_cast<idx>(blockIdx.x) * kRows, i = i0 + threadIdx.x;
  const idx r = (b * g.H + h) * g.Nq + i;
  const A L = i < g.Nq ? lse[r] : neg_inf<A>();
  const bool valid = L != neg_inf<A>();  // rows with nothing visible contribute nothing
  const A dl = i < g.Nq ? delta[r] : A(0);
  const T* K = head_rows<T>(k, b, h);
  const T* V = head_rows<T>(v, b, h);
  const A scale = static_cast<A>(m.scale);
  A qr[DM], dor[DM], acc[DM];
  load_row(qr, head_rows<T>(q, b, h), q.sn, i, g.D, valid, scale);
  load_row(dor, head_rows<T>(dout, b, h), dout.sn, i, g.Dv, valid, A(1));
  zero_row(acc);
  const idx rows_end = i0 + kRows < g.Nq ? i0 + kRows : g.Nq;
  const idx kend = key_end(g, m, rows_end);
  for (idx j0 = 0; j0 < kend; j0 += BK) {
    const int nk = static_cast<int>(kend - j0 < BK ? kend - j0 : BK);
    stage_tiles(ks, vs, K, k.sn, g.D, V, v.sn, g.Dv, j0, nk);
    if (!valid) continue;
    for (int jj = 0; jj < nk; ++jj) {
      const idx j = j0 + jj;
      if (m.causal && m.k_pos0 + j > m.q_pos0 + i) break;
      A s = A(0), dp = A(0);
#pragma unroll
      for (int d = 0; d < DM; ++d) {
        s += qr[d] * ks[jj][d];
        dp += dor[d] * vs[jj][d];
      }
      s += bias_at<T, A>(m, b, h, i, j);
      if (s == neg_inf<A>()) continue;
      const A ds = exp_acc(s - L) * (dp - dl) * scale;
#pragma unroll
      for (int d = 0; d < DM; ++d) acc[d] += ds * ks[jj][d];
    }
  }
  if (!valid || dq.p == nullptr) return;
  add_row<T>(dq, b, h, i, acc, g.D);
}

/// dK and dV: one thread per key, walking the query tiles.
template <class T, class A, int DM>
__global__ void __launch_bounds__(kRows) dkdv_kernel(Geom g, In q, In k, In v, In dout, const A* lse, const A* delta,
                                                     Mask m, Out dk, Out dv) {
  constexpr int BQ = KeyTile<A, DM>::value;
  __shared__ A qs[BQ][DM];
  __shared__ A dos[BQ][DM];
  __shared__ A ls[BQ], dls[BQ];
  const idx b = blockIdx.z, h = blockIdx.y, j0 = static_cast<idx>(blockIdx.x) * kRows, j = j0 + threadIdx.x;
  const bool valid = j < g.Nk;
  const T* Q = head_rows<T>(q, b, h);
  const T* dO = head_rows<T>(dout, b, h);
  const A* Lb = lse + (b * g.H + h) * g.Nq;
  const A* Db = delta + (b * g.H + h) * g.Nq;
  const A scale = static_cast<A>(m.scale);
  A kr[DM], vr[DM], gk[DM], gv[DM];
  load_row(kr, head_rows<T>(k, b, h), k.sn, j, g.D, valid, scale);
  load_row(vr, head_rows<T>(v, b, h), v.sn, j, g.Dv, valid, A(1));
  zero_row(gk);
  zero_row(gv);
  // causal: the first query that sees the block's first key
  idx istart = 0;
  if (m.causal) {
    const idx s0 = m.k_pos0 + j0 - m.q_pos0;
    istart = s0 < 0 ? 0 : (s0 > g.Nq ? g.Nq : s0);
  }
  for (idx a0 = istart; a0 < g.Nq; a0 += BQ) {
    const int nq = static_cast<int>(g.Nq - a0 < BQ ? g.Nq - a0 : BQ);
    __syncthreads();  // ls / dls of the previous tile may still be read
    for (int ii = threadIdx.x; ii < BQ; ii += blockDim.x) {
      ls[ii] = ii < nq ? Lb[a0 + ii] : neg_inf<A>();
      dls[ii] = ii < nq ? Db[a0 + ii] : A(0);
    }
    stage_tiles(qs, dos, Q, q.sn, g.D, dO, dout.sn, g.Dv, a0, nq);
    if (!valid) continue;
    for (int ii = 0; ii < nq; ++ii) {
      const idx i = a0 + ii;
      if (ls[ii] == neg_inf<A>()) continue;
      if (m.causal && m.k_pos0 + j > m.q_pos0 + i) continue;
      A s = A(0), dp = A(0);
#pragma unroll
      for (int d = 0; d < DM; ++d) {
        s += kr[d] * qs[ii][d];
        dp += vr[d] * dos[ii][d];
      }
      s += bias_at<T, A>(m, b, h, i, j);
      if (s == neg_inf<A>()) continue;
      const A p = exp_acc(s - ls[ii]);
      const A ds = p * (dp - dls[ii]) * scale;
#pragma unroll
      for (int d = 0; d < DM; ++d) {
        gv[d] += p * dos[ii][d];
        gk[d] += ds * qs[ii][d];
      }
    }
  }
  if (!valid) return;
  if (dk.p) add_row<T>(dk, b, h, j, gk, g.D);
  if (dv.p) add_row<T>(dv, b, h, j, gv, g.Dv);
}

template <class T, class A>
__global__ void merge_kernel(Geom g, Out out, A* lse, In out_b, const A* lse_b) {
  const idx n = g.B * g.H * g.Nq;
  SHARD_GRID_STRIDE(r, n) {
    const idx bh = r / g.Nq, b = bh / g.H, h = bh % g.H, i = r % g.Nq;
    const A la = lse[r], lb = lse_b[r];
    if (lb == neg_inf<A>()) continue;
    T* o = static_cast<T*>(out.p) + b * out.sb + h * out.sh + i * out.sn;
    const T* ob = static_cast<const T*>(out_b.p) + b * out_b.sb + h * out_b.sh + i * out_b.sn;
    if (la == neg_inf<A>()) {
      for (idx d = 0; d < g.Dv; ++d) o[d] = ob[d];
      lse[r] = lb;
      continue;
    }
    const A mx = la > lb ? la : lb;
    const A ln = mx + log_acc(exp_acc(la - mx) + exp_acc(lb - mx));
    const A ca = exp_acc(la - ln), cb = exp_acc(lb - ln);
    for (idx d = 0; d < g.Dv; ++d) o[d] = from_acc<T>(ca * to_acc(o[d]) + cb * to_acc(ob[d]));
    lse[r] = ln;
  }
}

/// One thread per (b, h, query row), grid-stride.
unsigned rows_grid(idx n) { return grid_for(n); }
/// kRows rows per block on x, heads on y, batch on z.
dim3 row_blocks(idx rows, const Geom& g) {
  return dim3(static_cast<unsigned>((rows + kRows - 1) / kRows), static_cast<unsigned>(g.H), static_cast<unsigned>(g.B));
}

/// The register-array bound for head dims D, Dv: 64, 128, 256, or 0 when too large.
int dm_for(const Geom& g) {
  const idx dmax = g.D > g.Dv ? g.D : g.Dv;
  return dmax <= 64 ? 64 : dmax <= 128 ? 128 : dmax <= kMaxHeadDim ? 256 : 0;
}

template <class T, class A, int DM>
int forward_dm(const Geom& g, In q, In k, In v, const Mask& m, Out out, void* lse, cudaStream_t s) {
  forward_kernel<T, A, DM><<<row_blocks(g.Nq, g), kRows, 0, s>>>(g, q, k, v, m, out, static_cast<A*>(lse));
  return last_error();
}

template <class T, class A>
int forward_t(const Geom& g, In q, In k, In v, const Mask& m, Out out, void* lse, cudaStream_t s) {
  switch (dm_for(g)) {
    case 64: return forward_dm<T, A, 64>(g, q, k, v, m, out, lse, s);
    case 128: return forward_dm<T, A, 128>(g, q, k, v, m, out, lse, s);
    case 256: return forward_dm<T, A, 256>(g, q, k, v, m, out, lse, s);
    default: return invalid();
  }
}

template <class T, class A, int DM>
int backward_dm(const Geom& g, In q, In k, In v, In dout, const A* L, const A* delta, const Mask& m, Out dq, Out dk,
                Out dv, cudaStream_t s) {
  if (dq.p) {
    dq_kernel<T, A, DM><<<row_blocks(g.Nq, g), kRows, 0, s>>>(g, q, k, v, dout, L, delta, m, dq);
    if (const int e = last_error()) return e;
  }
  if (dk.p || dv.p) {
    dkdv_kernel<T, A, DM><<<row_blocks(g.Nk, g), kRows, 0, s>>>(g, q, k, v, dout, L, delta, m, dk, dv);
    if (const int e = last_error()) return e;
  }
  return 0;
}

template <class T, class A>
int backward_t(const Geom& g, In q, In k, In v, In out, In dout, const void* lse, const Mask& m, Out dq, Out dk,
               Out dv, void* scratch, cudaStream_t s) {
  if (!dq.p && !dk.p && !dv.p) return 0;
  const int dm = dm_for(g);
  if (dm == 0) return invalid();
  A* delta = static_cast<A*>(scratch);
  const A* L = static_cast<const A*>(lse);
  delta_kernel<T, A><<<rows_grid(g.B * g.H * g.Nq), kThreads, 0, s>>>(g, out, dout, delta);
  if (const int e = last_error()) return e;
  if (dm == 64) return backward_dm<T, A, 64>(g, q, k, v, dout, L, delta, m, dq, dk, dv, s);
  if (dm == 128) return backward_dm<T, A, 128>(g, q, k, v, dout, L, delta, m, dq, dk, dv, s);
  return backward_dm<T, A, 256>(g, q, k, v, dout, L, delta, m, dq, dk, dv, s);
}

template <class T, class A>
int merge_t(const Geom& g, Out out, void* lse, In out_b, const void* lse_b, cudaStream_t s) {
  merge_kernel<T, A><<<rows_grid(g.B * g.H * g.Nq), kThreads, 0, s>>>(g, out, static_cast<A*>(lse), out_b,
                                                                 static_cast<const A*>(lse_b));
  return last_error();
}

}  // namespace

int forward(int dtype, const Geom& g, In q, In k, In v, const Mask& m, Out out, void* lse, void* stream) {
  if (g.B * g.H * g.Nq == 0) return 0;
  const auto s = as_stream(stream);
  if (dtype == 1) return forward_t<double, double>(g, q, k, v, m, out, lse, s);
  if (dtype == 2) return forward_t<__nv_bfloat16, float>(g, q, k, v, m, out, lse, s);
  if (dtype == 3) return forward_t<__half, float>(g, q, k, v, m, out, lse, s);
  return forward_t<float, float>(g, q, k, v, m, out, lse, s);
}

std::size_t backward_scratch_bytes(int dtype, const Geom& g) {
  return static_cast<std::size_t>(g.B * g.H * g.Nq) * (dtype == 1 ? sizeof(double) : sizeof(float));
}

int backward(int dtype, const Geom& g, In q, In k, In v, In out, In dout, const void* lse, const Mask& m, Out dq,
             Out dk, Out dv, void* scratch, void* stream) {
  if (g.B * g.H * g.Nq == 0 || g.Nk == 0) return 0;
  const auto s = as_stream(stream);
  if (dtype == 1) return backward_t<double, double>(g, q, k, v, out, dout, lse, m, dq, dk, dv, scratch, s);
  if (dtype == 2) return backward_t<__nv_bfloat16, float>(g, q, k, v, out, dout, lse, m, dq, dk, dv, scratch, s);
  if (dtype == 3) return backward_t<__half, float>(g, q, k, v, out, dout, lse, m, dq, dk, dv, scratch, s);
  return backward_t<float, float>(g, q, k, v, out, dout, lse, m, dq, dk, dv, scratch, s);
}

int merge(int dtype, const Geom& g, Out out, void* lse, In out_b, const void* lse_b, void* stream) {
  if (g.B * g.H * g.Nq == 0) return 0;
  const auto s = as_stream(stream);
  if (dtype == 1) return merge_t<double, double>(g, out, lse, out_b, lse_b, s);
  if (dtype == 2) return merge_t<__nv_bfloat16, float>(g, out, lse, out_b, lse_b, s);
  if (dtype == 3) return merge_t<__half, float>(g, out, lse, out_b, lse_b, s);
  return merge_t<float, float>(g, out, lse, out_b, lse_b, s);
}

}  // namespace shard::kernels::attention
