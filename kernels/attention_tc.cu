// Tensor-core attention kernels (nvcuda::wmma, float accumulation): the memory-efficient scheme of
// kernels/attention.cu's tiled kernels with every product on the tensor cores.
//  - f16 storage: half fragments, m16n16k16 (compute capability 7.0 and newer);
//  - bf16 storage: bfloat16 fragments, m16n16k16 (8.0 and newer);
//  - f32 storage with kAllowTF32 (ExecSettings::allow_tf32): TF32 fragments, m16n16k8 (8.0 and
//    newer); the operands are rounded to TF32 (10-bit mantissa, round to nearest, ties away) as
//    they are staged, the products accumulate in float.
// cuDNN's fused SDPA (src/cuda/attention_cudnn.cpp) is still asked first for bf16 / f16; these
// kernels take what it declines (no cudnn-frontend in the build, a bias, head dims that are not
// multiples of 8, ...) and f32 under allow_tf32.
//
// Scheme (FlashAttention-2's work split, deterministic): a block of 4 warps owns 64 rows
// (queries in forward and dQ, keys in dK / dV), each warp 16 of them, and walks the other side in
// tiles of 64 staged in shared memory (converted to the fragment's element type, head dims
// zero-padded to DM = 64 or 128). Per tile a warp computes its 16 x 64 score block S (and dP in
// the backward) with wmma, stores it to shared memory as float, and its 32 lanes (two per row, 32
// columns each) apply the scale, the mask and the softmax; the probabilities (or dS) go back to
// shared memory in the fragment type and feed the next wmma product (P V, dS K, P^T dO, dS^T Q).
// The forward's output stays in accumulator fragments across tiles; the online softmax rescales
// them per row through a fragment of row indices: a 16 x 16 matrix whose entries are their row
// numbers, loaded into an accumulator fragment of the same type, tells which row element x[t]
// of any such fragment belongs to (load_matrix_sync, mma_sync and store_matrix_sync of one
// fragment type agree on the element layout, whatever it is). dQ and dK / dV are separate
// kernels that recompute P from the forward's lse, as the SIMT kernels do: no atomics.
//
// bf16 / TF32 kernels compiled for an architecture below 8.0 trap; the host never launches them
// there (it asks the device's compute capability first).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "attention_common.cuh"
#include "attention_tc.cuh"
#include "common.cuh"
#include "tc_common.cuh"

