// Attention kernel family on CUDA (float, double, bfloat16 and half with float accumulation): the blockwise
// (FlashAttention-style) forward with an online softmax, the backward from the final out / lse,
// and the lse merge (see src/kernels_api/attention.hpp and include/shardtensor/exec/attention.hpp).
// cuDNN's fused SDPA (src/cuda/attention_cudnn.cpp) is asked first for bf16 / f16; what it declines
// and every f32 / f64 call runs here. Two kernel sets:
//  - tiled (namespace tiled, float accumulation, head dims <= 128): register-blocked small GEMMs
//    over shared-memory tiles, 64 own rows per block; see the comment at that namespace.
//  - row kernels (f64, head dims 129..256, or SHARDTENSOR_ATTENTION_TILED=0):
//    - forward: one thread per query row (kRows rows per block); the block stages a tile of BK keys
//      and values in shared memory (converted to the accumulation type); each thread keeps its
//      (scaled) query, running max / sum and its output accumulator in registers. Memory O(N * D).
//    - backward: delta_i = dout_i . out_i (one thread per row), then two gather kernels without
//      atomics (deterministic): dQ with one thread per query walking the key tiles, and dK / dV
//      with one thread per key walking the query tiles (P recomputed from lse in both).
//    - Head dims up to 256 (template DM = 64 / 128 / 256 bounds the per-thread register arrays).
//  - merge: one thread per query row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "attention_common.cuh"
#include "attention_tc.cuh"
#include "common.cuh"
#include "kernels_api/attention.hpp"

