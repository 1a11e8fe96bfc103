// CUDA kernels of the neighbour-search family (launchers: src/kernels_api/neighbors.hpp): the
// brute-force kNN / radius search and the merge of two neighbour lists. Results equal the CPU
// table's (src/exec/neighbors_cpu.cpp) bit for bit:
//  - d2 = sum_d (q[d] - s[d])^2 left to right in the points' type, with the _rn intrinsics so that
//    nvcc never contracts a multiply and an add into an FMA (the CPU build has no FMA either).
//    The simulator lane cannot see a contraction (GPGPU-Sim evaluates fma with two roundings);
//    its test gpusim_neighbors_ptx_no_fma reads the PTX instead;
//  - a support point is a candidate when d2 <= r2 (r2 = +inf for kNN; NaN never is), and every
//    query keeps the first `width` candidates in the total order (d2, index): unique, whatever the
//    order in which candidates arrive.
// Search: one thread per query, 128 queries per block; the block stages the support points in
// tiles in shared memory and every thread scans each tile (a broadcast read) in index order. The
// running list is a sorted array in registers (an unrolled insertion over a compile-time capacity
// 1, 4, 8, 16 or 32 >= width, of which the first `width` entries are written), or, for wider
// lists, the output row itself in global memory. Queries of up to 4 dims live in registers.
// (Parallel over queries only: a search with very few queries and many support points leaves
// most of the GPU idle; splitting the support over blocks plus a merge is the remedy when needed.)
// Merge: one thread per row, the CPU's two-pointer merge into a separate output.
#include <cuda_runtime.h>

#include <climits>

#include "common.cuh"
#include "kernels_api/neighbors.hpp"

