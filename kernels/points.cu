// CUDA kernels of the points family (launchers: src/kernels_api/points.hpp). The per-point
// formulas are src/kernels_api/points_ops.hpp, the same code the CPU table runs. Neighbour-list
// kernels: one thread per output element (or per row where a row's entries are summed), no
// atomics, the CPU's summation order. Grid kernels: one thread per point; the scatters add into
// f64 blocks with a compare-and-swap loop (the simulator lane has no atom.add.f64), so the order
// of the additions into one cell may vary between runs.
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_api/points.hpp"

namespace shard::kernels {
namespace {

using idx = pts_idx;
using namespace cu;

__device__ __forceinline__ void atomic_add_f64(double* p, double v) {
  auto* a = reinterpret_cast<unsigned long long*>(p);
  unsigned long long old = *a, assumed;
  do {
    assumed = old;
    old = atomicCAS(a, assumed,
                    static_cast<unsigned long long>(__double_as_longlong(
                        __dadd_rn(__longlong_as_double(static_cast<long long>(assumed)), v))));
  } while (assumed != old);
}

__device__ __forceinline__ idx clamp_count(idx c, idx k) { return c < 0 ? 0 : (c > k ? k : c); }

template <class T>
__global__ void offsets_fwd(idx n, idx k, idx D, const T* G, const T* q, const idx* ix, T* y) {
  SHARD_GRID_STRIDE(e, n * k * D) {
    const idx d = e % D, ik = e / D, i = ik / k;
    y[e] = ix[ik] >= 0 ? G[e] - q[i * D + d] : T(0);
  }
}

template <class T>
__global__ void offsets_bwd(idx n, idx k, idx D, const T* gy, const idx* ix, T* gG, T* gq) {
  SHARD_GRID_STRIDE(t, n * D) {
    const idx i = t / D, d = t - i * D;
    double s = 0;
    for (idx j = 0; j < k; ++j) {
      const idx e = (i * k + j) * D + d;
      const bool valid = ix[i * k + j] >= 0;
      if (gG) gG[e] = valid ? gy[e] : T(0);
      if (valid) s += static_cast<double>(gy[e]);
    }
    if (gq) gq[t] = static_cast<T>(-s);
  }
}

template <class T>
__global__ void norm_fwd(idx nk, idx D, const T* o, T* y) {
  SHARD_GRID_STRIDE(e, nk) {
    double s = 0;
    for (idx d = 0; d < D; ++d) s += static_cast<double>(o[e * D + d]) * static_cast<double>(o[e * D + d]);
    y[e] = static_cast<T>(sqrt(s));
  }
}

template <class T>
__global__ void norm_bwd(idx nk, idx D, const T* o, const T* dd, const T* gy, T* go) {
  SHARD_GRID_STRIDE(e, nk) {
    const double s = dd[e] > T(0) ? static_cast<double>(gy[e]) / static_cast<double>(dd[e]) : 0.0;
    for (idx d = 0; d < D; ++d) go[e * D + d] = static_cast<T>(s * static_cast<double>(o[e * D + d]));
  }
}

template <class T>
__global__ void weights_k(idx n, idx k, int kind, double param, const T* dist, const idx* cnt, const T* gy, T* out) {
  SHARD_GRID_STRIDE(e, n * k) {
    const idx i = e / k, j = e - i * k;
    double w = 0, dw = 0;
    if (j < cnt[i]) pts_weight_of(kind, param, static_cast<double>(dist[e]), w, dw);
    out[e] = gy ? static_cast<T>(dw * static_cast<double>(gy[e])) : static_cast<T>(w);
  }
}

template <class T>
__global__ void aggregate_fwd(idx n, idx k, idx C, int reduce, const T* v, const T* w, const idx* cnt, T* y, idx* am) {
  SHARD_GRID_STRIDE(t, n * C) {
    const idx i = t / C, c = t - i * C;
    const idx m = clamp_count(cnt[i], k);
    if (reduce == pts_max) {
      idx best = -1;
      T bv = T(0);
      for (idx j = 0; j < m; ++j) {
        const T x = w ? w[i * k + j] * v[(i * k + j) * C + c] : v[(i * k + j) * C + c];
        if (best < 0 || x > bv) {
          best = j;
          bv = x;
        }
      }
      y[t] = bv;
      am[t] = best;
      continue;
    }
    double s = 0;
    for (idx j = 0; j < m; ++j) {
      const double x = static_cast<double>(v[(i * k + j) * C + c]);
      s += w ? static_cast<double>(w[i * k + j]) * x : x;
    }
    if (reduce == pts_mean) s = m > 0 ? s / static_cast<double>(m) : 0.0;
    y[t] = static_cast<T>(s);
  }
}

/// One thread per entry (i, j): writes g_values[i, j, :] and g_weights[i, j] whole.
template <class T>
__global__ void aggregate_bwd(idx n, idx k, idx C, int reduce, const T* v, const T* w, const idx* cnt, const idx* am,
                              const T* gy, T* gv, T* gw) {
  SHARD_GRID_STRIDE(e, n * k) {
    const idx i = e / k, j = e - i * k;
    const idx m = clamp_count(cnt[i], k);
    if (reduce == pts_max) {
      T sw = T(0);
      for (idx c = 0; c < C; ++c) {
        const bool hit = am[i * C + c] == j && j < m;
        const T gc = gy[i * C + c];
        if (gv) gv[e * C + c] = hit ? (w ? w[e] * gc : gc) : T(0);
        if (hit) sw += gc * v[e * C + c];
      }
      if (gw) gw[e] = sw;
      continue;
    }
    const double scale = reduce == pts_mean ? (m > 0 ? 1.0 / static_cast<double>(m) : 0.0) : 1.0;
    const bool valid = j < m;
    const double wk = w ? static_cast<double>(w[e]) : 1.0;
    double sw = 0;
    for (idx c = 0; c < C; ++c) {
      const double gc = static_cast<double>(gy[i * C + c]) * scale;
      if (gv) gv[e * C + c] = valid ? static_cast<T>(wk * gc) : T(0);
      if (valid) sw += gc * static_cast<double>(v[e * C + c]);
    }
    if (gw) gw[e] = static_cast<T>(sw);
  }
}

template <class T>
__device__ __forceinline__ void load_point(const T* p, int D, double* x) {
  for (int d = 0; d < D; ++d) x[d] = static_cast<double>(p[d]);
}

/// The interpolation stencil of point i (the interpolation, its points' gradient and its scatter).
template <class T>
__device__ __forceinline__ void stencil_of(const PtsGrid& g, const T* p, idx i, PtsCorners& k) {
  double x[3];
  load_point(p + i * g.dims, g.dims, x);
  pts_corners(g, x, k);
}

template <class T>
__global__ void grid_interp_k(PtsGrid g, const T* v, const T* p, T* y) {
  SHARD_GRID_STRIDE(i, g.points) {
    PtsCorners k;
    stencil_of(g, p, i, k);
    for (idx c = 0; c < g.channels; ++c) {
      double acc = 0;
      for (int j = 0; j < k.n; ++j) acc += k.w[j] * static_cast<double>(v[c * g.sc + k.cell[j]]);
      y[i * g.channels + c] = static_cast<T>(acc);
    }
  }
}

template <class T>
__global__ void grid_interp_gp_k(PtsGrid g, const T* v, const T* p, const T* gy, T* gx) {
  SHARD_GRID_STRIDE(i, g.points) {
    PtsCorners k;
    stencil_of(g, p, i, k);
    double acc[3] = {0, 0, 0};
    for (int j = 0; j < k.n; ++j) {
      double s = 0;
      for (idx c = 0; c < g.channels; ++c)
        s += static_cast<double>(gy[i * g.channels + c]) * static_cast<double>(v[c * g.sc + k.cell[j]]);
      for (int d = 0; d < g.dims; ++d) acc[d] += k.dw[j][d] * s;
    }
    for (int d = 0; d < g.dims; ++d) gx[i * g.dims + d] = static_cast<T>(acc[d]);
  }
}

template <class T>
__global__ void grid_interp_scatter_k(PtsGrid g, const T* p, const T* gy, double* v) {
  SHARD_GRID_STRIDE(i, g.points) {
    PtsCorners k;
    stencil_of(g, p, i, k);
    for (idx c = 0; c < g.channels; ++c)
      for (int j = 0; j < k.n; ++j)
        atomic_add_f64(v + c * g.sc + k.cell[j], k.w[j] * static_cast<double>(gy[i * g.channels + c]));
  }
}

template <class T>
__global__ void grid_splat_k(PtsGrid g, const T* p, const T* f, int with_w, double* v) {
  SHARD_GRID_STRIDE(i, g.points) {
    double x[3], dw[3];
    idx a[3], b[3], ic[3];
    load_point(p + i * g.dims, g.dims, x);
    if (!pts_cell_range(g, x, a, b)) continue;
    for (int d = 0; d < g.dims; ++d) ic[d] = a[d];
    do {
      idx cell = 0;
      double w = 0;
      if (!pts_cell_weight(g, x, ic, cell, w, dw)) continue;
      for (idx c = 0; c < g.channels; ++c)
        atomic_add_f64(v + c * g.sc + cell, w * static_cast<double>(f[i * g.channels + c]));
      if (with_w) atomic_add_f64(v + g.channels * g.sc + cell, w);
    } while (pts_next_cell(g.dims, a, b, ic));
  }
}

/// One thread per point; gfeatures in chunks of kLocal channels (one walk over the cells per
/// chunk, double sums in the CPU's cell order), gpoints on the first walk.
template <class T>
__global__ void grid_splat_bwd_k(PtsGrid g, const double* v, const T* p, const T* f, int with_w, T* gf, T* gp) {
  constexpr int kLocal = 16;
  SHARD_GRID_STRIDE(i, g.points) {
    const idx C = g.channels;
    double x[3], dw[3];
    idx a[3], b[3], ic[3];
    load_point(p + i * g.dims, g.dims, x);
    double accp[3] = {0, 0, 0};
    // channels in chunks of kLocal doubles (the CPU's per-channel sums, in the same cell order)
    for (idx c0 = 0; c0 < (gf && C > 0 ? C : 1); c0 += kLocal) {
      double accf[kLocal];
      for (int c = 0; c < kLocal; ++c) accf[c] = 0;
      const idx cn = gf ? (C - c0 < kLocal ? C - c0 : kLocal) : 0;
      const bool first = c0 == 0;
      if (pts_cell_range(g, x, a, b)) {
        for (int d = 0; d < g.dims; ++d) ic[d] = a[d];
        do {
          idx cell = 0;
          double w = 0;
          if (!pts_cell_weight(g, x, ic, cell, w, dw)) continue;
          for (idx c = 0; c < cn; ++c) accf[c] += w * v[(c0 + c) * g.sc + cell];
          if (first && gp && g.linear) {
            double s = with_w ? v[C * g.sc + cell] : 0.0;
            for (idx c = 0; c < C; ++c) s += static_cast<double>(f[i * C + c]) * v[c * g.sc + cell];
            for (int d = 0; d < g.dims; ++d) accp[d] += dw[d] * s;
          }
        } while (pts_next_cell(g.dims, a, b, ic));
      }
      for (idx c = 0; c < cn; ++c) gf[i * C + c0 + c] = static_cast<T>(accf[c]);
    }
    if (gp)
      for (int d = 0; d < g.dims; ++d) gp[i * g.dims + d] = static_cast<T>(accp[d]);
  }
}

__global__ void grid_mean_k(idx C, idx cells, double* s) {
  SHARD_GRID_STRIDE(k, cells) {
    const double wsum = s[C * cells + k];
    for (idx c = 0; c < C; ++c) s[c * cells + k] = wsum > 0 ? s[c * cells + k] / wsum : 0.0;
  }
}

__global__ void grid_mean_bwd_k(idx C, idx cells, const double* q, int with_w, double* v) {
  SHARD_GRID_STRIDE(k, cells) {
    const double S = q[C * cells + k];
    double gs = 0;
    for (idx c = 0; c < C; ++c) {
      const double gc = v[c * cells + k];
      gs -= gc * q[c * cells + k];
      v[c * cells + k] = S > 0 ? gc / S : 0.0;
    }
    if (with_w) v[C * cells + k] = S > 0 ? gs / S : 0.0;
  }
}

template <class Fn>
int by_type(int f64, Fn&& fn) {
  if (f64) fn(double{});
  else fn(float{});
  return last_error();
}

__global__ void owner_k(idx n, PtsPartition g, int f64, const void* p, idx* owner, unsigned long long* counts) {
  SHARD_GRID_STRIDE(i, n) {
    const idx o = f64 ? pts_owner(g, static_cast<const double*>(p) + i * g.dims)
                      : pts_owner(g, static_cast<const float*>(p) + i * g.dims);
    if (owner) owner[i] = o;
    atomicAdd(counts + (o < 0 ? g.ranks : o), 1ull);
  }
}

// Stable compaction, one block per group: the block walks the rows in chunks of blockDim.x and
// writes the rows i with pred(i) to rows[start ..) in ascending order (a shared-memory inclusive
// scan of the chunk's flags; no warp vote, which the simulator lane may not have). Every thread of
// the block must call it with the same start.
template <class Pred>
__device__ void compact_rows(idx n, idx start, Pred pred, idx* rows) {
  __shared__ idx scan[kThreads];
  const int t = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  idx base = start;
  for (idx c = 0; c < n; c += nt) {
    const idx i = c + t;
    const bool hit = i < n && pred(i);
    scan[t] = hit ? 1 : 0;
    __syncthreads();
    for (int off = 1; off < nt; off <<= 1) {
      const idx v = t >= off ? scan[t - off] : 0;
      __syncthreads();
      scan[t] += v;
      __syncthreads();
    }
    if (hit) rows[base + scan[t] - 1] = i;
    base += scan[nt - 1];
    __syncthreads();
  }
}

struct OwnedBy {
  const idx* owner;
  idx r;
  __device__ bool operator()(idx i) const { return owner[i] == r; }
};

// One block per rank: the rows it owns, ascending.
__global__ void bucket_rows_k(idx n, int ranks, const idx* owner, const idx* offsets, idx* rows) {
  for (idx r = blockIdx.x; r < ranks; r += gridDim.x) compact_rows(n, offsets[r], OwnedBy{owner, r}, rows);
}

template <class T>
__device__ __forceinline__ double point_bound(const T* pb, idx stride, idx i) {
  return pb ? static_cast<double>(pb[i * stride + stride - 1]) : 0.0;
}

template <class T>
struct SelectedBy {
  PtsBoxes g;
  const T* p;
  const T* pb;
  idx pbs, b;
  __device__ bool operator()(idx i) const {
    return pts_box_selects(g, b, p + i * g.dims, pb != nullptr, point_bound(pb, pbs, i));
  }
};

template <class T>
__global__ void near_boxes_count_k(idx n, PtsBoxes g, const T* p, const T* pb, idx pbs, unsigned long long* counts) {
  SHARD_GRID_STRIDE(i, n) {
    const double bound = point_bound(pb, pbs, i);
    for (idx b = 0; b < g.boxes; ++b)
      if (pts_box_selects(g, b, p + i * g.dims, pb != nullptr, bound)) atomicAdd(counts + b, 1ull);
  }
}

// One block per box (a box that selects nothing returns at once: the test is block-uniform).
template <class T>
__global__ void near_boxes_rows_k(idx n, PtsBoxes g, const T* p, const T* pb, idx pbs, const idx* offsets,
                                  idx* rows) {
  for (idx b = blockIdx.x; b < g.boxes; b += gridDim.x) {
    if (!(g.threshold[b] >= 0)) continue;
    compact_rows(n, offsets[b], SelectedBy<T>{g, p, pb, pbs, b}, rows);
  }
}

template <class T>
__global__ void list_filter_k(idx n, idx k, const T* d2, const T* bound, idx* ix) {
  SHARD_GRID_STRIDE(e, n * k) {
    if (!(d2[e] <= bound[e / k])) ix[e] = -1;
  }
}

__global__ void remap_k(idx n, const idx* table, idx* ix) {
  SHARD_GRID_STRIDE(e, n) {
    const idx v = ix[e];
    if (v >= 0) ix[e] = table[v];
  }
}

}  // namespace

int points_offsets_forward(int f64, idx n, idx k, idx D, const void* G, const void* q, const idx* ix, void* out,
                           void* stream) {
  if (n * k * D <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    offsets_fwd<T><<<grid_for(n * k * D), kThreads, 0, as_stream(stream)>>>(
        n, k, D, static_cast<const T*>(G), static_cast<const T*>(q), ix, static_cast<T*>(out));
  });
}