namespace shard::kernels::attention {
namespace {

using namespace cu;
using namespace detail;
constexpr int kRows = 128;  ///< threads (query or key rows) per block

/// Keys per shared-memory tile: two tiles of BK x DM accumulation values, 32 KiB.
template <class A, int DM>
struct KeyTile {
  static constexpr int value = 16384 / (DM * static_cast<int>(sizeof(A)));
};

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

// ---------------------------------------------------------------------------------------------
// Tiled kernels (float accumulation: float, bfloat16 and half storage; head dims up to 128).
//
// The row kernels above do one shared-memory load per FMA (every thread reads the same key
// element), so they are bound by shared-memory issue, and with one thread per query a 4096-token
// head gives the GPU only 32 blocks. The tiled kernels are the memory-efficient scheme with
// register blocking: a block of kTT = 128 threads owns 64 rows (queries in forward and dQ, keys in
// dK / dV) and walks the other side in tiles of 32. Every product is a small GEMM over
// shared-memory tiles stored reduction-index-major ("k-major"), in which thread (ty, tx) =
// (tid / 8, tid % 8) keeps a 4 x 4 register tile (own rows 4ty..4ty+3, tile columns 4tx..4tx+3)
// or a 4 x 8 one for the head-dim outputs (columns 4tx..4tx+3 and 32+4tx..32+4tx+3), and reads
// one float4 of each operand per reduction step: 2 loads per 16 FMAs instead of 1 per FMA.
// Head dims are padded to DM = 64 or 128 (template): the output tile is 4 x DM / 8 per thread.
// The softmax statistics of a row live in the 8 lanes (tx) that share it and are combined with
// xor shuffles, so they never touch shared memory. Deterministic: no atomics; dQ and dK / dV
// are separate kernels as before, each recomputing P from the forward's lse.
namespace tiled {

constexpr int kTT = 128;         ///< threads per block
constexpr int kOwn = 64;         ///< rows a block owns (4 per ty)
constexpr int kIt = 32;          ///< rows per tile of the walked side (4 per tx)
constexpr int kSO = kOwn + 4;    ///< row stride of k-major tiles whose columns are own rows
constexpr int kSI = kIt + 4;     ///< row stride of k-major tiles whose columns are tile rows
constexpr int kMaxDM = 128;      ///< the largest padded head dim
/// Row stride of row-major [row][d] tiles.
template <int DM>
__host__ __device__ constexpr int sd() { return DM + 4; }
static_assert(kIt * kSO <= 64 * kSI, "a [kIt][kSO] tile must fit in a [DM][kSI] one it aliases");

__device__ inline float ninf() { return -INFINITY; }

/// Rows [r0, r0 + nr) of X (row stride sn, width w), times `scale`, into dst as k-major:
/// dst[d * stride + rr] for rr < rows, d < DM; zero outside the rows and the width.
template <int DM, class T>
__device__ inline void stage_kmajor(float* dst, int stride, int rows, const T* X, idx sn, idx r0, int nr, idx w,
                                    float scale) {
  for (int e = threadIdx.x; e < rows * DM; e += kTT) {
    const int rr = e / DM, d = e % DM;
    dst[d * stride + rr] = rr < nr && d < w ? to_acc(X[(r0 + rr) * sn + d]) * scale : 0.f;
  }
}
/// The same rows row-major: dst[rr * sd<DM>() + d].
template <int DM, class T>
__device__ inline void stage_rows(float* dst, int rows, const T* X, idx sn, idx r0, int nr, idx w) {
  for (int e = threadIdx.x; e < rows * DM; e += kTT) {
    const int rr = e / DM, d = e % DM;
    dst[rr * sd<DM>() + d] = rr < nr && d < w ? to_acc(X[(r0 + rr) * sn + d]) : 0.f;
  }
}

/// acc[r][c] += sum_{k < K} A[k][4ty + r] * B[k][4tx + c]  (A stride sa, B stride sb; K rounded
/// up to 4 reads zero padding).
__device__ inline void mma_tile(float (&acc)[4][4], const float* A, int sa, const float* B, int sb, int K, int ty,
                                int tx) {
  const int kk = (K + 3) & ~3;
#pragma unroll 4
  for (int k = 0; k < kk; ++k) {
    const float4 a = *reinterpret_cast<const float4*>(A + k * sa + 4 * ty);
    const float4 b = *reinterpret_cast<const float4*>(B + k * sb + 4 * tx);
    const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
  }
}
/// acc[r][c] += sum_{k < K} A[k][4ty + r] * B[k][col(c)] with col(c) = 32 (c / 4) + 4tx + c % 4:
/// the DM head-dim columns of a row-major tile B, NC = DM / 8 per thread.
template <int NC>
__device__ inline void mma_head(float (&acc)[4][NC], const float* A, int sa, const float* B, int sb, int K, int ty,
                                int tx) {
#pragma unroll 2
  for (int k = 0; k < K; ++k) {
    const float4 a = *reinterpret_cast<const float4*>(A + k * sa + 4 * ty);
    const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int gq = 0; gq < NC / 4; ++gq) {
      const float4 b = *reinterpret_cast<const float4*>(B + k * sb + 32 * gq + 4 * tx);
      const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][4 * gq + c] = fmaf(av[r], bv[c], acc[r][4 * gq + c]);
    }
  }
}
__device__ inline int head_col(int tx, int c) { return 32 * (c / 4) + 4 * tx + c % 4; }

/// Writes the thread's 4 x 4 tile transposed: dst[(4tx + c) * kSO + 4ty + r] = v[r][c].
__device__ inline void store_t(float* dst, const float (&v)[4][4], int ty, int tx) {
#pragma unroll
  for (int c = 0; c < 4; ++c)
    *reinterpret_cast<float4*>(dst + (4 * tx + c) * kSO + 4 * ty) = make_float4(v[0][c], v[1][c], v[2][c], v[3][c]);
}

/// Max / sum over the 8 lanes (tx) of a row group.
__device__ inline float row_max(float x) {
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ inline float row_sum(float x) {
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

/// Adds the 4 x NC head-dim tile of own rows [r0 + 4ty, +4) (valid where ok[r]) to gradient o.
template <class T, int NC>
__device__ inline void add_head(Out o, idx b, idx h, idx r0, const float (&acc)[4][NC], const bool (&ok)[4], idx w,
                                int ty, int tx) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    if (!ok[r]) continue;
    T* G = static_cast<T*>(o.p) + b * o.sb + h * o.sh + (r0 + 4 * ty + r) * o.sn;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = head_col(tx, c);
      if (d < w) G[d] = from_acc<T>(to_acc(G[d]) + acc[r][c]);
    }
  }
}

/// Dynamic shared memory (floats) of the forward kernel: Qt, Kt / P, Vn.
template <int DM>
constexpr int fwd_smem() { return DM * kSO + DM * kSI + kIt * sd<DM>(); }

