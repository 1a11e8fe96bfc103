// Norm kernel family on CUDA (f32, f64, and bf16 / f16 storage): per-statistic sums, apply,
// backward sums and dx for batch / group / layer normalisation of a contiguous [A, C, S] block
// (see src/kernels_api/norm.hpp). Every sum accumulates in double; one block per statistic (or
// per channel) reduces with a fixed-order shared-memory tree, so results are deterministic. The
// kernels are templated on the storage type: elements are widened to double as they are read
// (wide) and results rounded through the storage's compute type as they are written (narrow):
// double -> float -> bf16 / f16, the two roundings of the f32 working-copy route, bit for bit.
#include <cuda_runtime.h>

#include <type_traits>

#include "common.cuh"
#include "kernels_api/norm.hpp"
#include "kernels_api/pointwise_ops.hpp"

namespace shard::kernels::norm {
namespace {

using namespace cu;
constexpr int kBlock = kThreads;

/// Number of elements of statistic k.
__host__ __device__ inline idx stat_len(const Geom& g) {
  if (g.kind == 0) return g.A * g.S;
  if (g.kind == 1) return (g.C / g.G) * g.S;
  return g.C;
}
__host__ __device__ inline idx stat_count(const Geom& g) {
  if (g.kind == 0) return g.C;
  if (g.kind == 1) return g.A * g.G;
  return g.A * g.S;
}
/// Offset and channel of element j of statistic k.
__device__ inline idx stat_elem(const Geom& g, idx k, idx j, idx* c) {
  if (g.kind == 0) {
    const idx a = j / g.S, s = j % g.S;
    *c = k;
    return (a * g.C + k) * g.S + s;
  }
  if (g.kind == 1) {
    const idx cg = g.C / g.G;
    *c = (k % g.G) * cg + j / g.S;
    return k * cg * g.S + j;
  }
  const idx a = k / g.S, s = k % g.S;
  *c = j;
  return (a * g.C + j) * g.S + s;
}
/// Statistic of the element at offset off (channel c).
__device__ inline idx stat_of(const Geom& g, idx off, idx* c) {
  const idx s = off % g.S, r = off / g.S, cc = r % g.C, a = r / g.C;
  *c = cc;
  if (g.kind == 0) return cc;
  if (g.kind == 1) return a * g.G + cc / (g.C / g.G);
  return a * g.S + s;
}

/// The type a fused activation is evaluated in (pw::act_t, shared with the CPU table); z is
/// rounded to it first.
using pw::act_t;

/// The fused activation's side of the backward (src/exec/norm_cpu.cpp's ActGrad): gz = gy act'(u),
/// u = z + res[off] in act_t<T> (z = xhat w[c] + b[c]; res: g.res, optional); gy itself without
/// an activation.
template <class T>
__device__ inline double grad_z(const Geom& g, double gv, double xhat, const T* w, const T* b, idx c, idx off) {
  if (g.act < 0) return gv;
  using A = act_t<T>;
  const double z = xhat * (w ? wide(w[c]) : 1.0) + (b ? wide(b[c]) : 0.0);
  A u = static_cast<A>(z);
  if (g.res) u = u + static_cast<A>(wide(static_cast<const T*>(g.res)[off]));
  return static_cast<double>(pw::act_bwd<A>(g.act, u, static_cast<A>(gv)));
}
/// act(z + res[off]) in act_t<T> (z itself without an activation or a residual).
template <class T>
__device__ inline double act_value(const Geom& g, double z, idx off) {
  using A = act_t<T>;
  if (g.act < 0 && !g.res) return z;
  A u = static_cast<A>(z);
  if (g.res) u = u + static_cast<A>(wide(static_cast<const T*>(g.res)[off]));
  return static_cast<double>(g.act < 0 ? u : pw::act_fwd<A>(g.act, u));
}
/// The residual's gradient (gz) at off, when asked for.
template <class T>
__device__ inline void store_dres(const Geom& g, idx off, double gz) {
  if (g.dres) static_cast<T*>(g.dres)[off] = narrow<T>(gz);
}

/// Fixed-order tree reduction of two values over the block; thread 0 gets the totals.
__device__ inline void block_reduce2(double& u, double& v) {
  __shared__ double su[kBlock], sv[kBlock];
  u = block_sum(u, su);
  v = block_sum(v, sv);
}

template <class T>
__global__ void sums_kernel(Geom g, const T* __restrict__ x, const double* __restrict__ mean, double* out) {
  const idx K = stat_count(g), n = stat_len(g);
  for (idx k = blockIdx.x; k < K; k += gridDim.x) {
    double acc = 0, unused = 0;
    for (idx j = threadIdx.x; j < n; j += blockDim.x) {
      idx c;
      const double v = wide(x[stat_elem(g, k, j, &c)]);
      if (mean) {
        const double d = v - mean[k];
        acc += d * d;
      } else {
        acc += v;
      }
    }
    block_reduce2(acc, unused);
    if (threadIdx.x == 0) out[k] = acc;
  }
}

template <class T>
__global__ void backward_stat_kernel(Geom g, const T* __restrict__ x, const T* __restrict__ gy,
                                     const double* __restrict__ mean, const double* __restrict__ invstd,
                                     const T* __restrict__ w, const T* __restrict__ b, double* sg, double* sgx) {
  const idx K = stat_count(g), n = stat_len(g);
  for (idx k = blockIdx.x; k < K; k += gridDim.x) {
    double a1 = 0, a2 = 0;
    for (idx j = threadIdx.x; j < n; j += blockDim.x) {
      idx c;
      const idx off = stat_elem(g, k, j, &c);
      const double wc = w ? wide(w[c]) : 1.0;
      const double xhat = (wide(x[off]) - mean[k]) * invstd[k];
      const double d = grad_z(g, wide(gy[off]), xhat, w, b, c, off) * wc;
      a1 += d;
      a2 += d * xhat;
    }
    block_reduce2(a1, a2);
    if (threadIdx.x == 0) {
      sg[k] = a1;
      sgx[k] = a2;
    }
  }
}

template <class T>
__global__ void backward_channel_kernel(Geom g, const T* __restrict__ x, const T* __restrict__ gy,
                                        const double* __restrict__ mean, const double* __restrict__ invstd,
                                        const T* __restrict__ w, const T* __restrict__ b, double* dw, double* db) {
  const idx n = g.A * g.S;
  for (idx c = blockIdx.x; c < g.C; c += gridDim.x) {
    double aw = 0, ab = 0;
    for (idx j = threadIdx.x; j < n; j += blockDim.x) {
      const idx a = j / g.S, s = j % g.S, off = (a * g.C + c) * g.S + s;
      idx cc;
      const idx k = stat_of(g, off, &cc);
      const double xhat = (wide(x[off]) - mean[k]) * invstd[k];
      const double gv = grad_z(g, wide(gy[off]), xhat, w, b, c, off);
      aw += gv * xhat;
      ab += gv;
    }
    block_reduce2(aw, ab);
    if (threadIdx.x == 0) {
      if (dw) dw[c] = aw;
      if (db) db[c] = ab;
    }
  }
}

template <class T>
__global__ void apply_kernel(Geom g, idx total, const T* __restrict__ x, const double* __restrict__ mean,
                             const double* __restrict__ invstd, const T* __restrict__ w, const T* __restrict__ b,
                             T* __restrict__ y) {
  SHARD_GRID_STRIDE(i, total) {
    idx c;
    const idx k = stat_of(g, i, &c);
    const double wc = w ? wide(w[c]) : 1.0, bc = b ? wide(b[c]) : 0.0;
    y[i] = narrow<T>(act_value<T>(g, (wide(x[i]) - mean[k]) * invstd[k] * wc + bc, i));
  }
}

template <class T>
__global__ void dx_kernel(Geom g, idx total, const T* __restrict__ x, const T* __restrict__ gy,
                          const double* __restrict__ mean, const double* __restrict__ invstd, const T* __restrict__ w,
                          const T* __restrict__ b, const double* __restrict__ sg, const double* __restrict__ sgx,
                          double inv_count, T* __restrict__ dx) {
  SHARD_GRID_STRIDE(i, total) {
    idx c;
    const idx k = stat_of(g, i, &c);
    const double wc = w ? wide(w[c]) : 1.0;
    const double xhat = (wide(x[i]) - mean[k]) * invstd[k];
    const double gz = grad_z(g, wide(gy[i]), xhat, w, b, c, i);
    store_dres<T>(g, i, gz);
    const double d = gz * wc;
    if (!sg) {
      dx[i] = narrow<T>(d * invstd[k]);
      continue;
    }
    dx[i] = narrow<T>(invstd[k] * (d - sg[k] * inv_count - xhat * sgx[k] * inv_count));
  }
}

// ---- Wide statistics (batch and group kinds): a statistic is R rows of S contiguous elements
// (group: the cg channels of one sample, contiguous; batch: one channel of every sample). Its n =
// R * S elements are split over `chunks` blocks; each block's partial goes to part[k][chunk] and a
// fixed-order pass adds them (deterministic). Chunking keeps the GPU busy when there are few
// statistics (GroupNorm: A * G of them, often 32), where one block per statistic left most SMs
// idle; with chunks == 1 the sums equal the one-block kernels' exactly.

/// Row i of statistic k (kinds 0 and 1): element offset of its first element and its channel.
struct RowSet {
  idx base, rstride, R, c0, cstep;
};
__device__ inline RowSet stat_rows(const Geom& g, idx k) {
  if (g.kind == 0) return {k * g.S, g.C * g.S, g.A, k, 0};
  const idx cg = g.C / g.G, a = k / g.G, grp = k % g.G;
  return {(a * g.C + grp * cg) * g.S, g.S, cg, grp * cg, 1};
}
/// The rows of channel c (for dw / db): row i = sample i.
__device__ inline RowSet channel_rows(const Geom& g, idx c) { return {c * g.S, g.C * g.S, g.A, c, 0}; }

/// Calls f(i, s) for the elements j = i * S + s in [j0, j1) this thread owns (stride blockDim):
/// the row index advances by addition when rows are at least a block long (no division per element).
template <class F>
__device__ inline void for_chunk(idx S, idx j0, idx j1, F&& f) {
  const idx B = blockDim.x;
  idx j = j0 + threadIdx.x;
  if (j >= j1) return;
  if (S >= B) {
    idx i = j / S, s = j - i * S;
    for (; j < j1; j += B) {
      f(i, s);
      s += B;
      if (s >= S) s -= S, ++i;
    }
  } else {
    for (; j < j1; j += B) {
      const idx i = j / S;
      f(i, j - i * S);
    }
  }
}

/// Partial sums per (statistic, chunk): of x (mean null) or (x - mean)^2.
template <class T>
__global__ void sums_chunk_kernel(Geom g, idx K, idx chunks, const T* __restrict__ x, const double* __restrict__ mean,
                                  double* __restrict__ part) {
  const idx n = stat_len(g), per = (n + chunks - 1) / chunks;
  for (idx k = blockIdx.y; k < K; k += gridDim.y) {
    const RowSet r = stat_rows(g, k);
    const idx j0 = blockIdx.x * per, j1 = j0 + per < n ? j0 + per : n;
    const double m = mean ? mean[k] : 0.0;
    double acc = 0, unused = 0;
    for_chunk(g.S, j0, j1, [&](idx i, idx s) {
      const double v = wide(x[r.base + i * r.rstride + s]);
      if (mean) {
        const double d = v - m;
        acc += d * d;
      } else {
        acc += v;
      }
    });
    block_reduce2(acc, unused);
    if (threadIdx.x == 0) part[k * chunks + blockIdx.x] = acc;
    __syncthreads();
  }
}
/// Local moments of statistic k (norm_moments): the sum, mean and M2 = sum (x - mean)^2 of its n
/// elements from the sums s1 = sum (x - c), s2 = sum (x - c)^2 shifted by its first element c, so
/// one pass over x gives all three without the cancellation of sum x^2 - n mean^2 (c lies in the
/// data). src/exec/norm_cpu.cpp's moments_from_shifted, operation for operation (_rn: no contraction).
__device__ inline void moments_from_shifted(idx n, double c, double s1, double s2, double* sum, double* m2,
                                            double* lmean, idx k) {
  if (n <= 0) {
    sum[k] = 0, m2[k] = 0, lmean[k] = 0;
    return;
  }
  const double dn = static_cast<double>(n), q = __ddiv_rn(s1, dn);
  sum[k] = __dadd_rn(__dmul_rn(dn, c), s1);
  lmean[k] = __dadd_rn(c, q);
  const double v = __dsub_rn(s2, __dmul_rn(s1, q));
  m2[k] = v > 0 ? v : 0.0;
}
/// The shift of statistic k: its first element, widened (n > 0).
template <class T>
__device__ inline double moment_shift(const Geom& g, const T* x, idx k) {
  idx c;
  return wide(x[stat_elem(g, k, 0, &c)]);
}
/// norm_moments with one block per statistic.
template <class T>
__global__ void moments_kernel(Geom g, const T* __restrict__ x, double* sum, double* m2, double* lmean) {
  const idx K = stat_count(g), n = stat_len(g);
  for (idx k = blockIdx.x; k < K; k += gridDim.x) {
    const double c = n > 0 ? moment_shift(g, x, k) : 0.0;
    double s1 = 0, s2 = 0;
    for (idx j = threadIdx.x; j < n; j += blockDim.x) {
      idx ch;
      const double d = wide(x[stat_elem(g, k, j, &ch)]) - c;
      s1 += d;
      s2 += d * d;
    }
    block_reduce2(s1, s2);
    if (threadIdx.x == 0) moments_from_shifted(n, c, s1, s2, sum, m2, lmean, k);
    __syncthreads();
  }
}
/// Shifted partial sums (s1, s2) per (statistic, chunk), into part[2 (k chunks + chunk) + {0, 1}].
template <class T>
__global__ void moments_chunk_kernel(Geom g, idx K, idx chunks, const T* __restrict__ x, double* __restrict__ part) {
  const idx n = stat_len(g), per = (n + chunks - 1) / chunks;
  for (idx k = blockIdx.y; k < K; k += gridDim.y) {
    const RowSet r = stat_rows(g, k);
    const idx j0 = blockIdx.x * per, j1 = j0 + per < n ? j0 + per : n;
    const double c = wide(x[r.base]);  // element j = 0 of statistic k
    double s1 = 0, s2 = 0;
    for_chunk(g.S, j0, j1, [&](idx i, idx s) {
      const double d = wide(x[r.base + i * r.rstride + s]) - c;
      s1 += d;
      s2 += d * d;
    });
    block_reduce2(s1, s2);
    if (threadIdx.x == 0) {
      part[2 * (k * chunks + blockIdx.x)] = s1;
      part[2 * (k * chunks + blockIdx.x) + 1] = s2;
    }
    __syncthreads();
  }
}
/// Adds the chunk partials in chunk order and finishes the moments (one thread per statistic).
template <class T>
__global__ void moments_total_kernel(Geom g, idx K, idx chunks, const T* __restrict__ x,
                                     const double* __restrict__ part, double* sum, double* m2, double* lmean) {
  const idx n = stat_len(g);
  SHARD_GRID_STRIDE(k, K) {
    double s1 = 0, s2 = 0;
    for (idx ch = 0; ch < chunks; ++ch) {
      s1 += part[2 * (k * chunks + ch)];
      s2 += part[2 * (k * chunks + ch) + 1];
    }
    moments_from_shifted(n, n > 0 ? wide(x[stat_rows(g, k).base]) : 0.0, s1, s2, sum, m2, lmean, k);
  }
}
/// Partial (sg, sgx) per (statistic, chunk).
template <class T>
__global__ void backward_stat_chunk_kernel(Geom g, idx K, idx chunks, const T* __restrict__ x,
                                           const T* __restrict__ gy, const double* __restrict__ mean,
                                           const double* __restrict__ invstd, const T* __restrict__ w,
                                           const T* __restrict__ b, double* __restrict__ part) {
  const idx n = stat_len(g), per = (n + chunks - 1) / chunks;
  for (idx k = blockIdx.y; k < K; k += gridDim.y) {
    const RowSet r = stat_rows(g, k);
    const idx j0 = blockIdx.x * per, j1 = j0 + per < n ? j0 + per : n;
    const double m = mean[k], is = invstd[k];
    double a1 = 0, a2 = 0;
    for_chunk(g.S, j0, j1, [&](idx i, idx s) {
      const idx off = r.base + i * r.rstride + s;
      const idx c = r.c0 + i * r.cstep;
      const double wc = w ? wide(w[c]) : 1.0;
      const double xhat = (wide(x[off]) - m) * is;
      const double d = grad_z(g, wide(gy[off]), xhat, w, b, c, off) * wc;
      a1 += d;
      a2 += d * xhat;
    });
    block_reduce2(a1, a2);
    if (threadIdx.x == 0) {
      part[2 * (k * chunks + blockIdx.x)] = a1;
      part[2 * (k * chunks + blockIdx.x) + 1] = a2;
    }
    __syncthreads();
  }
}
/// Partial (dw, db) per (channel, chunk) for the batch and group kinds (the statistic of a row is
/// fixed: c, or sample * G + c / cg).
template <class T>
__global__ void backward_channel_chunk_kernel(Geom g, idx chunks, const T* __restrict__ x, const T* __restrict__ gy,
                                              const double* __restrict__ mean, const double* __restrict__ invstd,
                                              const T* __restrict__ w, const T* __restrict__ b,
                                              double* __restrict__ part) {
  const idx n = g.A * g.S, per = (n + chunks - 1) / chunks;
  for (idx c = blockIdx.y; c < g.C; c += gridDim.y) {
    const RowSet r = channel_rows(g, c);
    const idx j0 = blockIdx.x * per, j1 = j0 + per < n ? j0 + per : n;
    double aw = 0, ab = 0;
    for_chunk(g.S, j0, j1, [&](idx i, idx s) {
      const idx off = r.base + i * r.rstride + s;
      const idx k = g.kind == 0 ? c : i * g.G + c / (g.C / g.G);
      const double xhat = (wide(x[off]) - mean[k]) * invstd[k];
      const double gv = grad_z(g, wide(gy[off]), xhat, w, b, c, off);
      aw += gv * xhat;
      ab += gv;
    });
    block_reduce2(aw, ab);
    if (threadIdx.x == 0) {
      part[2 * (c * chunks + blockIdx.x)] = aw;
      part[2 * (c * chunks + blockIdx.x) + 1] = ab;
    }
    __syncthreads();
  }
}
/// out_j[k] = sum over chunks of part[width * (k * chunks + ch) + j], j < width, in chunk order.
__global__ void chunk_total_kernel(idx K, idx chunks, int width, const double* __restrict__ part, double* out0,
                                   double* out1) {
  SHARD_GRID_STRIDE(k, K) {
    double a = 0, b = 0;
    for (idx ch = 0; ch < chunks; ++ch) {
      a += part[width * (k * chunks + ch)];
      if (width == 2) b += part[width * (k * chunks + ch) + 1];
    }
    if (out0) out0[k] = a;
    if (out1) out1[k] = b;
  }
}

// ---- One-pass backward sums (batch and group kinds, rows of at least kRowMin elements): a row
// (a, c) of S contiguous elements has one statistic, so the partials p1 = sum gz and p2 = sum gz
// xhat of its chunks give every output (src/exec/norm_cpu.cpp's backward_sums_impl, same
// structure): dw[c] = sum_a p2, db[c] = sum_a p1, sg[k] = sum w[c] p1 and sgx[k] = sum w[c] p2
// over the rows of statistic k. x and gy are read once (the channel and statistic passes above
// read them twice), and a fused activation's derivative is evaluated once per element.

/// Partials (p1, p2) per (row, chunk) into part[2 * (row * chunks + chunk)].
template <class T>
__global__ void backward_row_chunk_kernel(Geom g, idx chunks, const T* __restrict__ x, const T* __restrict__ gy,
                                          const double* __restrict__ mean, const double* __restrict__ invstd,
                                          const T* __restrict__ w, const T* __restrict__ b,
                                          double* __restrict__ part) {
  const idx rows = g.A * g.C, per = (g.S + chunks - 1) / chunks;
  for (idx r = blockIdx.y; r < rows; r += gridDim.y) {
    const idx a = r / g.C, c = r - a * g.C;
    const idx k = g.kind == 0 ? c : a * g.G + c / (g.C / g.G);
    const double m = mean[k], is = invstd[k];
    const idx s0 = blockIdx.x * per, s1 = s0 + per < g.S ? s0 + per : g.S;
    double p1 = 0, p2 = 0;
    for (idx s = s0 + threadIdx.x; s < s1; s += blockDim.x) {
      const idx off = r * g.S + s;
      const double xhat = (wide(x[off]) - m) * is;
      const double gz = grad_z(g, wide(gy[off]), xhat, w, b, c, off);
      p1 += gz;
      p2 += gz * xhat;
    }
    block_reduce2(p1, p2);
    if (threadIdx.x == 0) {
      part[2 * (r * chunks + blockIdx.x)] = p1;
      part[2 * (r * chunks + blockIdx.x) + 1] = p2;
    }
    __syncthreads();
  }
}
/// One thread per output, fixed order: threads [0, C) the channel sums dw, db; [C, C + K) the
/// statistic sums sg, sgx (each output may be null).
template <class T>
__global__ void backward_row_combine_kernel(Geom g, idx chunks, const double* __restrict__ part,
                                            const T* __restrict__ w, double* sg, double* sgx, double* dw,
                                            double* db) {
  const idx K = stat_count(g);
  auto row_total = [&](idx r, int j) {
    double t = 0;
    for (idx ch = 0; ch < chunks; ++ch) t += part[2 * (r * chunks + ch) + j];
    return t;
  };
  SHARD_GRID_STRIDE(t, g.C + K) {
    if (t < g.C) {
      if (!dw && !db) continue;
      double aw = 0, ab = 0;
      for (idx a = 0; a < g.A; ++a) {
        aw += row_total(a * g.C + t, 1);
        ab += row_total(a * g.C + t, 0);
      }
      if (dw) dw[t] = aw;
      if (db) db[t] = ab;
      continue;
    }
    if (!sg || !sgx) continue;
    const idx k = t - g.C;
    double a1 = 0, a2 = 0;
    if (g.kind == 0) {
      const double wc = w ? wide(w[k]) : 1.0;
      for (idx a = 0; a < g.A; ++a) {
        a1 += wc * row_total(a * g.C + k, 0);
        a2 += wc * row_total(a * g.C + k, 1);
      }
    } else {
      const idx cg = g.C / g.G, a = k / g.G, grp = k - a * g.G;
      for (idx c = grp * cg; c < (grp + 1) * cg; ++c) {
        const double wc = w ? wide(w[c]) : 1.0;
        a1 += wc * row_total(a * g.C + c, 0);
        a2 += wc * row_total(a * g.C + c, 1);
      }
    }
    sg[k] = a1;
    sgx[k] = a2;
  }
}

// ---- Row kernels for apply and dx: one (sample, channel) row of S contiguous elements per
// blockIdx.y, the statistic and the affine parameters read once per row: no index division per
// element (the flat kernels above divide three times per element).
template <class T>
__global__ void apply_rows_kernel(Geom g, const T* __restrict__ x, const double* __restrict__ mean,
                                  const double* __restrict__ invstd, const T* __restrict__ w, const T* __restrict__ b,
                                  T* __restrict__ y) {
  const idx rows = g.A * g.C, step = static_cast<idx>(gridDim.x) * blockDim.x;
  for (idx r = blockIdx.y; r < rows; r += gridDim.y) {
    const idx a = r / g.C, c = r - a * g.C;
    const double wc = w ? wide(w[c]) : 1.0, bc = b ? wide(b[c]) : 0.0;
    const T* xr = x + r * g.S;
    T* yr = y + r * g.S;
    if (g.kind == 2) {
      const double* mk = mean + a * g.S;
      const double* ik = invstd + a * g.S;
      for (idx s = blockIdx.x * static_cast<idx>(blockDim.x) + threadIdx.x; s < g.S; s += step)
        yr[s] = narrow<T>(act_value<T>(g, (wide(xr[s]) - mk[s]) * ik[s] * wc + bc, r * g.S + s));
    } else {
      const idx k = g.kind == 0 ? c : a * g.G + c / (g.C / g.G);
      const double m = mean[k], is = invstd[k];
      for (idx s = blockIdx.x * static_cast<idx>(blockDim.x) + threadIdx.x; s < g.S; s += step)
        yr[s] = narrow<T>(act_value<T>(g, (wide(xr[s]) - m) * is * wc + bc, r * g.S + s));
    }
  }
}
template <class T>
__global__ void dx_rows_kernel(Geom g, const T* __restrict__ x, const T* __restrict__ gy,
                               const double* __restrict__ mean, const double* __restrict__ invstd,
                               const T* __restrict__ w, const T* __restrict__ b, const double* __restrict__ sg,
                               const double* __restrict__ sgx, double inv_count, T* __restrict__ dx) {
  const idx rows = g.A * g.C, step = static_cast<idx>(gridDim.x) * blockDim.x;
  for (idx r = blockIdx.y; r < rows; r += gridDim.y) {
    const idx a = r / g.C, c = r - a * g.C;
    const double wc = w ? wide(w[c]) : 1.0;
    const T* xr = x + r * g.S;
    const T* gr = gy + r * g.S;
    T* dr = dx + r * g.S;
    const idx k0 = g.kind == 2 ? a * g.S : (g.kind == 0 ? c : a * g.G + c / (g.C / g.G));
    const idx dk = g.kind == 2 ? 1 : 0;
    for (idx s = blockIdx.x * static_cast<idx>(blockDim.x) + threadIdx.x; s < g.S; s += step) {
      const idx k = k0 + s * dk;
      const double xhat = (wide(xr[s]) - mean[k]) * invstd[k];
      const double gz = grad_z(g, wide(gr[s]), xhat, w, b, c, r * g.S + s);
      store_dres<T>(g, r * g.S + s, gz);
      const double d = gz * wc;
      if (!sg) {
        dr[s] = narrow<T>(d * invstd[k]);
        continue;
      }
      dr[s] = narrow<T>(invstd[k] * (d - sg[k] * inv_count - xhat * sgx[k] * inv_count));
    }
  }
}

// ---- Layer norm over tokens (layer kind with S == 1: transformer activations [..., C], one
// statistic per contiguous row of C elements). The generic kernels give such a row a block of
// kBlock threads (most idle for C < kBlock, and a shared-memory tree per row), read dw / db's
// columns with a stride of C (each warp load touching 32 rows: uncoalesced), and divide per
// element in apply / dx. Here one warp owns a row (loads coalesced along it; a fixed-order
// butterfly reduction, lane 0's total written: deterministic), and dw / db are per-thread columns
// (a warp reads 32 consecutive channels of a row) over chunks of rows, plus chunk_total_kernel's
// fixed-order total. Results agree with the CPU table to double rounding (tests/gpusim/
// cuda_sim_norm_pool_resize.cpp's token cases).
__host__ __device__ inline bool tok_rows(const Geom& g) { return g.kind == 2 && g.S == 1; }
constexpr int kLanes32 = 32;
constexpr int kTokWarps = kBlock / kLanes32;  // rows (warps) per block

__device__ inline double warp_total(double v) {
  for (int o = kLanes32 / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
/// f(a) for the rows this warp owns (grid-stride over warps; uniform within the warp).
template <class F>
__device__ inline void for_tok_rows(idx A, F&& f) {
  const idx w0 = static_cast<idx>(blockIdx.x) * kTokWarps + threadIdx.x / kLanes32;
  const idx step = static_cast<idx>(gridDim.x) * kTokWarps;
  for (idx a = w0; a < A; a += step) f(a);
}

template <class T>
__global__ void moments_tok_kernel(Geom g, const T* __restrict__ x, double* sum, double* m2, double* lmean) {
  const idx C = g.C;
  const int lane = threadIdx.x % kLanes32;
  for_tok_rows(g.A, [&](idx a) {
    const T* xr = x + a * C;
    const double c0 = C > 0 ? wide(xr[0]) : 0.0;
    double s1 = 0, s2 = 0;
    for (idx j = lane; j < C; j += kLanes32) {
      const double d = wide(xr[j]) - c0;
      s1 += d;
      s2 += d * d;
    }
    s1 = warp_total(s1);
    s2 = warp_total(s2);
    if (lane == 0) moments_from_shifted(C, c0, s1, s2, sum, m2, lmean, a);
  });
}
template <class T>
__global__ void apply_tok_kernel(Geom g, const T* __restrict__ x, const double* __restrict__ mean,
                                 const double* __restrict__ invstd, const T* __restrict__ w, const T* __restrict__ b,
                                 T* __restrict__ y) {
  const idx C = g.C;
  const int lane = threadIdx.x % kLanes32;
  for_tok_rows(g.A, [&](idx a) {
    const double mk = mean[a], ik = invstd[a];
    for (idx j = lane; j < C; j += kLanes32) {
      const idx off = a * C + j;
      const double wc = w ? wide(w[j]) : 1.0, bc = b ? wide(b[j]) : 0.0;
      y[off] = narrow<T>(act_value<T>(g, (wide(x[off]) - mk) * ik * wc + bc, off));
    }
  });
}
/// sg[a] = sum gz w[c], sgx[a] = sum gz w[c] xhat along row a.
template <class T>
__global__ void stat_tok_kernel(Geom g, const T* __restrict__ x, const T* __restrict__ gy,
                                const double* __restrict__ mean, const double* __restrict__ invstd,
                                const T* __restrict__ w, const T* __restrict__ b, double* sg, double* sgx) {
  const idx C = g.C;
  const int lane = threadIdx.x % kLanes32;
  for_tok_rows(g.A, [&](idx a) {
    const double mk = mean[a], ik = invstd[a];
    double a1 = 0, a2 = 0;
    for (idx j = lane; j < C; j += kLanes32) {
      const idx off = a * C + j;
      const double wc = w ? wide(w[j]) : 1.0;
      const double xhat = (wide(x[off]) - mk) * ik;
      const double d = grad_z(g, wide(gy[off]), xhat, w, b, j, off) * wc;
      a1 += d;
      a2 += d * xhat;
    }
    a1 = warp_total(a1);
    a2 = warp_total(a2);
    if (lane == 0) {
      sg[a] = a1;
      sgx[a] = a2;
    }
  });
}
/// dw / db partials: thread column c = blockIdx.x * blockDim.x + threadIdx.x over the rows of chunk
/// blockIdx.y, into part[2 * (c * chunks + chunk) + {0: sum gz xhat, 1: sum gz}].
template <class T>
__global__ void channel_tok_kernel(Geom g, idx chunks, const T* __restrict__ x, const T* __restrict__ gy,
                                   const double* __restrict__ mean, const double* __restrict__ invstd,
                                   const T* __restrict__ w, const T* __restrict__ b, double* __restrict__ part) {
  const idx C = g.C, per = (g.A + chunks - 1) / chunks;
  const idx c = static_cast<idx>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (idx ch = blockIdx.y; ch < chunks; ch += gridDim.y) {
    const idx a0 = ch * per, a1 = a0 + per < g.A ? a0 + per : g.A;
    double aw = 0, ab = 0;
    for (idx a = a0; a < a1; ++a) {
      const idx off = a * C + c;
      const double xhat = (wide(x[off]) - mean[a]) * invstd[a];
      const double gv = grad_z(g, wide(gy[off]), xhat, w, b, c, off);
      aw += gv * xhat;
      ab += gv;
    }
    part[2 * (c * chunks + ch)] = aw;
    part[2 * (c * chunks + ch) + 1] = ab;
  }
}
template <class T>
__global__ void dx_tok_kernel(Geom g, const T* __restrict__ x, const T* __restrict__ gy,
                              const double* __restrict__ mean, const double* __restrict__ invstd,
                              const T* __restrict__ w, const T* __restrict__ b, const double* __restrict__ sg,
                              const double* __restrict__ sgx, double inv_count, T* __restrict__ dx) {
  const idx C = g.C;
  const int lane = threadIdx.x % kLanes32;
  for_tok_rows(g.A, [&](idx a) {
    const double mk = mean[a], ik = invstd[a];
    const double sk = sg ? sg[a] : 0.0, sxk = sg ? sgx[a] : 0.0;
    for (idx j = lane; j < C; j += kLanes32) {
      const idx off = a * C + j;
      const double wc = w ? wide(w[j]) : 1.0;
      const double xhat = (wide(x[off]) - mk) * ik;
      const double gz = grad_z(g, wide(gy[off]), xhat, w, b, j, off);
      store_dres<T>(g, off, gz);
      const double d = gz * wc;
      dx[off] = sg ? narrow<T>(ik * (d - sk * inv_count - xhat * sxk * inv_count)) : narrow<T>(d * ik);
    }
  });
}

/// Rows at least this long take the row kernels; shorter rows the flat ones.
constexpr idx kRowMin = 128;
/// Blocks the chunked statistics aim for in all (a few per SM of a large GPU).
constexpr idx kTargetBlocks = 1024;
/// Chunks per statistic for K statistics of n elements: enough blocks to fill the GPU, each with
/// at least 4 elements per thread; 1 for the layer kind (many short statistics).
idx chunks_for(const Geom& g, idx K, idx n) {
  if (g.kind == 2 || K <= 0 || n <= 0) return 1;
  idx c = (kTargetBlocks + K - 1) / K;
  const idx most = (n + 4 * kBlock - 1) / (4 * kBlock);
  if (c > most) c = most;
  return c < 1 ? 1 : c;
}
dim3 row_grid(const Geom& g) {
  const idx rows = g.A * g.C;
  idx gx = (g.S + kBlock - 1) / kBlock;
  if (gx > 64) gx = 64;
  return dim3(static_cast<unsigned>(gx < 1 ? 1 : gx), static_cast<unsigned>(rows < 65535 ? rows : 65535));
}
/// Whether backward_sums takes the one-pass row kernels (batch / group kinds, long rows).
bool row_sums(const Geom& g) { return g.kind != 2 && g.S >= kRowMin && g.A * g.C > 0; }
/// Chunks per row for the one-pass backward sums: enough blocks to fill the GPU, each thread with
/// at least 4 elements of its chunk.
idx row_chunks(const Geom& g) {
  const idx rows = g.A * g.C;
  if (rows <= 0 || g.S <= 0) return 1;
  idx c = (kTargetBlocks + rows - 1) / rows;
  const idx most = (g.S + 4 * kBlock - 1) / (4 * kBlock);
  if (c > most) c = most;
  return c < 1 ? 1 : c;
}
dim3 chunk_grid(idx chunks, idx items) {
  return dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(items < 65535 ? items : 65535));
}
/// Blocks of the warp-per-row token kernels for A rows.
unsigned tok_grid(idx A) {
  idx b = (A + kTokWarps - 1) / kTokWarps;
  if (b > 65535) b = 65535;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}
/// Row chunks of the token kernels' dw / db partials: enough blocks to fill the GPU, each chunk at
/// least 32 rows.
idx tok_chunks(const Geom& g) {
  const idx cb = (g.C + kBlock - 1) / kBlock;
  if (cb <= 0 || g.A <= 0) return 1;
  idx c = (kTargetBlocks + cb - 1) / cb;
  const idx most = (g.A + 31) / 32;
  if (c > most) c = most;
  if (c > 65535) c = 65535;
  return c < 1 ? 1 : c;
}

template <class T>
__global__ void to_f64_kernel(idx n, const T* __restrict__ src, double* __restrict__ dst) {
  SHARD_GRID_STRIDE(i, n) dst[i] = wide(src[i]);
}
template <class T>
__global__ void from_f64_kernel(idx n, const double* __restrict__ src, T* __restrict__ dst) {
  SHARD_GRID_STRIDE(i, n) dst[i] = narrow<T>(src[i]);
}

/// norm_finish (src/exec/norm_cpu.cpp's finish_impl, operation for operation).
__global__ void finish_kernel(Finish f) {
  const bool bad = stats_check_failed(f.check, f.P);
  const double nan = __longlong_as_double(0x7ff8000000000000LL);
  const double cnt = static_cast<double>(f.count);
  auto get = [](const void* r, bool f64, idx k) {
    return f64 ? static_cast<const double*>(r)[k] : static_cast<double>(static_cast<const float*>(r)[k]);
  };
  auto put = [](void* r, bool f64, idx k, double v) {
    if (f64) static_cast<double*>(r)[k] = v;
    else static_cast<float*>(r)[k] = __double2float_rn(v);
  };
  SHARD_GRID_STRIDE(k, f.K) {
    switch (f.mode) {
      case 3:
        if (bad) f.v[k] = nan;
        break;
      case 0: f.v[k] = bad ? nan : __ddiv_rn(f.v[k], cnt); break;
      case 4: {  // spread: this rank's M2 about the global mean
        const double d = __dsub_rn(f.aux[k], f.mean[k]);
        f.v[k] = __dadd_rn(f.v[k], __dmul_rn(static_cast<double>(f.local_count), __dmul_rn(d, d)));
        break;
      }
      case 2:
        f.mean[k] = bad ? nan : get(f.rm, f.rm_f64, k);
        f.v[k] = bad ? nan : __ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(get(f.rv, f.rv_f64, k), f.eps)));
        break;
      default: {
        const double var = bad ? nan : __ddiv_rn(f.v[k], cnt);
        const double unbiased = f.count > 1 ? __ddiv_rn(__dmul_rn(var, cnt), static_cast<double>(f.count - 1)) : var;
        const double m = f.momentum, m1 = __dsub_rn(1.0, m);
        if (f.rm) put(f.rm, f.rm_f64, k, __dadd_rn(__dmul_rn(m1, get(f.rm, f.rm_f64, k)), __dmul_rn(m, f.mean[k])));
        if (f.rv) put(f.rv, f.rv_f64, k, __dadd_rn(__dmul_rn(m1, get(f.rv, f.rv_f64, k)), __dmul_rn(m, unbiased)));
        f.v[k] = __ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(var, f.eps)));
      }
    }
  }
}