int points_offsets_backward(int f64, idx n, idx k, idx D, const void* grad, const idx* ix, void* gG, void* gq,
                            void* stream) {
  if (n * D <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    offsets_bwd<T><<<grid_for(n * D), kThreads, 0, as_stream(stream)>>>(n, k, D, static_cast<const T*>(grad), ix,
                                                                        static_cast<T*>(gG), static_cast<T*>(gq));
  });
}

int points_norm_forward(int f64, idx nk, idx D, const void* o, void* out, void* stream) {
  if (nk <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    norm_fwd<T><<<grid_for(nk), kThreads, 0, as_stream(stream)>>>(nk, D, static_cast<const T*>(o), static_cast<T*>(out));
  });
}

int points_norm_backward(int f64, idx nk, idx D, const void* o, const void* dist, const void* grad, void* go,
                         void* stream) {
  if (nk <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    norm_bwd<T><<<grid_for(nk), kThreads, 0, as_stream(stream)>>>(nk, D, static_cast<const T*>(o),
                                                                  static_cast<const T*>(dist),
                                                                  static_cast<const T*>(grad), static_cast<T*>(go));
  });
}

int points_weights(int f64, idx n, idx k, int kind, double param, const void* dist, const idx* cnt, const void* grad,
                   void* out, void* stream) {
  if (n * k <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    weights_k<T><<<grid_for(n * k), kThreads, 0, as_stream(stream)>>>(
        n, k, kind, param, static_cast<const T*>(dist), cnt, static_cast<const T*>(grad), static_cast<T*>(out));
  });
}

