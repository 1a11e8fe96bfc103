// CPU implementation of the attention kernel family: blocked FlashAttention-style kernels.
//
// Forward: one work unit is (b, h, a tile of Bq queries); it walks the key tiles of Bk keys,
// S = scale Q K^T (GEMM), adds the bias, masks causally (tiles entirely above the diagonal are
// skipped), updates the running row max / sum (online softmax), and accumulates P V (GEMM) into
// a Bq x Dv accumulator. Backward (FlashAttention-2): one work unit is (b, h, a set of key
// tiles); for each key tile it walks the query tiles, recomputes P = exp(S - lse), and adds
// dV += P^T dO, dS = P (dO V^T - delta), dQ += scale dS K, dK += scale dS^T Q (GEMMs). Memory
// beyond the operands is O(threads * Bq * Bk) plus a [B, H, Nq] delta array, and in backward,
// when a head is split over several units, one partial dQ per unit.
//
// Threads: OpenMP over the work units (omp_get_max_threads(), 1 inside a parallel region), with
// single-threaded BLAS for the per-tile GEMMs (BlasThreadsScope, the conv kernels' policy).
// Accumulation is in the operand type (float for f32, double for f64). The element-wise row
// kernels are compiled for AVX-512 and AVX2 and picked at run time (attention_cpu_isa.inc).
// The row-at-a-time reference lives in tests/support/attention_reference.hpp.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "exec/attention_kernels.hpp"
#include "shardtensor/core/cpu_isa.hpp"
#include "shardtensor/exec/blas.hpp"