namespace shard::kernels {
namespace {

using idx = nb_idx;
using namespace cu;

constexpr int kQueryThreads = 128;  ///< queries per block
constexpr int kTileBytes = 16384;   ///< target size of the support tile in shared memory
constexpr int kTileMaxPoints = 512;
constexpr int kRegDim = 4;          ///< query dims kept in registers

/// Round-to-nearest arithmetic that nvcc never fuses into an FMA.
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

template <class T>
__device__ __forceinline__ T inf() {
  return static_cast<T>(INFINITY);
}

/// (d2, index) order of a real entry a against b; a padded b (index < 0) sorts after a.
template <class T, class I>
__device__ __forceinline__ bool before(T ad, I ai, T bd, I bi) {
  return bi < 0 || ad < bd || (ad == bd && ai < bi);
}

/// The running list of one query in registers: CAP entries sorted by (d2, index), padding
/// (-1, +inf) at the end. Holds the best CAP candidates, of which the first `width` are the answer.
template <class T, int CAP>
struct RegList {
  T d[CAP];
  int i[CAP];
  __device__ __forceinline__ void init(idx* /*row_i*/, idx /*width*/) {
#pragma unroll
    for (int p = 0; p < CAP; ++p) {
      d[p] = inf<T>();
      i[p] = -1;
    }
  }
  __device__ __forceinline__ void consider(T ed, int ei) {
    if (!before(ed, ei, d[CAP - 1], i[CAP - 1])) return;
    bool placed = false;
#pragma unroll
    for (int p = CAP - 1; p >= 1; --p) {
      if (!placed) {
        if (before(ed, ei, d[p - 1], i[p - 1])) {
          d[p] = d[p - 1];
          i[p] = i[p - 1];
        } else {
          d[p] = ed;
          i[p] = ei;
          placed = true;
        }
      }
    }
    if (!placed) {
      d[0] = ed;
      i[0] = ei;
    }
  }
  /// Writes the first `width` (<= CAP) entries; returns the valid count.
  __device__ __forceinline__ idx write(idx* row_i, T* row_d, idx width, idx offset) const {
    idx n = 0;
#pragma unroll
    for (int p = 0; p < CAP; ++p) {
      if (p < width) {
        const bool real = i[p] >= 0;
        row_i[p] = real ? i[p] + offset : idx{-1};
        row_d[p] = real ? d[p] : inf<T>();
        n += real ? 1 : 0;
      }
    }
    return n;
  }
};

/// The running list in the output row itself (global memory), for widths above the register
/// capacities: the CPU table's sorted-array insertion, support rows stored without the offset.
template <class T>
struct RowList {
  idx* ri = nullptr;
  T* rd = nullptr;
  idx w = 0, n = 0;
  __device__ __forceinline__ void init(idx* row_i, T* row_d, idx width) {
    ri = row_i;
    rd = row_d;
    w = width;
    n = 0;
  }
  __device__ __forceinline__ void consider(T ed, int ei) {
    if (n == w) {
      if (!before(ed, idx{ei}, rd[w - 1], ri[w - 1])) return;
    } else {
      ++n;
    }
    idx pos = n - 1;
    while (pos > 0 && before(ed, idx{ei}, rd[pos - 1], ri[pos - 1])) {
      ri[pos] = ri[pos - 1];
      rd[pos] = rd[pos - 1];
      --pos;
    }
    ri[pos] = ei;
    rd[pos] = ed;
  }
  __device__ __forceinline__ idx write(idx offset) {
    for (idx p = 0; p < n; ++p) ri[p] += offset;
    for (idx p = n; p < w; ++p) {
      ri[p] = -1;
      rd[p] = inf<T>();
    }
    return n;
  }
};

/// Squared distance of the query (registers qr when D <= kRegDim, else global qp) to the support
/// point sp (shared memory), left to right, unfused.
template <class T>
__device__ __forceinline__ T sqdist(const T (&qr)[kRegDim], const T* qp, const T* sp, int D) {
  T r = 0;
  if (D <= kRegDim) {
#pragma unroll
    for (int d = 0; d < kRegDim; ++d) {
      if (d < D) {
        const T diff = sub_rn(qr[d], sp[d]);
        r = add_rn(r, mul_rn(diff, diff));
      }
    }
  } else {
    for (int d = 0; d < D; ++d) {
      const T diff = sub_rn(qp[d], sp[d]);
      r = add_rn(r, mul_rn(diff, diff));
    }
  }
  return r;
}

/// CAP > 0: list in registers (width <= CAP); CAP == 0: list in the output row.
template <class T, int CAP>
__global__ void __launch_bounds__(kQueryThreads)
    search_kernel(idx nq, idx ns, int D, idx width, T r2, idx offset, int tile_pts, const T* __restrict__ q,
                  const T* __restrict__ s, idx* __restrict__ out_i, T* __restrict__ out_d,
                  idx* __restrict__ counts, int* __restrict__ nan_flag) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* tile = reinterpret_cast<T*>(smem_raw);
  const idx nblocks = (nq + kQueryThreads - 1) / kQueryThreads;
  bool first_pass = true;  // the support NaN check runs in block 0's first pass only
  for (idx qb = blockIdx.x; qb < nblocks; qb += gridDim.x) {
    const idx qi = qb * kQueryThreads + threadIdx.x;
    const bool active = qi < nq;
    const T* qp = q + (active ? qi : 0) * D;
    T qr[kRegDim];
#pragma unroll
    for (int d = 0; d < kRegDim; ++d) qr[d] = active && d < D ? qp[d] : T(0);
    if (active) {
      bool bad = false;
      for (int d = 0; d < D; ++d) bad |= isnan(qp[d]);
      if (bad) *nan_flag = 1;
    }
    idx* row_i = out_i + (active ? qi : 0) * width;
    T* row_d = out_d + (active ? qi : 0) * width;
    std::conditional_t<CAP == 0, RowList<T>, RegList<T, (CAP > 0 ? CAP : 1)>> list;
    if constexpr (CAP == 0) {
      list.init(row_i, row_d, width);
    } else {
      list.init(row_i, width);
    }
    const bool check_support = first_pass && blockIdx.x == 0;
    for (idx t0 = 0; t0 < ns; t0 += tile_pts) {
      const int np = static_cast<int>(ns - t0 < tile_pts ? ns - t0 : tile_pts);
      __syncthreads();  // every thread is done with the previous tile
      const T* src = s + t0 * D;
      for (int e = threadIdx.x; e < np * D; e += blockDim.x) {
        const T v = src[e];
        tile[e] = v;
        if (check_support && isnan(v)) *nan_flag = 1;
      }
      __syncthreads();
      if (active) {
        for (int j = 0; j < np; ++j) {
          const T d2 = sqdist<T>(qr, qp, tile + j * D, D);
          if (d2 <= r2) list.consider(d2, static_cast<int>(t0 + j));
        }
      }
    }
    if (active) {
      idx n;
      if constexpr (CAP == 0)
        n = list.write(offset);
      else
        n = list.write(row_i, row_d, width, offset);
      if (counts) counts[qi] = n;
    }
    first_pass = false;
  }
}

template <class T, int CAP>
int launch_search(idx nq, idx ns, int D, idx width, double r2, idx offset, const void* q, const void* s, idx* out_i,
                  void* out_d, idx* counts, int* nan_flag, cudaStream_t stream) {
  const int pt_bytes = D * static_cast<int>(sizeof(T));
  int tile_pts = kTileBytes / pt_bytes;
  tile_pts = tile_pts < 1 ? 1 : (tile_pts > kTileMaxPoints ? kTileMaxPoints : tile_pts);
  const std::size_t smem = static_cast<std::size_t>(tile_pts) * pt_bytes;
  search_kernel<T, CAP><<<grid_for(nq, kQueryThreads), kQueryThreads, smem, stream>>>(
      nq, ns, D, width, static_cast<T>(r2), offset, tile_pts, static_cast<const T*>(q), static_cast<const T*>(s),
      out_i, static_cast<T*>(out_d), counts, nan_flag);
  return last_error();
}

template <class T>
__global__ void merge_kernel(idx nq, idx w, const idx* __restrict__ ai, const T* __restrict__ ad,
                             const idx* __restrict__ bi, const T* __restrict__ bd, idx* __restrict__ oi,
                             T* __restrict__ od, idx* __restrict__ counts) {
  SHARD_GRID_STRIDE(r, nq) {
    const idx* ar = ai + r * w;
    const T* adr = ad + r * w;
    const idx* br = bi + r * w;
    const T* bdr = bd + r * w;
    idx* orow = oi + r * w;
    T* odr = od + r * w;
    idx a = 0, b = 0, n = 0;
    for (idx o = 0; o < w; ++o) {
      const bool va = a < w && ar[a] >= 0, vb = b < w && br[b] >= 0;
      if (va && (!vb || !before(bdr[b], br[b], adr[a], ar[a]))) {
        orow[o] = ar[a];
        odr[o] = adr[a];
        ++a;
        ++n;
      } else if (vb) {
        orow[o] = br[b];
        odr[o] = bdr[b];
        ++b;
        ++n;
      } else {
        orow[o] = -1;
        odr[o] = inf<T>();
      }
    }
    if (counts) counts[r] = n;
  }
}

}  // namespace