int points_aggregate_forward(int f64, idx n, idx k, idx C, int reduce, const void* v, const void* w, const idx* cnt,
                             void* out, idx* am, void* stream) {
  if (n * C <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    aggregate_fwd<T><<<grid_for(n * C), kThreads, 0, as_stream(stream)>>>(
        n, k, C, reduce, static_cast<const T*>(v), static_cast<const T*>(w), cnt, static_cast<T*>(out), am);
  });
}

int points_aggregate_backward(int f64, idx n, idx k, idx C, int reduce, const void* v, const void* w, const idx* cnt,
                              const idx* am, const void* grad, void* gv, void* gw, void* stream) {
  if (n * k <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    aggregate_bwd<T><<<grid_for(n * k), kThreads, 0, as_stream(stream)>>>(
        n, k, C, reduce, static_cast<const T*>(v), static_cast<const T*>(w), cnt, am, static_cast<const T*>(grad),
        static_cast<T*>(gv), static_cast<T*>(gw));
  });
}

int points_grid_interp(int f64, const PtsGrid& g, const void* ext, const void* p, void* out, void* stream) {
  if (g.points <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    grid_interp_k<T><<<grid_for(g.points), kThreads, 0, as_stream(stream)>>>(g, static_cast<const T*>(ext),
                                                                             static_cast<const T*>(p), static_cast<T*>(out));
  });
}