namespace shard::exec {

namespace attn_avx512 {
#define SHARD_TGT __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#define SHARD_ISA_NS attn_avx512
#include "attention_cpu_isa.inc"
#undef SHARD_ISA_NS
#undef SHARD_TGT
}  // namespace attn_avx512

namespace attn_avx2 {
#define SHARD_TGT __attribute__((target("avx2,fma")))
#define SHARD_ISA_NS attn_avx2
#include "attention_cpu_isa.inc"
#undef SHARD_ISA_NS
#undef SHARD_TGT
}  // namespace attn_avx2

namespace attn_base {
#define SHARD_TGT
#define SHARD_ISA_NS attn_base
#include "attention_cpu_isa.inc"
#undef SHARD_ISA_NS
#undef SHARD_TGT
}  // namespace attn_base

namespace {


/// Tile sizes (queries x keys). Defaults measured with bench/bench_attention (docs/performance.md,
/// issue 7); SHARDTENSOR_ATTN_TILE="BQxBK" overrides them for tuning.
struct Tiles {
  index_t bq = 64, bk = 256;
};
Tiles tiles() {
  static const Tiles t = [] {
    Tiles r;
    if (const char* e = std::getenv("SHARDTENSOR_ATTN_TILE")) {
      long a = 0, b = 0;
      if (std::sscanf(e, "%ldx%ld", &a, &b) == 2 && a > 0 && b > 0) r = {a, b};
    }
    return r;
  }();
  return t;
}

int plan_threads(index_t units) {
  if (omp_in_parallel()) return 1;
  return static_cast<int>(std::max<index_t>(1, std::min<index_t>(omp_get_max_threads(), units)));
}

/// Leading dimension for a GEMM operand of `rows` rows of `cols` elements at row stride `sn`.
index_t ld(index_t sn, index_t rows, index_t cols) { return rows <= 1 ? std::max<index_t>(1, cols) : sn; }

template <class T>
void gemm_t(Trans ta, Trans tb, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda, const T* b,
            index_t ldb, T beta, T* c, index_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // C = beta C (BLAS would check the leading dimensions of empty operands)
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  ::shard::detail::gemm_core(dtype_of<T>, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// Adds the bias tile and masks (causal) the scores S [nq x nk] (row stride ldS) of query rows
/// [i0, i0 + nq) and keys [j0, j0 + nk).
template <class T>
void bias_mask(T* S, index_t ldS, const AttnMask& m, index_t b, index_t h, index_t i0, index_t nq, index_t j0,
               index_t nk) {
  if (m.bias) {
    const T* bias = static_cast<const T*>(m.bias) + b * m.bias_sb + h * m.bias_sh;
    for (index_t r = 0; r < nq; ++r) {
      const T* br = bias + (i0 + r) * m.bias_sq + j0 * m.bias_sk;
      T* s = S + r * ldS;
      if (m.bias_sk == 1) {
#pragma omp simd
        for (index_t c = 0; c < nk; ++c) s[c] += br[c];
      } else {
        for (index_t c = 0; c < nk; ++c) s[c] += br[c * m.bias_sk];
      }
    }
  }
  if (m.causal && m.k_pos0 + j0 + nk - 1 > m.q_pos0 + i0) {
    for (index_t r = 0; r < nq; ++r) {
      // key column c is masked when k_pos0 + j0 + c > q_pos0 + i0 + r
      const index_t c0 = std::max<index_t>(0, m.q_pos0 + i0 + r - m.k_pos0 - j0 + 1);
      T* s = S + r * ldS;
      for (index_t c = c0; c < nk; ++c) s[c] = -std::numeric_limits<T>::infinity();
    }
  }
}

/// Exclusive end of the keys any of the query rows [i0, i0 + nq) can see.
index_t key_end(const AttnGeom& g, const AttnMask& m, index_t i0, index_t nq) {
  if (!m.causal) return g.Nk;
  return std::clamp<index_t>(m.q_pos0 + i0 + nq - m.k_pos0, 0, g.Nk);
}

template <class T>
struct Buf {
  std::vector<T> v;
  T* get(std::size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
};

template <class T, class R>
void forward_t(const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, const AttnMask& m, AttnOut out, void* lse_v) {
  const auto [Bq, Bk] = tiles();
  const T* Q = static_cast<const T*>(q.data);
  const T* K = static_cast<const T*>(k.data);
  const T* V = static_cast<const T*>(v.data);
  T* O = static_cast<T*>(out.data);
  T* L = static_cast<T*>(lse_v);
  const T scale = static_cast<T>(m.scale), ninf = -std::numeric_limits<T>::infinity();
  const index_t ntq = (g.Nq + Bq - 1) / Bq, units = g.B * g.H * ntq;
  const int nth = plan_threads(units);
  std::optional<BlasThreadsScope> single_blas;  // the BLAS setting is process-wide: not from inside a region
  if (!omp_in_parallel()) single_blas.emplace(1);
#pragma omp parallel num_threads(nth)
  {
    Buf<T> sbuf, obuf, mbuf, lbuf;
    T* S = sbuf.get(static_cast<std::size_t>(Bq * Bk));
    T* acc = obuf.get(static_cast<std::size_t>(Bq * std::max<index_t>(1, g.Dv)));
    T* mx = mbuf.get(static_cast<std::size_t>(Bq));
    T* l = lbuf.get(static_cast<std::size_t>(Bq));
#pragma omp for schedule(dynamic, 1)
    for (index_t u = 0; u < units; ++u) {
      const index_t bh = u / ntq, b = bh / g.H, h = bh % g.H, i0 = (u % ntq) * Bq, nq = std::min(Bq, g.Nq - i0);
      const T* Qi = Q + b * q.sb + h * q.sh + i0 * q.sn;
      const T* Kb = K + b * k.sb + h * k.sh;
      const T* Vb = V + b * v.sb + h * v.sh;
      std::fill_n(acc, nq * g.Dv, T(0));
      std::fill_n(mx, nq, ninf);
      std::fill_n(l, nq, T(0));
      const index_t jend = key_end(g, m, i0, nq);
      for (index_t j0 = 0; j0 < jend; j0 += Bk) {
        const index_t nk = std::min(Bk, jend - j0);
        gemm_t<T>(Trans::no, Trans::yes, nq, nk, g.D, scale, Qi, ld(q.sn, nq, g.D), Kb + j0 * k.sn,
                  ld(k.sn, nk, g.D), T(0), S, Bk);
        bias_mask(S, Bk, m, b, h, i0, nq, j0, nk);
        for (index_t r = 0; r < nq; ++r) {
          T* s = S + r * Bk;
          const T mn = std::max(mx[r], R::max(s, nk));
          if (mn == ninf) {  // nothing visible yet in this row
            std::fill_n(s, nk, T(0));
            continue;
          }
          const T c = mx[r] == ninf ? T(0) : std::exp(mx[r] - mn);
          const T sum = R::exp_sum(s, nk, mn);
          if (c != T(1)) R::scale(acc + r * g.Dv, g.Dv, c);
          l[r] = l[r] * c + sum;
          mx[r] = mn;
        }
        gemm_t<T>(Trans::no, Trans::no, nq, g.Dv, nk, T(1), S, Bk, Vb + j0 * v.sn, ld(v.sn, nk, g.Dv), T(1), acc,
                  std::max<index_t>(1, g.Dv));
      }
      T* Oi = O + b * out.sb + h * out.sh + i0 * out.sn;
      T* Li = L + bh * g.Nq + i0;
      for (index_t r = 0; r < nq; ++r) {
        if (l[r] == T(0)) {
          std::fill_n(Oi + r * out.sn, g.Dv, T(0));
          Li[r] = ninf;
        } else {
          R::store(Oi + r * out.sn, acc + r * g.Dv, g.Dv, T(1) / l[r]);
          Li[r] = mx[r] + std::log(l[r]);
        }
      }
    }
  }
}

template <class T, class R>
void backward_t(const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, AttnIn out, AttnIn dout, const void* lse_v,
                const AttnMask& m, AttnOut dq, AttnOut dk, AttnOut dv) {
  const auto [Bq, Bk] = tiles();
  const T* Q = static_cast<const T*>(q.data);
  const T* K = static_cast<const T*>(k.data);
  const T* V = static_cast<const T*>(v.data);
  const T* O = static_cast<const T*>(out.data);
  const T* dO = static_cast<const T*>(dout.data);
  const T* L = static_cast<const T*>(lse_v);
  T* dQ = static_cast<T*>(dq.data);
  T* dK = static_cast<T*>(dk.data);
  T* dV = static_cast<T*>(dv.data);
  if (!dQ && !dK && !dV) return;
  const T scale = static_cast<T>(m.scale), ninf = -std::numeric_limits<T>::infinity();
  const index_t BH = g.B * g.H, ntk = (g.Nk + Bk - 1) / Bk;
  const int max_threads = plan_threads(BH * ntk);
  // Key tiles of one head split over C units when the heads alone do not balance the threads;
  // unit c takes tiles c, c + C, ... (balanced under a causal mask). dQ then goes to one partial
  // buffer per unit, summed at the end.
  const bool split = max_threads > 1 && BH < 4 * max_threads && (!dQ || BH % max_threads != 0);
  const index_t C = split ? std::min<index_t>(ntk, (4 * max_threads + BH - 1) / BH) : 1;
  const index_t units = BH * C;
  const int nth = plan_threads(units);
  const bool partial_dq = dQ && C > 1;
  std::vector<T> dq_part(partial_dq ? static_cast<std::size_t>(units * g.Nq * g.D) : 0);
  std::vector<T> delta(static_cast<std::size_t>(BH * g.Nq));
  std::optional<BlasThreadsScope> single_blas;
  if (!omp_in_parallel()) single_blas.emplace(1);
#pragma omp parallel num_threads(nth)
  {
#pragma omp for schedule(static)
    for (index_t r = 0; r < BH * g.Nq; ++r) {
      const index_t bh = r / g.Nq, b = bh / g.H, h = bh % g.H, i = r % g.Nq;
      const index_t oo = b * out.sb + h * out.sh + i * out.sn, od = b * dout.sb + h * dout.sh + i * dout.sn;
      delta[static_cast<std::size_t>(r)] = R::dot(dO + od, O + oo, g.Dv);
    }
    Buf<T> pbuf, dsbuf;
    T* P = pbuf.get(static_cast<std::size_t>(Bq * Bk));
    T* dS = dsbuf.get(static_cast<std::size_t>(Bq * Bk));
#pragma omp for schedule(dynamic, 1)
    for (index_t u = 0; u < units; ++u) {
      const index_t bh = u / C, c = u % C, b = bh / g.H, h = bh % g.H;
      const T* Qb = Q + b * q.sb + h * q.sh;
      const T* Kb = K + b * k.sb + h * k.sh;
      const T* Vb = V + b * v.sb + h * v.sh;
      const T* dOb = dO + b * dout.sb + h * dout.sh;
      const T* Lb = L + bh * g.Nq;
      const T* deltab = delta.data() + bh * g.Nq;
      T* dQb = partial_dq ? dq_part.data() + u * g.Nq * g.D : (dQ ? dQ + b * dq.sb + h * dq.sh : nullptr);
      const index_t ldq = partial_dq ? g.D : dq.sn;
      for (index_t kt = c; kt < ntk; kt += C) {
        const index_t j0 = kt * Bk, nk = std::min(Bk, g.Nk - j0);
        const T* Kj = Kb + j0 * k.sn;
        const T* Vj = Vb + j0 * v.sn;
        const index_t istart = m.causal ? std::clamp<index_t>(m.k_pos0 + j0 - m.q_pos0, 0, g.Nq) : 0;
        for (index_t i0 = istart; i0 < g.Nq; i0 += Bq) {
          const index_t nq = std::min(Bq, g.Nq - i0);
          const T* Qi = Qb + i0 * q.sn;
          const T* dOi = dOb + i0 * dout.sn;
          gemm_t<T>(Trans::no, Trans::yes, nq, nk, g.D, scale, Qi, ld(q.sn, nq, g.D), Kj, ld(k.sn, nk, g.D), T(0),
                    P, Bk);
          bias_mask(P, Bk, m, b, h, i0, nq, j0, nk);
          for (index_t r = 0; r < nq; ++r) {
            const T lse = Lb[i0 + r];
            if (lse == ninf)
              std::fill_n(P + r * Bk, nk, T(0));
            else
              R::exp(P + r * Bk, nk, lse);
          }
          if (dV)
            gemm_t<T>(Trans::yes, Trans::no, nk, g.Dv, nq, T(1), P, Bk, dOi, ld(dout.sn, nq, g.Dv), T(1),
                      dV + b * dv.sb + h * dv.sh + j0 * dv.sn, ld(dv.sn, nk, g.Dv));
          if (!dQb && !dK) continue;
          gemm_t<T>(Trans::no, Trans::yes, nq, nk, g.Dv, T(1), dOi, ld(dout.sn, nq, g.Dv), Vj, ld(v.sn, nk, g.Dv),
                    T(0), dS, Bk);
          for (index_t r = 0; r < nq; ++r) R::ds(dS + r * Bk, P + r * Bk, nk, deltab[i0 + r]);
          if (dQb)
            gemm_t<T>(Trans::no, Trans::no, nq, g.D, nk, scale, dS, Bk, Kj, ld(k.sn, nk, g.D), T(1),
                      dQb + i0 * ldq, ld(ldq, nq, g.D));
          if (dK)
            gemm_t<T>(Trans::yes, Trans::no, nk, g.D, nq, scale, dS, Bk, Qi, ld(q.sn, nq, g.D), T(1),
                      dK + b * dk.sb + h * dk.sh + j0 * dk.sn, ld(dk.sn, nk, g.D));
        }
      }
    }
    if (partial_dq) {
#pragma omp for schedule(static)
      for (index_t r = 0; r < BH * g.Nq; ++r) {
        const index_t bh = r / g.Nq, b = bh / g.H, h = bh % g.H, i = r % g.Nq;
        T* dst = dQ + b * dq.sb + h * dq.sh + i * dq.sn;
        for (index_t cc = 0; cc < C; ++cc) {
          const T* src = dq_part.data() + ((bh * C + cc) * g.Nq + i) * g.D;
#pragma omp simd
          for (index_t d = 0; d < g.D; ++d) dst[d] += src[d];
        }
      }
    }
  }
}

template <class T>
void merge_t(const AttnGeom& g, AttnOut out, void* lse_v, AttnIn out_b, const void* lse_b_v) {
  T* O = static_cast<T*>(out.data);
  const T* Ob = static_cast<const T*>(out_b.data);
  T* L = static_cast<T*>(lse_v);
  const T* Lb = static_cast<const T*>(lse_b_v);
  const T ninf = -std::numeric_limits<T>::infinity();
  const index_t rows = g.B * g.H * g.Nq;
#pragma omp parallel for schedule(static) num_threads(plan_threads(rows / 256 + 1))
  for (index_t r = 0; r < rows; ++r) {
    const index_t bh = r / g.Nq, b = bh / g.H, h = bh % g.H, i = r % g.Nq;
    const T la = L[r], lb = Lb[r];
    if (lb == ninf) continue;
    T* oi = O + b * out.sb + h * out.sh + i * out.sn;
    const T* obi = Ob + b * out_b.sb + h * out_b.sh + i * out_b.sn;
    if (la == ninf) {
      std::copy_n(obi, g.Dv, oi);
      L[r] = lb;
      continue;
    }
    const T mx = std::max(la, lb);
    const T ln = mx + std::log(std::exp(la - mx) + std::exp(lb - mx));
    const T ca = std::exp(la - ln), cb = std::exp(lb - ln);
    for (index_t d = 0; d < g.Dv; ++d) oi[d] = ca * oi[d] + cb * obi[d];
    L[r] = ln;
  }
}

template <class T, class F>
void with_rows(F&& f) {
  switch (cpu_isa()) {
    case CpuIsa::avx512: return f.template operator()<T, attn_avx512::Rows<T>>();
    case CpuIsa::avx2: return f.template operator()<T, attn_avx2::Rows<T>>();
    default: return f.template operator()<T, attn_base::Rows<T>>();
  }
}

struct CpuAttention final : AttentionKernels {
  void forward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, const AttnMask& m, AttnOut out, void* lse,
               ExecContext&) const override {
    auto f = [&]<class T, class R>() { forward_t<T, R>(g, q, k, v, m, out, lse); };
    if (dt == DType::f32)
      with_rows<float>(f);
    else
      with_rows<double>(f);
  }
  void backward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, AttnIn out, AttnIn dout, const void* lse,
                const AttnMask& m, AttnOut dq, AttnOut dk, AttnOut dv, ExecContext&) const override {
    auto f = [&]<class T, class R>() { backward_t<T, R>(g, q, k, v, out, dout, lse, m, dq, dk, dv); };
    if (dt == DType::f32)
      with_rows<float>(f);
    else
      with_rows<double>(f);
  }
  void merge(DType dt, const AttnGeom& g, AttnOut out, void* lse, AttnIn out_b, const void* lse_b,
             ExecContext&) const override {
    if (dt == DType::f32)
      merge_t<float>(g, out, lse, out_b, lse_b);
    else
      merge_t<double>(g, out, lse, out_b, lse_b);
  }
};

const CpuAttention g_cpu_attention;

}  // namespace

SHARD_CPU_TABLE(attention, g_cpu_attention);

}  // namespace shard::exec