namespace shard::kernels::attention::tc {
namespace {

using namespace detail;
using namespace shard::kernels::tc;

template <class T, class Keep>
__device__ inline void add_rows(Out o, idx b, idx h, idx r0, const float* O, int ldo, idx w_out, int nrows, int w,
                                int lane, Keep keep) {
  const int n = 16 * static_cast<int>(w_out);
  for (int e = lane; e < n; e += 32) {
    const int rr = 16 * w + e / static_cast<int>(w_out), d = e % static_cast<int>(w_out);
    if (rr >= nrows || !keep(rr)) continue;
    T* G = static_cast<T*>(o.p) + b * o.sb + h * o.sh + (r0 + rr) * o.sn + d;
    *G = from_acc<T>(to_acc(*G) + O[rr * ldo + d]);
  }
}

// ---- forward -------------------------------------------------------------------------------

template <class T, class Tag, int DM>
__device__ void forward_body(const Geom& g, In q, In k, In v, const Mask& m, Out out, float* lse) {
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
  float* Rf = Rid + 256;  // per row: the rescale factor, then 1 / l
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const idx b = blockIdx.z, h = blockIdx.y, i0 = static_cast<idx>(blockIdx.x) * kBR;
  const int nq = static_cast<int>(g.Nq - i0 < kBR ? g.Nq - i0 : kBR);
  const T* K = head_rows<T>(k, b, h);
  const T* V = head_rows<T>(v, b, h);
  const float scale = static_cast<float>(m.scale);
  stage<Tag, DM>(Qs, L::LDE, head_rows<T>(q, b, h), q.sn, i0, nq, g.D);
  for (int e = threadIdx.x; e < 256; e += kT) Rid[e] = static_cast<float>(e / 16);
  __syncthreads();
  FragC<Tag> rid, o[NF];
  wmma::load_matrix_sync(rid, Rid, 16, wmma::mem_row_major);
#pragma unroll
  for (int n = 0; n < NF; ++n) wmma::fill_fragment(o[n], 0.f);
  // softmax lanes: two per row (r), 32 columns each (c0)
  const int r = 16 * w + (lane >> 1), c0 = 32 * (lane & 1);
  const idx i = i0 + r;
  float mx = -INFINITY, l = 0.f;
  const int kd = round_up(g.D, KS);
  const idx kend = key_end(g, m, i0 + nq);
  for (idx j0 = 0; j0 < kend; j0 += kBR) {
    const int nk = static_cast<int>(kend - j0 < kBR ? kend - j0 : kBR);
    __syncthreads();  // every warp is done with the previous tile's keys and values
    stage<Tag, DM>(Ks, L::LDE, K, k.sn, j0, nk, g.D);
    stage<Tag, DM>(Vs, L::LDE, V, v.sn, j0, nk, g.Dv);
    __syncthreads();
    {
      FragC<Tag> s[4];
      scores<Tag>(s, Qs, L::LDE, Ks, L::LDE, kd, w);
      store_scores<Tag>(Ss, s, w);
    }
    __syncwarp();
    float* srow = Ss + r * kLS;
    E* prow = Ps + r * L::LDP;
    online_softmax<Tag>(
        srow, prow, c0,
        [&](int c, float raw) {
          const idx j = j0 + c;
          const bool vis = c < nk && r < nq && !(m.causal && m.k_pos0 + j > m.q_pos0 + i);
          return vis ? raw * scale + bias_at<T, float>(m, b, h, i, j) : -INFINITY;
        },
        mx, l, Rf, r, lane);
    __syncwarp();
    scale_rows<Tag, NF>(o, rid, Rf, w);
    accumulate<Tag, NF>(o, Ps, L::LDP, Vs, L::LDE, round_up(nk, KS), g.Dv, w);
  }
  __syncthreads();  // every warp is done with the keys and values: their memory takes the output
  float* Os = reinterpret_cast<float*>(base + L::kE);
  if ((lane & 1) == 0) {
    Rf[r] = l == 0.f ? 0.f : 1.f / l;
    if (r < nq) lse[(b * g.H + h) * g.Nq + i] = l == 0.f ? -INFINITY : mx + logf(l);
  }
  __syncwarp();
  scale_rows<Tag, NF>(o, rid, Rf, w);
  store_rows<Tag, NF>(Os, L::LDO, o, w);
  __syncwarp();
  const int dv = static_cast<int>(g.Dv);
  for (int e = lane; e < 16 * dv; e += 32) {
    const int rr = 16 * w + e / dv, d = e % dv;
    if (rr < nq)
      static_cast<T*>(out.p)[b * out.sb + h * out.sh + (i0 + rr) * out.sn + d] = from_acc<T>(Os[rr * L::LDO + d]);
  }
}

// ---- backward: dQ --------------------------------------------------------------------------

template <class T, class Tag, int DM>
__device__ void dq_body(const Geom& g, In q, In k, In v, In dout, const float* lse, const float* delta,
                        const Mask& m, Out dq) {
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
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const idx b = blockIdx.z, h = blockIdx.y, i0 = static_cast<idx>(blockIdx.x) * kBR;
  const int nq = static_cast<int>(g.Nq - i0 < kBR ? g.Nq - i0 : kBR);
  const T* K = head_rows<T>(k, b, h);
  const T* V = head_rows<T>(v, b, h);
  const float scale = static_cast<float>(m.scale);
  const float* Lb = lse + (b * g.H + h) * g.Nq;
  stage<Tag, DM>(Qs, L::LDE, head_rows<T>(q, b, h), q.sn, i0, nq, g.D);
  stage<Tag, DM>(dOs, L::LDE, head_rows<T>(dout, b, h), dout.sn, i0, nq, g.Dv);
  const int r = 16 * w + (lane >> 1), c0 = 32 * (lane & 1);
  const idx i = i0 + r;
  const float Lr = r < nq ? Lb[i] : -INFINITY;
  const bool ok = Lr != -INFINITY;  // rows with nothing visible contribute nothing
  const float dl = ok ? delta[(b * g.H + h) * g.Nq + i] : 0.f;
  FragC<Tag> acc[NF];
#pragma unroll
  for (int n = 0; n < NF; ++n) wmma::fill_fragment(acc[n], 0.f);
  const int kd = round_up(g.D, KS), kv = round_up(g.Dv, KS);
  const idx kend = key_end(g, m, i0 + nq);
  for (idx j0 = 0; j0 < kend; j0 += kBR) {
    const int nk = static_cast<int>(kend - j0 < kBR ? kend - j0 : kBR);
    __syncthreads();
    stage<Tag, DM>(Ks, L::LDE, K, k.sn, j0, nk, g.D);
    stage<Tag, DM>(Vs, L::LDE, V, v.sn, j0, nk, g.Dv);
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
      const idx j = j0 + c;
      const bool vis = ok && c < nk && !(m.causal && m.k_pos0 + j > m.q_pos0 + i);
      const float sv = vis ? Ss[r * kLS + c] * scale + bias_at<T, float>(m, b, h, i, j) : -INFINITY;
      const float ds = sv == -INFINITY ? 0.f : expf(sv - Lr) * (dPs[r * kLS + c] - dl) * scale;
      dSs[r * L::LDP + c] = Elem<Tag>::from(ds);
    }
    __syncwarp();
    accumulate<Tag, NF>(acc, dSs, L::LDP, Ks, L::LDE, round_up(nk, KS), g.D, w);
  }
  if (!dq.p) return;
  __syncthreads();
  float* Os = reinterpret_cast<float*>(base + 2 * L::kE);
  store_rows<Tag, NF>(Os, L::LDO, acc, w);
  __syncwarp();
  add_rows<T>(dq, b, h, i0, Os, L::LDO, g.D, nq, w, lane, [&](int rr) { return Lb[i0 + rr] != -INFINITY; });
}

// ---- backward: dK and dV -------------------------------------------------------------------

template <class T, class Tag, int DM>
__device__ void dkdv_body(const Geom& g, In q, In k, In v, In dout, const float* lse, const float* delta,
                          const Mask& m, Out dk, Out dv) {
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
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const idx b = blockIdx.z, h = blockIdx.y, j0 = static_cast<idx>(blockIdx.x) * kBR;
  const int nkb = static_cast<int>(g.Nk - j0 < kBR ? g.Nk - j0 : kBR);
  const T* Q = head_rows<T>(q, b, h);
  const T* dO = head_rows<T>(dout, b, h);
  const float* Lb = lse + (b * g.H + h) * g.Nq;
  const float* Db = delta + (b * g.H + h) * g.Nq;
  const float scale = static_cast<float>(m.scale);
  stage<Tag, DM>(Ks, L::LDE, head_rows<T>(k, b, h), k.sn, j0, nkb, g.D);
  stage<Tag, DM>(Vs, L::LDE, head_rows<T>(v, b, h), v.sn, j0, nkb, g.Dv);
  FragC<Tag> gk[NF], gv[NF];
#pragma unroll
  for (int n = 0; n < NF; ++n) wmma::fill_fragment(gk[n], 0.f), wmma::fill_fragment(gv[n], 0.f);
  const int r = 16 * w + (lane >> 1), c0 = 32 * (lane & 1);  // r: own key row
  const idx j = j0 + r;
  const int kd = round_up(g.D, KS), kv = round_up(g.Dv, KS);
  idx istart = 0;  // causal: the first query that sees the block's first key
  if (m.causal) {
    const idx s0 = m.k_pos0 + j0 - m.q_pos0;
    istart = s0 < 0 ? 0 : (s0 > g.Nq ? g.Nq : s0);
  }
  for (idx a0 = istart; a0 < g.Nq; a0 += kBR) {
    const int nq = static_cast<int>(g.Nq - a0 < kBR ? g.Nq - a0 : kBR);
    __syncthreads();
    stage<Tag, DM>(Qs, L::LDE, Q, q.sn, a0, nq, g.D);
    stage<Tag, DM>(dOs, L::LDE, dO, dout.sn, a0, nq, g.Dv);
    for (int t = threadIdx.x; t < kBR; t += kT) {
      Ls[t] = t < nq ? Lb[a0 + t] : -INFINITY;
      Ds[t] = t < nq ? Db[a0 + t] : 0.f;
    }
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
      const idx i = a0 + c;
      const float Li = Ls[c];
      const bool vis = r < nkb && Li != -INFINITY && !(m.causal && m.k_pos0 + j > m.q_pos0 + i);
      const float sv = vis ? St[r * kLS + c] * scale + bias_at<T, float>(m, b, h, i, j) : -INFINITY;
      const float p = sv == -INFINITY ? 0.f : expf(sv - Li);
      Pt[r * L::LDP + c] = Elem<Tag>::from(p);
      dSt[r * L::LDP + c] = Elem<Tag>::from(p * (dPt[r * kLS + c] - Ds[c]) * scale);
    }
    __syncwarp();
    const int kr = round_up(nq, KS);
    accumulate<Tag, NF>(gv, Pt, L::LDP, dOs, L::LDE, kr, g.Dv, w);
    accumulate<Tag, NF>(gk, dSt, L::LDP, Qs, L::LDE, kr, g.D, w);
  }
  __syncthreads();
  float* Os = reinterpret_cast<float*>(base + 2 * L::kE);
  auto all = [](int) { return true; };
  if (dk.p) {
    store_rows<Tag, NF>(Os, L::LDO, gk, w);
    __syncwarp();
    add_rows<T>(dk, b, h, j0, Os, L::LDO, g.D, nkb, w, lane, all);
    __syncwarp();
  }
  if (dv.p) {
    store_rows<Tag, NF>(Os, L::LDO, gv, w);
    __syncwarp();
    add_rows<T>(dv, b, h, j0, Os, L::LDO, g.Dv, nkb, w, lane, all);
  }
}

