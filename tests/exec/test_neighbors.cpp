// The neighbors kernel family's CPU table (exec/neighbors.hpp: kNN, radius, merge) against a
// brute-force oracle written here (all pairs, canonical d2, sort by (d2, index)): uniform and
// clustered points, duplicates, exact ties on an integer grid, r = 0, k > Ns, Ns = 0, Nq = 0,
// D = 1, 2, 3, 5, f32 and f64, index_offset, every method (automatic, tree, brute), merge of two
// halves == search over the whole, and bad input.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <shardtensor/core/error.hpp>
#include <shardtensor/exec/neighbors.hpp>

#include "support/host_blocks.hpp"

namespace st_exec_test_neighbors {

using namespace shard;
using exec::KnnGeometry;
using exec::NeighborMergeGeometry;
using exec::NeighborMethod;
using exec::RadiusGeometry;

namespace {

using st_support::block_of;
using st_support::vec_of;

enum class Cloud { uniform, clustered, grid, duplicates };

/// n points of dim D: uniform in [0,1)^D, clustered (tight Gaussian blobs), on an integer grid
/// {0..3}^D (many exact ties), or a few distinct points repeated (duplicates).
template <class T>
std::vector<T> points(index_t n, int D, Cloud kind, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<double> nd(0.0, 0.01);
  std::uniform_int_distribution<int> cell(0, 3);
  std::vector<T> p(static_cast<std::size_t>(n * D));
  std::vector<double> centres(5 * static_cast<std::size_t>(D));
  for (auto& c : centres) c = u(gen);
  std::vector<T> distinct(3 * static_cast<std::size_t>(D));
  for (auto& c : distinct) c = static_cast<T>(u(gen));
  for (index_t i = 0; i < n; ++i) {
    const auto blob = static_cast<std::size_t>(gen() % 5), rep = static_cast<std::size_t>(gen() % 3);
    for (int d = 0; d < D; ++d) {
      T& x = p[static_cast<std::size_t>(i * D + d)];
      switch (kind) {
        case Cloud::uniform: x = static_cast<T>(u(gen)); break;
        case Cloud::clustered: x = static_cast<T>(centres[blob * D + d] + nd(gen)); break;
        case Cloud::grid: x = static_cast<T>(cell(gen)); break;
        case Cloud::duplicates: x = distinct[rep * D + d]; break;
      }
    }
  }
  return p;
}

template <class T>
T sqdist(const T* a, const T* b, int D) {
  T r = 0;
  for (int d = 0; d < D; ++d) {
    const T diff = a[d] - b[d];
    r += diff * diff;
  }
  return r;
}

/// Oracle: rows of width w over all support points with d2 <= r2, sorted by (d2, index), padded.
template <class T>
void oracle(const std::vector<T>& q, const std::vector<T>& s, int D, index_t w, T r2, index_t offset,
            std::vector<index_t>& idx, std::vector<T>& d2, std::vector<index_t>& counts) {
  const index_t nq = static_cast<index_t>(q.size()) / D, ns = static_cast<index_t>(s.size()) / D;
  idx.assign(static_cast<std::size_t>(nq * w), -1);
  d2.assign(static_cast<std::size_t>(nq * w), std::numeric_limits<T>::infinity());
  counts.assign(static_cast<std::size_t>(nq), 0);
  for (index_t i = 0; i < nq; ++i) {
    std::vector<std::pair<T, index_t>> all;
    for (index_t j = 0; j < ns; ++j) {
      const T d = sqdist(q.data() + i * D, s.data() + j * D, D);
      if (d <= r2) all.push_back({d, j});
    }
    std::sort(all.begin(), all.end());
    const index_t n = std::min<index_t>(w, static_cast<index_t>(all.size()));
    for (index_t c = 0; c < n; ++c) {
      idx[static_cast<std::size_t>(i * w + c)] = all[static_cast<std::size_t>(c)].second + offset;
      d2[static_cast<std::size_t>(i * w + c)] = all[static_cast<std::size_t>(c)].first;
    }
    counts[static_cast<std::size_t>(i)] = n;
  }
}

template <class T>
struct Result {
  std::vector<index_t> idx;
  std::vector<T> d2;
  std::vector<index_t> counts;
};

template <class T>
Result<T> run_knn(const std::vector<T>& q, const std::vector<T>& s, int D, index_t k, index_t offset,
                  NeighborMethod m) {
  const index_t nq = static_cast<index_t>(q.size()) / D, ns = static_cast<index_t>(s.size()) / D;
  const Block qb = block_of<T>({nq, D}, q), sb = block_of<T>({ns, D}, s);
  const Block ib = Block::allocate(DType::i64, Device::cpu(), {nq, k});
  const Block db = Block::allocate(dtype_of<T>, Device::cpu(), {nq, k});
  ExecContext ctx(Device::cpu());
  exec::neighbors_knn(KnnGeometry{nq, ns, D, k, offset, m}, qb, sb, ib, db, ctx);
  return {vec_of<index_t>(ib), vec_of<T>(db), {}};
}

template <class T>
Result<T> run_radius(const std::vector<T>& q, const std::vector<T>& s, int D, double r, index_t maxn, index_t offset,
                     NeighborMethod m) {
  const index_t nq = static_cast<index_t>(q.size()) / D, ns = static_cast<index_t>(s.size()) / D;
  const Block qb = block_of<T>({nq, D}, q), sb = block_of<T>({ns, D}, s);
  const Block ib = Block::allocate(DType::i64, Device::cpu(), {nq, maxn});
  const Block db = Block::allocate(dtype_of<T>, Device::cpu(), {nq, maxn});
  const Block cb = Block::allocate(DType::i64, Device::cpu(), {nq});
  ExecContext ctx(Device::cpu());
  exec::neighbors_radius(RadiusGeometry{nq, ns, D, r, maxn, offset, m}, qb, sb, ib, db, cb, ctx);
  return {vec_of<index_t>(ib), vec_of<T>(db), vec_of<index_t>(cb)};
}

template <class T>
void check_equal(const Result<T>& got, const std::vector<index_t>& idx, const std::vector<T>& d2) {
  REQUIRE(got.idx.size() == idx.size());
  CHECK(got.idx == idx);
  // Bitwise-equal distances (inf == inf).
  bool same = got.d2.size() == d2.size();
  for (std::size_t i = 0; same && i < d2.size(); ++i) same = got.d2[i] == d2[i];
  CHECK(same);
}

constexpr NeighborMethod kMethods[] = {NeighborMethod::automatic, NeighborMethod::tree, NeighborMethod::brute};

}  // namespace

TEMPLATE_TEST_CASE("neighbors_knn equals the brute-force oracle exactly, ties by index", "[exec][neighbors]", float,
                   double) {
  using T = TestType;
  for (Cloud kind : {Cloud::uniform, Cloud::clustered, Cloud::grid, Cloud::duplicates})
    for (int D : {1, 2, 3, 5})
      for (index_t ns : {index_t{0}, index_t{1}, index_t{7}, index_t{300}, index_t{1500}})
        for (index_t k : {index_t{1}, index_t{4}, index_t{16}}) {
          const index_t nq = ns == 1500 ? 200 : 90;
          const auto s = points<T>(ns, D, kind, 11 + static_cast<unsigned>(ns));
          // Queries: fresh points of the same kind plus the first support points themselves (exact hits).
          auto q = points<T>(nq, D, kind, 5);
          for (index_t i = 0; i < std::min<index_t>(ns, 10) * D; ++i) q[static_cast<std::size_t>(i)] = s[static_cast<std::size_t>(i)];
          const index_t offset = ns == 300 ? 1000 : 0;
          std::vector<index_t> idx, counts;
          std::vector<T> d2;
          oracle<T>(q, s, D, k, std::numeric_limits<T>::infinity(), offset, idx, d2, counts);
          for (NeighborMethod m : kMethods) {
            INFO("cloud " << int(kind) << " D " << D << " ns " << ns << " k " << k << " method " << int(m));
            check_equal(run_knn<T>(q, s, D, k, offset, m), idx, d2);
          }
        }
}

TEMPLATE_TEST_CASE("neighbors_radius equals the brute-force oracle exactly, capped, r = 0", "[exec][neighbors]", float,
                   double) {
  using T = TestType;
  for (Cloud kind : {Cloud::uniform, Cloud::clustered, Cloud::grid, Cloud::duplicates})
    for (int D : {1, 2, 3})
      for (index_t ns : {index_t{0}, index_t{5}, index_t{400}, index_t{2000}})
        for (double r : {0.0, 0.05, 1.0, 2.0})
          for (index_t maxn : {index_t{1}, index_t{8}, index_t{100}}) {  // 100: the heap path
            const index_t nq = 80;
            const auto s = points<T>(ns, D, kind, 3 + static_cast<unsigned>(ns));
            auto q = points<T>(nq, D, kind, 17);
            for (index_t i = 0; i < std::min<index_t>(ns, 10) * D; ++i) q[static_cast<std::size_t>(i)] = s[static_cast<std::size_t>(i)];
            const index_t offset = ns == 400 ? 7 : 0;
            std::vector<index_t> idx, counts;
            std::vector<T> d2;
            oracle<T>(q, s, D, maxn, static_cast<T>(r * r), offset, idx, d2, counts);
            for (NeighborMethod m : kMethods) {
              INFO("cloud " << int(kind) << " D " << D << " ns " << ns << " r " << r << " maxn " << maxn << " method "
                            << int(m));
              const auto got = run_radius<T>(q, s, D, r, maxn, offset, m);
              check_equal(got, idx, d2);
              CHECK(got.counts == counts);
            }
          }
}

TEMPLATE_TEST_CASE("neighbors_merge of two halves equals the search over the whole", "[exec][neighbors]", float,
                   double) {
  using T = TestType;
  const int D = 3;
  for (Cloud kind : {Cloud::uniform, Cloud::grid, Cloud::duplicates})
    for (index_t split : {index_t{0}, index_t{1}, index_t{400}, index_t{1000}}) {
      const index_t ns = 1000, nq = 150, k = 12;
      const auto s = points<T>(ns, D, kind, 23);
      const auto q = points<T>(nq, D, kind, 29);
      const std::vector<T> lo(s.begin(), s.begin() + split * D), hi(s.begin() + split * D, s.end());
      INFO("cloud " << int(kind) << " split " << split);
      ExecContext ctx(Device::cpu());
      // kNN: the high half (offset split) merged into the low half's running list, and the reverse.
      {
        const auto whole = run_knn<T>(q, s, D, k, 0, NeighborMethod::automatic);
        for (bool reverse : {false, true}) {
          auto a = run_knn<T>(q, lo, D, k, 0, NeighborMethod::automatic);
          auto b = run_knn<T>(q, hi, D, k, split, NeighborMethod::automatic);
          if (reverse) std::swap(a, b);
          const Block ai = block_of<index_t>({nq, k}, a.idx), ad = block_of<T>({nq, k}, a.d2);
          const Block bi = block_of<index_t>({nq, k}, b.idx), bd = block_of<T>({nq, k}, b.d2);
          exec::neighbors_merge(NeighborMergeGeometry{nq, k}, ai, ad, nullptr, bi, bd, nullptr, ctx);
          check_equal(Result<T>{vec_of<index_t>(ai), vec_of<T>(ad), {}}, whole.idx, whole.d2);
        }
      }
      // Radius lists, with counts.
      {
        const double r = kind == Cloud::grid ? 1.0 : 0.2;
        const index_t maxn = 20;
        const auto whole = run_radius<T>(q, s, D, r, maxn, 0, NeighborMethod::automatic);
        auto a = run_radius<T>(q, lo, D, r, maxn, 0, NeighborMethod::automatic);
        auto b = run_radius<T>(q, hi, D, r, maxn, split, NeighborMethod::automatic);
        const Block ai = block_of<index_t>({nq, maxn}, a.idx), ad = block_of<T>({nq, maxn}, a.d2),
                    ac = block_of<index_t>({nq}, a.counts);
        const Block bi = block_of<index_t>({nq, maxn}, b.idx), bd = block_of<T>({nq, maxn}, b.d2),
                    bc = block_of<index_t>({nq}, b.counts);
        exec::neighbors_merge(NeighborMergeGeometry{nq, maxn}, ai, ad, &ac, bi, bd, &bc, ctx);
        check_equal(Result<T>{vec_of<index_t>(ai), vec_of<T>(ad), {}}, whole.idx, whole.d2);
        CHECK(vec_of<index_t>(ac) == whole.counts);
      }
    }
}

TEST_CASE("neighbors: k > Ns pads with -1 / +inf, Nq = 0 is a no-op", "[exec][neighbors]") {
  const std::vector<double> s{0.0, 0.0, 1.0, 0.0, 0.0, 1.0};  // 3 points in 2-D
  const std::vector<double> q{0.1, 0.0};
  const auto got = run_knn<double>(q, s, 2, 5, 10, NeighborMethod::automatic);
  CHECK(got.idx == std::vector<index_t>{10, 11, 12, -1, -1});
  CHECK(got.d2[0] == 0.1 * 0.1);
  CHECK(std::isinf(got.d2[3]));
  CHECK(std::isinf(got.d2[4]));
  ExecContext ctx(Device::cpu());
  const Block qb = Block::allocate(DType::f64, Device::cpu(), {0, 2});
  const Block sb = block_of<double>({3, 2}, s);
  const Block ib = Block::allocate(DType::i64, Device::cpu(), {0, 4});
  const Block db = Block::allocate(DType::f64, Device::cpu(), {0, 4});
  CHECK_NOTHROW(exec::neighbors_knn(KnnGeometry{0, 3, 2, 4}, qb, sb, ib, db, ctx));
}

TEST_CASE("neighbors: bad input is a shard::Error", "[exec][neighbors]") {
  ExecContext ctx(Device::cpu());
  const index_t nq = 4, ns = 6, D = 3, k = 2;
  const Block q = block_of<double>({nq, D}, points<double>(nq, D, Cloud::uniform, 1));
  const Block s = block_of<double>({ns, D}, points<double>(ns, D, Cloud::uniform, 2));
  const Block s2 = block_of<double>({ns, 2}, points<double>(ns, 2, Cloud::uniform, 2));
  const Block sf = block_of<float>({ns, D}, points<float>(ns, D, Cloud::uniform, 2));
  const Block idx = Block::allocate(DType::i64, Device::cpu(), {nq, k});
  const Block d2 = Block::allocate(DType::f64, Device::cpu(), {nq, k});
  const Block d2f = Block::allocate(DType::f32, Device::cpu(), {nq, k});
  const Block idx32 = Block::allocate(DType::i32, Device::cpu(), {nq, k});
  const Block cnt = Block::allocate(DType::i64, Device::cpu(), {nq});
  const KnnGeometry g{nq, ns, static_cast<int>(D), k};
  CHECK_NOTHROW(exec::neighbors_knn(g, q, s, idx, d2, ctx));
  KnnGeometry bad = g;
  bad.k = 0;
  CHECK_THROWS_AS(exec::neighbors_knn(bad, q, s, Block::allocate(DType::i64, Device::cpu(), {nq, 0}),
                                      Block::allocate(DType::f64, Device::cpu(), {nq, 0}), ctx),
                  shard::Error);
  bad = g;
  bad.index_offset = -1;
  CHECK_THROWS_AS(exec::neighbors_knn(bad, q, s, idx, d2, ctx), shard::Error);
  bad = g;
  bad.dim = 2;  // geometry disagrees with the blocks
  CHECK_THROWS_AS(exec::neighbors_knn(bad, q, s, idx, d2, ctx), shard::Error);
  CHECK_THROWS_AS(exec::neighbors_knn(g, q, s2, idx, d2, ctx), shard::Error);    // mismatched D
  CHECK_THROWS_AS(exec::neighbors_knn(g, q, sf, idx, d2, ctx), shard::Error);    // mixed dtypes
  CHECK_THROWS_AS(exec::neighbors_knn(g, q, s, idx, d2f, ctx), shard::Error);    // distance dtype
  CHECK_THROWS_AS(exec::neighbors_knn(g, q, s, idx32, d2, ctx), shard::Error);   // index dtype
  CHECK_THROWS_AS(exec::neighbors_knn(g, q, s, d2, idx, ctx), shard::Error);     // swapped outputs
  const Block flat = block_of<double>({nq * D}, points<double>(nq, D, Cloud::uniform, 1));
  CHECK_THROWS_AS(exec::neighbors_knn(g, flat, s, idx, d2, ctx), shard::Error);  // not [N, D]
  // NaN coordinates.
  auto qn = points<double>(nq, D, Cloud::uniform, 1);
  qn[4] = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(exec::neighbors_knn(g, block_of<double>({nq, D}, qn), s, idx, d2, ctx), shard::Error);
  // Radius.
  const RadiusGeometry rg{nq, ns, static_cast<int>(D), 0.5, k};
  CHECK_NOTHROW(exec::neighbors_radius(rg, q, s, idx, d2, cnt, ctx));
  RadiusGeometry rb = rg;
  rb.radius = -0.1;
  CHECK_THROWS_AS(exec::neighbors_radius(rb, q, s, idx, d2, cnt, ctx), shard::Error);
  rb.radius = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(exec::neighbors_radius(rb, q, s, idx, d2, cnt, ctx), shard::Error);
  rb = rg;
  rb.max_neighbours = 0;
  CHECK_THROWS_AS(exec::neighbors_radius(rb, q, s, Block::allocate(DType::i64, Device::cpu(), {nq, 0}),
                                         Block::allocate(DType::f64, Device::cpu(), {nq, 0}), cnt, ctx),
                  shard::Error);
  CHECK_THROWS_AS(exec::neighbors_radius(rg, q, s, idx, d2, Block::allocate(DType::i64, Device::cpu(), {nq + 1}), ctx),
                  shard::Error);
  // Merge.
  CHECK_THROWS_AS(exec::neighbors_merge(NeighborMergeGeometry{nq, k}, idx, d2, &cnt, idx, d2, nullptr, ctx),
                  shard::Error);
  CHECK_THROWS_AS(exec::neighbors_merge(NeighborMergeGeometry{nq, k + 1}, idx, d2, nullptr, idx, d2, nullptr, ctx),
                  shard::Error);
  CHECK_THROWS_AS(exec::neighbors_merge(NeighborMergeGeometry{nq, 0}, idx, d2, nullptr, idx, d2, nullptr, ctx),
                  shard::Error);
}

}  // namespace st_exec_test_neighbors