unsigned blocks_for(idx n) { return grid_for(n, kBlock); }
unsigned grid_for_stats(idx K) { return blocks_per_item(K); }
int done() { return last_error(); }

template <class T>
int sums_t(Geom g, const void* x, const double* mean, double* out, double* ws, void* stream) {
  const idx K = stat_count(g);
  if (K == 0) return 0;
  const idx chunks = chunks_for(g, K, stat_len(g));
  if (chunks > 1 && ws) {
    sums_chunk_kernel<T><<<chunk_grid(chunks, K), kBlock, 0, as_stream(stream)>>>(g, K, chunks, static_cast<const T*>(x),
                                                                                mean, ws);
    if (const int e = done()) return e;
    chunk_total_kernel<<<blocks_for(K), kBlock, 0, as_stream(stream)>>>(K, chunks, 1, ws, out, nullptr);
    return done();
  }
  sums_kernel<T><<<grid_for_stats(K), kBlock, 0, as_stream(stream)>>>(g, static_cast<const T*>(x), mean, out);
  return done();
}
template <class T>
int moments_t(Geom g, const void* x, double* sum, double* m2, double* lmean, double* ws, void* stream) {
  const idx K = stat_count(g);
  if (K == 0) return 0;
  const T* xt = static_cast<const T*>(x);
  if (tok_rows(g)) {
    moments_tok_kernel<T><<<tok_grid(g.A), kBlock, 0, as_stream(stream)>>>(g, xt, sum, m2, lmean);
    return done();
  }
  const idx chunks = chunks_for(g, K, stat_len(g));
  if (chunks > 1 && ws) {
    moments_chunk_kernel<T><<<chunk_grid(chunks, K), kBlock, 0, as_stream(stream)>>>(g, K, chunks, xt, ws);
    if (const int e = done()) return e;
    moments_total_kernel<T><<<blocks_for(K), kBlock, 0, as_stream(stream)>>>(g, K, chunks, xt, ws, sum, m2, lmean);
    return done();
  }
  moments_kernel<T><<<grid_for_stats(K), kBlock, 0, as_stream(stream)>>>(g, xt, sum, m2, lmean);
  return done();
}
template <class T>
int apply_t(Geom g, const void* x, const double* mean, const double* invstd, const void* w, const void* b, void* y,
            void* stream) {
  const idx total = g.A * g.C * g.S;
  if (total == 0) return 0;
  if (tok_rows(g)) {
    apply_tok_kernel<T><<<tok_grid(g.A), kBlock, 0, as_stream(stream)>>>(
        g, static_cast<const T*>(x), mean, invstd, static_cast<const T*>(w), static_cast<const T*>(b),
        static_cast<T*>(y));
    return done();
  }
  if (g.S >= kRowMin) {
    apply_rows_kernel<T><<<row_grid(g), kBlock, 0, as_stream(stream)>>>(
        g, static_cast<const T*>(x), mean, invstd, static_cast<const T*>(w), static_cast<const T*>(b),
        static_cast<T*>(y));
    return done();
  }
  apply_kernel<T><<<blocks_for(total), kBlock, 0, as_stream(stream)>>>(
      g, total, static_cast<const T*>(x), mean, invstd, static_cast<const T*>(w), static_cast<const T*>(b),
      static_cast<T*>(y));
  return done();
}
template <class T>
int backward_sums_t(Geom g, const void* x, const void* gy, const double* mean, const double* invstd, const void* w,
                    const void* b, double* sg, double* sgx, double* dw, double* db, double* ws, void* stream) {
  const auto s = as_stream(stream);
  const auto* xt = static_cast<const T*>(x);
  const auto* gt = static_cast<const T*>(gy);
  const auto* wt = static_cast<const T*>(w);
  const auto* bt = static_cast<const T*>(b);
  const idx K = stat_count(g);
  if (tok_rows(g) && ws) {
    if ((dw || db) && g.C > 0 && g.A > 0) {
      const idx chunks = tok_chunks(g);
      const dim3 grid(static_cast<unsigned>((g.C + kBlock - 1) / kBlock), static_cast<unsigned>(chunks));
      channel_tok_kernel<T><<<grid, kBlock, 0, s>>>(g, chunks, xt, gt, mean, invstd, wt, bt, ws);
      if (const int e = done()) return e;
      chunk_total_kernel<<<blocks_for(g.C), kBlock, 0, s>>>(g.C, chunks, 2, ws, dw, db);
      if (const int e = done()) return e;
    } else if (dw || db) {  // no rows: zero sums
      backward_channel_kernel<T><<<grid_for_stats(g.C > 0 ? g.C : 1), kBlock, 0, s>>>(g, xt, gt, mean, invstd, wt, bt,
                                                                                     dw, db);
      if (const int e = done()) return e;
    }
    if (sg && sgx && g.A > 0)
      stat_tok_kernel<T><<<tok_grid(g.A), kBlock, 0, s>>>(g, xt, gt, mean, invstd, wt, bt, sg, sgx);
    return done();
  }
  if (row_sums(g) && ws) {  // one pass over x and gy
    const idx chunks = row_chunks(g);
    backward_row_chunk_kernel<T><<<chunk_grid(chunks, g.A * g.C), kBlock, 0, s>>>(g, chunks, xt, gt, mean, invstd, wt,
                                                                                bt, ws);
    if (const int e = done()) return e;
    backward_row_combine_kernel<T><<<blocks_for(g.C + K), kBlock, 0, s>>>(g, chunks, ws, wt, sg && sgx ? sg : nullptr,
                                                                          sg && sgx ? sgx : nullptr, dw, db);
    return done();
  }
  if ((dw || db) && g.C > 0) {
    const idx chunks = chunks_for(g, g.C, g.A * g.S);
    if (chunks > 1 && ws) {
      backward_channel_chunk_kernel<T><<<chunk_grid(chunks, g.C), kBlock, 0, s>>>(g, chunks, xt, gt, mean, invstd, wt,
                                                                                  bt, ws);
      if (const int e = done()) return e;
      chunk_total_kernel<<<blocks_for(g.C), kBlock, 0, s>>>(g.C, chunks, 2, ws, dw, db);
    } else {
      backward_channel_kernel<T><<<grid_for_stats(g.C), kBlock, 0, s>>>(g, xt, gt, mean, invstd, wt, bt, dw, db);
    }
    if (const int e = done()) return e;
  }
  if (sg && sgx && K > 0) {
    const idx chunks = chunks_for(g, K, stat_len(g));
    if (chunks > 1 && ws) {
      // After the channel pass in stream order: the partials may reuse ws.
      backward_stat_chunk_kernel<T><<<chunk_grid(chunks, K), kBlock, 0, s>>>(g, K, chunks, xt, gt, mean, invstd, wt,
                                                                              bt, ws);
      if (const int e = done()) return e;
      chunk_total_kernel<<<blocks_for(K), kBlock, 0, s>>>(K, chunks, 2, ws, sg, sgx);
    } else {
      backward_stat_kernel<T><<<grid_for_stats(K), kBlock, 0, s>>>(g, xt, gt, mean, invstd, wt, bt, sg, sgx);
    }
  }
  return done();
}
template <class T>
int backward_dx_t(Geom g, const void* x, const void* gy, const double* mean, const double* invstd, const void* w,
                  const void* b, const double* sg, const double* sgx, double inv_count, void* dx, void* stream) {
  const idx total = g.A * g.C * g.S;
  if (total == 0) return 0;
  if (tok_rows(g)) {
    dx_tok_kernel<T><<<tok_grid(g.A), kBlock, 0, as_stream(stream)>>>(
        g, static_cast<const T*>(x), static_cast<const T*>(gy), mean, invstd, static_cast<const T*>(w),
        static_cast<const T*>(b), sg, sgx, inv_count, static_cast<T*>(dx));
    return done();
  }
  if (g.S >= kRowMin) {
    dx_rows_kernel<T><<<row_grid(g), kBlock, 0, as_stream(stream)>>>(
        g, static_cast<const T*>(x), static_cast<const T*>(gy), mean, invstd, static_cast<const T*>(w),
        static_cast<const T*>(b), sg, sgx, inv_count, static_cast<T*>(dx));
    return done();
  }
  dx_kernel<T><<<blocks_for(total), kBlock, 0, as_stream(stream)>>>(
      g, total, static_cast<const T*>(x), static_cast<const T*>(gy), mean, invstd, static_cast<const T*>(w),
      static_cast<const T*>(b), sg, sgx, inv_count, static_cast<T*>(dx));
  return done();
}

}  // namespace