/// Forward: 64 queries per block, key tiles of 32 (35 KiB of shared memory at DM 64, 70 at 128).
template <class T, int DM>
__global__ void __launch_bounds__(kTT) forward_kernel(Geom g, In q, In k, In v, Mask m, Out out, float* lse) {
  constexpr int NC = DM / 8;
  extern __shared__ float4 smem4[];
  float* Qt = reinterpret_cast<float*>(smem4);  // scaled queries, [d][row]
  float* KP = Qt + DM * kSO;                     // keys [d][j]; then P [j][row]
  float* Vn = KP + DM * kSI;                     // values [j][e]
  const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
  const idx b = blockIdx.z, h = blockIdx.y, i0 = static_cast<idx>(blockIdx.x) * kOwn;
  const int nq = static_cast<int>(g.Nq - i0 < kOwn ? g.Nq - i0 : kOwn);
  const T* K = head_rows<T>(k, b, h);
  const T* V = head_rows<T>(v, b, h);
  const float scale = static_cast<float>(m.scale);
  stage_kmajor<DM>(Qt, kSO, kOwn, head_rows<T>(q, b, h), q.sn, i0, nq, g.D, scale);
  float o[4][NC], mx[4], l[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    mx[r] = ninf();
    l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < NC; ++c) o[r][c] = 0.f;
  }
  const idx kend = key_end(g, m, i0 + nq);
  for (idx j0 = 0; j0 < kend; j0 += kIt) {
    const int nk = static_cast<int>(kend - j0 < kIt ? kend - j0 : kIt);
    __syncthreads();  // the previous tile's P and V are read
    stage_kmajor<DM>(KP, kSI, kIt, K, k.sn, j0, nk, g.D, 1.f);
    stage_rows<DM>(Vn, kIt, V, v.sn, j0, nk, g.Dv);
    __syncthreads();
    float s[4][4] = {};
    mma_tile(s, Qt, kSO, KP, kSI, static_cast<int>(g.D), ty, tx);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const idx i = i0 + 4 * ty + r;
      float tmax = ninf();
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const idx j = j0 + 4 * tx + c;
        const bool vis = 4 * tx + c < nk && 4 * ty + r < nq && !(m.causal && m.k_pos0 + j > m.q_pos0 + i);
        s[r][c] = vis ? s[r][c] + bias_at<T, float>(m, b, h, i, j) : ninf();
        tmax = fmaxf(tmax, s[r][c]);
      }
      // every lane of the warp takes part in both shuffles (full mask); rows with nothing
      // visible yet keep P = 0 and their statistics
      const float mnew = fmaxf(mx[r], row_max(tmax));
      const bool live = mnew != ninf();
      float ps = 0.f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[r][c] = live ? expf(s[r][c] - mnew) : 0.f;
        ps += s[r][c];
      }
      const float tot = row_sum(ps);
      if (live) {
        const float cs = expf(mx[r] - mnew);  // 0 when mx was -inf
        l[r] = l[r] * cs + tot;
#pragma unroll
        for (int c = 0; c < NC; ++c) o[r][c] *= cs;
        mx[r] = mnew;
      }
    }
    __syncthreads();  // every thread has read the keys
    store_t(KP, s, ty, tx);
    __syncthreads();
    mma_head(o, KP, kSO, Vn, sd<DM>(), nk, ty, tx);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const idx i = i0 + 4 * ty + r;
    if (4 * ty + r >= nq) continue;
    T* O = static_cast<T*>(out.p) + b * out.sb + h * out.sh + i * out.sn;
    const float inv = l[r] == 0.f ? 0.f : 1.f / l[r];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = head_col(tx, c);
      if (d < g.Dv) O[d] = from_acc<T>(o[r][c] * inv);
    }
    if (tx == 0) lse[(b * g.H + h) * g.Nq + i] = l[r] == 0.f ? ninf() : mx[r] + logf(l[r]);
  }
}

/// Dynamic shared memory (floats) of the dQ kernel: Qt, dOt, Kt / dSt, Vt, Kn (62 KiB at DM 64,
/// 121 at 128).
template <int DM>
constexpr int dq_smem() { return 2 * DM * kSO + 2 * DM * kSI + kIt * sd<DM>(); }
/// ... and of the dK / dV kernel: Kt, Vt, Qt / P, dOt / dS, Qn, dOn, lse, delta (69 / 137 KiB).
template <int DM>
constexpr int dkdv_smem() { return 2 * DM * kSO + 2 * DM * kSI + 2 * kIt * sd<DM>() + 2 * kIt; }