// ---- kernels: bf16 / TF32 bodies only where the architecture has them ----------------------


template <class T, class Tag, int DM>
__global__ void __launch_bounds__(kT) forward_kernel(Geom g, In q, In k, In v, Mask m, Out out, float* lse) {
  if constexpr (NeedsSm80Here<Tag>::value) {
    __trap();
  } else {
    forward_body<T, Tag, DM>(g, q, k, v, m, out, lse);
  }
}
template <class T, class Tag, int DM>
__global__ void __launch_bounds__(kT) dq_kernel(Geom g, In q, In k, In v, In dout, const float* lse,
                                                const float* delta, Mask m, Out dq) {
  if constexpr (NeedsSm80Here<Tag>::value) {
    __trap();
  } else {
    dq_body<T, Tag, DM>(g, q, k, v, dout, lse, delta, m, dq);
  }
}
template <class T, class Tag, int DM>
__global__ void __launch_bounds__(kT) dkdv_kernel(Geom g, In q, In k, In v, In dout, const float* lse,
                                                  const float* delta, Mask m, Out dk, Out dv) {
  if constexpr (NeedsSm80Here<Tag>::value) {
    __trap();
  } else {
    dkdv_body<T, Tag, DM>(g, q, k, v, dout, lse, delta, m, dk, dv);
  }
}

