// CPU table of the points kernel family (include/shardtensor/exec/points.hpp): plain loops in
// index order, sums in double. The per-point formulas (weights, interpolation stencils, the
// cells within a radius) are src/kernels_api/points_ops.hpp, shared with the CUDA kernels.
#include <algorithm>
#include <cmath>
#include <vector>

#include "exec/points_kernels.hpp"
#include "shardtensor/core/error.hpp"

namespace shard::exec {
namespace {

using kernels::PtsCorners;
using kernels::PtsGrid;

template <class F>
void dispatch(DType dt, F&& f) {
  if (dt == DType::f64) f(double{});
  else f(float{});
}

index_t valid_count(const index_t* cnt, index_t i, index_t K, const char* op) {
  const index_t c = cnt[i];
  SHARD_CHECK(c >= 0 && c <= K, op, "neighbour count {} of row {} outside [0, {}]", c, i, K);
  return c;
}

template <class T>
void point_of(const T* p, int D, double* x) {
  for (int d = 0; d < D; ++d) x[d] = static_cast<double>(p[d]);
}

struct CpuPoints final : PointsKernels {
  void offsets_forward(DType dt, const PointListGeometry& g, const void* gathered, const void* query,
                       const index_t* ix, void* out, ExecContext&) const override {
    const index_t n = g.n, K = g.k, D = g.width;
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* G = static_cast<const T*>(gathered);
      const T* q = static_cast<const T*>(query);
      T* y = static_cast<T*>(out);
      for (index_t i = 0; i < n; ++i)
        for (index_t k = 0; k < K; ++k)
          for (index_t d = 0; d < D; ++d) {
            const index_t e = (i * K + k) * D + d;
            y[e] = ix[i * K + k] >= 0 ? G[e] - q[i * D + d] : T(0);
          }
    });
  }