/// dQ: 64 queries per block, key tiles of 32; dQ += scale * dS K with dS = P (dP - delta).
template <class T, int DM>
__global__ void __launch_bounds__(kTT) dq_kernel(Geom g, In q, In k, In v, In dout, const float* lse,
                                                const float* delta, Mask m, Out dq) {
  extern __shared__ float4 smem4[];
  float* Qt = reinterpret_cast<float*>(smem4);  // [d][row], scaled
  float* dOt = Qt + DM * kSO;                    // [e][row]
  float* KS = dOt + DM * kSO;                    // keys [d][j]; then dS [j][row]
  float* Vt = KS + DM * kSI;                     // [e][j]
  float* Kn = Vt + DM * kSI;                     // [j][d]
  constexpr int NC = DM / 8;
  const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
  const idx b = blockIdx.z, h = blockIdx.y, i0 = static_cast<idx>(blockIdx.x) * kOwn;
  const int nq = static_cast<int>(g.Nq - i0 < kOwn ? g.Nq - i0 : kOwn);
  const T* K = head_rows<T>(k, b, h);
  const T* V = head_rows<T>(v, b, h);
  const float scale = static_cast<float>(m.scale);
  stage_kmajor<DM>(Qt, kSO, kOwn, head_rows<T>(q, b, h), q.sn, i0, nq, g.D, scale);
  stage_kmajor<DM>(dOt, kSO, kOwn, head_rows<T>(dout, b, h), dout.sn, i0, nq, g.Dv, 1.f);
  float L[4], dl[4], acc[4][NC];
  bool ok[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const idx i = i0 + 4 * ty + r;
    L[r] = 4 * ty + r < nq ? lse[(b * g.H + h) * g.Nq + i] : ninf();
    ok[r] = L[r] != ninf();  // rows with nothing visible contribute nothing
    dl[r] = ok[r] ? delta[(b * g.H + h) * g.Nq + i] : 0.f;
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = 0.f;
  }
  const idx kend = key_end(g, m, i0 + nq);
  for (idx j0 = 0; j0 < kend; j0 += kIt) {
    const int nk = static_cast<int>(kend - j0 < kIt ? kend - j0 : kIt);
    __syncthreads();  // the previous tile's dS and keys are read
    stage_kmajor<DM>(KS, kSI, kIt, K, k.sn, j0, nk, g.D, 1.f);
    stage_kmajor<DM>(Vt, kSI, kIt, V, v.sn, j0, nk, g.Dv, 1.f);
    stage_rows<DM>(Kn, kIt, K, k.sn, j0, nk, g.D);
    __syncthreads();
    float s[4][4] = {}, dp[4][4] = {};
    mma_tile(s, Qt, kSO, KS, kSI, static_cast<int>(g.D), ty, tx);
    mma_tile(dp, dOt, kSO, Vt, kSI, static_cast<int>(g.Dv), ty, tx);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const idx i = i0 + 4 * ty + r;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const idx j = j0 + 4 * tx + c;
        const bool vis = ok[r] && 4 * tx + c < nk && !(m.causal && m.k_pos0 + j > m.q_pos0 + i);
        const float sv = vis ? s[r][c] + bias_at<T, float>(m, b, h, i, j) : ninf();
        s[r][c] = sv == ninf() ? 0.f : expf(sv - L[r]) * (dp[r][c] - dl[r]) * scale;
      }
    }
    __syncthreads();  // every thread has read the keys
    store_t(KS, s, ty, tx);
    __syncthreads();
    mma_head(acc, KS, kSO, Kn, sd<DM>(), nk, ty, tx);
  }
  if (dq.p) add_head<T>(dq, b, h, i0, acc, ok, g.D, ty, tx);
}

