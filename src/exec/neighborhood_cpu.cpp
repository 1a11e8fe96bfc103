// CPU implementation of the neighbourhood-attention kernel family (fp32 and fp64; see
// include/shardtensor/exec/neighborhood.hpp). Per (batch, query) row: the valid keys of its window
// are listed once, then per head two passes (scores and their max, then exp-weighted sum), all
// accumulated in double. The backward recomputes the probabilities from lse: dq per query over
// its window, dk / dv per key gathered over the queries that see it (offset order), so results do
// not depend on the thread count. Rows are split over OpenMP threads.
#include <cmath>
#include <limits>
#include <vector>

#include "exec/neighborhood_kernels.hpp"

namespace shard::exec {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// Key index along dim d for query index i and window offset o, or -1 if the key is not valid.
inline index_t key_of(const NbhdGeom& g, int d, index_t i, index_t o) {
  index_t e = g.qoff[d] + i + g.dilation[d] * (o - nbhd_reach_lo(g.window[d]));
  if (g.wrap[d]) {
    e %= g.nk[d];
    if (e < 0) e += g.nk[d];
  }
  return (e >= g.valid_lo[d] && e < g.valid_hi[d]) ? e : -1;
}

/// Query index along dim d that reaches key e through offset o, or -1 if none does.
inline index_t query_of(const NbhdGeom& g, int d, index_t e, index_t o) {
  index_t i = e - g.qoff[d] - g.dilation[d] * (o - nbhd_reach_lo(g.window[d]));
  if (g.wrap[d]) {
    i %= g.nk[d];
    if (i < 0) i += g.nk[d];
  }
  return (i >= 0 && i < g.nq[d]) ? i : -1;
}

/// A window entry: the key's (or query's) spatial element offsets in two operands.
struct NbhdEntry {
  index_t a, b;
  index_t lin;  ///< linear query index (gather direction only)
};

/// Valid keys of query (i0, i1, i2): spatial element offsets into k and v, in offset order.
void keys_of_query(const NbhdGeom& g, const index_t i[3], const NbhdIn& k, const NbhdIn& v, std::vector<NbhdEntry>& out) {
  out.clear();
  for (index_t o0 = 0; o0 < g.window[0]; ++o0) {
    const index_t e0 = key_of(g, 0, i[0], o0);
    if (e0 < 0) continue;
    for (index_t o1 = 0; o1 < g.window[1]; ++o1) {
      const index_t e1 = key_of(g, 1, i[1], o1);
      if (e1 < 0) continue;
      for (index_t o2 = 0; o2 < g.window[2]; ++o2) {
        const index_t e2 = key_of(g, 2, i[2], o2);
        if (e2 < 0) continue;
        out.push_back({e0 * k.ss[0] + e1 * k.ss[1] + e2 * k.ss[2], e0 * v.ss[0] + e1 * v.ss[1] + e2 * v.ss[2], 0});
      }
    }
  }
}

/// Queries that see key (e0, e1, e2) (none if the key is not valid): spatial element offsets
/// into q and dout, and the linear query index (for lse / delta), in offset order.
void queries_of_key(const NbhdGeom& g, const index_t e[3], const NbhdIn& q, const NbhdIn& dout,
                    std::vector<NbhdEntry>& out) {
  out.clear();
  for (int d = 0; d < 3; ++d)
    if (e[d] < g.valid_lo[d] || e[d] >= g.valid_hi[d]) return;
  for (index_t o0 = 0; o0 < g.window[0]; ++o0) {
    const index_t i0 = query_of(g, 0, e[0], o0);
    if (i0 < 0) continue;
    for (index_t o1 = 0; o1 < g.window[1]; ++o1) {
      const index_t i1 = query_of(g, 1, e[1], o1);
      if (i1 < 0) continue;
      for (index_t o2 = 0; o2 < g.window[2]; ++o2) {
        const index_t i2 = query_of(g, 2, e[2], o2);
        if (i2 < 0) continue;
        out.push_back({i0 * q.ss[0] + i1 * q.ss[1] + i2 * q.ss[2],
                       i0 * dout.ss[0] + i1 * dout.ss[1] + i2 * dout.ss[2], (i0 * g.nq[1] + i1) * g.nq[2] + i2});
      }
    }
  }
}

/// Dot product in double with eight interleaved partial sums (independent lanes the compiler
/// turns into SIMD), combined in a fixed order: deterministic, independent of threads.
template <class T>
double dot(const T* a, const T* b, index_t n) {
  constexpr index_t L = 8;
  double p[L] = {};
  index_t d = 0;
  for (; d + L <= n; d += L)
    for (index_t j = 0; j < L; ++j) p[j] += static_cast<double>(a[d + j]) * static_cast<double>(b[d + j]);
  for (index_t j = 0; d < n; ++d, ++j) p[j] += static_cast<double>(a[d]) * static_cast<double>(b[d]);
  return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

inline void split3(index_t r, const index_t n[3], index_t i[3]) {
  i[2] = r % n[2];
  i[1] = (r / n[2]) % n[1];
  i[0] = r / (n[2] * n[1]);
}

template <class T>
void forward_t(const NbhdGeom& g, NbhdIn q, NbhdIn k, NbhdIn v, NbhdOut out, void* lse_v) {
  const T* Q = static_cast<const T*>(q.data);
  const T* K = static_cast<const T*>(k.data);
  const T* V = static_cast<const T*>(v.data);
  T* O = static_cast<T*>(out.data);
  T* L = static_cast<T*>(lse_v);
  const index_t nqt = g.nq[0] * g.nq[1] * g.nq[2];
  const index_t rows = g.B * nqt;
  const index_t wvol = g.window[0] * g.window[1] * g.window[2];
  const bool par = rows * g.H * wvol * (g.D + g.Dv) > 65536;
#pragma omp parallel if (par)
  {
    std::vector<NbhdEntry> keys;
    std::vector<double> s(static_cast<std::size_t>(wvol)), acc(static_cast<std::size_t>(g.Dv));
#pragma omp for schedule(static)
    for (index_t r = 0; r < rows; ++r) {
      const index_t b = r / nqt, qi = r % nqt;
      index_t i[3];
      split3(qi, g.nq, i);
      keys_of_query(g, i, k, v, keys);
      const index_t qs = b * q.sb + i[0] * q.ss[0] + i[1] * q.ss[1] + i[2] * q.ss[2];
      const index_t os = b * out.sb + i[0] * out.ss[0] + i[1] * out.ss[1] + i[2] * out.ss[2];
      for (index_t h = 0; h < g.H; ++h) {
        const T* qp = Q + qs + h * q.sh;
        T* op = O + os + h * out.sh;
        const std::size_t nk = keys.size();
        double mx = kNegInf;
        for (std::size_t j = 0; j < nk; ++j) {
          s[j] = g.scale * dot(qp, K + b * k.sb + h * k.sh + keys[j].a, g.D);
          if (s[j] > mx) mx = s[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double l = 0;
        for (std::size_t j = 0; j < nk; ++j) {
          const double p = std::exp(s[j] - mx);
          l += p;
          const T* vp = V + b * v.sb + h * v.sh + keys[j].b;
          for (index_t d = 0; d < g.Dv; ++d) acc[static_cast<std::size_t>(d)] += p * static_cast<double>(vp[d]);
        }
        const index_t li = r * g.H + h;
        if (nk == 0) {
          for (index_t d = 0; d < g.Dv; ++d) op[d] = T(0);
          L[li] = static_cast<T>(kNegInf);
        } else {
          for (index_t d = 0; d < g.Dv; ++d) op[d] = static_cast<T>(acc[static_cast<std::size_t>(d)] / l);
          L[li] = static_cast<T>(mx + std::log(l));
        }
      }
    }
  }
}

template <class T>
void backward_t(const NbhdGeom& g, NbhdIn q, NbhdIn k, NbhdIn v, NbhdIn out, NbhdIn dout, const void* lse_v,
                NbhdOut dq, NbhdOut dk, NbhdOut dv) {
  const T* Q = static_cast<const T*>(q.data);
  const T* K = static_cast<const T*>(k.data);
  const T* V = static_cast<const T*>(v.data);
  const T* O = static_cast<const T*>(out.data);
  const T* dO = static_cast<const T*>(dout.data);
  const T* L = static_cast<const T*>(lse_v);
  T* dQ = static_cast<T*>(dq.data);
  T* dK = static_cast<T*>(dk.data);
  T* dV = static_cast<T*>(dv.data);
  const index_t nqt = g.nq[0] * g.nq[1] * g.nq[2], nkt = g.nk[0] * g.nk[1] * g.nk[2];
  const index_t wvol = g.window[0] * g.window[1] * g.window[2];
  const index_t qrows = g.B * nqt, krows = g.B * nkt;
  const bool par = (qrows + krows) * g.H * wvol * (g.D + g.Dv) > 65536;
  // delta_i = dout_i . out_i per (b, query, h).
  std::vector<double> delta(static_cast<std::size_t>(qrows * g.H));
#pragma omp parallel for schedule(static) if (par)
  for (index_t r = 0; r < qrows; ++r) {
    const index_t b = r / nqt;
    index_t i[3];
    split3(r % nqt, g.nq, i);
    for (index_t h = 0; h < g.H; ++h)
      delta[static_cast<std::size_t>(r * g.H + h)] =
          dot(dO + b * dout.sb + i[0] * dout.ss[0] + i[1] * dout.ss[1] + i[2] * dout.ss[2] + h * dout.sh,
              O + b * out.sb + i[0] * out.ss[0] + i[1] * out.ss[1] + i[2] * out.ss[2] + h * out.sh, g.Dv);
  }
  if (dQ) {
#pragma omp parallel if (par)
    {
      std::vector<NbhdEntry> keys;
      std::vector<double> acc(static_cast<std::size_t>(g.D));
#pragma omp for schedule(static)
      for (index_t r = 0; r < qrows; ++r) {
        const index_t b = r / nqt;
        index_t i[3];
        split3(r % nqt, g.nq, i);
        keys_of_query(g, i, k, v, keys);
        for (index_t h = 0; h < g.H; ++h) {
          const T* qp = Q + b * q.sb + i[0] * q.ss[0] + i[1] * q.ss[1] + i[2] * q.ss[2] + h * q.sh;
          const T* dop = dO + b * dout.sb + i[0] * dout.ss[0] + i[1] * dout.ss[1] + i[2] * dout.ss[2] + h * dout.sh;
          T* dqp = dQ + b * dq.sb + i[0] * dq.ss[0] + i[1] * dq.ss[1] + i[2] * dq.ss[2] + h * dq.sh;
          std::fill(acc.begin(), acc.end(), 0.0);
          const double lse = static_cast<double>(L[r * g.H + h]);
          const double dl = delta[static_cast<std::size_t>(r * g.H + h)];
          if (lse != kNegInf) {
            for (const NbhdEntry& e : keys) {
              const T* kp = K + b * k.sb + h * k.sh + e.a;
              const T* vp = V + b * v.sb + h * v.sh + e.b;
              const double p = std::exp(g.scale * dot(qp, kp, g.D) - lse);
              const double ds = p * (dot(dop, vp, g.Dv) - dl) * g.scale;
              for (index_t d = 0; d < g.D; ++d) acc[static_cast<std::size_t>(d)] += ds * static_cast<double>(kp[d]);
            }
          }
          for (index_t d = 0; d < g.D; ++d) dqp[d] = static_cast<T>(acc[static_cast<std::size_t>(d)]);
        }
      }
    }
  }
  if (dK || dV) {
#pragma omp parallel if (par)
    {
      std::vector<NbhdEntry> qs;
      std::vector<double> ak(static_cast<std::size_t>(g.D)), av(static_cast<std::size_t>(g.Dv));
#pragma omp for schedule(static)
      for (index_t r = 0; r < krows; ++r) {
        const index_t b = r / nkt;
        index_t e[3];
        split3(r % nkt, g.nk, e);
        queries_of_key(g, e, q, dout, qs);
        for (index_t h = 0; h < g.H; ++h) {
          const T* kp = K + b * k.sb + e[0] * k.ss[0] + e[1] * k.ss[1] + e[2] * k.ss[2] + h * k.sh;
          const T* vp = V + b * v.sb + e[0] * v.ss[0] + e[1] * v.ss[1] + e[2] * v.ss[2] + h * v.sh;
          std::fill(ak.begin(), ak.end(), 0.0);
          std::fill(av.begin(), av.end(), 0.0);
          for (const NbhdEntry& x : qs) {
            const index_t row = (b * nqt + x.lin) * g.H + h;
            const double lse = static_cast<double>(L[row]);
            if (lse == kNegInf) continue;
            const T* qp = Q + b * q.sb + h * q.sh + x.a;
            const T* dop = dO + b * dout.sb + h * dout.sh + x.b;
            const double p = std::exp(g.scale * dot(qp, kp, g.D) - lse);
            for (index_t d = 0; d < g.Dv; ++d) av[static_cast<std::size_t>(d)] += p * static_cast<double>(dop[d]);
            const double ds = p * (dot(dop, vp, g.Dv) - delta[static_cast<std::size_t>(row)]) * g.scale;
            for (index_t d = 0; d < g.D; ++d) ak[static_cast<std::size_t>(d)] += ds * static_cast<double>(qp[d]);
          }
          if (dK) {
            T* p = dK + b * dk.sb + e[0] * dk.ss[0] + e[1] * dk.ss[1] + e[2] * dk.ss[2] + h * dk.sh;
            for (index_t d = 0; d < g.D; ++d) p[d] = static_cast<T>(ak[static_cast<std::size_t>(d)]);
          }
          if (dV) {
            T* p = dV + b * dv.sb + e[0] * dv.ss[0] + e[1] * dv.ss[1] + e[2] * dv.ss[2] + h * dv.sh;
            for (index_t d = 0; d < g.Dv; ++d) p[d] = static_cast<T>(av[static_cast<std::size_t>(d)]);
          }
        }
      }
    }
  }
}

struct CpuNbhdAttention final : NbhdAttentionKernels {
  void forward(DType dt, const NbhdGeom& g, NbhdIn q, NbhdIn k, NbhdIn v, NbhdOut out, void* lse,
               ExecContext&) const override {
    if (dt == DType::f32)
      forward_t<float>(g, q, k, v, out, lse);
    else
      forward_t<double>(g, q, k, v, out, lse);
  }
  void backward(DType dt, const NbhdGeom& g, NbhdIn q, NbhdIn k, NbhdIn v, NbhdIn out, NbhdIn dout, const void* lse,
                NbhdOut dq, NbhdOut dk, NbhdOut dv, ExecContext&) const override {
    if (dt == DType::f32)
      backward_t<float>(g, q, k, v, out, dout, lse, dq, dk, dv);
    else
      backward_t<double>(g, q, k, v, out, dout, lse, dq, dk, dv);
  }
};

const CpuNbhdAttention g_cpu_nbhd_attention;

}  // namespace

SHARD_CPU_TABLE(nbhd_attention, g_cpu_nbhd_attention);

}  // namespace shard::exec
