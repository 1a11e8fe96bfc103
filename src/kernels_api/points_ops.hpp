#pragma once
// The per-point maths of the points family (include/shardtensor/exec/points.hpp), shared by the
// CPU table (src/exec/points_cpu.cpp) and the CUDA kernels (kernels/points.cu), so both devices
// evaluate the same formulas in the same order: distance weights and their derivative, the
// multilinear interpolation stencil of a point in an extended grid block, and the walk over the
// cells within a radius of a point. Plain C++17 (host and device), double arithmetic.
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SHARD_PTS_HD __host__ __device__ __forceinline__
#else
#define SHARD_PTS_HD inline
#endif

namespace shard::kernels {

using pts_idx = std::int64_t;

/// Weight kinds (exec::PointWeightFn::Kind order).
enum PtsWeight : int { pts_inverse_distance = 0, pts_gaussian = 1, pts_linear = 2 };
/// Aggregations (exec::PointAggregate order).
enum PtsAggregate : int { pts_sum = 0, pts_mean = 1, pts_max = 2 };

/// f(d) and f'(d) of a distance weight.
SHARD_PTS_HD void pts_weight_of(int kind, double param, double d, double& w, double& dw) {
  if (kind == pts_inverse_distance) {
    const double a = 1.0 / (d + param);
    w = a;
    dw = -a * a;
  } else if (kind == pts_gaussian) {
    const double s2 = param * param;
    w = exp(-d * d / (2 * s2));
    dw = -d / s2 * w;
  } else {
    w = d < param ? 1.0 - d / param : 0.0;
    dw = d < param ? -1.0 / param : 0.0;
  }
}

/// A rank's part of a point <-> grid op (exec::PointGridGeometry) with the element strides of the
/// extended block it reads or writes: sc per channel, s[d] per spatial dim.
struct PtsGrid {
  int dims = 0;
  pts_idx channels = 0, points = 0;
  pts_idx global[3] = {0, 0, 0}, offset[3] = {0, 0, 0}, len[3] = {0, 0, 0}, ghost[3] = {0, 0, 0};
  double lo[3] = {0, 0, 0}, h[3] = {1, 1, 1};
  double radius = 0;
  int linear = 0;
  pts_idx sc = 0, s[3] = {0, 0, 0};
  SHARD_PTS_HD pts_idx ext(int d) const { return len[d] + 2 * ghost[d]; }
  SHARD_PTS_HD pts_idx cell(const pts_idx* i) const {
    pts_idx o = 0;
    for (int d = 0; d < dims; ++d) o += i[d] * s[d];
    return o;
  }
};

/// The 2^D corners of a point's interpolation stencil in the extended block.
struct PtsCorners {
  int n = 0;
  pts_idx cell[8];   ///< offsets (without the channel)
  double w[8];       ///< multilinear weights
  double dw[8][3];   ///< d w / d x_d
};

/// The stencil of point p (D coordinates, read as double by the caller).
SHARD_PTS_HD void pts_corners(const PtsGrid& g, const double* p, PtsCorners& c) {
  const int D = g.dims;
  pts_idx e0[3] = {0, 0, 0};
  double t[3] = {0, 0, 0};
  bool clamped[3] = {false, false, false};  // both corners are the edge cell: flat along d
  for (int d = 0; d < D; ++d) {
    const double x = (p[d] - g.lo[d]) / g.h[d] - 0.5;
    const double f = floor(x);
    pts_idx e = static_cast<pts_idx>(f) - (g.offset[d] - g.ghost[d]);
    double tt = x - f;
    // The partition check keeps e in [0, ext - 2]; guard against the last bit of rounding.
    if (e < 0) {
      e = 0;
      tt = 0;
    }
    if (e > g.ext(d) - 2) {
      e = g.ext(d) - 2;
      tt = 1;
    }
    e0[d] = e;
    t[d] = tt;
    const pts_idx i0 = e + g.offset[d] - g.ghost[d];  // global index of the lower corner
    clamped[d] = i0 < 0 || i0 + 1 > g.global[d] - 1;
  }
  c.n = 1 << D;
  for (int k = 0; k < c.n; ++k) {
    pts_idx idx[3] = {0, 0, 0};
    double w = 1;
    double wd[3] = {1, 1, 1};  // product of the other dims' weights
    for (int d = 0; d < D; ++d) {
      const bool up = (k >> d) & 1;
      idx[d] = e0[d] + (up ? 1 : 0);
      const double wdim = up ? t[d] : 1 - t[d];
      for (int e = 0; e < D; ++e)
        if (e != d) wd[e] *= wdim;
      w *= wdim;
    }
    c.cell[k] = g.cell(idx);
    c.w[k] = w;
    for (int d = 0; d < D; ++d) {
      const bool up = (k >> d) & 1;
      c.dw[k][d] = clamped[d] ? 0.0 : wd[d] * (up ? 1.0 : -1.0) / g.h[d];
    }
  }
}

/// The range of cells [a[d], b[d]] of the extended block (global indices, inside the domain) that
/// may lie within g.radius of p; false when empty.
SHARD_PTS_HD bool pts_cell_range(const PtsGrid& g, const double* p, pts_idx* a, pts_idx* b) {
  const double r = g.radius;
  for (int d = 0; d < g.dims; ++d) {
    const double c = (p[d] - g.lo[d]) / g.h[d] - 0.5, rh = r / g.h[d];
    pts_idx first = g.offset[d] - g.ghost[d];
    if (first < 0) first = 0;
    pts_idx last = g.offset[d] + g.len[d] - 1 + g.ghost[d];
    if (last > g.global[d] - 1) last = g.global[d] - 1;
    const pts_idx lo = static_cast<pts_idx>(ceil(c - rh)) - 1, hi = static_cast<pts_idx>(floor(c + rh)) + 1;
    a[d] = lo > first ? lo : first;
    b[d] = hi < last ? hi : last;
    if (a[d] > b[d]) return false;
  }
  return true;
}

/// For global cell i (in the range above) of point p: whether it is within the radius with a
/// positive weight, its offset in the extended block, its weight and d w / d p.
SHARD_PTS_HD bool pts_cell_weight(const PtsGrid& g, const double* p, const pts_idx* i, pts_idx& cell, double& w,
                                  double* dw) {
  const int D = g.dims;
  const double r = g.radius;
  double d2 = 0;
  double diff[3] = {0, 0, 0};
  for (int d = 0; d < D; ++d) {
    diff[d] = p[d] - (g.lo[d] + (static_cast<double>(i[d]) + 0.5) * g.h[d]);
    d2 += diff[d] * diff[d];
  }
  if (!(d2 <= r * r)) return false;
  w = 1;
  for (int d = 0; d < 3; ++d) dw[d] = 0;
  if (g.linear) {
    const double dist = sqrt(d2);
    w = 1 - dist / r;
    if (dist > 0)
      for (int d = 0; d < D; ++d) dw[d] = -diff[d] / (dist * r);
  }
  if (!(w > 0)) return false;
  pts_idx e[3] = {0, 0, 0};
  for (int d = 0; d < D; ++d) e[d] = i[d] - (g.offset[d] - g.ghost[d]);
  cell = g.cell(e);
  return true;
}

/// Advances the row-major multi-index i over [a, b]; false after the last.
SHARD_PTS_HD bool pts_next_cell(int D, const pts_idx* a, const pts_idx* b, pts_idx* i) {
  int d = D - 1;
  while (d >= 0 && i[d] == b[d]) {
    i[d] = a[d];
    --d;
  }
  if (d < 0) return false;
  ++i[d];
  return true;
}

/// A box partition (exec::PointBoxPartition) with its arrays readable where the kernel runs:
/// cuts of dim d at cuts[meta[d] .. meta[d + 1]), the rank stride of dim d at meta[dims + 1 + d].
struct PtsPartition {
  int dims = 0;
  int ranks = 1;
  const double* cuts = nullptr;
  const pts_idx* meta = nullptr;  ///< offsets [dims + 1], then strides [dims]
};

/// The rank whose box holds point p (dims coordinates of type T), -1 outside the domain or NaN:
/// dist/points.hpp BoxPartition::owner, the same comparisons in the same order.
template <class T>
SHARD_PTS_HD pts_idx pts_owner(const PtsPartition& g, const T* p) {
  pts_idx rank = 0;
  for (int d = 0; d < g.dims; ++d) {
    const double* c = g.cuts + g.meta[d];
    const pts_idx m = g.meta[d + 1] - g.meta[d];
    const double x = static_cast<double>(p[d]);
    if (!(x >= c[0] && x <= c[m - 1])) return -1;  // outside, or NaN
    pts_idx lo = 0, hi = m;  // upper bound: the first cut > x
    while (lo < hi) {
      const pts_idx mid = lo + (hi - lo) / 2;
      if (c[mid] > x) hi = mid;
      else lo = mid + 1;
    }
    pts_idx k = lo - 1;
    if (k > m - 2) k = m - 2;
    while (k > 0 && c[k] == c[k + 1] && x == c[m - 1]) --k;  // x == hi: the last non-empty slab
    rank += k * g.meta[g.dims + 1 + d];
  }
  return rank;
}

/// Boxes of the halo selections (exec::PointBoxes) with their arrays readable where the kernel
/// runs: box b is the closed box [lo[b * dims + d], hi[b * dims + d]]; threshold[b] < 0: box b
/// selects nothing. With a per-point bound pb (pb_stride elements per point, the last one used:
/// e.g. the k-th d2 of a kNN row), the bound of point i is pb * scale + add wherever
/// threshold[b] >= 0; without it, threshold[b].
struct PtsBoxes {
  int dims = 0;
  pts_idx boxes = 0;
  const double* lo = nullptr;
  const double* hi = nullptr;
  const double* threshold = nullptr;
  double scale = 1, add = 0;
};

/// a * b and a + b rounded once each (never contracted into an fma by nvcc, so a device and the
/// CPU table compute the same distances and bounds bit for bit).
SHARD_PTS_HD double pts_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
SHARD_PTS_HD double pts_add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

/// Whether box b selects point p (dims coordinates of T; bound: the point's own bound, read only
/// when the selection has per-point bounds): dist2(p, box b) <= the bound, with dist2 summed in
/// double in dim order as BoxPartition::dist2_to_box. NaN coordinates or bounds select nothing.
template <class T>
SHARD_PTS_HD bool pts_box_selects(const PtsBoxes& g, pts_idx b, const T* p, bool per_point, double bound) {
  const double t = g.threshold[b];
  if (!(t >= 0)) return false;
  const double lim = per_point ? pts_add(pts_mul(bound, g.scale), g.add) : t;
  double s = 0;
  for (int d = 0; d < g.dims; ++d) {
    const double l = g.lo[b * g.dims + d], h = g.hi[b * g.dims + d], x = static_cast<double>(p[d]);
    const double e = x < l ? l - x : (x > h ? x - h : 0.0);
    s = pts_add(s, pts_mul(e, e));
  }
  return s <= lim;
}

}  // namespace shard::kernels
