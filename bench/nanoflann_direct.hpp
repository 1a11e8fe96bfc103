#pragma once
// Shared by bench_neighbors and bench_dist_neighbors: the benchmark point clouds and nanoflann
// called directly (its own KNNResultSet / radiusSearch, leaf size 32, no tie handling), the
// single-rank anchor every neighbour-search figure is compared with.
#include <nanoflann.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include <shardtensor/core/shape.hpp>

#include "bench_util.hpp"

namespace shard::bench {

/// n points in [0,1)^3: uniform, or 32 Gaussian blobs (sigma 0.02) — ~30x denser where it matters.
std::vector<float> make_points(index_t n, bool clustered, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<float> c(32 * 3);
  for (auto& x : c) x = 0.1f + 0.8f * u(gen);
  std::vector<float> p(static_cast<std::size_t>(n) * 3);
  for (index_t i = 0; i < n; ++i) {
    const std::size_t b = gen() % 32;
    for (int d = 0; d < 3; ++d) p[static_cast<std::size_t>(i) * 3 + d] = clustered ? c[b * 3 + d] + nd(gen) : u(gen);
  }
  return p;
}

struct Cloud {
  const float* p;
  std::size_t n;
  std::size_t kdtree_get_point_count() const { return n; }
  float kdtree_get_pt(std::uint32_t i, std::size_t d) const { return p[static_cast<std::size_t>(i) * 3 + d]; }
  template <class B>
  bool kdtree_get_bbox(B&) const {
    return false;
  }
};
using Metric = nanoflann::L2_Simple_Adaptor<float, Cloud, float, std::uint32_t>;
using Tree = nanoflann::KDTreeSingleIndexAdaptor<Metric, Cloud, 3, std::uint32_t>;

/// nanoflann directly: build + knnSearch (k) or radiusSearch (all within r, then the nearest
/// `maxn` kept) for every point. Writes the k-th (or last kept) distance per query to `kth`.
double direct(const std::vector<float>& pts, index_t n, bool knn, index_t k, float r2, index_t maxn,
              std::vector<float>& kth) {
  const double t0 = now_ms();
  const Cloud cloud{pts.data(), static_cast<std::size_t>(n)};
  Tree tree(3, cloud, nanoflann::KDTreeSingleIndexAdaptorParams(32));
  std::vector<std::uint32_t> idx(static_cast<std::size_t>(k));
  std::vector<float> d(static_cast<std::size_t>(k));
  std::vector<std::pair<std::uint32_t, float>> found;
  nanoflann::SearchParams sp(0, 0.f, true);
  kth.resize(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) {
    const float* q = pts.data() + static_cast<std::size_t>(i) * 3;
    if (knn) {
      tree.knnSearch(q, static_cast<std::size_t>(k), idx.data(), d.data());
      kth[static_cast<std::size_t>(i)] = d[static_cast<std::size_t>(k - 1)];
    } else {
      const std::size_t m = tree.radiusSearch(q, r2, found, sp);
      kth[static_cast<std::size_t>(i)] =
          m == 0 ? INFINITY : found[std::min<std::size_t>(m, static_cast<std::size_t>(maxn)) - 1].second;
    }
  }
  return now_ms() - t0;
}

}  // namespace shard::bench
