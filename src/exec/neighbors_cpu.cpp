// CPU table of the neighbour-search kernel family (include/shardtensor/exec/neighbors.hpp).
//
// Every query keeps the best `cap` support points in the total order (d2, index) (a sorted
// array for small caps, a bounded max-heap above), with an optional distance bound (radius queries: d2 <= r2).
// Candidates come either from all support points (brute force) or from a nanoflann k-d tree
// (libnanoflann-dev, header-only) that only PRUNES: nanoflann calls addPoint for every point of
// every leaf it cannot exclude, and we recompute the canonical d2 ourselves, so the result is
// exactly the brute-force one. Two details make the pruning safe for ties:
//  - worstDist() (the pruning bound, compared with `<` at the leaves and against an incrementally
//    updated lower bound on the box distance) is the current worst d2 inflated by a relative
//    slack far above the rounding of that lower bound and moved one ulp up, so a point whose d2
//    EQUALS the current worst (and may win the tie by a smaller index) is never pruned;
//  - a tie at the k-th distance is decided by our list, not by nanoflann's result set.
// Queries are spread over OpenMP threads (dynamic schedule) when there are many; the tree is
// built once per call (single-threaded: nanoflann 1.4), and searched concurrently (const).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <nanoflann.hpp>

#include "exec/neighbors_kernels.hpp"
#include "shardtensor/core/error.hpp"

namespace shard::exec {
namespace {

/// The canonical squared distance (see neighbors.hpp): left to right in T.
template <class T>
inline T sqdist(const T* a, const T* b, int D) {
  T r = 0;
  for (int d = 0; d < D; ++d) {
    const T diff = a[d] - b[d];
    r += diff * diff;
  }
  return r;
}

template <class T>
struct KnnEntry {
  T d;
  index_t i;
};
/// (d2, index) order; a padded entry (index < 0) sorts after every real one.
template <class T>
inline bool before(const KnnEntry<T>& a, const KnnEntry<T>& b) {
  if (a.i < 0 || b.i < 0) return b.i < 0 && a.i >= 0;
  return a.d < b.d || (a.d == b.d && a.i < b.i);
}

/// The pruning bound handed to nanoflann for a worst distance w: strictly above w by more than
/// the rounding of nanoflann's box-distance bound.
template <class T>
inline T inflate(T w) {
  if (!(w < std::numeric_limits<T>::infinity())) return std::numeric_limits<T>::infinity();
  constexpr T slack = std::is_same_v<T, float> ? T(1e-4) : T(1e-10);
  // Never below the smallest normal: a denormal bound would read as 0 under flush-to-zero.
  return std::max(std::nextafter(w + w * slack, std::numeric_limits<T>::infinity()), std::numeric_limits<T>::min());
}

/// (d2, index) order of two real entries.
template <class T>
inline bool less_real(const KnnEntry<T>& a, const KnnEntry<T>& b) {
  return a.d < b.d || (a.d == b.d && a.i < b.i);
}

/// Bounded top-`cap` in (d2, index) order, with the distance bound r2 (inf: none): a sorted
/// array with insertion for small caps (k = 16: fewer moves than a heap's sift), a max-heap
/// (front = worst kept) above kSortedCap. Also the nanoflann result-set interface (addPoint /
/// worstDist / full / size).
template <class T>
struct TopK {
  static constexpr std::size_t kSortedCap = 64;
  using DistanceType = T;
  std::vector<KnnEntry<T>> buf;
  std::size_t cap = 1;
  T r2 = std::numeric_limits<T>::infinity();
  T bound = std::numeric_limits<T>::infinity();  // inflated pruning bound
  const T* q = nullptr;
  const T* s = nullptr;
  int D = 0;

