// CPU implementation of the reduce kernel family: the loops formerly in
// nn/functional/reduction.hpp and loss.hpp, moved (same order of accumulation, same threading).
#include <algorithm>
#include <cstdint>
#include <cmath>
#include <limits>
#include <vector>

#include "exec/reduce_kernels.hpp"
#include "exec/strided_rows.hpp"

namespace shard::exec {
namespace {

constexpr index_t kReduceParallelMin = index_t{1} << 16;

template <class F> void reduce_by_dtype(DType dt, F&& f) {
  if (dt == DType::f64) f(double{});
  else f(float{});
}

/// The mse gradient factor: T(scale * g[0]) with g the upstream gradient (one T), else T(scale)
/// (the CUDA kernels compute the same double product, then round once).
template <class T> T coefficient(double scale, const void* g) {
  return static_cast<T>(g ? scale * static_cast<double>(*static_cast<const T*>(g)) : scale);
}

/// The statistics allreduce's check failed (P * S2 != S1^2 over its two sums; null: no check).
bool check_failed(const double* check, index_t P) {
  if (!check) return false;
  const auto s1 = static_cast<unsigned __int128>(static_cast<std::uint64_t>(check[0]));
  const auto s2 = static_cast<unsigned __int128>(static_cast<std::uint64_t>(check[1]));
  return s2 * static_cast<std::uint64_t>(P) != s1 * s1;
}

/// Strides mapping an index of x's shape to the keepdim result `out` (0 on reduced dims).
Block::Extents keepdim_strides(const Block& x, const Block& out) {
  Block::Extents st{};
  index_t acc = 1;
  for (int d = out.rank - 1; d >= 0; --d) {
    const auto e = out.shape[static_cast<std::size_t>(d)];
    st[static_cast<std::size_t>(d)] = (e == 1 && x.shape[static_cast<std::size_t>(d)] != 1) ? 0 : acc;
    acc *= e;
  }
  return st;
}

/// The offset under strides st of row r of the dims [0, k) of shape s (row-major).
inline index_t outer_offset(const Block::Extents& s, const Block::Extents& st, int k, index_t r) {
  index_t off = 0;
  for (int d = k - 1; d >= 0; --d) {
    off += (r % s[static_cast<std::size_t>(d)]) * st[static_cast<std::size_t>(d)];
    r /= s[static_cast<std::size_t>(d)];
  }
  return off;
}

/// Calls f(i, j, o) for each element of x in element (row-major) order: i its index in a contiguous
/// block of x's shape, j its offset under the keepdim strides st, o its offset in x under x's own
/// strides (o == i for a contiguous x). Walking a strided x (e.g. the interior of a halo-padded
/// array) row by row in this order visits the same values in the same order as its contiguous copy,
/// so sums and maxima are bitwise those of the copy.
template <class Fn>
void for_each_mapped(const Block& x, const Block::Extents& st, Fn f) {
  const index_t n = x.numel();
  if (n == 0) return;
  const int R = x.rank;
  const auto& s = x.shape;
  const index_t inner = R ? s[static_cast<std::size_t>(R - 1)] : 1, outer = n / inner,
                is = R ? st[static_cast<std::size_t>(R - 1)] : 0, xs = detail::row_step(x);
  const bool dense = x.is_contiguous();
  for (index_t r = 0; r < outer; ++r) {
    const index_t off = outer_offset(s, st, R - 1, r);
    const index_t base = r * inner;
    if (dense) {
      for (index_t i = 0; i < inner; ++i) f(base + i, off + i * is, base + i);
    } else {
      const index_t xo = detail::row_offset(x, r);
      for (index_t i = 0; i < inner; ++i) f(base + i, off + i * is, xo + i * xs);
    }
  }
}

/// Adds n elements p[i * step] to the 8 double lanes l, element i into lane (pos + i) % 8, and
/// returns pos + n. Each lane adds its elements in index order, so a row split into pieces (the
/// rows of a strided view) gives the same lanes as the whole row.
template <class T>
index_t lane_add(double* l, const T* p, index_t n, index_t step, index_t pos) {
  index_t i = 0;
  for (; i < n && (pos + i) % 8 != 0; ++i) l[(pos + i) % 8] += static_cast<double>(p[i * step]);
  if (step == 1) {
    for (; i + 8 <= n; i += 8)
      for (int k = 0; k < 8; ++k) l[k] += static_cast<double>(p[i + k]);
  } else {
    for (; i + 8 <= n; i += 8)
      for (int k = 0; k < 8; ++k) l[k] += static_cast<double>(p[(i + k) * step]);
  }
  for (; i < n; ++i) l[(pos + i) % 8] += static_cast<double>(p[i * step]);
  return pos + n;
}

/// acc[j] += the sum of each "row" of x, when x's trailing dims [k, R) are all reduced (keepdim
/// stride 0): the row's elements go in index order into 8 interleaved double lanes, added pairwise
/// at the end. Eight independent add chains instead of one (one chain runs at one element per add
/// latency: 1.3 ms for 2^20 elements); the order depends only on the element's index, so a strided
/// view (walked row by row of its last dim) and its contiguous copy give the same bits, whatever the
/// thread count. False when it does not apply (no reduced trailing dim, or rows under 16 elements).
template <class T>
bool sum_rows_in_lanes(const Block& x, const Block::Extents& st, const T* px, std::vector<double>& acc) {
  const int R = x.rank;
  if (R == 0 || x.numel() == 0 || st[static_cast<std::size_t>(R - 1)] != 0) return false;
  const auto& s = x.shape;
  int k = R - 1;
  while (k > 0 && st[static_cast<std::size_t>(k - 1)] == 0) --k;
  index_t inner = 1;
  for (int d = k; d < R; ++d) inner *= s[static_cast<std::size_t>(d)];
  if (inner < 16) return false;
  const index_t last = s[static_cast<std::size_t>(R - 1)], pieces = inner / last;
  const index_t outer = x.numel() / inner, xs = detail::row_step(x);
  const bool dense = x.is_contiguous();
  for (index_t r = 0; r < outer; ++r) {
    const index_t off = outer_offset(s, st, k, r);
    double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (dense) {
      lane_add(l, px + r * inner, inner, 1, 0);
    } else {
      index_t pos = 0;
      for (index_t q = 0; q < pieces; ++q) pos = lane_add(l, px + detail::row_offset(x, r * pieces + q), last, xs, pos);
    }
    acc[static_cast<std::size_t>(off)] += ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  }
  return true;
}

struct CpuReduce final : ReduceKernels {
  bool takes_strided_input() const override { return true; }
  void reduce_sum(const Block& x, const Block& out, double scale, ExecContext&) const override {
    reduce_by_dtype(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* px = static_cast<const T*>(x.data);
      std::vector<double> acc(static_cast<std::size_t>(out.numel()), 0.0);
      const Block::Extents st = keepdim_strides(x, out);
      if (!sum_rows_in_lanes(x, st, px, acc))
        for_each_mapped(x, st, [&](index_t, index_t j, index_t o) { acc[static_cast<std::size_t>(j)] += px[o]; });
      T* po = static_cast<T*>(out.data);
      for (std::size_t j = 0; j < acc.size(); ++j) po[j] = static_cast<T>(acc[j] * scale);
    });
  }
  void reduce_max(const Block& x, const Block& out, ExecContext&) const override {
    reduce_by_dtype(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* px = static_cast<const T*>(x.data);
      T* po = static_cast<T*>(out.data);
      std::fill(po, po + out.numel(), -std::numeric_limits<T>::infinity());
      for_each_mapped(x, keepdim_strides(x, out), [&](index_t, index_t j, index_t o) { po[j] = std::max(po[j], px[o]); });
    });
  }
  void broadcast_scaled(const Block& g, const Block& gx, double scale, ExecContext&) const override {
    reduce_by_dtype(g.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T f = static_cast<T>(scale);
      const T* pg = static_cast<const T*>(g.data);
      T* pgx = static_cast<T*>(gx.data);
      for_each_mapped(gx, keepdim_strides(gx, g), [&](index_t i, index_t j, index_t) { pgx[i] = pg[j] * f; });
    });
  }
  void max_ties(const Block& x, const Block& m, const Block& ties, ExecContext&) const override {
    reduce_by_dtype(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* px = static_cast<const T*>(x.data);
      const T* pm = static_cast<const T*>(m.data);
      double* pt = static_cast<double*>(ties.data);
      std::fill(pt, pt + ties.numel(), 0.0);
      for_each_mapped(x, keepdim_strides(x, m), [&](index_t, index_t j, index_t o) {
        if (px[o] == pm[j]) pt[j] += 1.0;
      });
    });
  }
  void max_backward(const Block& x, const Block& m, const Block& g, const Block& ties, const Block& gx,
                    ExecContext&) const override {
    reduce_by_dtype(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* px = static_cast<const T*>(x.data);
      const T* pm = static_cast<const T*>(m.data);
      const T* pg = static_cast<const T*>(g.data);
      const double* pt = static_cast<const double*>(ties.data);
      T* pgx = static_cast<T*>(gx.data);
      for_each_mapped(x, keepdim_strides(x, m), [&](index_t i, index_t j, index_t o) {
        pgx[i] = px[o] == pm[j] ? static_cast<T>(pg[j] / pt[j]) : T(0);
      });
    });
  }
  double global_sum(int kind, DType dt, index_t n, const void* a, const void* b, ExecContext&) const override {
    double s = 0;
    reduce_by_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(a);
      const T* y = static_cast<const T*>(b);
      double acc = 0;
      if (kind == 0) {
#pragma omp parallel for reduction(+ : acc) schedule(static) if (n > kReduceParallelMin)
        for (index_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]);
      } else if (kind == 1) {
#pragma omp parallel for reduction(+ : acc) schedule(static) if (n > kReduceParallelMin)
        for (index_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(y[i]);
      } else {
#pragma omp parallel for reduction(+ : acc) schedule(static) if (n > kReduceParallelMin)
        for (index_t i = 0; i < n; ++i) {
          const double d = static_cast<double>(x[i]) - static_cast<double>(y[i]);
          acc += d * d;
        }
      }
      s = acc;
    });
    return s;
  }
  void global_sum_into(int kind, DType dt, index_t n, const void* a, const void* b, double scale, void* out,
                       ExecContext& ctx) const override {
    const double s = global_sum(kind, dt, n, a, b, ctx);
    reduce_by_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      *static_cast<T*>(out) = static_cast<T>(s * scale);
    });
  }
  void mse_backward(double scale, const void* g, DType dt, index_t n, const void* p, const void* t, void* gp, void* gt,
                    ExecContext&) const override {
    reduce_by_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      const T c = coefficient<T>(scale, g);
      const T* pp = static_cast<const T*>(p);
      const T* pt = static_cast<const T*>(t);
      T* o = static_cast<T*>(gp);
#pragma omp parallel for simd schedule(static) if (n > kReduceParallelMin)
      for (index_t i = 0; i < n; ++i) o[i] = c * (pp[i] - pt[i]);
      if (gt) {
        T* ot = static_cast<T*>(gt);
#pragma omp parallel for simd schedule(static) if (n > kReduceParallelMin)
        for (index_t i = 0; i < n; ++i) ot[i] = -o[i];
      }
    });
  }
  bool sq_diff_sum_strided(const Block& a, const Block& b, double& out, ExecContext&) const override {
    using detail::row_offset;
    const index_t inner = detail::row_extent(a), rows = inner ? a.numel() / inner : 0;
    const index_t sa = detail::row_step(a), sb = detail::row_step(b);
    double acc = 0;
    reduce_by_dtype(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* pa = static_cast<const T*>(a.data);
      const T* pb = static_cast<const T*>(b.data);
#pragma omp parallel for reduction(+ : acc) schedule(static) if (rows * inner > kReduceParallelMin)
      for (index_t r = 0; r < rows; ++r) {
        const T* x = pa + row_offset(a, r);
        const T* y = pb + row_offset(b, r);
        double s = 0;
        if (sa == 1 && sb == 1) {
#pragma omp simd reduction(+ : s)
          for (index_t i = 0; i < inner; ++i) {
            const double d = static_cast<double>(x[i]) - static_cast<double>(y[i]);
            s += d * d;
          }
        } else {
          for (index_t i = 0; i < inner; ++i) {
            const double d = static_cast<double>(x[i * sa]) - static_cast<double>(y[i * sb]);
            s += d * d;
          }
        }
        acc += s;
      }
    });
    out = acc;
    return true;
  }
  bool sq_diff_sum_strided_into(const Block& a, const Block& b, double scale, void* out,
                                ExecContext& ctx) const override {
    double s = 0;
    sq_diff_sum_strided(a, b, s, ctx);
    reduce_by_dtype(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      *static_cast<T*>(out) = static_cast<T>(s * scale);
    });
    return true;
  }
  bool mse_backward_strided(double scale, const void* g, const Block& p, const Block& t, const Block& gp,
                            const Block& gt, ExecContext&) const override {
    using detail::row_offset;
    const index_t inner = detail::row_extent(p), rows = inner ? p.numel() / inner : 0;
    const index_t sp = detail::row_step(p), st = detail::row_step(t);
    reduce_by_dtype(p.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T c = coefficient<T>(scale, g);
      const T* pp = static_cast<const T*>(p.data);
      const T* pt = static_cast<const T*>(t.data);
      T* o = static_cast<T*>(gp.data);
      T* ot = static_cast<T*>(gt.data);
#pragma omp parallel for schedule(static) if (rows * inner > kReduceParallelMin)
      for (index_t r = 0; r < rows; ++r) {
        const T* x = pp + row_offset(p, r);
        const T* y = pt + row_offset(t, r);
        T* g = o + r * inner;
        if (sp == 1 && st == 1) {
#pragma omp simd
          for (index_t i = 0; i < inner; ++i) g[i] = c * (x[i] - y[i]);
        } else {
          for (index_t i = 0; i < inner; ++i) g[i] = c * (x[i * sp] - y[i * st]);
        }
        if (ot) {
          T* gt_row = ot + r * inner;
#pragma omp simd
          for (index_t i = 0; i < inner; ++i) gt_row[i] = -g[i];
        }
      }
    });
    return true;
  }
  // Per sample, the same sequential order as the flat forms (row by row is element order).
  bool rel_l2_sums_strided(const Block& p, const Block& t, index_t samples, double* sums,
                           ExecContext&) const override {
    const index_t inner = detail::row_extent(p), rows = inner ? p.numel() / inner : 0;
    if (p.rank < 2 || rows % samples != 0) return false;
    const index_t per = rows / samples, sp = detail::row_step(p), st = detail::row_step(t);
    reduce_by_dtype(p.dtype, [&](auto tag) {
      using T = decltype(tag);
      for (index_t s = 0; s < samples; ++s) {
        double a = 0, b = 0;
        for (index_t r = s * per; r < (s + 1) * per; ++r) {
          const T* pp = static_cast<const T*>(p.data) + detail::row_offset(p, r);
          const T* pt = static_cast<const T*>(t.data) + detail::row_offset(t, r);
          for (index_t i = 0; i < inner; ++i) {
            const double d = static_cast<double>(pp[i * sp]) - static_cast<double>(pt[i * st]);
            a += d * d;
            b += static_cast<double>(pt[i * st]) * static_cast<double>(pt[i * st]);
          }
        }
        sums[2 * s] = a;
        sums[2 * s + 1] = b;
      }
    });
    return true;
  }
  bool rel_l2_backward_strided(const Block& p, const Block& t, index_t samples, const double* coef, const Block& gp,
                               const Block& gt, ExecContext&) const override {
    const index_t inner = detail::row_extent(p), rows = inner ? p.numel() / inner : 0;
    if (p.rank < 2 || rows % samples != 0) return false;
    const index_t per = rows / samples, sp = detail::row_step(p), st = detail::row_step(t);
    reduce_by_dtype(p.dtype, [&](auto tag) {
      using T = decltype(tag);
      for (index_t r = 0; r < rows; ++r) {
        const double cp = coef[2 * (r / per)], ct = coef[2 * (r / per) + 1];
        const T* pp = static_cast<const T*>(p.data) + detail::row_offset(p, r);
        const T* pt = static_cast<const T*>(t.data) + detail::row_offset(t, r);
        T* op = static_cast<T*>(gp.data) + r * inner;
        T* ot = static_cast<T*>(gt.data) + r * inner;
        for (index_t i = 0; i < inner; ++i) {
          const double d = static_cast<double>(pp[i * sp]) - static_cast<double>(pt[i * st]);
          op[i] = static_cast<T>(cp * d);
          ot[i] = static_cast<T>(-cp * d - ct * static_cast<double>(pt[i * st]));
        }
      }
    });
    return true;
  }
  void rel_l2_sums(DType dt, index_t samples, index_t inner, const void* p, const void* t, double* sums,
                   ExecContext&) const override {
    reduce_by_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      for (index_t s = 0; s < samples; ++s) {
        double a = 0, b = 0;
        const T* pp = static_cast<const T*>(p) + s * inner;
        const T* pt = static_cast<const T*>(t) + s * inner;
        for (index_t i = 0; i < inner; ++i) {
          const double d = static_cast<double>(pp[i]) - static_cast<double>(pt[i]);
          a += d * d;
          b += static_cast<double>(pt[i]) * static_cast<double>(pt[i]);
        }
        sums[2 * s] = a;
        sums[2 * s + 1] = b;
      }
    });
  }
  void rel_l2_backward(DType dt, index_t samples, index_t inner, const void* p, const void* t, const double* coef,
                       void* gp, void* gt, ExecContext&) const override {
    reduce_by_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      for (index_t s = 0; s < samples; ++s) {
        const double cp = coef[2 * s], ct = coef[2 * s + 1];
        const T* pp = static_cast<const T*>(p) + s * inner;
        const T* pt = static_cast<const T*>(t) + s * inner;
        T* op = static_cast<T*>(gp) + s * inner;
        T* ot = static_cast<T*>(gt) + s * inner;
        for (index_t i = 0; i < inner; ++i) {
          const double d = static_cast<double>(pp[i]) - static_cast<double>(pt[i]);
          op[i] = static_cast<T>(cp * d);
          ot[i] = static_cast<T>(-cp * d - ct * static_cast<double>(pt[i]));
        }
      }
    });
  }
  void rel_l2_value(DType dt, index_t samples, index_t global, const double* sums, const double* check, index_t P,
                    void* out, ExecContext&) const override {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    double loss = 0;
    for (index_t s = 0; s < samples; ++s) loss += std::sqrt(sums[2 * s]) / std::sqrt(sums[2 * s + 1]);
    loss = check_failed(check, P) ? nan : loss / static_cast<double>(global);
    reduce_by_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      *static_cast<T*>(out) = static_cast<T>(loss);
    });
  }
  void rel_l2_coefficients(DType dt, index_t samples, index_t global, const double* sums, const double* check,
                           index_t P, const void* g, double* coef, ExecContext&) const override {
    double gv = 0;
    reduce_by_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      gv = static_cast<double>(*static_cast<const T*>(g)) / static_cast<double>(global);
    });
    const bool bad = check_failed(check, P);
    for (index_t s = 0; s < samples; ++s) {
      const double a = std::sqrt(sums[2 * s]), b = std::sqrt(sums[2 * s + 1]);
      coef[2 * s] = bad ? std::numeric_limits<double>::quiet_NaN() : a > 0 ? gv / (a * b) : 0.0;  // d/dp of a/b
      coef[2 * s + 1] = bad ? std::numeric_limits<double>::quiet_NaN() : gv * a / (b * b * b);  // d/dt: -a t / b^3
    }
  }
};

const CpuReduce g_cpu_reduce;

}  // namespace

SHARD_CPU_TABLE(reduce, g_cpu_reduce);

}  // namespace shard::exec
