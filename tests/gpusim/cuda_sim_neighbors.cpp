// gpusim lane: the neighbour-search family (kernels/neighbors.cu, src/cuda/neighbors_cuda.cpp)
// against the CPU table, EXACT equality of indices, squared distances and counts (the CUDA table
// promises the CPU's bits): kNN with k = 1, 5, 16 (register lists), 40 (the list in the output
// row), k > n_support, n_support = 0; radius with r = 0 (duplicates), ties on an integer grid
// (d2 == r2 exactly), the max_neighbours cap hit and not; D = 2, 3, 5 (query in global memory)
// and 40 (support tiles of 51 points: several tiles per search); two query blocks (n_query > 128);
// index_offset; the merge of two shards' lists == the search over the whole; NaN refused; f32, f64.
#include <catch2/catch_template_test_macros.hpp>

#include <cstdint>
#include <limits>

#include "exec/neighbors_kernels.hpp"
#include "gpusim_support.hpp"

namespace st_gpusim_cuda_sim_neighbors {

using namespace gpusim;
using exec::KnnGeometry;
using exec::NeighborMergeGeometry;
using exec::NeighborsKernels;
using exec::RadiusGeometry;

namespace {
const NeighborsKernels& cu() { return exec::kernels_for<NeighborsKernels>(gpu(), "test"); }
const NeighborsKernels& cpu() { return exec::kernels_for<NeighborsKernels>(Device::cpu(), "test"); }

enum class Kind { uniform, grid, duplicates };

/// n points of dim D: uniform in [0, 1), on the integer grid {0..3}^D (many exact ties), or three
/// distinct points (the same three for every seed, so query and support share them) repeated
/// (duplicates: d2 == 0 between distinct indices).
std::vector<double> cloud(index_t n, int D, Kind kind, unsigned seed) {
  std::mt19937_64 g(seed), gd(12345u + static_cast<unsigned>(D));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> distinct(3 * static_cast<std::size_t>(D));
  for (auto& x : distinct) x = u(gd);
  std::vector<double> p(static_cast<std::size_t>(n) * D);
  for (index_t i = 0; i < n; ++i) {
    const auto rep = static_cast<std::size_t>(g() % 3);
    for (int d = 0; d < D; ++d) {
      double& x = p[static_cast<std::size_t>(i) * D + d];
      switch (kind) {
        case Kind::uniform: x = u(g); break;
        case Kind::grid: x = static_cast<double>(g() % 4); break;
        case Kind::duplicates: x = distinct[rep * D + d]; break;
      }
    }
  }
  return p;
}

/// Exact equality of the device copy and the host copy (indices, distances, counts).
template <class P>
void require_equal(const P& p, const char* what) {
  const auto d = p.device(), h = p.host();
  INFO(what << ": " << worst(d, h));
  CHECK(d == h);
}

/// Query and support pairs for one case.
template <class T>
struct Points {
  Pair<T> q, s;
  Points(index_t nq, index_t ns, int D, Kind kind, unsigned seed)
      : q({nq, D}, cloud(nq, D, kind, seed)), s({ns, D}, ns > 0 ? cloud(ns, D, kind, seed + 1) : std::vector<double>{}) {}
};

template <class T>
void knn_case(index_t nq, index_t ns, int D, index_t k, Kind kind, unsigned seed, index_t offset = 0) {
  INFO("knn nq " << nq << " ns " << ns << " D " << D << " k " << k << " kind " << int(kind) << " offset " << offset);
  Points<T> p(nq, ns, D, kind, seed);
  Pair<index_t> idx({nq, k});
  Pair<T> d2({nq, k});
  KnnGeometry g;
  g.n_query = nq;
  g.n_support = ns;
  g.dim = D;
  g.k = k;
  g.index_offset = offset;
  g.method = exec::NeighborMethod::brute;
  cpu().knn(dtype_of<T>, g, p.q.h.data, p.s.h.data, static_cast<index_t*>(idx.h.data), d2.h.data, hctx());
  cu().knn(dtype_of<T>, g, p.q.d.data, p.s.d.data, static_cast<index_t*>(idx.d.data), d2.d.data, gctx());
  require_equal(idx, "knn indices");
  require_equal(d2, "knn dist2");
  // The CPU k-d tree path gives the same lists (the tables agree whatever the CPU method).
  g.method = exec::NeighborMethod::tree;
  Pair<index_t> idx_t({nq, k});
  Pair<T> d2_t({nq, k});
  cpu().knn(dtype_of<T>, g, p.q.h.data, p.s.h.data, static_cast<index_t*>(idx_t.h.data), d2_t.h.data, hctx());
  CHECK(idx_t.host() == idx.device());
  CHECK(d2_t.host() == d2.device());
}

template <class T>
void radius_case(index_t nq, index_t ns, int D, double r, index_t cap, Kind kind, unsigned seed) {
  INFO("radius nq " << nq << " ns " << ns << " D " << D << " r " << r << " cap " << cap << " kind " << int(kind));
  Points<T> p(nq, ns, D, kind, seed);
  Pair<index_t> idx({nq, cap}), counts({nq});
  Pair<T> d2({nq, cap});
  RadiusGeometry g;
  g.n_query = nq;
  g.n_support = ns;
  g.dim = D;
  g.radius = r;
  g.max_neighbours = cap;
  g.index_offset = 7;
  g.method = exec::NeighborMethod::brute;
  cpu().radius(dtype_of<T>, g, p.q.h.data, p.s.h.data, static_cast<index_t*>(idx.h.data), d2.h.data,
               static_cast<index_t*>(counts.h.data), hctx());
  cu().radius(dtype_of<T>, g, p.q.d.data, p.s.d.data, static_cast<index_t*>(idx.d.data), d2.d.data,
              static_cast<index_t*>(counts.d.data), gctx());
  require_equal(idx, "radius indices");
  require_equal(d2, "radius dist2");
  require_equal(counts, "radius counts");
  // Not a vacuous case: some rows found something (r > 0 or duplicates).
  const auto c = counts.host();
  double total = 0;
  for (double x : c) total += x;
  CHECK(total > 0);
}

/// Search the support in two shards (index offsets), merge on both tables, compare with each other
/// and with the search over the whole support.
template <class T>
void merge_case(index_t nq, index_t ns, int D, index_t width, bool radius, Kind kind, unsigned seed) {
  INFO("merge nq " << nq << " ns " << ns << " D " << D << " width " << width << " radius " << radius);
  const std::vector<double> qv = cloud(nq, D, kind, seed), sv = cloud(ns, D, kind, seed + 1);
  const index_t n1 = ns / 3, n2 = ns - n1;
  const std::vector<double> s1(sv.begin(), sv.begin() + n1 * D), s2(sv.begin() + n1 * D, sv.end());
  Pair<T> q({nq, D}, qv), sa({n1, D}, s1), sb({n2, D}, s2), sall({ns, D}, sv);
  const double r = 0.4;
  auto run = [&](const NeighborsKernels& t, bool dev, const Pair<T>& s, index_t n, index_t offset, Pair<index_t>& idx,
                 Pair<T>& d2, Pair<index_t>& counts) {
    ExecContext& ctx = dev ? gctx() : hctx();
    const void* qp = dev ? q.d.data : q.h.data;
    const void* sp = dev ? s.d.data : s.h.data;
    auto* ip = static_cast<index_t*>(dev ? idx.d.data : idx.h.data);
    void* dp = dev ? d2.d.data : d2.h.data;
    if (radius) {
      RadiusGeometry g;
      g.n_query = nq, g.n_support = n, g.dim = D, g.radius = r, g.max_neighbours = width, g.index_offset = offset;
      t.radius(dtype_of<T>, g, qp, sp, ip, dp, static_cast<index_t*>(dev ? counts.d.data : counts.h.data), ctx);
    } else {
      KnnGeometry g;
      g.n_query = nq, g.n_support = n, g.dim = D, g.k = width, g.index_offset = offset;
      t.knn(dtype_of<T>, g, qp, sp, ip, dp, ctx);
    }
  };
  Pair<index_t> ia({nq, width}), ib({nq, width}), iall({nq, width}), ca({nq}), cb({nq}), call({nq});
  Pair<T> da({nq, width}), db({nq, width}), dall({nq, width});
  for (const bool dev : {false, true}) {
    const NeighborsKernels& t = dev ? cu() : cpu();
    run(t, dev, sa, n1, 0, ia, da, ca);
    run(t, dev, sb, n2, n1, ib, db, cb);
    run(t, dev, sall, ns, 0, iall, dall, call);
    const NeighborMergeGeometry mg{nq, width};
    ExecContext& ctx = dev ? gctx() : hctx();
    auto ptr = [dev](auto& pair) { return dev ? pair.d.data : pair.h.data; };
    t.merge(dtype_of<T>, mg, static_cast<index_t*>(ptr(ia)), ptr(da), radius ? static_cast<index_t*>(ptr(ca)) : nullptr,
            static_cast<const index_t*>(ptr(ib)), ptr(db), radius ? static_cast<const index_t*>(ptr(cb)) : nullptr,
            ctx);
  }
  require_equal(ia, "merged indices");
  require_equal(da, "merged dist2");
  CHECK(ia.device() == iall.device());
  CHECK(da.device() == dall.device());
  if (radius) {
    require_equal(ca, "merged counts");
    CHECK(ca.device() == call.device());
  }
}

}  // namespace

TEMPLATE_TEST_CASE("gpusim neighbors: kNN equals the CPU table bit for bit", "[gpusim][neighbors]", float, double) {
  GPUSIM_REQUIRE_GPU();
  using T = TestType;
  SECTION("k = 1, 5, 16, 40; D = 3 and 2; two query blocks") {
    knn_case<T>(200, 150, 3, 1, Kind::uniform, 1u);
    knn_case<T>(64, 200, 3, 5, Kind::uniform, 2u, 1000);
    knn_case<T>(130, 120, 2, 16, Kind::uniform, 3u);
    knn_case<T>(64, 100, 3, 40, Kind::uniform, 4u, 5);
  }
  SECTION("ties on an integer grid and exact duplicates") {
    knn_case<T>(100, 180, 3, 5, Kind::grid, 5u);
    knn_case<T>(64, 120, 2, 40, Kind::grid, 6u);
    knn_case<T>(80, 90, 3, 8, Kind::duplicates, 7u);
  }
  SECTION("k > n_support pads with -1 / +inf; n_support = 0") {
    knn_case<T>(70, 20, 3, 25, Kind::uniform, 8u);
    knn_case<T>(64, 30, 2, 50, Kind::grid, 9u);
    knn_case<T>(10, 0, 3, 4, Kind::uniform, 10u);
  }
  SECTION("D = 5 (query in global memory) and D = 40 (several support tiles)") {
    knn_case<T>(64, 100, 5, 5, Kind::uniform, 11u);
    knn_case<T>(40, 200, 40, 6, Kind::uniform, 12u);
  }
}

TEMPLATE_TEST_CASE("gpusim neighbors: radius search equals the CPU table bit for bit", "[gpusim][neighbors]", float,
                   double) {
  GPUSIM_REQUIRE_GPU();
  using T = TestType;
  SECTION("uniform points, cap hit and not") {
    radius_case<T>(150, 200, 3, 0.3, 8, Kind::uniform, 21u);
    radius_case<T>(64, 150, 2, 0.25, 40, Kind::uniform, 22u);
    radius_case<T>(64, 100, 3, 0.2, 1, Kind::uniform, 23u);
  }
  SECTION("r = 0 finds exact duplicates; d2 == r2 on the grid is inside") {
    radius_case<T>(64, 120, 3, 0.0, 16, Kind::duplicates, 24u);
    radius_case<T>(100, 150, 3, 1.0, 12, Kind::grid, 25u);
    radius_case<T>(64, 100, 2, std::sqrt(2.0), 40, Kind::grid, 26u);
  }
}

TEMPLATE_TEST_CASE("gpusim neighbors: merge of two shards' lists equals the CPU table and the whole search",
                   "[gpusim][neighbors]", float, double) {
  GPUSIM_REQUIRE_GPU();
  using T = TestType;
  merge_case<T>(100, 150, 3, 5, false, Kind::uniform, 31u);
  merge_case<T>(64, 120, 2, 40, false, Kind::grid, 32u);
  merge_case<T>(80, 140, 3, 12, true, Kind::uniform, 33u);
  merge_case<T>(64, 90, 3, 6, true, Kind::duplicates, 34u);
}

TEMPLATE_TEST_CASE("gpusim neighbors: NaN coordinates are refused as on the CPU", "[gpusim][neighbors]", float,
                   double) {
  GPUSIM_REQUIRE_GPU();
  using T = TestType;
  for (const bool in_query : {true, false}) {
    INFO("NaN in " << (in_query ? "query" : "support"));
    Points<T> p(40, 60, 3, Kind::uniform, 41u);
    Pair<T>& bad = in_query ? p.q : p.s;
    static_cast<T*>(bad.h.data)[17] = std::numeric_limits<T>::quiet_NaN();
    bad.upload();
    Pair<index_t> idx({40, 3});
    Pair<T> d2({40, 3});
    KnnGeometry g;
    g.n_query = 40, g.n_support = 60, g.dim = 3, g.k = 3;
    CHECK_THROWS_AS(cpu().knn(dtype_of<T>, g, p.q.h.data, p.s.h.data, static_cast<index_t*>(idx.h.data), d2.h.data,
                              hctx()),
                    shard::Error);
    CHECK_THROWS_AS(cu().knn(dtype_of<T>, g, p.q.d.data, p.s.d.data, static_cast<index_t*>(idx.d.data), d2.d.data,
                             gctx()),
                    shard::Error);
  }
}

}  // namespace st_gpusim_cuda_sim_neighbors