// ---- host side -----------------------------------------------------------------------------

bool enabled() {
  static const bool on = [] {
    const char* e = std::getenv("SHARDTENSOR_ATTENTION_TC");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

template <class T, class Tag, int DM>
unsigned g_fwd_state[2] = {0, 0};
template <class T, class Tag, int DM>
unsigned g_dq_state[2] = {0, 0};
template <class T, class Tag, int DM>
unsigned g_dkv_state[2] = {0, 0};

template <class T, class Tag, int DM>
bool fwd_ready() {
  return smem_granted(forward_kernel<T, Tag, DM>, Lay<Tag, DM>::fwd, g_fwd_state<T, Tag, DM>);
}
template <class T, class Tag, int DM>
bool bwd_ready(bool dq, bool dkv) {
  return (!dq || smem_granted(dq_kernel<T, Tag, DM>, Lay<Tag, DM>::dq, g_dq_state<T, Tag, DM>)) &&
         (!dkv || smem_granted(dkdv_kernel<T, Tag, DM>, Lay<Tag, DM>::dkdv, g_dkv_state<T, Tag, DM>));
}

dim3 own_blocks(idx rows, const Geom& g) {
  return dim3(static_cast<unsigned>((rows + kBR - 1) / kBR), static_cast<unsigned>(g.H), static_cast<unsigned>(g.B));
}

template <class T, class Tag, int DM>
int fwd_dm(const Geom& g, In q, In k, In v, const Mask& m, Out out, float* lse, cudaStream_t s) {
  if (!fwd_ready<T, Tag, DM>()) return kDeclined;
  forward_kernel<T, Tag, DM><<<own_blocks(g.Nq, g), kT, Lay<Tag, DM>::fwd, s>>>(g, q, k, v, m, out, lse);
  return cu::last_error();
}
template <class T, class Tag, int DM>
int bwd_dm(const Geom& g, In q, In k, In v, In dout, const float* L, const float* delta, const Mask& m, Out dq, Out dk,
           Out dv, cudaStream_t s) {
  const bool want_kv = dk.p || dv.p;
  if (!bwd_ready<T, Tag, DM>(dq.p != nullptr, want_kv)) return kDeclined;  // nothing half done
  if (dq.p) {
    dq_kernel<T, Tag, DM><<<own_blocks(g.Nq, g), kT, Lay<Tag, DM>::dq, s>>>(g, q, k, v, dout, L, delta, m, dq);
    if (const int e = cu::last_error()) return e;
  }
  if (want_kv) {
    dkdv_kernel<T, Tag, DM><<<own_blocks(g.Nk, g), kT, Lay<Tag, DM>::dkdv, s>>>(g, q, k, v, dout, L, delta, m, dk,
                                                                                 dv);
    if (const int e = cu::last_error()) return e;
  }
  return 0;
}

/// Calls f(T{}, Tag{}) for the storage dtype's tensor-core form, or returns kDeclined.
template <class F>
int by_form(int dtype, int flags, F&& f) {
  if (!enabled()) return kDeclined;
  const int sm = device_sm();
  const bool lowp = (flags & kLowpTensorCores) != 0;
  if (dtype == 3 && lowp && sm >= 70) return f(__half{}, HalfTag{});
  if (dtype == 2 && lowp && sm >= 80) return f(__nv_bfloat16{}, Bf16Tag{});
  if (dtype == 0 && (flags & kAllowTF32) && sm >= 80) return f(float{}, Tf32Tag{});
  return kDeclined;
}
bool fits(const Geom& g) { return g.D <= kMaxDM && g.Dv <= kMaxDM; }
bool dm64(const Geom& g) { return g.D <= 64 && g.Dv <= 64; }

}  // namespace

int forward(int dtype, int flags, const Geom& g, In q, In k, In v, const Mask& m, Out out, float* lse,
            cudaStream_t s) {
  if (!fits(g)) return kDeclined;
  return by_form(dtype, flags, [&](auto t, auto tag) {
    using T = decltype(t);
    using Tag = decltype(tag);
    return dm64(g) ? fwd_dm<T, Tag, 64>(g, q, k, v, m, out, lse, s) : fwd_dm<T, Tag, 128>(g, q, k, v, m, out, lse, s);
  });
}

int backward(int dtype, int flags, const Geom& g, In q, In k, In v, In dout, const float* lse, const float* delta,
             const Mask& m, Out dq, Out dk, Out dv, cudaStream_t s) {
  if (!fits(g)) return kDeclined;
  return by_form(dtype, flags, [&](auto t, auto tag) {
    using T = decltype(t);
    using Tag = decltype(tag);
    return dm64(g) ? bwd_dm<T, Tag, 64>(g, q, k, v, dout, lse, delta, m, dq, dk, dv, s)
                   : bwd_dm<T, Tag, 128>(g, q, k, v, dout, lse, delta, m, dq, dk, dv, s);
  });
}

bool takes(int dtype, int flags, const Geom& g, bool backward, bool dq, bool dkv) {
  if (!fits(g)) return false;
  return by_form(dtype, flags, [&](auto t, auto tag) {
           using T = decltype(t);
           using Tag = decltype(tag);
           const bool ok = dm64(g) ? (backward ? bwd_ready<T, Tag, 64>(dq, dkv) : fwd_ready<T, Tag, 64>())
                                   : (backward ? bwd_ready<T, Tag, 128>(dq, dkv) : fwd_ready<T, Tag, 128>());
           return ok ? 1 : kDeclined;
         }) == 1;
}

}  // namespace shard::kernels::attention::tc
