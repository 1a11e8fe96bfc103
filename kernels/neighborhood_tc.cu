// Tensor-core neighbourhood attention (nvcuda::wmma, float accumulation; f16, bf16, and f32 as
// TF32 under allow_tf32), with the building blocks of the local-attention kernels
// (kernels/tc_common.cuh, kernels/attention_tc.cu).
//
// Scheme. A block of 4 warps owns a patch of 64 queries: T0 x T1 x T2 = 64 positions (powers of
// two, chosen per call from the block's extents) that share one residue r_d modulo the dilation
// l_d in every dim, i_d = r_d + l_d (tile_d T_d + t_d). The keys any of them sees lie in the
// union of their windows: per dim the U_d = T_d + w_d - 1 raw positions
//   u_d = qoff_d + r_d + l_d (tile_d T_d + a_d - w_d / 2),  0 <= a_d < U_d
// (taken modulo nk_d on a wrapped dim; a key outside [0, nk) or the valid range is masked), and
// query slot t sees key slot a exactly when 0 <= a_d - t_d < w_d in every dim (window offset
// o_d = a_d - t_d). The union (U0 U1 U2 slots, raster order) is walked in tiles of 64 keys,
// gathered into shared memory, and every tile is the local attention's 64 x 64 block: S = Q K^T
// and the softmax, P V, on the tensor cores, with the window as the mask. A 2-D 7 x 7 window on an
// 8 x 8 patch computes 196 keys per query for 49 visible (flex_attention's 128-token 1-D blocks:
// ~900 for a 128-wide field).
// Backward: dQ the same way (and delta = dout . out per query, which dK / dV reads); dK / dV per
// patch of 64 keys (the same residue construction over nk) walking the union of the queries that
// see them: i_d = r_d - qoff_d + l_d (tile_d T_d + a_d - (w_d - 1 - w_d / 2)), and query slot a
// sees key slot t when 0 <= a_d - t_d < w_d. Deterministic: no atomics; dq, dk, dv are
// overwritten (keys no query sees get 0), as the contract says.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "attention_common.cuh"
#include "common.cuh"
#include "neighborhood_tc.cuh"
#include "tc_common.cuh"