int neighbors_search(int is_f64, idx n_query, idx n_support, int dim, idx width, double r2, idx index_offset,
                     const void* query, const void* support, idx* indices, void* dist2, idx* counts, int* nan_flag,
                     void* stream) {
  if (n_query <= 0) return 0;
  if (dim < 1 || dim > kNeighborsMaxDim || n_support < 0 || n_support > INT_MAX || width < 1) return invalid();
  const cudaStream_t s = as_stream(stream);
  return by_float_type(is_f64, [&](auto t) {
    using T = decltype(t);
#define SHARD_NB_LAUNCH(CAP) \
  launch_search<T, CAP>(n_query, n_support, dim, width, r2, index_offset, query, support, indices, dist2, counts, \
                        nan_flag, s)
    if (width <= 1) return SHARD_NB_LAUNCH(1);
    if (width <= 4) return SHARD_NB_LAUNCH(4);
    if (width <= 8) return SHARD_NB_LAUNCH(8);
    if (width <= 16) return SHARD_NB_LAUNCH(16);
    if (width <= 32) return SHARD_NB_LAUNCH(32);
    return SHARD_NB_LAUNCH(0);
#undef SHARD_NB_LAUNCH
  });
}

int neighbors_merge(int is_f64, idx n_query, idx width, const idx* indices, const void* dist2, const idx* cand_indices,
                    const void* cand_dist2, idx* out_indices, void* out_dist2, idx* counts, void* stream) {
  if (n_query <= 0) return 0;
  if (width < 1) return invalid();
  return by_float_type(is_f64, [&](auto t) {
    using T = decltype(t);
    merge_kernel<T><<<grid_for(n_query), kThreads, 0, as_stream(stream)>>>(
        n_query, width, indices, static_cast<const T*>(dist2), cand_indices, static_cast<const T*>(cand_dist2),
        out_indices, static_cast<T*>(out_dist2), counts);
    return last_error();
  });
}

}  // namespace shard::kernels