  void offsets_backward(DType dt, const PointListGeometry& g, const void* grad, const index_t* ix, void* g_gathered,
                        void* g_query, ExecContext&) const override {
    const index_t n = g.n, K = g.k, D = g.width;
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* gy = static_cast<const T*>(grad);
      T* gG = static_cast<T*>(g_gathered);
      T* gq = static_cast<T*>(g_query);
      for (index_t i = 0; i < n; ++i)
        for (index_t d = 0; d < D; ++d) {
          double s = 0;
          for (index_t k = 0; k < K; ++k) {
            const index_t e = (i * K + k) * D + d;
            const bool valid = ix[i * K + k] >= 0;
            if (gG) gG[e] = valid ? gy[e] : T(0);
            if (valid) s += static_cast<double>(gy[e]);
          }
          if (gq) gq[i * D + d] = static_cast<T>(-s);
        }
    });
  }

  void norm_forward(DType dt, const PointListGeometry& g, const void* offsets, void* out, ExecContext&) const override {
    const index_t nk = g.n * g.k, D = g.width;
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* o = static_cast<const T*>(offsets);
      T* y = static_cast<T*>(out);
      for (index_t e = 0; e < nk; ++e) {
        double s = 0;
        for (index_t d = 0; d < D; ++d) s += static_cast<double>(o[e * D + d]) * static_cast<double>(o[e * D + d]);
        y[e] = static_cast<T>(std::sqrt(s));
      }
    });
  }

  void norm_backward(DType dt, const PointListGeometry& g, const void* offsets, const void* dist, const void* grad,
                     void* g_offsets, ExecContext&) const override {
    const index_t nk = g.n * g.k, D = g.width;
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* o = static_cast<const T*>(offsets);
      const T* dd = static_cast<const T*>(dist);
      const T* gy = static_cast<const T*>(grad);
      T* go = static_cast<T*>(g_offsets);
      for (index_t e = 0; e < nk; ++e) {
        const double s = dd[e] > T(0) ? static_cast<double>(gy[e]) / static_cast<double>(dd[e]) : 0.0;
        for (index_t d = 0; d < D; ++d) go[e * D + d] = static_cast<T>(s * static_cast<double>(o[e * D + d]));
      }
    });
  }

  // f(dist) (grad null) or grad f'(dist), for j < counts[i]; 0 elsewhere
  static void weights_apply(DType dt, const PointListGeometry& g, const PointWeightFn& f, const void* dist,
                            const index_t* cnt, const void* grad, void* out) {
    const index_t n = g.n, K = g.k;
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* d = static_cast<const T*>(dist);
      const T* gy = static_cast<const T*>(grad);
      T* y = static_cast<T*>(out);
      for (index_t i = 0; i < n; ++i)
        for (index_t k = 0; k < K; ++k) {
          double w = 0, dw = 0;
          if (k < cnt[i]) kernels::pts_weight_of(static_cast<int>(f.kind), f.param, static_cast<double>(d[i * K + k]), w, dw);
          y[i * K + k] = static_cast<T>(gy ? dw * static_cast<double>(gy[i * K + k]) : w);
        }
    });
  }

  void weights_forward(DType dt, const PointListGeometry& g, const PointWeightFn& f, const void* dist,
                       const index_t* cnt, void* out, ExecContext&) const override {
    weights_apply(dt, g, f, dist, cnt, nullptr, out);
  }

  void weights_backward(DType dt, const PointListGeometry& g, const PointWeightFn& f, const void* dist,
                        const index_t* cnt, const void* grad, void* g_dist, ExecContext&) const override {
    weights_apply(dt, g, f, dist, cnt, grad, g_dist);
  }

  void aggregate_forward(DType dt, const PointListGeometry& g, PointAggregate reduce, const void* values,
                         const void* weights, const index_t* cnt, void* out, index_t* am,
                         ExecContext&) const override {
    const char* op = "aggregate";
    const index_t n = g.n, K = g.k, C = g.width;
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* v = static_cast<const T*>(values);
      const T* w = static_cast<const T*>(weights);
      T* y = static_cast<T*>(out);
      for (index_t i = 0; i < n; ++i) {
        const index_t m = valid_count(cnt, i, K, op);
        for (index_t c = 0; c < C; ++c) {
          if (reduce == PointAggregate::max) {
            index_t best = -1;
            T bv = T(0);
            for (index_t k = 0; k < m; ++k) {
              const T x = w ? w[i * K + k] * v[(i * K + k) * C + c] : v[(i * K + k) * C + c];
              if (best < 0 || x > bv) {
                best = k;
                bv = x;
              }
            }
            y[i * C + c] = bv;
            am[i * C + c] = best;
            continue;
          }
          double s = 0;
          for (index_t k = 0; k < m; ++k) {
            const double x = static_cast<double>(v[(i * K + k) * C + c]);
            s += w ? static_cast<double>(w[i * K + k]) * x : x;
          }
          if (reduce == PointAggregate::mean) s = m > 0 ? s / static_cast<double>(m) : 0.0;
          y[i * C + c] = static_cast<T>(s);
        }
      }
    });
  }

  void aggregate_backward(DType dt, const PointListGeometry& g, PointAggregate reduce, const void* values,
                          const void* weights, const index_t* cnt, const index_t* am, const void* grad,
                          void* g_values, void* g_weights, ExecContext&) const override {
    const char* op = "aggregate";
    const index_t n = g.n, K = g.k, C = g.width;
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* v = static_cast<const T*>(values);
      const T* w = static_cast<const T*>(weights);
      const T* gy = static_cast<const T*>(grad);
      T* gv = static_cast<T*>(g_values);
      T* gw = static_cast<T*>(g_weights);
      if (gv) std::fill(gv, gv + n * K * C, T(0));
      if (gw) std::fill(gw, gw + n * K, T(0));
      for (index_t i = 0; i < n; ++i) {
        const index_t m = valid_count(cnt, i, K, op);
        if (reduce == PointAggregate::max) {
          for (index_t c = 0; c < C; ++c) {
            const index_t k = am[i * C + c];
            if (k < 0) continue;
            SHARD_CHECK(k < m, op, "argmax {} of row {} outside [0, {})", k, i, m);
            const T gc = gy[i * C + c];
            if (gv) gv[(i * K + k) * C + c] += w ? w[i * K + k] * gc : gc;
            if (gw) gw[i * K + k] += gc * v[(i * K + k) * C + c];
          }
          continue;
        }
        const double scale = reduce == PointAggregate::mean ? (m > 0 ? 1.0 / static_cast<double>(m) : 0.0) : 1.0;
        for (index_t k = 0; k < m; ++k) {
          const double wk = w ? static_cast<double>(w[i * K + k]) : 1.0;
          double sw = 0;
          for (index_t c = 0; c < C; ++c) {
            const double gc = static_cast<double>(gy[i * C + c]) * scale;
            if (gv) gv[(i * K + k) * C + c] = static_cast<T>(wk * gc);
            sw += gc * static_cast<double>(v[(i * K + k) * C + c]);
          }
          if (gw) gw[i * K + k] = static_cast<T>(sw);
        }
      }
    });
  }

  // ---------------------------------------------------------------------------- point <-> grid

  void grid_interp(DType dt, const PtsGrid& g, const void* ext, const void* points, void* out,
                   ExecContext&) const override {
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* v = static_cast<const T*>(ext);
      const T* p = static_cast<const T*>(points);
      T* y = static_cast<T*>(out);
      const index_t C = g.channels, D = g.dims;
      double x[3];
      PtsCorners k;
      for (index_t i = 0; i < g.points; ++i) {
        point_of(p + i * D, g.dims, x);
        kernels::pts_corners(g, x, k);
        for (index_t c = 0; c < C; ++c) {
          double acc = 0;
          for (int j = 0; j < k.n; ++j) acc += k.w[j] * static_cast<double>(v[c * g.sc + k.cell[j]]);
          y[i * C + c] = static_cast<T>(acc);
        }
      }
    });
  }

  void grid_interp_grad_points(DType dt, const PtsGrid& g, const void* ext, const void* points, const void* grad,
                               void* gpoints, ExecContext&) const override {
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* v = static_cast<const T*>(ext);
      const T* p = static_cast<const T*>(points);
      const T* gy = static_cast<const T*>(grad);
      T* gx = static_cast<T*>(gpoints);
      const index_t C = g.channels, D = g.dims;
      double x[3];
      PtsCorners k;
      for (index_t i = 0; i < g.points; ++i) {
        point_of(p + i * D, g.dims, x);
        kernels::pts_corners(g, x, k);
        double acc[3] = {0, 0, 0};
        for (int j = 0; j < k.n; ++j) {
          double s = 0;  // sum_c grad[c] * v[c, corner]
          for (index_t c = 0; c < C; ++c)
            s += static_cast<double>(gy[i * C + c]) * static_cast<double>(v[c * g.sc + k.cell[j]]);
          for (index_t d = 0; d < D; ++d) acc[d] += k.dw[j][d] * s;
        }
        for (index_t d = 0; d < D; ++d) gx[i * D + d] = static_cast<T>(acc[d]);
      }
    });
  }

  void grid_interp_scatter(DType dt, const PtsGrid& g, const void* points, const void* grad, double* v,
                           ExecContext&) const override {
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* p = static_cast<const T*>(points);
      const T* gy = static_cast<const T*>(grad);
      const index_t C = g.channels, D = g.dims;
      double x[3];
      PtsCorners k;
      for (index_t i = 0; i < g.points; ++i) {
        point_of(p + i * D, g.dims, x);
        kernels::pts_corners(g, x, k);
        for (index_t c = 0; c < C; ++c)
          for (int j = 0; j < k.n; ++j) v[c * g.sc + k.cell[j]] += k.w[j] * static_cast<double>(gy[i * C + c]);
      }
    });
  }

  void grid_splat(DType dt, const PtsGrid& g, const void* points, const void* features, bool with_w, double* v,
                  ExecContext&) const override {
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* p = static_cast<const T*>(points);
      const T* f = static_cast<const T*>(features);
      const index_t C = g.channels, D = g.dims;
      double x[3], dw[3];
      kernels::pts_idx a[3], b[3], ic[3];
      for (index_t i = 0; i < g.points; ++i) {
        const T* fi = f + i * C;
        point_of(p + i * D, g.dims, x);
        if (!kernels::pts_cell_range(g, x, a, b)) continue;
        for (int d = 0; d < g.dims; ++d) ic[d] = a[d];
        do {
          kernels::pts_idx cell = 0;
          double w = 0;
          if (!kernels::pts_cell_weight(g, x, ic, cell, w, dw)) continue;
          for (index_t c = 0; c < C; ++c) v[c * g.sc + cell] += w * static_cast<double>(fi[c]);
          if (with_w) v[C * g.sc + cell] += w;
        } while (kernels::pts_next_cell(g.dims, a, b, ic));
      }
    });
  }

  void grid_splat_backward(DType dt, const PtsGrid& g, const double* v, const void* points, const void* features,
                           bool with_w, void* gfeatures, void* gpoints, ExecContext&) const override {
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* p = static_cast<const T*>(points);
      const T* f = static_cast<const T*>(features);
      T* gf = static_cast<T*>(gfeatures);
      T* gp = static_cast<T*>(gpoints);
      const index_t C = g.channels, D = g.dims;
      std::vector<double> accf(static_cast<std::size_t>(C));
      double x[3], dw[3];
      kernels::pts_idx a[3], b[3], ic[3];
      for (index_t i = 0; i < g.points; ++i) {
        const T* fi = f + i * C;
        std::fill(accf.begin(), accf.end(), 0.0);
        double accp[3] = {0, 0, 0};
        point_of(p + i * D, g.dims, x);
        if (kernels::pts_cell_range(g, x, a, b)) {
          for (int d = 0; d < g.dims; ++d) ic[d] = a[d];
          do {
            kernels::pts_idx cell = 0;
            double w = 0;
            if (!kernels::pts_cell_weight(g, x, ic, cell, w, dw)) continue;
            if (gf)
              for (index_t c = 0; c < C; ++c) accf[static_cast<std::size_t>(c)] += w * v[c * g.sc + cell];
            if (gp && g.linear) {
              double s = with_w ? v[C * g.sc + cell] : 0.0;
              for (index_t c = 0; c < C; ++c) s += static_cast<double>(fi[c]) * v[c * g.sc + cell];
              for (index_t d = 0; d < D; ++d) accp[d] += dw[d] * s;
            }
          } while (kernels::pts_next_cell(g.dims, a, b, ic));
        }
        if (gf)
          for (index_t c = 0; c < C; ++c) gf[i * C + c] = static_cast<T>(accf[static_cast<std::size_t>(c)]);
        if (gp)
          for (index_t d = 0; d < D; ++d) gp[i * D + d] = static_cast<T>(accp[d]);
      }
    });
  }

  void grid_mean(index_t C, index_t cells, double* s, ExecContext&) const override {
    for (index_t k = 0; k < cells; ++k) {
      const double wsum = s[C * cells + k];
      for (index_t c = 0; c < C; ++c) s[c * cells + k] = wsum > 0 ? s[c * cells + k] / wsum : 0.0;
    }
  }

  void grid_mean_backward(index_t C, index_t cells, const double* q, bool with_w, double* v,
                          ExecContext&) const override {
    for (index_t k = 0; k < cells; ++k) {
      const double S = q[C * cells + k];
      double gs = 0;
      for (index_t c = 0; c < C; ++c) {
        const double gc = v[c * cells + k];
        gs -= gc * q[c * cells + k];
        v[c * cells + k] = S > 0 ? gc / S : 0.0;
      }
      if (with_w) v[C * cells + k] = S > 0 ? gs / S : 0.0;
    }
  }

  void owner(DType dt, index_t n, const kernels::PtsPartition& part, const void* points, index_t* own, index_t* counts,
             ExecContext&) const override {
    std::fill(counts, counts + part.ranks + 1, index_t{0});
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* p = static_cast<const T*>(points);
      for (index_t i = 0; i < n; ++i) {
        const index_t o = kernels::pts_owner(part, p + i * part.dims);
        if (own) own[i] = o;
        ++counts[o < 0 ? part.ranks : o];
      }
    });
  }

  void bucket_rows(index_t n, int ranks, const index_t* own, const index_t* offsets, index_t* rows,
                   ExecContext&) const override {
    std::vector<index_t> fill(offsets, offsets + ranks);
    for (index_t i = 0; i < n; ++i)
      if (own[i] >= 0) rows[fill[static_cast<std::size_t>(own[i])]++] = i;
  }

  template <class T>
  static double bound_of(const void* pb, index_t stride, index_t i) {
    return pb ? static_cast<double>(static_cast<const T*>(pb)[i * stride + stride - 1]) : 0.0;
  }
  void near_boxes_count(DType dt, index_t n, const kernels::PtsBoxes& g, const void* points, const void* pb,
                        index_t pbs, index_t* counts, ExecContext&) const override {
    std::fill(counts, counts + g.boxes, index_t{0});
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* p = static_cast<const T*>(points);
      for (index_t i = 0; i < n; ++i) {
        const double bound = bound_of<T>(pb, pbs, i);
        for (index_t b = 0; b < g.boxes; ++b)
          if (kernels::pts_box_selects(g, b, p + i * g.dims, pb != nullptr, bound)) ++counts[b];
      }
    });
  }
  void near_boxes_rows(DType dt, index_t n, const kernels::PtsBoxes& g, const void* points, const void* pb,
                       index_t pbs, const index_t* offsets, index_t* rows, ExecContext&) const override {
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* p = static_cast<const T*>(points);
      for (index_t b = 0; b < g.boxes; ++b) {
        if (!(g.threshold[b] >= 0)) continue;
        index_t at = offsets[b];
        for (index_t i = 0; i < n; ++i)
          if (kernels::pts_box_selects(g, b, p + i * g.dims, pb != nullptr, bound_of<T>(pb, pbs, i))) rows[at++] = i;
      }
    });
  }
  void list_filter(DType dt, index_t n, index_t k, const void* d2, const void* bound, index_t* ix,
                   ExecContext&) const override {
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      const T* d = static_cast<const T*>(d2);
      const T* b = static_cast<const T*>(bound);
      for (index_t e = 0; e < n * k; ++e)
        if (!(d[e] <= b[e / k])) ix[e] = -1;
    });
  }
  void remap(index_t n, index_t m, const index_t* table, index_t* ix, ExecContext&) const override {
    for (index_t e = 0; e < n; ++e) {
      const index_t v = ix[e];
      if (v < 0) continue;
      SHARD_CHECK(v < m, "points_remap", "index {} at {} is outside the table of {} entries", v, e, m);
      ix[e] = table[v];
    }
  }
};

const CpuPoints g_cpu_points;

}  // namespace

SHARD_CPU_TABLE(points, g_cpu_points);

}  // namespace shard::exec