idx workspace(Geom g) {
  const idx K = stat_count(g);
  const idx a = 2 * K * chunks_for(g, K, stat_len(g)), b = 2 * g.C * chunks_for(g, g.C, g.A * g.S);
  const idx r = row_sums(g) ? 2 * g.A * g.C * row_chunks(g) : 0;
  const idx t = tok_rows(g) ? 2 * g.C * tok_chunks(g) : 0;
  const idx m = a > b ? a : b, n = r > t ? r : t;
  return m > n ? m : n;
}
int sums(int dtype, Geom g, const void* x, const double* mean, double* out, double* ws, void* stream) {
  return by_storage(dtype, [&](auto t) { return sums_t<decltype(t)>(g, x, mean, out, ws, stream); });
}
int moments(int dtype, Geom g, const void* x, double* sum, double* m2, double* lmean, double* ws, void* stream) {
  return by_storage(dtype, [&](auto t) { return moments_t<decltype(t)>(g, x, sum, m2, lmean, ws, stream); });
}
int apply(int dtype, Geom g, const void* x, const double* mean, const double* invstd, const void* w, const void* b,
          void* y, void* stream) {
  return by_storage(dtype, [&](auto t) { return apply_t<decltype(t)>(g, x, mean, invstd, w, b, y, stream); });
}
int backward_sums(int dtype, Geom g, const void* x, const void* gy, const double* mean, const double* invstd,
                  const void* w, const void* b, double* sg, double* sgx, double* dw, double* db, double* ws,
                  void* stream) {
  return by_storage(dtype, [&](auto t) {
    return backward_sums_t<decltype(t)>(g, x, gy, mean, invstd, w, b, sg, sgx, dw, db, ws, stream);
  });
}
int backward_dx(int dtype, Geom g, const void* x, const void* gy, const double* mean, const double* invstd,
                const void* w, const void* b, const double* sg, const double* sgx, double inv_count, void* dx,
                void* stream) {
  return by_storage(dtype, [&](auto t) {
    return backward_dx_t<decltype(t)>(g, x, gy, mean, invstd, w, b, sg, sgx, inv_count, dx, stream);
  });
}
int to_f64(int dtype, idx n, const void* src, double* dst, void* stream) {
  if (n == 0) return 0;
  return by_storage(dtype, [&](auto t) {
    using T = decltype(t);
    to_f64_kernel<T><<<blocks_for(n), kBlock, 0, as_stream(stream)>>>(n, static_cast<const T*>(src), dst);
    return done();
  });
}
int from_f64(int dtype, idx n, const double* src, void* dst, void* stream) {
  if (n == 0) return 0;
  return by_storage(dtype, [&](auto t) {
    using T = decltype(t);
    from_f64_kernel<T><<<blocks_for(n), kBlock, 0, as_stream(stream)>>>(n, src, static_cast<T*>(dst));
    return done();
  });
}

int finish(const Finish& f, void* stream) {
  if (f.K <= 0) return 0;
  finish_kernel<<<blocks_for(f.K), kBlock, 0, as_stream(stream)>>>(f);
  return done();
}

}  // namespace shard::kernels::norm