/// dK and dV: 64 keys per block, query tiles of 32; dV += P^T dO, dK += scale * dS^T Q.
template <class T, int DM>
__global__ void __launch_bounds__(kTT) dkdv_kernel(Geom g, In q, In k, In v, In dout, const float* lse,
                                                  const float* delta, Mask m, Out dk, Out dv) {
  extern __shared__ float4 smem4[];
  float* Kt = reinterpret_cast<float*>(smem4);  // [d][row], scaled
  float* Vt = Kt + DM * kSO;                     // [e][row]
  float* QP = Vt + DM * kSO;                     // queries [d][i]; then P [i][row]
  float* OS = QP + DM * kSI;                     // dout [e][i]; then dS [i][row]
  float* Qn = OS + DM * kSI;                     // [i][d]
  float* On = Qn + kIt * sd<DM>();               // [i][e]
  float* Ls = On + kIt * sd<DM>();               // lse of the tile's queries
  constexpr int NC = DM / 8;
  float* Ds = Ls + kIt;                          // delta of the tile's queries
  const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
  const idx b = blockIdx.z, h = blockIdx.y, j0 = static_cast<idx>(blockIdx.x) * kOwn;
  const int nkb = static_cast<int>(g.Nk - j0 < kOwn ? g.Nk - j0 : kOwn);
  const T* Q = head_rows<T>(q, b, h);
  const T* dO = head_rows<T>(dout, b, h);
  const float* Lb = lse + (b * g.H + h) * g.Nq;
  const float* Db = delta + (b * g.H + h) * g.Nq;
  const float scale = static_cast<float>(m.scale);
  stage_kmajor<DM>(Kt, kSO, kOwn, head_rows<T>(k, b, h), k.sn, j0, nkb, g.D, scale);
  stage_kmajor<DM>(Vt, kSO, kOwn, head_rows<T>(v, b, h), v.sn, j0, nkb, g.Dv, 1.f);
  float gk[4][NC], gv[4][NC];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) gk[r][c] = gv[r][c] = 0.f;
  idx istart = 0;  // causal: the first query that sees the block's first key
  if (m.causal) {
    const idx s0 = m.k_pos0 + j0 - m.q_pos0;
    istart = s0 < 0 ? 0 : (s0 > g.Nq ? g.Nq : s0);
  }
  for (idx a0 = istart; a0 < g.Nq; a0 += kIt) {
    const int nq = static_cast<int>(g.Nq - a0 < kIt ? g.Nq - a0 : kIt);
    __syncthreads();  // the previous tile's P, dS, Q and dout are read
    stage_kmajor<DM>(QP, kSI, kIt, Q, q.sn, a0, nq, g.D, 1.f);
    stage_kmajor<DM>(OS, kSI, kIt, dO, dout.sn, a0, nq, g.Dv, 1.f);
    stage_rows<DM>(Qn, kIt, Q, q.sn, a0, nq, g.D);
    stage_rows<DM>(On, kIt, dO, dout.sn, a0, nq, g.Dv);
    for (int ii = threadIdx.x; ii < kIt; ii += kTT) {
      Ls[ii] = ii < nq ? Lb[a0 + ii] : ninf();
      Ds[ii] = ii < nq ? Db[a0 + ii] : 0.f;
    }
    __syncthreads();
    float s[4][4] = {}, dp[4][4] = {};
    mma_tile(s, Kt, kSO, QP, kSI, static_cast<int>(g.D), ty, tx);
    mma_tile(dp, Vt, kSO, OS, kSI, static_cast<int>(g.Dv), ty, tx);
    float p[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const idx j = j0 + 4 * ty + r;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const idx i = a0 + 4 * tx + c;
        const float Li = Ls[4 * tx + c];
        const bool vis = 4 * ty + r < nkb && Li != ninf() && !(m.causal && m.k_pos0 + j > m.q_pos0 + i);
        const float sv = vis ? s[r][c] + bias_at<T, float>(m, b, h, i, j) : ninf();
        p[r][c] = sv == ninf() ? 0.f : expf(sv - Li);
        s[r][c] = p[r][c] * (dp[r][c] - Ds[4 * tx + c]) * scale;
      }
    }
    __syncthreads();  // every thread has read Q and dout k-major
    store_t(QP, p, ty, tx);
    store_t(OS, s, ty, tx);
    __syncthreads();
    mma_head(gv, QP, kSO, On, sd<DM>(), nq, ty, tx);
    mma_head(gk, OS, kSO, Qn, sd<DM>(), nq, ty, tx);
  }
  bool ok[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) ok[r] = 4 * ty + r < nkb;
  if (dk.p) add_head<T>(dk, b, h, j0, gk, ok, g.D, ty, tx);
  if (dv.p) add_head<T>(dv, b, h, j0, gv, ok, g.Dv, ty, tx);
}

dim3 own_blocks(idx rows, const Geom& g) {
  return dim3(static_cast<unsigned>((rows + kOwn - 1) / kOwn), static_cast<unsigned>(g.H), static_cast<unsigned>(g.B));
}