int points_grid_interp_grad_points(int f64, const PtsGrid& g, const void* ext, const void* p, const void* grad,
                                   void* gp, void* stream) {
  if (g.points <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    grid_interp_gp_k<T><<<grid_for(g.points), kThreads, 0, as_stream(stream)>>>(
        g, static_cast<const T*>(ext), static_cast<const T*>(p), static_cast<const T*>(grad), static_cast<T*>(gp));
  });
}

int points_grid_interp_scatter(int f64, const PtsGrid& g, const void* p, const void* grad, double* gext,
                               void* stream) {
  if (g.points <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    grid_interp_scatter_k<T><<<grid_for(g.points), kThreads, 0, as_stream(stream)>>>(
        g, static_cast<const T*>(p), static_cast<const T*>(grad), gext);
  });
}

int points_grid_splat(int f64, const PtsGrid& g, const void* p, const void* f, int with_weight, double* ext,
                      void* stream) {
  if (g.points <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    grid_splat_k<T><<<grid_for(g.points), kThreads, 0, as_stream(stream)>>>(g, static_cast<const T*>(p),
                                                                            static_cast<const T*>(f), with_weight, ext);
  });
}

int points_grid_splat_backward(int f64, const PtsGrid& g, const double* cellg, const void* p, const void* f,
                               int with_weight, void* gf, void* gp, void* stream) {
  if (g.points <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    grid_splat_bwd_k<T><<<grid_for(g.points), kThreads, 0, as_stream(stream)>>>(
        g, cellg, static_cast<const T*>(p), static_cast<const T*>(f), with_weight, static_cast<T*>(gf),
        static_cast<T*>(gp));
  });
}

