// CPU implementation of the norm kernel family (exec/norm.hpp), type-erased over f32/f64 and the bf16/f16 storage dtypes; moved
// unchanged from src/nn/norm.cpp.
// The local block is viewed as [A, C, S] (x may be a strided view, see XMap); the statistic of element (a, c, s) is
//   batch: k = c;   group: k = a * G + c / (C / G);   layer: k = a * S + s.
// All sums accumulate in double. Each OpenMP loop is split so that one thread owns each statistic.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "exec/norm_kernels.hpp"
#include "exec/storage_cpu.hpp"
#include "kernels_api/pointwise_ops.hpp"
#include "shardtensor/core/error.hpp"

namespace shard::exec {
namespace {

/// Where x's element (a, c, s) lives: the dense [A, C, S] block, or a strided view (NormGeom's
/// xrank / xshape / xstrides; e.g. the interior of a halo-padded user array, read in place). The
/// S part of a strided x is walked row by row (rows of its innermost dim), in element order, so
/// every sum accumulates in the same order as on a contiguous copy.
struct XMap {
  const NormGeom* g;
  bool dense = true;
  index_t inner = 1, step = 1, rows = 1;  ///< S = rows x inner; step: stride inside a row
  explicit XMap(const NormGeom& geo) : g(&geo), dense(geo.xrank == 0) {
    if (dense) return;
    if (geo.cdim < geo.xrank - 1) {
      inner = geo.xshape[static_cast<std::size_t>(geo.xrank - 1)];
      step = geo.xstrides[static_cast<std::size_t>(geo.xrank - 1)];
    }
    rows = inner ? geo.S / inner : 0;
  }
  /// Offset of (a, c, s = 0).
  index_t base(index_t a, index_t c) const {
    index_t off = c * g->xstrides[static_cast<std::size_t>(g->cdim)];
    for (int d = g->cdim - 1; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      off += (a % g->xshape[u]) * g->xstrides[u];
      a /= g->xshape[u];
    }
    return off;
  }
  /// Offset of row r of the S part (the dims after cdim but the innermost).
  index_t row(index_t r) const {
    index_t off = 0;
    for (int d = g->xrank - 2; d > g->cdim; --d) {
      const auto u = static_cast<std::size_t>(d);
      off += (r % g->xshape[u]) * g->xstrides[u];
      r /= g->xshape[u];
    }
    return off;
  }
};

/// f(s, offset of x(a, c, s)) for s = 0 .. S-1 in order.
template <class F>
inline void for_s(const XMap& m, index_t a, index_t c, F&& f) {
  const index_t S = m.g->S;
  if (m.dense) {
    const index_t off = (a * m.g->C + c) * S;
    for (index_t s = 0; s < S; ++s) f(s, off + s);
    return;
  }
  const index_t b = m.base(a, c);
  index_t s = 0;
  for (index_t r = 0; r < m.rows; ++r) {
    const index_t o = b + m.row(r);
    if (m.step == 1) {
      for (index_t i = 0; i < m.inner; ++i) f(s++, o + i);
    } else {
      for (index_t i = 0; i < m.inner; ++i) f(s++, o + i * m.step);
    }
  }
}

/// Independent accumulators per row: element s of a row goes to lane s % kLanes (lanes added in
/// order at the end). A dense row then vectorises (one accumulator is bound by the add latency),
/// and the lane depends on s alone, so a strided x (XMap) gives the bits of its dense copy.
constexpr index_t kLanes = 8;

/// f(lane, s, offset of x(a, c, s)) for s = 0 .. S-1 in order, lane = s % kLanes; a dense row in
/// blocks of kLanes with the lane a compile-time-strided index (vectorisable).
template <class F>
inline void for_s_lanes(const XMap& m, index_t a, index_t c, F&& f) {
  if (!m.dense) {
    for_s(m, a, c, [&](index_t s, index_t xo) { f(s % kLanes, s, xo); });
    return;
  }
  const index_t S = m.g->S, off = (a * m.g->C + c) * S;
  index_t s = 0;
  for (; s + kLanes <= S; s += kLanes)
    for (index_t l = 0; l < kLanes; ++l) f(l, s + l, off + s + l);
  for (index_t l = 0; s < S; ++s, ++l) f(l, s, off + s);
}

/// f(a, c) for the rows of statistic k in order (batch: channel k of every sample; group: the
/// group's channels of sample a); batch and group kinds.
template <class F>
inline void for_stat_rows(const NormGeom& g, index_t k, F&& f) {
  if (g.kind == NormKind::batch) {
    for (index_t a = 0; a < g.A; ++a) f(a, k);
    return;
  }
  const index_t cg = g.C / g.G, a = k / g.G, grp = k % g.G;
  for (index_t ci = 0; ci < cg; ++ci) f(a, grp * cg + ci);
}

namespace pw = kernels::pw;
static_assert(static_cast<int>(NormAct::relu) == pw::u_relu && static_cast<int>(NormAct::gelu) == pw::u_gelu &&
                  static_cast<int>(NormAct::gelu_tanh) == pw::u_gelu_tanh &&
                  static_cast<int>(NormAct::silu) == pw::u_silu && static_cast<int>(NormAct::tanh) == pw::u_tanh &&
                  static_cast<int>(NormAct::sigmoid) == pw::u_sigmoid,
              "NormAct codes are the pointwise family's unary codes");

/// The type a fused activation is evaluated in (pw::act_t: float for f32 / bf16 / f16 storage,
/// double for f64). z (double) is rounded to it first, so a fused f32 norm equals
/// norm-then-activation bit for bit on the CPU (the same roundings, the same formulas).
using pw::act_t;

/// The fused activation's side of the backward: gz = gy act'(u), u = z + r (z = xhat w[c] + b[c];
/// r: the optional dense residual, element ro), evaluated in act_t<T> (gy itself without an
/// activation). Act: the activation's pointwise code, -1 for none (a template parameter: the
/// kernels below are instantiated per activation, so no element pays a switch).
template <class T, int Act>
struct ActGrad {
  const T* w;
  const T* b;
  const T* r;
  double operator()(double gv, double xhat, index_t c, index_t ro) const;
};

/// f(std::integral_constant<int, code>) for the activation code `act` of a NormGeom.
template <class F>
decltype(auto) with_act(NormAct act, F&& f) {
  switch (act) {
    case NormAct::relu: return f(std::integral_constant<int, pw::u_relu>{});
    case NormAct::gelu: return f(std::integral_constant<int, pw::u_gelu>{});
    case NormAct::gelu_tanh: return f(std::integral_constant<int, pw::u_gelu_tanh>{});
    case NormAct::silu: return f(std::integral_constant<int, pw::u_silu>{});
    case NormAct::tanh: return f(std::integral_constant<int, pw::u_tanh>{});
    case NormAct::sigmoid: return f(std::integral_constant<int, pw::u_sigmoid>{});
    default: return f(std::integral_constant<int, -1>{});
  }
}

using storage::from_double;  // double -> T: bf16 / f16 through float (the f32 route's two roundings)
using storage::to_double;    // T -> double, exact

template <class T, int Act>
double ActGrad<T, Act>::operator()(double gv, double xhat, index_t c, index_t ro) const {
  if constexpr (Act < 0) {
    (void)xhat, (void)c, (void)ro;
    return gv;
  } else {
    using A = act_t<T>;
    const double z = xhat * (w ? to_double(w[c]) : 1.0) + (b ? to_double(b[c]) : 0.0);
    A u = static_cast<A>(z);
    if (r) u = u + static_cast<A>(to_double(r[ro]));
    return static_cast<double>(pw::act_grad<Act, A>(u, static_cast<A>(gv)));
  }
}

template <class T>
void sums_impl(const NormGeom& g, const T* x, const double* mean, double* out) {
  const index_t A = g.A, C = g.C, S = g.S, K = g.stats();
  const XMap m(g);
  std::fill_n(out, K, 0.0);
  auto term = [mean](double v, index_t k) {
    if (!mean) return v;
    const double d = v - mean[k];
    return d * d;
  };
  switch (g.kind) {
    case NormKind::batch:
    case NormKind::group:
#pragma omp parallel for schedule(static) if (A * C * S > (1 << 16))
      for (index_t k = 0; k < K; ++k) {
        double acc = 0;
        for_stat_rows(g, k, [&](index_t a, index_t c) {
          for_s(m, a, c, [&](index_t, index_t xo) { acc += term(to_double(x[xo]), k); });
        });
        out[k] = acc;
      }
      break;
    case NormKind::layer:
#pragma omp parallel for schedule(static) if (A * C * S > (1 << 16))
      for (index_t a = 0; a < A; ++a) {
        double* o = out + a * S;
        for (index_t c = 0; c < C; ++c)
          for_s(m, a, c, [&](index_t s, index_t xo) { o[s] += term(to_double(x[xo]), a * S + s); });
      }
      break;
  }
}

/// Local sum, mean and M2 of a statistic of n elements from its sums shifted by its first element c
/// (s1 = sum (x - c), s2 = sum (x - c)^2); kernels/norm.cu's moments_from_shifted, operation for
/// operation.
inline void moments_from_shifted(index_t n, double c, double s1, double s2, double& sum, double& m2, double& lmean) {
  if (n <= 0) {
    sum = m2 = lmean = 0;
    return;
  }
  const auto dn = static_cast<double>(n);
  const double q = s1 / dn;
  sum = dn * c + s1;
  lmean = c + q;
  const double v = s2 - s1 * q;
  m2 = v > 0 ? v : 0.0;
}

/// Shifted sums of one statistic (batch / group kinds) over its rows (a, c), in kLanes lanes.
struct ShiftedSums {
  double s1[kLanes] = {}, s2[kLanes] = {};
  double shift = 0;
  bool first = true;
  template <class T>
  void row(const XMap& m, const T* x, index_t a, index_t c) {
    const index_t S = m.g->S;
    if (S == 0) return;
    if (first) {  // element (a, c, 0): the statistic's first
      shift = to_double(x[m.dense ? (a * m.g->C + c) * S : m.base(a, c)]);
      first = false;
    }
    const double sh = shift;
    for_s_lanes(m, a, c, [&](index_t l, index_t, index_t xo) {
      const double d = to_double(x[xo]) - sh;
      s1[l] += d;
      s2[l] += d * d;
    });
  }
  void finish(index_t n, double& sum, double& m2, double& lmean) const {
    double t1 = 0, t2 = 0;
    for (index_t l = 0; l < kLanes; ++l) t1 += s1[l], t2 += s2[l];
    moments_from_shifted(n, shift, t1, t2, sum, m2, lmean);
  }
};

/// The layer kind over a dense x with S == 1: layer_norm over the last dim (transformer tokens
/// [..., C]), statistic a being the contiguous row x[a C, a C + C). The general loops below walk
/// [A, C, S] rows of S elements, so there every element paid a row's set-up (and an integer
/// division): ~20 ns per element for forward + backward. The *_rows forms walk the statistic
/// rows directly, with the same operations in the same order for every value, so they give the
/// general form's bits (the strided x that keeps the general form gives its dense copy's bits).
bool layer_rows(const NormGeom& g) { return g.kind == NormKind::layer && g.S == 1 && g.xrank == 0; }

/// Statistic rows a at a time: kRowBlock rows' sums advance together (independent add chains;
/// each row's sums in element order, as in the general form).
constexpr index_t kRowBlock = 4;

template <class T>
void moments_rows(const NormGeom& g, const T* x, double* sum, double* m2, double* lmean) {
  const index_t A = g.A, C = g.C;
  const index_t blocks = (A + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (A * C > (1 << 16))
  for (index_t bi = 0; bi < blocks; ++bi) {
    const index_t a0 = bi * kRowBlock, nr = std::min(kRowBlock, A - a0);
    double sh[kRowBlock] = {}, s1[kRowBlock] = {}, s2[kRowBlock] = {};
    if (C > 0 && nr == kRowBlock) {
      const T* xr = x + a0 * C;
      for (index_t r = 0; r < kRowBlock; ++r) sh[r] = to_double(xr[r * C]);
      for (index_t c = 0; c < C; ++c)
        for (index_t r = 0; r < kRowBlock; ++r) {
          const double d = to_double(xr[r * C + c]) - sh[r];
          s1[r] += d;
          s2[r] += d * d;
        }
    } else if (C > 0) {
      for (index_t r = 0; r < nr; ++r) {
        const T* xr = x + (a0 + r) * C;
        sh[r] = to_double(xr[0]);
        for (index_t c = 0; c < C; ++c) {
          const double d = to_double(xr[c]) - sh[r];
          s1[r] += d;
          s2[r] += d * d;
        }
      }
    }
    for (index_t r = 0; r < nr; ++r)
      moments_from_shifted(C, sh[r], s1[r], s2[r], sum[a0 + r], m2[a0 + r], lmean[a0 + r]);
  }
}

template <class T>
void moments_impl(const NormGeom& g, const T* x, double* sum, double* m2, double* lmean) {
  if (layer_rows(g)) return moments_rows(g, x, sum, m2, lmean);
  const index_t A = g.A, C = g.C, S = g.S;
  const XMap m(g);
  switch (g.kind) {
    case NormKind::batch:
    case NormKind::group: {
      const index_t n = g.kind == NormKind::batch ? A * S : (C / g.G) * S;  // elements per statistic
#pragma omp parallel for schedule(static) if (A * C * S > (1 << 16))
      for (index_t k = 0; k < g.stats(); ++k) {
        ShiftedSums acc;
        for_stat_rows(g, k, [&](index_t a, index_t c) { acc.row(m, x, a, c); });
        acc.finish(n, sum[k], m2[k], lmean[k]);
      }
      break;
    }
    case NormKind::layer:
#pragma omp parallel for schedule(static) if (A * C * S > (1 << 16))
      for (index_t a = 0; a < A; ++a) {
        // Statistic (a, s): shift x(a, 0, s); s1 / s2 accumulate in sum / m2, the shift in lmean.
        double* s1 = sum + a * S;
        double* s2 = m2 + a * S;
        double* sh = lmean + a * S;
        std::fill_n(s1, S, 0.0);
        std::fill_n(s2, S, 0.0);
        std::fill_n(sh, S, 0.0);
        if (C > 0) for_s(m, a, 0, [&](index_t s, index_t xo) { sh[s] = to_double(x[xo]); });
        for (index_t c = 0; c < C; ++c)
          for_s(m, a, c, [&](index_t s, index_t xo) {
            const double d = to_double(x[xo]) - sh[s];
            s1[s] += d;
            s2[s] += d * d;
          });
        for (index_t s = 0; s < S; ++s) moments_from_shifted(C, sh[s], s1[s], s2[s], s1[s], s2[s], sh[s]);
      }
      break;
  }
}

// Calls f(row pointer offset, a, c, k0, dk) per [a, c] row: element s of the row has statistic k0 + s * dk.
template <class Fn>
void for_rows(const NormGeom& g, Fn f) {
  const index_t A = g.A, C = g.C, S = g.S;
  const index_t cg = g.kind == NormKind::group ? C / g.G : 1;
#pragma omp parallel for schedule(static) if (A * C * S > (1 << 16))
  for (index_t r = 0; r < A * C; ++r) {
    const index_t a = r / C, c = r % C;
    switch (g.kind) {
      case NormKind::batch: f(r * S, a, c, c, index_t{0}); break;
      case NormKind::group: f(r * S, a, c, a * g.G + c / cg, index_t{0}); break;
      case NormKind::layer: f(r * S, a, c, a * S, index_t{1}); break;
    }
  }
}

/// One output of apply: y = act(z + r) from x's value v, its statistic (mk, ik) and channel
/// (wc, bc); ro: the element's offset in the dense residual / output. With a residual, z is
/// rounded to the activation type A, then + r in A (the add op's rounding), then act.
template <class T, int Act>
inline T apply_value(double v, double mk, double ik, double wc, double bc, const T* r, index_t ro) {
  using A = act_t<T>;
  const double z = (v - mk) * ik * wc + bc;
  A u = static_cast<A>(z);
  if (r) u = u + static_cast<A>(to_double(r[ro]));
  if constexpr (Act < 0) return r ? from_double<T>(static_cast<double>(u)) : from_double<T>(z);
  else return from_double<T>(static_cast<double>(pw::unary_fwd<Act, A>(u, A(0))));
}

/// One element of backward_dx at offset o (x's value v, gy's gv0, statistic (mk, ik), the sums
/// sk / sxk of its statistic, channel c with weight wc); writes dx[o] and, when asked, dr[o].
template <class T, int Act>
inline void dx_value(const ActGrad<T, Act>& gz, double v, double gv0, double mk, double ik, double wc, index_t c,
                     index_t o, const double* sk, const double* sxk, double inv_count, T* dx, T* dr) {
  const double xhat = (v - mk) * ik;
  const double gv = gz(gv0, xhat, c, o);
  if (dr) dr[o] = from_double<T>(gv);  // the residual's gradient
  const double d = gv * wc;
  dx[o] = sk ? from_double<T>(ik * (d - *sk * inv_count - xhat * *sxk * inv_count)) : from_double<T>(d * ik);
}

/// apply_impl for layer_rows: statistic a is row a.
template <class T, int Act>
void apply_rows(const NormGeom& g, const T* x, const double* mean, const double* invstd, const T* w, const T* b,
                const T* r, T* y) {
  const index_t C = g.C;
#pragma omp parallel for schedule(static) if (g.A * C > (1 << 16))
  for (index_t a = 0; a < g.A; ++a) {
    const double mk = mean[a], ik = invstd[a];
    const index_t off = a * C;
    for (index_t c = 0; c < C; ++c) {
      const double wc = w ? to_double(w[c]) : 1.0, bc = b ? to_double(b[c]) : 0.0;
      y[off + c] = apply_value<T, Act>(to_double(x[off + c]), mk, ik, wc, bc, r, off + c);
    }
  }
}

template <class T, int Act>
void apply_impl(const NormGeom& g, const T* x, const double* mean, const double* invstd, const T* w, const T* b,
                const T* r, T* y) {
  if (layer_rows(g)) return apply_rows<T, Act>(g, x, mean, invstd, w, b, r, y);
  const XMap m(g);
  for_rows(g, [&](index_t off, index_t a, index_t c, index_t k0, index_t dk) {
    const double wc = w ? to_double(w[c]) : 1.0, bc = b ? to_double(b[c]) : 0.0;
    for_s(m, a, c, [&](index_t s, index_t xo) {
      const index_t k = k0 + s * dk;
      y[off + s] = apply_value<T, Act>(to_double(x[xo]), mean[k], invstd[k], wc, bc, r, off + s);
    });
  });
}

/// backward_sums_impl for layer_rows, in two passes that keep the general form's order: sg[a] /
/// sgx[a] along each row (threads over rows), then dw[c] / db[c] down each column, rows in order
/// (threads over blocks of columns). gz is evaluated in both passes (the general form keeps every
/// element's partials in an A x C x 2 double array instead: 4 times x's bytes for f32).
template <class T, int Act>
void backward_sums_rows(const NormGeom& g, const T* x, const T* gy, const double* mean, const double* invstd,
                        const T* w, const T* b, const T* r, double* sg, double* sgx, double* dw, double* db) {
  const index_t A = g.A, C = g.C;
  const ActGrad<T, Act> gz{w, b, r};
  const bool par = A * C > (1 << 16);
  if (sg) std::fill_n(sg, A, 0.0);
  if (sgx) std::fill_n(sgx, A, 0.0);
  if (sg && sgx) {
#pragma omp parallel for schedule(static) if (par)
    for (index_t a = 0; a < A; ++a) {
      const double mk = mean[a], ik = invstd[a];
      const index_t off = a * C;
      double t1 = 0, t2 = 0;
      for (index_t c = 0; c < C; ++c) {
        const double wc = w ? to_double(w[c]) : 1.0;
        const double xhat = (to_double(x[off + c]) - mk) * ik;
        const double d = gz(to_double(gy[off + c]), xhat, c, off + c) * wc;
        t1 += d;
        t2 += d * xhat;
      }
      sg[a] = t1;
      sgx[a] = t2;
    }
  }
  if (!dw && !db) return;
  constexpr index_t kCols = 16;  // one 64-byte line of f32 per row and block
  const index_t cblocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (par)
  for (index_t cb = 0; cb < cblocks; ++cb) {
    const index_t c0 = cb * kCols, nc = std::min(kCols, C - c0);
    double aw[kCols] = {}, ab[kCols] = {};
    for (index_t a = 0; a < A; ++a) {
      const double mk = mean[a], ik = invstd[a];
      const index_t off = a * C + c0;
      for (index_t j = 0; j < nc; ++j) {
        const double xhat = (to_double(x[off + j]) - mk) * ik;
        const double gv = gz(to_double(gy[off + j]), xhat, c0 + j, off + j);
        aw[j] += gv * xhat;
        ab[j] += gv;
      }
    }
    for (index_t j = 0; j < nc; ++j) {
      if (dw) dw[c0 + j] = aw[j];
      if (db) db[c0 + j] = ab[j];
    }
  }
}

template <class T, int Act>
void backward_sums_impl(const NormGeom& g, const T* x, const T* gy, const double* mean, const double* invstd,
                        const T* w, const T* b, const T* r, double* sg, double* sgx, double* dw, double* db) {
  if (layer_rows(g)) return backward_sums_rows<T, Act>(g, x, gy, mean, invstd, w, b, r, sg, sgx, dw, db);
  // One pass over x and gy. Row r = (a, c) of S elements: its partials p1 = sum gz and p2 = sum gz
  // xhat (in element order, one thread per row) give dw[c] = sum_a p2 and db[c] = sum_a p1. In the
  // batch and group kinds a row has one statistic, so sg[k] = sum w[c] p1 and sgx[k] = sum w[c] p2
  // over the rows of statistic k (rows in order); in the layer kind (statistic a * S + s) the same
  // pass adds gz w[c] and gz w[c] xhat into sg and sgx (one thread per sample a, channels in
  // order). gz, and with it a fused activation's derivative, is evaluated once per element.
  const index_t A = g.A, C = g.C, S = g.S, K = g.stats();
  if (!sg && !sgx && !dw && !db) return;
  const XMap m(g);
  const ActGrad<T, Act> gz{w, b, r};
  const bool layer = g.kind == NormKind::layer;
  const index_t cg = g.kind == NormKind::group ? C / g.G : 1;
  std::vector<double> p(static_cast<std::size_t>(2 * A * C));
  auto p1 = [&](index_t a, index_t c) -> double& { return p[static_cast<std::size_t>(2 * (a * C + c))]; };
  auto p2 = [&](index_t a, index_t c) -> double& { return p[static_cast<std::size_t>(2 * (a * C + c) + 1)]; };
  if (layer) {
    if (sg) std::fill_n(sg, K, 0.0);
    if (sgx) std::fill_n(sgx, K, 0.0);
#pragma omp parallel for schedule(static) if (A * C * S > (1 << 16))
    for (index_t a = 0; a < A; ++a) {
      for (index_t c = 0; c < C; ++c) {
        const double wc = w ? to_double(w[c]) : 1.0;
        const index_t off = (a * C + c) * S;
        double r1 = 0, r2 = 0;
        for_s(m, a, c, [&](index_t s, index_t xo) {
          const index_t k = a * S + s;
          const double xhat = (to_double(x[xo]) - mean[k]) * invstd[k];
          const double gv = gz(to_double(gy[off + s]), xhat, c, off + s);
          r1 += gv;
          r2 += gv * xhat;
          if (sg && sgx) {
            const double d = gv * wc;
            sg[k] += d;
            sgx[k] += d * xhat;
          }
        });
        p1(a, c) = r1;
        p2(a, c) = r2;
      }
    }
  } else {
#pragma omp parallel for schedule(static) if (A * C * S > (1 << 16))
    for (index_t r = 0; r < A * C; ++r) {
      const index_t a = r / C, c = r % C;
      const index_t k = g.kind == NormKind::batch ? c : a * g.G + c / cg;
      const double mk = mean[k], ik = invstd[k];
      const index_t off = r * S;
      double l1[kLanes] = {}, l2[kLanes] = {};  // for_s_lanes' lanes, added in order below
      for_s_lanes(m, a, c, [&](index_t l, index_t s, index_t xo) {
        const double xhat = (to_double(x[xo]) - mk) * ik;
        const double gv = gz(to_double(gy[off + s]), xhat, c, off + s);
        l1[l] += gv;
        l2[l] += gv * xhat;
      });
      double r1 = 0, r2 = 0;
      for (index_t l = 0; l < kLanes; ++l) r1 += l1[l], r2 += l2[l];
      p1(a, c) = r1;
      p2(a, c) = r2;
    }
  }
  for (index_t c = 0; c < C; ++c) {
    double aw = 0, ab = 0;
    for (index_t a = 0; a < A; ++a) aw += p2(a, c), ab += p1(a, c);
    if (dw) dw[c] = aw;
    if (db) db[c] = ab;
  }
  if (layer || (!sg && !sgx)) return;
  for (index_t k = 0; k < K; ++k) {
    double a1 = 0, a2 = 0;
    if (g.kind == NormKind::batch) {
      const double wc = w ? to_double(w[k]) : 1.0;
      for (index_t a = 0; a < A; ++a) a1 += wc * p1(a, k), a2 += wc * p2(a, k);
    } else {
      const index_t a = k / g.G, grp = k % g.G;
      for (index_t c = grp * cg; c < (grp + 1) * cg; ++c) {
        const double wc = w ? to_double(w[c]) : 1.0;
        a1 += wc * p1(a, c);
        a2 += wc * p2(a, c);
      }
    }
    if (sg) sg[k] = a1;
    if (sgx) sgx[k] = a2;
  }
}

/// backward_dx_impl for layer_rows.
template <class T, int Act>
void backward_dx_rows(const NormGeom& g, const T* x, const T* gy, const double* mean, const double* invstd, const T* w,
                      const T* b, const T* r, const double* sg, const double* sgx, double inv_count, T* dx, T* dr) {
  const index_t C = g.C;
  const ActGrad<T, Act> gz{w, b, r};
#pragma omp parallel for schedule(static) if (g.A * C > (1 << 16))
  for (index_t a = 0; a < g.A; ++a) {
    const double mk = mean[a], ik = invstd[a];
    const double* sk = sg ? sg + a : nullptr;
    const double* sxk = sg ? sgx + a : nullptr;
    const index_t off = a * C;
    for (index_t c = 0; c < C; ++c) {
      const double wc = w ? to_double(w[c]) : 1.0;
      dx_value<T, Act>(gz, to_double(x[off + c]), to_double(gy[off + c]), mk, ik, wc, c, off + c, sk, sxk, inv_count,
                       dx, dr);
    }
  }
}

template <class T, int Act>
void backward_dx_impl(const NormGeom& g, const T* x, const T* gy, const double* mean, const double* invstd, const T* w,
                      const T* b, const T* r, const double* sg, const double* sgx, double inv_count, T* dx, T* dr) {
  if (layer_rows(g)) return backward_dx_rows<T, Act>(g, x, gy, mean, invstd, w, b, r, sg, sgx, inv_count, dx, dr);
  const XMap m(g);
  const ActGrad<T, Act> gz{w, b, r};
  for_rows(g, [&](index_t off, index_t a, index_t c, index_t k0, index_t dk) {
    const double wc = w ? to_double(w[c]) : 1.0;
    for_s(m, a, c, [&](index_t s, index_t xo) {
      const index_t k = k0 + s * dk;
      dx_value<T, Act>(gz, to_double(x[xo]), to_double(gy[off + s]), mean[k], invstd[k], wc, c, off + s,
                       sg ? sg + k : nullptr, sg ? sgx + k : nullptr, inv_count, dx, dr);
    });
  });
}

template <class T>
void load_impl(index_t n, const T* src, double* host) {
  for (index_t i = 0; i < n; ++i) host[i] = to_double(src[i]);
}
template <class T>
void store_impl(index_t n, const double* host, T* dst) {
  for (index_t i = 0; i < n; ++i) dst[i] = from_double<T>(host[i]);
}

#define SHARD_NORM_DISPATCH(dt, CALL) SHARD_STORAGE_DISPATCH("norm", dt, CALL)

/// norm_finish on host memory (the arithmetic the CUDA kernel repeats with _rn intrinsics).
void finish_impl(const NormFinishArgs& a) {
  // Exact in 128 bits, like allreduce_sum's host check (the sums are integers below 2^53).
  const auto s1 = a.check ? static_cast<unsigned __int128>(static_cast<std::uint64_t>(a.check[0])) : 0;
  const auto s2 = a.check ? static_cast<unsigned __int128>(static_cast<std::uint64_t>(a.check[1])) : 0;
  const bool bad = a.check && s2 * static_cast<std::uint64_t>(a.P) != s1 * s1;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto cnt = static_cast<double>(a.count);
  auto get = [](const Block* r, index_t k) {
    return r->dtype == DType::f32 ? static_cast<double>(static_cast<const float*>(r->data)[k])
                                  : static_cast<const double*>(r->data)[k];
  };
  auto put = [](const Block* r, index_t k, double v) {
    if (r->dtype == DType::f32) static_cast<float*>(r->data)[k] = static_cast<float>(v);
    else static_cast<double*>(r->data)[k] = v;
  };
  for (index_t k = 0; k < a.K; ++k) {
    switch (a.mode) {
      case NormFinish::check:
        if (bad) a.v[k] = nan;
        break;
      case NormFinish::mean: a.v[k] = bad ? nan : a.v[k] / cnt; break;
      case NormFinish::spread: {
        const double d = a.local_mean[k] - a.mean[k];
        a.v[k] = a.v[k] + static_cast<double>(a.local_count) * (d * d);
        break;
      }
      case NormFinish::eval:
        a.mean[k] = bad ? nan : get(a.run_mean, k);
        a.v[k] = bad ? nan : 1.0 / std::sqrt(get(a.run_var, k) + a.eps);
        break;
      case NormFinish::invstd: {
        const double var = bad ? nan : a.v[k] / cnt;
        const double unbiased = a.count > 1 ? var * cnt / static_cast<double>(a.count - 1) : var;
        const double m = a.momentum;
        if (a.run_mean) put(a.run_mean, k, (1 - m) * get(a.run_mean, k) + m * a.mean[k]);
        if (a.run_var) put(a.run_var, k, (1 - m) * get(a.run_var, k) + m * unbiased);
        a.v[k] = 1.0 / std::sqrt(var + a.eps);
        break;
      }
    }
  }
}

struct CpuNorm final : NormKernels {
  bool takes_strided_input() const override { return true; }
  // bf16 / f16 read and written in place: the loops widen every element to double and round the
  // result once (double -> float -> storage, exactly what the f32 working-copy route computes), so
  // a bf16 norm needs no whole-tensor f32 copies.
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void sums(DType dt, const NormGeom& g, const void* x, const double* mean, double* out, ExecContext&) const override {
    SHARD_NORM_DISPATCH(dt, sums_impl<T>(g, static_cast<const T*>(x), mean, out));
  }
  void moments(DType dt, const NormGeom& g, const void* x, double* sum, double* m2, double* lmean,
               ExecContext&) const override {
    SHARD_NORM_DISPATCH(dt, moments_impl<T>(g, static_cast<const T*>(x), sum, m2, lmean));
  }
  // The activation code becomes a template argument (with_act) once per call.
  void apply(DType dt, const NormGeom& g, const void* x, const double* mean, const double* invstd, const void* w,
             const void* b, const void* r, void* y, ExecContext&) const override {
    SHARD_NORM_DISPATCH(dt, with_act(g.act, [&](auto act) {
      apply_impl<T, decltype(act)::value>(g, static_cast<const T*>(x), mean, invstd, static_cast<const T*>(w),
                                          static_cast<const T*>(b), static_cast<const T*>(r), static_cast<T*>(y));
    }));
  }
  void backward_sums(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                     const double* invstd, const void* w, const void* b, const void* r, double* sg, double* sgx,
                     double* dw, double* db, ExecContext&) const override {
    SHARD_NORM_DISPATCH(dt, with_act(g.act, [&](auto act) {
      backward_sums_impl<T, decltype(act)::value>(g, static_cast<const T*>(x), static_cast<const T*>(gy), mean,
                                                  invstd, static_cast<const T*>(w), static_cast<const T*>(b),
                                                  static_cast<const T*>(r), sg, sgx, dw, db);
    }));
  }
  void backward_dx(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                   const double* invstd, const void* w, const void* b, const void* r, const double* sg,
                   const double* sgx, double inv_count, void* dx, void* dr, ExecContext&) const override {
    SHARD_NORM_DISPATCH(dt, with_act(g.act, [&](auto act) {
      backward_dx_impl<T, decltype(act)::value>(g, static_cast<const T*>(x), static_cast<const T*>(gy), mean, invstd,
                                                static_cast<const T*>(w), static_cast<const T*>(b),
                                                static_cast<const T*>(r), sg, sgx, inv_count, static_cast<T*>(dx),
                                                static_cast<T*>(dr));
    }));
  }
  void load_f64(DType dt, index_t n, const void* src, double* host, ExecContext&) const override {
    SHARD_NORM_DISPATCH(dt, load_impl<T>(n, static_cast<const T*>(src), host));
  }
  void store_f64(DType dt, index_t n, const double* host, void* dst, ExecContext&) const override {
    SHARD_NORM_DISPATCH(dt, store_impl<T>(n, host, static_cast<T*>(dst)));
  }
  void finish(const NormFinishArgs& a, ExecContext&) const override { finish_impl(a); }
};

#undef SHARD_NORM_DISPATCH

const CpuNorm g_cpu_norm;

}  // namespace

SHARD_CPU_TABLE(norm, g_cpu_norm);

}  // namespace shard::exec