/// Per kernel instantiation: the devices that granted / refused its shared memory.
template <class T, int DM>
unsigned g_fwd_state[2] = {0, 0};
template <class T, int DM>
unsigned g_dq_state[2] = {0, 0};
template <class T, int DM>
unsigned g_dkv_state[2] = {0, 0};

template <class T, int DM>
bool fwd_ready() {
  return smem_granted(forward_kernel<T, DM>, fwd_smem<DM>() * sizeof(float), g_fwd_state<T, DM>);
}
template <class T, int DM>
bool bwd_ready(bool dq, bool dkv) {
  return (!dq || smem_granted(dq_kernel<T, DM>, dq_smem<DM>() * sizeof(float), g_dq_state<T, DM>)) &&
         (!dkv || smem_granted(dkdv_kernel<T, DM>, dkdv_smem<DM>() * sizeof(float), g_dkv_state<T, DM>));
}

template <class T, int DM>
int fwd_dm(const Geom& g, In q, In k, In v, const Mask& m, Out out, void* lse, cudaStream_t s) {
  constexpr std::size_t bytes = fwd_smem<DM>() * sizeof(float);
  if (!fwd_ready<T, DM>()) return kDeclined;
  forward_kernel<T, DM><<<own_blocks(g.Nq, g), kTT, bytes, s>>>(g, q, k, v, m, out, static_cast<float*>(lse));
  return last_error();
}

template <class T, int DM>
int bwd_dm(const Geom& g, In q, In k, In v, In dout, const float* L, const float* delta, const Mask& m, Out dq,
           Out dk, Out dv, cudaStream_t s) {
  constexpr std::size_t bq = dq_smem<DM>() * sizeof(float), bkv = dkdv_smem<DM>() * sizeof(float);
  const bool want_kv = dk.p || dv.p;
  // both kernels' memory first: a refusal leaves nothing half done
  if (!bwd_ready<T, DM>(dq.p != nullptr, want_kv)) return kDeclined;
  if (dq.p) {
    dq_kernel<T, DM><<<own_blocks(g.Nq, g), kTT, bq, s>>>(g, q, k, v, dout, L, delta, m, dq);
    if (const int e = last_error()) return e;
  }
  if (want_kv) {
    dkdv_kernel<T, DM><<<own_blocks(g.Nk, g), kTT, bkv, s>>>(g, q, k, v, dout, L, delta, m, dk, dv);
    if (const int e = last_error()) return e;
  }
  return 0;
}

/// The padded head dim of a geometry: 64 or 128.
inline int dm_of(const Geom& g) { return g.D <= 64 && g.Dv <= 64 ? 64 : 128; }

template <class T>
int forward(const Geom& g, In q, In k, In v, const Mask& m, Out out, void* lse, cudaStream_t s) {
  return dm_of(g) == 64 ? fwd_dm<T, 64>(g, q, k, v, m, out, lse, s) : fwd_dm<T, 128>(g, q, k, v, m, out, lse, s);
}
template <class T>
int backward(const Geom& g, In q, In k, In v, In dout, const float* L, const float* delta, const Mask& m, Out dq,
             Out dk, Out dv, cudaStream_t s) {
  return dm_of(g) == 64 ? bwd_dm<T, 64>(g, q, k, v, dout, L, delta, m, dq, dk, dv, s)
                        : bwd_dm<T, 128>(g, q, k, v, dout, L, delta, m, dq, dk, dv, s);
}
/// Whether a launch of this geometry takes the tiled kernels on the current device.
template <class T>
bool ready(const Geom& g, bool backward, bool dq, bool dkv) {
  if (dm_of(g) == 64) return backward ? bwd_ready<T, 64>(dq, dkv) : fwd_ready<T, 64>();
  return backward ? bwd_ready<T, 128>(dq, dkv) : fwd_ready<T, 128>();
}

}  // namespace tiled