int points_owner(int f64, idx n, const PtsPartition& part, const void* p, idx* owner, idx* counts, void* stream) {
  static_assert(sizeof(idx) == sizeof(unsigned long long), "64-bit counts");
  const cudaError_t rc =
      cudaMemsetAsync(counts, 0, static_cast<std::size_t>(part.ranks + 1) * sizeof(idx), as_stream(stream));
  if (rc != cudaSuccess) return static_cast<int>(rc);
  if (n <= 0) return 0;
  owner_k<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(n, part, f64, p, owner,
                                                           reinterpret_cast<unsigned long long*>(counts));
  return last_error();
}

int points_bucket_rows(idx n, int ranks, const idx* owner, const idx* offsets, idx* rows, void* stream) {
  if (n <= 0 || ranks <= 0) return 0;
  bucket_rows_k<<<blocks_per_item(ranks), kThreads, 0, as_stream(stream)>>>(n, ranks, owner, offsets, rows);
  return last_error();
}

int points_near_boxes_count(int f64, idx n, const PtsBoxes& boxes, const void* p, const void* pb, idx pb_stride,
                            idx* counts, void* stream) {
  static_assert(sizeof(idx) == sizeof(unsigned long long), "64-bit counts");
  if (boxes.boxes <= 0) return 0;
  const cudaError_t rc =
      cudaMemsetAsync(counts, 0, static_cast<std::size_t>(boxes.boxes) * sizeof(idx), as_stream(stream));
  if (rc != cudaSuccess) return static_cast<int>(rc);
  if (n <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    near_boxes_count_k<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
        n, boxes, static_cast<const T*>(p), static_cast<const T*>(pb), pb_stride,
        reinterpret_cast<unsigned long long*>(counts));
  });
}