  void reset(const T* query) {
    buf.clear();
    q = query;
    bound = inflate(r2);
  }
  void consider(index_t j) {
    const T d = sqdist(q, s + j * D, D);
    if (!(d <= r2)) return;
    const KnnEntry<T> e{d, j};
    if (cap <= kSortedCap) {
      std::size_t n = buf.size();
      if (n == cap) {
        if (!less_real(e, buf[n - 1])) return;
      } else {
        buf.push_back(e);
        ++n;
      }
      std::size_t pos = n - 1;
      while (pos > 0 && less_real(e, buf[pos - 1])) {
        buf[pos] = buf[pos - 1];
        --pos;
      }
      buf[pos] = e;
      if (n == cap) bound = inflate(std::min(buf[n - 1].d, r2));
      return;
    }
    const auto cmp = [](const KnnEntry<T>& a, const KnnEntry<T>& b) { return less_real(a, b); };
    if (buf.size() < cap) {
      buf.push_back(e);
      std::push_heap(buf.begin(), buf.end(), cmp);
      if (buf.size() < cap) return;
    } else {
      if (!less_real(e, buf.front())) return;
      std::pop_heap(buf.begin(), buf.end(), cmp);
      buf.back() = e;
      std::push_heap(buf.begin(), buf.end(), cmp);
    }
    bound = inflate(std::min(buf.front().d, r2));
  }
  // nanoflann interface
  bool addPoint(T, std::uint32_t j) {
    consider(static_cast<index_t>(j));
    return true;
  }
  T worstDist() const { return bound; }
  bool full() const { return buf.size() == cap; }
  std::size_t size() const { return buf.size(); }