/// Whether the tiled kernels take (b, h) blocks of this geometry: float accumulation, head dims
/// <= 128, and not switched off (SHARDTENSOR_ATTENTION_TILED=0 keeps the row kernels, for A/B runs).
template <class A>
bool use_tiled(const Geom& g) {
  if (!std::is_same<A, float>::value || g.D > tiled::kMaxDM || g.Dv > tiled::kMaxDM) return false;
  static const bool on = [] {
    const char* e = std::getenv("SHARDTENSOR_ATTENTION_TILED");
    return !(e && e[0] == '0' && e[1] == '\0');
  }();
  return on;
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
int forward_t(int dtype, int flags, const Geom& g, In q, In k, In v, const Mask& m, Out out, void* lse,
              cudaStream_t s) {
  if constexpr (std::is_same<A, float>::value) {
    if (const int r = tc::forward(dtype, flags, g, q, k, v, m, out, static_cast<float*>(lse), s); r != kDeclined)
      return r;
  }
  if constexpr (std::is_same<A, float>::value)
    if (use_tiled<A>(g))
      if (const int r = tiled::forward<T>(g, q, k, v, m, out, lse, s); r != kDeclined) return r;
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
int backward_t(int dtype, int flags, const Geom& g, In q, In k, In v, In out, In dout, const void* lse, const Mask& m,
               Out dq, Out dk, Out dv, void* scratch, cudaStream_t s) {
  if (!dq.p && !dk.p && !dv.p) return 0;
  const int dm = dm_for(g);
  if (dm == 0) return invalid();
  A* delta = static_cast<A*>(scratch);
  const A* L = static_cast<const A*>(lse);
  delta_kernel<T, A><<<rows_grid(g.B * g.H * g.Nq), kThreads, 0, s>>>(g, out, dout, delta);
  if (const int e = last_error()) return e;
  if constexpr (std::is_same<A, float>::value) {
    if (const int r = tc::backward(dtype, flags, g, q, k, v, dout, L, delta, m, dq, dk, dv, s); r != kDeclined)
      return r;
  }
  if constexpr (std::is_same<A, float>::value)
    if (use_tiled<A>(g))
      if (const int r = tiled::backward<T>(g, q, k, v, dout, L, delta, m, dq, dk, dv, s); r != kDeclined)
        return r;
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

int forward(int dtype, const Geom& g, In q, In k, In v, const Mask& m, Out out, void* lse, void* stream, int flags) {
  if (g.B * g.H * g.Nq == 0) return 0;
  const auto s = as_stream(stream);
  if (dtype == 1) return forward_t<double, double>(dtype, flags, g, q, k, v, m, out, lse, s);
  if (dtype == 2) return forward_t<__nv_bfloat16, float>(dtype, flags, g, q, k, v, m, out, lse, s);
  if (dtype == 3) return forward_t<__half, float>(dtype, flags, g, q, k, v, m, out, lse, s);
  return forward_t<float, float>(dtype, flags, g, q, k, v, m, out, lse, s);
}

std::size_t backward_scratch_bytes(int dtype, const Geom& g) {
  return static_cast<std::size_t>(g.B * g.H * g.Nq) * (dtype == 1 ? sizeof(double) : sizeof(float));
}

int backward(int dtype, const Geom& g, In q, In k, In v, In out, In dout, const void* lse, const Mask& m, Out dq,
             Out dk, Out dv, void* scratch, void* stream, int flags) {
  if (g.B * g.H * g.Nq == 0 || g.Nk == 0) return 0;
  const auto s = as_stream(stream);
  if (dtype == 1)
    return backward_t<double, double>(dtype, flags, g, q, k, v, out, dout, lse, m, dq, dk, dv, scratch, s);
  if (dtype == 2)
    return backward_t<__nv_bfloat16, float>(dtype, flags, g, q, k, v, out, dout, lse, m, dq, dk, dv, scratch, s);
  if (dtype == 3)
    return backward_t<__half, float>(dtype, flags, g, q, k, v, out, dout, lse, m, dq, dk, dv, scratch, s);
  return backward_t<float, float>(dtype, flags, g, q, k, v, out, dout, lse, m, dq, dk, dv, scratch, s);
}

int kernel_set(int dtype, const Geom& g, bool backward, bool dq, bool dkv, int flags) {
  if (dtype == 1) return kRowKernels;
  if (tc::takes(dtype, flags, g, backward, dq, dkv)) return kTensorCores;
  if (!use_tiled<float>(g)) return kRowKernels;
  bool tiled_ok = false;
  if (dtype == 2) tiled_ok = tiled::ready<__nv_bfloat16>(g, backward, dq, dkv);
  else if (dtype == 3) tiled_ok = tiled::ready<__half>(g, backward, dq, dkv);
  else tiled_ok = tiled::ready<float>(g, backward, dq, dkv);
  return tiled_ok ? kTiled : kRowKernels;
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