int points_near_boxes_rows(int f64, idx n, const PtsBoxes& boxes, const void* p, const void* pb, idx pb_stride,
                           const idx* offsets, idx* rows, void* stream) {
  if (n <= 0 || boxes.boxes <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    near_boxes_rows_k<T><<<blocks_per_item(boxes.boxes), kThreads, 0, as_stream(stream)>>>(
        n, boxes, static_cast<const T*>(p), static_cast<const T*>(pb), pb_stride, offsets, rows);
  });
}

int points_list_filter(int f64, idx n, idx k, const void* d2, const void* bound, idx* ix, void* stream) {
  if (n <= 0 || k <= 0) return 0;
  return by_type(f64, [&](auto t) {
    using T = decltype(t);
    list_filter_k<T><<<grid_for(n * k), kThreads, 0, as_stream(stream)>>>(n, k, static_cast<const T*>(d2),
                                                                           static_cast<const T*>(bound), ix);
  });
}

int points_remap(idx n, const idx* table, idx* ix, void* stream) {
  if (n <= 0) return 0;
  remap_k<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(n, table, ix);
  return last_error();
}

int points_grid_mean(idx channels, idx cells, double* sums, void* stream) {
  if (cells <= 0) return 0;
  grid_mean_k<<<grid_for(cells), kThreads, 0, as_stream(stream)>>>(channels, cells, sums);
  return last_error();
}

int points_grid_mean_backward(idx channels, idx cells, const double* q, int with_weight, double* cellg, void* stream) {
  if (cells <= 0) return 0;
  grid_mean_bwd_k<<<grid_for(cells), kThreads, 0, as_stream(stream)>>>(channels, cells, q, with_weight, cellg);
  return last_error();
}

}  // namespace shard::kernels