  /// Sorted output row of width cap (padded), returns the valid count.
  index_t write(index_t* idx, T* d2, index_t offset) {
    if (cap > kSortedCap)
      std::sort_heap(buf.begin(), buf.end(), [](const KnnEntry<T>& a, const KnnEntry<T>& b) { return less_real(a, b); });
    const std::size_t n = buf.size();
    for (std::size_t c = 0; c < n; ++c) {
      idx[c] = buf[c].i + offset;
      d2[c] = buf[c].d;
    }
    for (std::size_t c = n; c < cap; ++c) {
      idx[c] = -1;
      d2[c] = std::numeric_limits<T>::infinity();
    }
    return static_cast<index_t>(n);
  }
};

/// nanoflann dataset adaptor over a contiguous [n, D] block.
template <class T>
struct Cloud {
  const T* p;
  std::size_t n;
  int D;
  std::size_t kdtree_get_point_count() const { return n; }
  T kdtree_get_pt(std::uint32_t i, std::size_t d) const { return p[static_cast<std::size_t>(i) * D + d]; }
  template <class BBox>
  bool kdtree_get_bbox(BBox&) const {
    return false;
  }
};

template <class T>
void check_finite(const char* op, const char* what, const T* p, index_t n) {
  index_t bad = 0;
#pragma omp parallel for reduction(+ : bad) if (n > 65536)
  for (index_t i = 0; i < n; ++i) bad += std::isnan(p[i]) ? 1 : 0;
  SHARD_CHECK(bad == 0, op, "{} has {} NaN coordinate(s)", what, bad);
}

/// Leaf size of the k-d tree (bench_neighbors: 10..64 within a few per cent for k = 16 on 1M
/// points; 32 builds faster).
constexpr std::size_t kLeafSize = 32;

/// Brute force when the tree cannot pay for its build (bench_neighbors --crossover, uniform 3-D,
/// k = 16, one thread): brute force wins only for Nq <~ 2 log2(Ns) queries (Ns = 16384: up to
/// ~20 queries; Ns = 1024: ~16; Ns = 64: ~8) — its bounded-heap work per support point costs more
/// than the tree's pruned visits even at Ns = 64 once there are tens of queries.
constexpr index_t kBruteSupport = 32;
constexpr index_t kBruteQueriesPerLog = 2;

bool use_brute(NeighborMethod m, index_t nq, index_t ns) {
  if (m != NeighborMethod::automatic) return m == NeighborMethod::brute;
  if (ns <= kBruteSupport) return true;
  index_t lg = 0;
  while ((index_t{1} << lg) < ns) ++lg;
  return nq <= kBruteQueriesPerLog * lg;
}

/// One search over all queries: `cap` best in (d2, index) order within r2 (inf for kNN).
template <class T, int DIM>
void search_tree(const T* q, const T* s, index_t nq, index_t ns, int D, std::size_t cap, T r2, index_t offset,
                 index_t* idx, T* d2, index_t* counts) {
  using Cl = Cloud<T>;
  using Metric = nanoflann::L2_Simple_Adaptor<T, Cl, T, std::uint32_t>;
  using Tree = nanoflann::KDTreeSingleIndexAdaptor<Metric, Cl, DIM, std::uint32_t>;
  const Cl cloud{s, static_cast<std::size_t>(ns), D};
  const Tree tree(D, cloud, nanoflann::KDTreeSingleIndexAdaptorParams(kLeafSize));
  const index_t w = static_cast<index_t>(cap);
#pragma omp parallel if (nq > 64)
  {
    TopK<T> top;
    top.cap = cap;
    top.r2 = r2;
    top.s = s;
    top.D = D;
    top.buf.reserve(std::min<std::size_t>(cap, static_cast<std::size_t>(ns)) + 1);
    const nanoflann::SearchParams params(0, 0.0f, false);
#pragma omp for schedule(dynamic, 64)
    for (index_t i = 0; i < nq; ++i) {
      top.reset(q + i * D);
      tree.findNeighbors(top, q + i * D, params);
      const index_t n = top.write(idx + i * w, d2 + i * w, offset);
      if (counts) counts[i] = n;
    }
  }
}

template <class T>
void search_brute(const T* q, const T* s, index_t nq, index_t ns, int D, std::size_t cap, T r2, index_t offset,
                  index_t* idx, T* d2, index_t* counts) {
  const index_t w = static_cast<index_t>(cap);
#pragma omp parallel if (nq * ns > 65536)
  {
    TopK<T> top;
    top.cap = cap;
    top.r2 = r2;
    top.s = s;
    top.D = D;
    top.buf.reserve(std::min<std::size_t>(cap, static_cast<std::size_t>(ns)) + 1);
#pragma omp for schedule(dynamic, 16)
    for (index_t i = 0; i < nq; ++i) {
      top.reset(q + i * D);
      for (index_t j = 0; j < ns; ++j) top.consider(j);
      const index_t n = top.write(idx + i * w, d2 + i * w, offset);
      if (counts) counts[i] = n;
    }
  }
}

template <class T>
void search(const char* op, NeighborMethod m, const T* q, const T* s, index_t nq, index_t ns, int D, index_t cap,
            T r2, index_t offset, index_t* idx, T* d2, index_t* counts) {
  check_finite(op, "query", q, nq * D);
  check_finite(op, "support", s, ns * D);
  SHARD_CHECK(ns < (index_t{1} << 32), op, "at most 2^32 - 1 support points per search, got {}", ns);
  const auto c = static_cast<std::size_t>(cap);
  if (ns == 0 || use_brute(m, nq, ns)) return search_brute(q, s, nq, ns, D, c, r2, offset, idx, d2, counts);
  switch (D) {
    case 1: return search_tree<T, 1>(q, s, nq, ns, D, c, r2, offset, idx, d2, counts);
    case 2: return search_tree<T, 2>(q, s, nq, ns, D, c, r2, offset, idx, d2, counts);
    case 3: return search_tree<T, 3>(q, s, nq, ns, D, c, r2, offset, idx, d2, counts);
    default: return search_tree<T, -1>(q, s, nq, ns, D, c, r2, offset, idx, d2, counts);
  }
}

template <class T>
void merge_t(const NeighborMergeGeometry& g, index_t* idx, T* d2, index_t* counts, const index_t* cidx, const T* cd2,
             const index_t* /*ccounts: the padding marks the valid entries*/) {
  const index_t w = g.width;
#pragma omp parallel if (g.n_query * w > 65536)
  {
    std::vector<KnnEntry<T>> row(static_cast<std::size_t>(w));
#pragma omp for
    for (index_t i = 0; i < g.n_query; ++i) {
      index_t* ai = idx + i * w;
      T* ad = d2 + i * w;
      const index_t* bi = cidx + i * w;
      const T* bd = cd2 + i * w;
      index_t a = 0, b = 0;
      for (index_t o = 0; o < w; ++o) {
        const bool va = a < w && ai[a] >= 0, vb = b < w && bi[b] >= 0;
        if (va && (!vb || !before(KnnEntry<T>{bd[b], bi[b]}, KnnEntry<T>{ad[a], ai[a]}))) {
          row[static_cast<std::size_t>(o)] = {ad[a], ai[a]};
          ++a;
        } else if (vb) {
          row[static_cast<std::size_t>(o)] = {bd[b], bi[b]};
          ++b;
        } else {
          row[static_cast<std::size_t>(o)] = {std::numeric_limits<T>::infinity(), -1};
        }
      }
      index_t n = 0;
      for (index_t o = 0; o < w; ++o) {
        ai[o] = row[static_cast<std::size_t>(o)].i;
        ad[o] = row[static_cast<std::size_t>(o)].d;
        n += ai[o] >= 0 ? 1 : 0;
      }
      if (counts) counts[i] = n;
    }
  }
}

struct CpuNeighbors final : NeighborsKernels {
  void knn(DType dt, const KnnGeometry& g, const void* query, const void* support, index_t* indices, void* dist2,
           ExecContext&) const override {
    if (dt == DType::f64)
      search<double>("neighbors_knn", g.method, static_cast<const double*>(query), static_cast<const double*>(support),
                     g.n_query, g.n_support, g.dim, g.k, std::numeric_limits<double>::infinity(), g.index_offset,
                     indices, static_cast<double*>(dist2), nullptr);
    else
      search<float>("neighbors_knn", g.method, static_cast<const float*>(query), static_cast<const float*>(support),
                    g.n_query, g.n_support, g.dim, g.k, std::numeric_limits<float>::infinity(), g.index_offset, indices,
                    static_cast<float*>(dist2), nullptr);
  }
  void radius(DType dt, const RadiusGeometry& g, const void* query, const void* support, index_t* indices,
              void* dist2, index_t* counts, ExecContext&) const override {
    const double r2 = g.radius * g.radius;
    if (dt == DType::f64)
      search<double>("neighbors_radius", g.method, static_cast<const double*>(query),
                     static_cast<const double*>(support), g.n_query, g.n_support, g.dim, g.max_neighbours, r2,
                     g.index_offset, indices, static_cast<double*>(dist2), counts);
    else
      search<float>("neighbors_radius", g.method, static_cast<const float*>(query), static_cast<const float*>(support),
                    g.n_query, g.n_support, g.dim, g.max_neighbours, static_cast<float>(r2), g.index_offset, indices,
                    static_cast<float*>(dist2), counts);
  }
  void merge(DType dt, const NeighborMergeGeometry& g, index_t* indices, void* dist2, index_t* counts,
             const index_t* cand_indices, const void* cand_dist2, const index_t* cand_counts,
             ExecContext&) const override {
    if (dt == DType::f64)
      merge_t(g, indices, static_cast<double*>(dist2), counts, cand_indices, static_cast<const double*>(cand_dist2),
              cand_counts);
    else
      merge_t(g, indices, static_cast<float*>(dist2), counts, cand_indices, static_cast<const float*>(cand_dist2),
              cand_counts);
  }
};

const CpuNeighbors g_cpu_neighbors;

}  // namespace

SHARD_CPU_TABLE(neighbors, g_cpu_neighbors);

}  // namespace shard::exec