namespace shard::kernels::nbhd::tc {
namespace {

using namespace shard::kernels::tc;
using attention::detail::smem_granted;

/// One call's patch: positions per dim T (product <= 64), union extents U = T + w - 1, blocks
/// per dim over the queries (nbq) and over the keys (nbk).
struct Patch {
  int T[3], U[3];
  idx nbq[3], nbk[3];
  idx NU;  ///< U0 U1 U2
};

__device__ inline idx wrap_mod(idx x, idx n) {
  x %= n;
  return x < 0 ? x + n : x;
}

__device__ inline idx at(const Operand& a, idx b, const idx (&i)[3], idx h) {
  return b * a.sb + i[0] * a.ss[0] + i[1] * a.ss[1] + i[2] * a.ss[2] + h * a.sh;
}

/// Whether every row of operand a can take 16-byte loads (aligned base, strides multiples of 16 bytes).
template <class T>
__device__ inline bool rows_aligned(const Operand& a) {
  constexpr idx VW = 16 / static_cast<idx>(sizeof(T));
  return reinterpret_cast<std::uintptr_t>(a.data) % 16 == 0 && a.sb % VW == 0 && a.ss[0] % VW == 0 &&
         a.ss[1] % VW == 0 && a.ss[2] % VW == 0 && a.sh % VW == 0;
}

/// Slot s (< T0 T1 T2 or < U0 U1 U2) of extents n as coordinates, raster order (dim 2 fastest).
__device__ inline void coords(int s, const int (&n)[3], int (&c)[3]) {
  c[2] = s % n[2];
  c[1] = (s / n[2]) % n[1];
  c[0] = s / (n[2] * n[1]);
}

/// The block's residue and tile per dim, from blockIdx.x over nb blocks per dim.
__device__ inline void block_patch(const Geom& g, const idx (&nb)[3], idx (&r)[3], idx (&tile)[3]) {
  idx x = blockIdx.x;
  for (int d = 2; d >= 0; --d) {
    const idx c = x % nb[d];
    x /= nb[d];
    r[d] = c % g.dilation[d];
    tile[d] = c / g.dilation[d];
  }
}

/// Row of the [B, n0, n1, n2, H] per-query arrays (lse, delta).
__device__ inline idx qrow(const Geom& g, idx b, const idx (&i)[3], idx h) {
  return ((b * g.nq[0] + i[0]) * g.nq[1] + i[1]) * g.nq[2] * g.H + i[2] * g.H + h;
}

/// Slot table entry: coordinates in the patch / union and the grid index (valid = 0: no row).
struct Slot {
  int a[3];
  int valid;
  idx e[3];
};

/// Key slot s of the forward's union (queries' patch r, tile): its grid index and validity.
__device__ inline Slot key_slot(const Geom& g, const Patch& P, const idx (&r)[3], const idx (&tile)[3], idx s) {
  Slot k{};
  k.valid = s < P.NU;
  if (!k.valid) return k;
  coords(static_cast<int>(s), P.U, k.a);
  for (int d = 0; d < 3; ++d) {
    idx u = g.qoff[d] + r[d] + g.dilation[d] * (tile[d] * P.T[d] + k.a[d] - g.window[d] / 2);
    if (g.wrap[d]) u = wrap_mod(u, g.nk[d]);
    k.e[d] = u;
    k.valid = k.valid && u >= 0 && u < g.nk[d] && u >= g.valid_lo[d] && u < g.valid_hi[d];
  }
  return k;
}
/// Query slot s of the dK / dV union (keys' patch r, tile).
__device__ inline Slot query_slot(const Geom& g, const Patch& P, const idx (&r)[3], const idx (&tile)[3], idx s) {
  Slot q{};
  q.valid = s < P.NU;
  if (!q.valid) return q;
  coords(static_cast<int>(s), P.U, q.a);
  for (int d = 0; d < 3; ++d) {
    const idx w = g.window[d];
    idx i = r[d] - g.qoff[d] + g.dilation[d] * (tile[d] * P.T[d] + q.a[d] - (w - 1 - w / 2));
    if (g.wrap[d]) i = wrap_mod(i, g.nk[d]);
    q.e[d] = i;
    q.valid = q.valid && i >= 0 && i < g.nq[d];
  }
  return q;
}
/// Own slot t (< 64) of a patch over extents n: its grid position r + l (tile T + t).
__device__ inline Slot own_slot(const Geom& g, const Patch& P, const idx (&n)[3], const idx (&r)[3],
                                const idx (&tile)[3], int t) {
  Slot o{};
  o.valid = t < P.T[0] * P.T[1] * P.T[2];
  if (!o.valid) return o;
  coords(t, P.T, o.a);
  for (int d = 0; d < 3; ++d) {
    o.e[d] = r[d] + g.dilation[d] * (tile[d] * P.T[d] + o.a[d]);
    o.valid = o.valid && o.e[d] < n[d];
  }
  return o;
}
/// Whether own slot o and union slot u are in one window: 0 <= u.a - o.a < w in every dim.
__device__ inline bool sees(const Geom& g, const Slot& o, const Slot& u) {
  return static_cast<unsigned>(u.a[0] - o.a[0]) < static_cast<unsigned>(g.window[0]) &&
         static_cast<unsigned>(u.a[1] - o.a[1]) < static_cast<unsigned>(g.window[1]) &&
         static_cast<unsigned>(u.a[2] - o.a[2]) < static_cast<unsigned>(g.window[2]);
}

/// Writes (overwrites) the warp's rows [16w, +16) of the float tile O (ld ldo, width cols) into
/// operand o at the positions of own slots that exist.
template <class T>
__device__ inline void write_own_rows(const Operand& o, const Slot* own, idx b, idx h, const float* O, int ldo,
                                      idx width, int w, int lane) {
  const int n = static_cast<int>(width);
  T* G = static_cast<T*>(const_cast<void*>(o.data));
  for (int e = lane; e < 16 * n; e += 32) {
    const int rr = 16 * w + e / n, d = e % n;
    if (own[rr].valid) G[at(o, b, own[rr].e, h) + d] = attention::detail::from_acc<T>(O[rr * ldo + d]);
  }
}

/// Shared memory beyond the attention layout: two slot tables of 64 entries.
constexpr std::size_t kSlots = 2 * 64 * sizeof(Slot);

// ---- forward -------------------------------------------------------------------------------

template <class T, class Tag, int DM>
__device__ void forward_body(const Geom& g, const Patch& P, Operand q, Operand k, Operand v, Operand out, float* lse) {
  using E = typename Elem<Tag>::E;
  using L = Lay<Tag, DM>;
  constexpr int NF = DM / 16, KS = Elem<Tag>::KS;
  extern __shared__ float4 smem4[];
  char* base = reinterpret_cast<char*>(smem4);
  E* Qs = reinterpret_cast<E*>(base);
  E* Ks = reinterpret_cast<E*>(base + L::kE);
  E* Vs = reinterpret_cast<E*>(base + 2 * L::kE);
  float* Ss = reinterpret_cast<float*>(base + 3 * L::kE);
  E* Ps = reinterpret_cast<E*>(base + 3 * L::kE + L::kS);
  float* Rid = reinterpret_cast<float*>(base + 3 * L::kE + L::kS + L::kP);
  float* Rf = Rid + 256;
  Slot* Own = reinterpret_cast<Slot*>(base + L::fwd);
  Slot* Ksl = Own + 64;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const idx b = blockIdx.z, h = blockIdx.y;
  idx r[3], tile[3];
  block_patch(g, P.nbq, r, tile);
  const T* Qp = static_cast<const T*>(q.data);
  const T* Kp = static_cast<const T*>(k.data);
  const T* Vp = static_cast<const T*>(v.data);
  const bool vq = rows_aligned<T>(q), vk = rows_aligned<T>(k), vv = rows_aligned<T>(v);
  if (threadIdx.x < 64) Own[threadIdx.x] = own_slot(g, P, g.nq, r, tile, threadIdx.x);
  for (int e = threadIdx.x; e < 256; e += kT) Rid[e] = static_cast<float>(e / 16);
  __syncthreads();
  stage_rows<Tag, DM, T>(Qs, L::LDE, [&](int rr) { return Own[rr].valid ? Qp + at(q, b, Own[rr].e, h) : nullptr; },
                         g.D, vq);
  FragC<Tag> rid, o[NF];
  wmma::load_matrix_sync(rid, Rid, 16, wmma::mem_row_major);
#pragma unroll
  for (int n = 0; n < NF; ++n) wmma::fill_fragment(o[n], 0.f);
  const int rw = 16 * w + (lane >> 1), c0 = 32 * (lane & 1);
  const Slot me = Own[rw];
  float mx = -INFINITY, l = 0.f;
  const int kd = round_up(g.D, KS);
  const float scale = static_cast<float>(g.scale);
  for (idx j0 = 0; j0 < P.NU; j0 += kBR) {
    __syncthreads();  // every warp is done with the previous tile
    if (threadIdx.x < 64) Ksl[threadIdx.x] = key_slot(g, P, r, tile, j0 + threadIdx.x);
    __syncthreads();
    stage_rows<Tag, DM, T>(Ks, L::LDE, [&](int rr) { return Ksl[rr].valid ? Kp + at(k, b, Ksl[rr].e, h) : nullptr; },
                           g.D, vk);
    stage_rows<Tag, DM, T>(Vs, L::LDE, [&](int rr) { return Ksl[rr].valid ? Vp + at(v, b, Ksl[rr].e, h) : nullptr; },
                           g.Dv, vv);
    __syncthreads();
    {
      FragC<Tag> s[4];
      scores<Tag>(s, Qs, L::LDE, Ks, L::LDE, kd, w);
      store_scores<Tag>(Ss, s, w);
    }
    __syncwarp();
    float* srow = Ss + rw * kLS;
    E* prow = Ps + rw * L::LDP;
    online_softmax<Tag>(
        srow, prow, c0,
        [&](int c, float raw) {
          const Slot& ks = Ksl[c];
          return me.valid && ks.valid && sees(g, me, ks) ? raw * scale : -INFINITY;
        },
        mx, l, Rf, rw, lane);
    __syncwarp();
    scale_rows<Tag, NF>(o, rid, Rf, w);
    const idx nk = P.NU - j0 < kBR ? P.NU - j0 : kBR;
    accumulate<Tag, NF>(o, Ps, L::LDP, Vs, L::LDE, round_up(nk, KS), g.Dv, w);
  }
  __syncthreads();
  float* Os = reinterpret_cast<float*>(base + L::kE);
  if ((lane & 1) == 0) {
    Rf[rw] = l == 0.f ? 0.f : 1.f / l;
    if (me.valid) lse[qrow(g, b, me.e, h)] = l == 0.f ? -INFINITY : mx + logf(l);
  }
  __syncwarp();
  scale_rows<Tag, NF>(o, rid, Rf, w);
  store_rows<Tag, NF>(Os, L::LDO, o, w);
  __syncwarp();
  write_own_rows<T>(out, Own, b, h, Os, L::LDO, g.Dv, w, lane);
}

// ---- backward: dQ and delta ----------------------------------------------------------------

template <class T, class Tag, int DM>
__device__ void dq_body(const Geom& g, const Patch& P, Operand q, Operand k, Operand v, Operand out, Operand dout,
                        const float* lse, Operand dq, float* delta) {
  using E = typename Elem<Tag>::E;
  using L = Lay<Tag, DM>;
  constexpr int NF = DM / 16, KS = Elem<Tag>::KS;
  extern __shared__ float4 smem4[];
  char* base = reinterpret_cast<char*>(smem4);
  E* Qs = reinterpret_cast<E*>(base);
  E* dOs = reinterpret_cast<E*>(base + L::kE);
  E* Ks = reinterpret_cast<E*>(base + 2 * L::kE);
  E* Vs = reinterpret_cast<E*>(base + 3 * L::kE);
  float* Ss = reinterpret_cast<float*>(base + 4 * L::kE);
  float* dPs = reinterpret_cast<float*>(base + 4 * L::kE + L::kS);
  E* dSs = reinterpret_cast<E*>(base + 4 * L::kE + 2 * L::kS);
  Slot* Own = reinterpret_cast<Slot*>(base + L::dq);
  Slot* Ksl = Own + 64;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const idx b = blockIdx.z, h = blockIdx.y;
  idx r[3], tile[3];
  block_patch(g, P.nbq, r, tile);
  const T* Kp = static_cast<const T*>(k.data);
  const T* Vp = static_cast<const T*>(v.data);
  const T* Qp = static_cast<const T*>(q.data);
  const T* dOp = static_cast<const T*>(dout.data);
  const T* OutP = static_cast<const T*>(out.data);
  if (threadIdx.x < 64) Own[threadIdx.x] = own_slot(g, P, g.nq, r, tile, threadIdx.x);
  __syncthreads();
  const int rw = 16 * w + (lane >> 1), c0 = 32 * (lane & 1);
  const Slot me = Own[rw];
  // delta = dout . out of the lane pair's row (each lane half the elements)
  float dl = 0.f;
  if (me.valid) {
    const T* a = dOp + at(dout, b, me.e, h);
    const T* o = OutP + at(out, b, me.e, h);
    for (idx d = lane & 1; d < g.Dv; d += 2) dl += attention::detail::to_acc(a[d]) * attention::detail::to_acc(o[d]);
  }
  dl += __shfl_xor_sync(0xffffffffu, dl, 1);
  const idx row = me.valid ? qrow(g, b, me.e, h) : 0;
  if (me.valid && (lane & 1) == 0) delta[row] = dl;
  if (!dq.data) return;  // block-uniform
  stage_rows<Tag, DM, T>(Qs, L::LDE, [&](int rr) { return Own[rr].valid ? Qp + at(q, b, Own[rr].e, h) : nullptr; },
                         g.D, rows_aligned<T>(q));
  stage_rows<Tag, DM, T>(dOs, L::LDE,
                         [&](int rr) { return Own[rr].valid ? dOp + at(dout, b, Own[rr].e, h) : nullptr; }, g.Dv,
                         rows_aligned<T>(dout));
  const float Lr = me.valid ? lse[row] : -INFINITY;
  const bool ok = Lr != -INFINITY;
  FragC<Tag> acc[NF];
#pragma unroll
  for (int n = 0; n < NF; ++n) wmma::fill_fragment(acc[n], 0.f);
  const int kd = round_up(g.D, KS), kv = round_up(g.Dv, KS);
  const float scale = static_cast<float>(g.scale);
  const bool vk = rows_aligned<T>(k), vv = rows_aligned<T>(v);
  for (idx j0 = 0; j0 < P.NU; j0 += kBR) {
    __syncthreads();
    if (threadIdx.x < 64) Ksl[threadIdx.x] = key_slot(g, P, r, tile, j0 + threadIdx.x);
    __syncthreads();
    stage_rows<Tag, DM, T>(Ks, L::LDE, [&](int rr) { return Ksl[rr].valid ? Kp + at(k, b, Ksl[rr].e, h) : nullptr; },
                           g.D, vk);
    stage_rows<Tag, DM, T>(Vs, L::LDE, [&](int rr) { return Ksl[rr].valid ? Vp + at(v, b, Ksl[rr].e, h) : nullptr; },
                           g.Dv, vv);
    __syncthreads();
    {
      FragC<Tag> s[4];
      scores<Tag>(s, Qs, L::LDE, Ks, L::LDE, kd, w);
      store_scores<Tag>(Ss, s, w);
      scores<Tag>(s, dOs, L::LDE, Vs, L::LDE, kv, w);
      store_scores<Tag>(dPs, s, w);
    }
    __syncwarp();
#pragma unroll 8
    for (int c = c0; c < c0 + 32; ++c) {
      const Slot& ks = Ksl[c];
      const bool vis = ok && ks.valid && sees(g, me, ks);
      const float ds = vis ? expf(Ss[rw * kLS + c] * scale - Lr) * (dPs[rw * kLS + c] - dl) * scale : 0.f;
      dSs[rw * L::LDP + c] = Elem<Tag>::from(ds);
    }
    __syncwarp();
    const idx nk = P.NU - j0 < kBR ? P.NU - j0 : kBR;
    accumulate<Tag, NF>(acc, dSs, L::LDP, Ks, L::LDE, round_up(nk, KS), g.D, w);
  }
  __syncthreads();
  float* Os = reinterpret_cast<float*>(base + 2 * L::kE);
  store_rows<Tag, NF>(Os, L::LDO, acc, w);
  __syncwarp();
  write_own_rows<T>(dq, Own, b, h, Os, L::LDO, g.D, w, lane);
}

// ---- backward: dK and dV -------------------------------------------------------------------

template <class T, class Tag, int DM>
__device__ void dkdv_body(const Geom& g, const Patch& P, Operand q, Operand k, Operand v, Operand dout,
                          const float* lse, const float* delta, Operand dk, Operand dv) {
  using E = typename Elem<Tag>::E;
  using L = Lay<Tag, DM>;
  constexpr int NF = DM / 16, KS = Elem<Tag>::KS;
  extern __shared__ float4 smem4[];
  char* base = reinterpret_cast<char*>(smem4);
  E* Ks = reinterpret_cast<E*>(base);
  E* Vs = reinterpret_cast<E*>(base + L::kE);
  E* Qs = reinterpret_cast<E*>(base + 2 * L::kE);
  E* dOs = reinterpret_cast<E*>(base + 3 * L::kE);
  float* St = reinterpret_cast<float*>(base + 4 * L::kE);
  float* dPt = reinterpret_cast<float*>(base + 4 * L::kE + L::kS);
  E* Pt = reinterpret_cast<E*>(base + 4 * L::kE + 2 * L::kS);
  E* dSt = reinterpret_cast<E*>(base + 4 * L::kE + 2 * L::kS + L::kP);
  float* Ls = reinterpret_cast<float*>(base + 4 * L::kE + 2 * L::kS + 2 * L::kP);
  float* Ds = Ls + kBR;
  Slot* Own = reinterpret_cast<Slot*>(base + L::dkdv);
  Slot* Qsl = Own + 64;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const idx b = blockIdx.z, h = blockIdx.y;
  idx r[3], tile[3];
  block_patch(g, P.nbk, r, tile);
  const T* Qp = static_cast<const T*>(q.data);
  const T* dOp = static_cast<const T*>(dout.data);
  const T* Kp = static_cast<const T*>(k.data);
  const T* Vp = static_cast<const T*>(v.data);
  if (threadIdx.x < 64) Own[threadIdx.x] = own_slot(g, P, g.nk, r, tile, threadIdx.x);
  __syncthreads();
  stage_rows<Tag, DM, T>(Ks, L::LDE, [&](int rr) { return Own[rr].valid ? Kp + at(k, b, Own[rr].e, h) : nullptr; },
                         g.D, rows_aligned<T>(k));
  stage_rows<Tag, DM, T>(Vs, L::LDE, [&](int rr) { return Own[rr].valid ? Vp + at(v, b, Own[rr].e, h) : nullptr; },
                         g.Dv, rows_aligned<T>(v));
  const int rw = 16 * w + (lane >> 1), c0 = 32 * (lane & 1);
  Slot me = Own[rw];
  for (int d = 0; d < 3; ++d)  // a key outside the domain takes part in no window: its gradient is 0
    me.valid = me.valid && me.e[d] >= g.valid_lo[d] && me.e[d] < g.valid_hi[d];
  FragC<Tag> gk[NF], gv[NF];
#pragma unroll
  for (int n = 0; n < NF; ++n) wmma::fill_fragment(gk[n], 0.f), wmma::fill_fragment(gv[n], 0.f);
  const int kd = round_up(g.D, KS), kv = round_up(g.Dv, KS);
  const float scale = static_cast<float>(g.scale);
  const bool vq = rows_aligned<T>(q), vo = rows_aligned<T>(dout);
  for (idx a0 = 0; a0 < P.NU; a0 += kBR) {
    __syncthreads();
    if (threadIdx.x < 64) {
      const Slot s = query_slot(g, P, r, tile, a0 + threadIdx.x);
      Qsl[threadIdx.x] = s;
      const idx row = s.valid ? qrow(g, b, s.e, h) : 0;
      Ls[threadIdx.x] = s.valid ? lse[row] : -INFINITY;
      Ds[threadIdx.x] = s.valid ? delta[row] : 0.f;
    }
    __syncthreads();
    stage_rows<Tag, DM, T>(Qs, L::LDE, [&](int rr) { return Qsl[rr].valid ? Qp + at(q, b, Qsl[rr].e, h) : nullptr; },
                           g.D, vq);
    stage_rows<Tag, DM, T>(dOs, L::LDE,
                           [&](int rr) { return Qsl[rr].valid ? dOp + at(dout, b, Qsl[rr].e, h) : nullptr; }, g.Dv,
                           vo);
    __syncthreads();
    {
      FragC<Tag> s[4];
      scores<Tag>(s, Ks, L::LDE, Qs, L::LDE, kd, w);
      store_scores<Tag>(St, s, w);
      scores<Tag>(s, Vs, L::LDE, dOs, L::LDE, kv, w);
      store_scores<Tag>(dPt, s, w);
    }
    __syncwarp();
#pragma unroll 8
    for (int c = c0; c < c0 + 32; ++c) {
      const float Li = Ls[c];
      const bool vis = me.valid && Li != -INFINITY && sees(g, me, Qsl[c]);
      const float p = vis ? expf(St[rw * kLS + c] * scale - Li) : 0.f;
      Pt[rw * L::LDP + c] = Elem<Tag>::from(p);
      dSt[rw * L::LDP + c] = Elem<Tag>::from(p * (dPt[rw * kLS + c] - Ds[c]) * scale);
    }
    __syncwarp();
    const idx nq = P.NU - a0 < kBR ? P.NU - a0 : kBR;
    const int kr = round_up(nq, KS);
    accumulate<Tag, NF>(gv, Pt, L::LDP, dOs, L::LDE, kr, g.Dv, w);
    accumulate<Tag, NF>(gk, dSt, L::LDP, Qs, L::LDE, kr, g.D, w);
  }
  __syncthreads();
  float* Os = reinterpret_cast<float*>(base + 2 * L::kE);
  if (dk.data) {
    store_rows<Tag, NF>(Os, L::LDO, gk, w);
    __syncwarp();
    write_own_rows<T>(dk, Own, b, h, Os, L::LDO, g.D, w, lane);
    __syncwarp();
  }
  if (dv.data) {
    store_rows<Tag, NF>(Os, L::LDO, gv, w);
    __syncwarp();
    write_own_rows<T>(dv, Own, b, h, Os, L::LDO, g.Dv, w, lane);
  }
}

// ---- kernels -------------------------------------------------------------------------------

template <class T, class Tag, int DM>
__global__ void __launch_bounds__(kT) forward_kernel(Geom g, Patch P, Operand q, Operand k, Operand v, Operand out,
                                                    float* lse) {
  if constexpr (NeedsSm80Here<Tag>::value) {
    __trap();
  } else {
    forward_body<T, Tag, DM>(g, P, q, k, v, out, lse);
  }
}
template <class T, class Tag, int DM>
__global__ void __launch_bounds__(kT) dq_kernel(Geom g, Patch P, Operand q, Operand k, Operand v, Operand out,
                                               Operand dout, const float* lse, Operand dq, float* delta) {
  if constexpr (NeedsSm80Here<Tag>::value) {
    __trap();
  } else {
    dq_body<T, Tag, DM>(g, P, q, k, v, out, dout, lse, dq, delta);
  }
}
template <class T, class Tag, int DM>
__global__ void __launch_bounds__(kT) dkdv_kernel(Geom g, Patch P, Operand q, Operand k, Operand v, Operand dout,
                                                 const float* lse, const float* delta, Operand dk, Operand dv) {
  if constexpr (NeedsSm80Here<Tag>::value) {
    __trap();
  } else {
    dkdv_body<T, Tag, DM>(g, P, q, k, v, dout, lse, delta, dk, dv);
  }
}

// ---- host side -----------------------------------------------------------------------------

bool enabled() {
  static const bool on = [] {
    const char* e = std::getenv("SHARDTENSOR_NBHD_TC");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

template <class Tag, int DM>
constexpr std::size_t fwd_bytes() { return Lay<Tag, DM>::fwd + kSlots; }
template <class Tag, int DM>
constexpr std::size_t dq_bytes() { return Lay<Tag, DM>::dq + kSlots; }
template <class Tag, int DM>
constexpr std::size_t dkdv_bytes() { return Lay<Tag, DM>::dkdv + kSlots; }

template <class T, class Tag, int DM>
unsigned g_fwd_state[2] = {0, 0};
template <class T, class Tag, int DM>
unsigned g_dq_state[2] = {0, 0};
template <class T, class Tag, int DM>
unsigned g_dkv_state[2] = {0, 0};

template <class T, class Tag, int DM>
bool fwd_ready() {
  return smem_granted(forward_kernel<T, Tag, DM>, fwd_bytes<Tag, DM>(), g_fwd_state<T, Tag, DM>);
}
template <class T, class Tag, int DM>
bool bwd_ready() {
  return smem_granted(dq_kernel<T, Tag, DM>, dq_bytes<Tag, DM>(), g_dq_state<T, Tag, DM>) &&
         smem_granted(dkdv_kernel<T, Tag, DM>, dkdv_bytes<Tag, DM>(), g_dkv_state<T, Tag, DM>);
}

/// The patch of a call: 64 = 2^6 positions handed out one doubling at a time to the dim with
/// the most positions per residue class left (ceil(n / l) / T), never past that count.
Patch patch_of(const Geom& g) {
  Patch P{};
  idx per[3];
  for (int d = 0; d < 3; ++d) {
    P.T[d] = 1;
    per[d] = (g.nq[d] + g.dilation[d] - 1) / g.dilation[d];
  }
  for (int step = 0; step < 6; ++step) {
    int best = -1;
    double most = 1.0;
    for (int d = 0; d < 3; ++d) {
      const double left = static_cast<double>(per[d]) / P.T[d];
      if (left > most) most = left, best = d;
    }
    if (best < 0) break;
    P.T[best] *= 2;
  }
  P.NU = 1;
  for (int d = 0; d < 3; ++d) {
    P.U[d] = P.T[d] + static_cast<int>(g.window[d]) - 1;
    P.NU *= P.U[d];
    const idx l = g.dilation[d];
    P.nbq[d] = l * (((g.nq[d] + l - 1) / l + P.T[d] - 1) / P.T[d]);
    P.nbk[d] = l * (((g.nk[d] + l - 1) / l + P.T[d] - 1) / P.T[d]);
  }
  return P;
}

unsigned blocks(const idx (&nb)[3]) { return static_cast<unsigned>(nb[0] * nb[1] * nb[2]); }
bool grid_fits(const Geom& g, const Patch& P) {
  const idx lim = 0x7fffffff;
  return g.H <= 65535 && g.B <= 65535 && P.nbq[0] * P.nbq[1] * P.nbq[2] <= lim && P.nbk[0] * P.nbk[1] * P.nbk[2] <= lim;
}

template <class F>
int by_form(int dtype, int flags, const Geom& g, F&& f) {
  if (!enabled() || g.D > kMaxDM || g.Dv > kMaxDM) return kDeclined;
  for (int d = 0; d < 3; ++d)
    if (g.window[d] < 1 || g.dilation[d] < 1 || g.window[d] > 4096) return kDeclined;
  const int sm = device_sm();
  const bool lowp = (flags & kLowpTensorCores) != 0;
  const bool dm64 = g.D <= 64 && g.Dv <= 64;
  if (dtype == f16 && lowp && sm >= 70) return f(__half{}, HalfTag{}, dm64);
  if (dtype == bf16 && lowp && sm >= 80) return f(__nv_bfloat16{}, Bf16Tag{}, dm64);
  if (dtype == f32 && (flags & kAllowTF32) && sm >= 80) return f(float{}, Tf32Tag{}, dm64);
  return kDeclined;
}

template <class T, class Tag, int DM>
int fwd_dm(const Geom& g, const Operand& q, const Operand& k, const Operand& v, const Operand& out, float* lse,
           cudaStream_t s) {
  const Patch P = patch_of(g);
  if (!grid_fits(g, P) || !fwd_ready<T, Tag, DM>()) return kDeclined;
  const dim3 grid(blocks(P.nbq), static_cast<unsigned>(g.H), static_cast<unsigned>(g.B));
  forward_kernel<T, Tag, DM><<<grid, kT, fwd_bytes<Tag, DM>(), s>>>(g, P, q, k, v, out, lse);
  return cu::last_error();
}

template <class T, class Tag, int DM>
int bwd_dm(const Geom& g, const Operand& q, const Operand& k, const Operand& v, const Operand& out,
           const Operand& dout, const float* lse, const Operand& dq, const Operand& dk, const Operand& dv,
           float* delta, cudaStream_t s) {
  const Patch P = patch_of(g);
  if (!grid_fits(g, P) || !bwd_ready<T, Tag, DM>()) return kDeclined;
  const dim3 gq(blocks(P.nbq), static_cast<unsigned>(g.H), static_cast<unsigned>(g.B));
  if (gq.x > 0) {  // no queries: dq is empty, and every key gets 0 below
    dq_kernel<T, Tag, DM><<<gq, kT, dq_bytes<Tag, DM>(), s>>>(g, P, q, k, v, out, dout, lse, dq, delta);
    if (const int e = cu::last_error()) return e;
  }
  if ((dk.data || dv.data) && blocks(P.nbk) > 0) {
    const dim3 gk(blocks(P.nbk), static_cast<unsigned>(g.H), static_cast<unsigned>(g.B));
    dkdv_kernel<T, Tag, DM><<<gk, kT, dkdv_bytes<Tag, DM>(), s>>>(g, P, q, k, v, dout, lse, delta, dk, dv);
    if (const int e = cu::last_error()) return e;
  }
  return 0;
}

}  // namespace

int forward(int dtype, int flags, const Geom& g, const Operand& q, const Operand& k, const Operand& v,
            const Operand& out, float* lse, cudaStream_t s) {
  return by_form(dtype, flags, g, [&](auto t, auto tag, bool dm64) {
    using T = decltype(t);
    using Tag = decltype(tag);
    return dm64 ? fwd_dm<T, Tag, 64>(g, q, k, v, out, lse, s) : fwd_dm<T, Tag, 128>(g, q, k, v, out, lse, s);
  });
}

int backward(int dtype, int flags, const Geom& g, const Operand& q, const Operand& k, const Operand& v,
             const Operand& out, const Operand& dout, const float* lse, const Operand& dq, const Operand& dk,
             const Operand& dv, float* delta, cudaStream_t s) {
  return by_form(dtype, flags, g, [&](auto t, auto tag, bool dm64) {
    using T = decltype(t);
    using Tag = decltype(tag);
    return dm64 ? bwd_dm<T, Tag, 64>(g, q, k, v, out, dout, lse, dq, dk, dv, delta, s)
                : bwd_dm<T, Tag, 128>(g, q, k, v, out, dout, lse, dq, dk, dv, delta, s);
  });
}

bool takes(int dtype, int flags, const Geom& g, bool backward) {
  return by_form(dtype, flags, g, [&](auto t, auto tag, bool dm64) {
           using T = decltype(t);
           using Tag = decltype(tag);
           if (!grid_fits(g, patch_of(g))) return kDeclined;
           const bool ok = dm64 ? (backward ? bwd_ready<T, Tag, 64>() : fwd_ready<T, Tag, 64>())
                                : (backward ? bwd_ready<T, Tag, 128>() : fwd_ready<T, Tag, 128>());
           return ok ? 1 : kDeclined;
         }) == 1;
}

}  // namespace shard::kernels::nbhd::tc
