// gather_to(root) / scatter_from(root): the oracle is the full tensor (the same seed gives the
// same global tensor at every rank count). 1-4 ranks, 1-D and 2-D meshes, uneven and empty
// shards, Replicate and Partial placements, f32/f64/c128, every root. Memory: a non-root rank's
// peak allocation (memory_stats) stays O(local), well below the global size.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <complex>

#include "support/mpi_harness.hpp"

namespace st_dist_mpi_gather {

using namespace shard;
using namespace shard::test;

namespace {

template <class T>
Tensor<T, 2> global_of(const Shape<2>& s, std::uint64_t seed) {
  auto t = Tensor<T, 2>::empty(s);
  if constexpr (std::is_same_v<T, std::complex<double>>) {
    auto re = Tensor<double, 2>::empty(s), im = Tensor<double, 2>::empty(s);
    re.fill_random(seed);
    im.fill_random(seed + 7);
    for (index_t i = 0; i < t.numel(); ++i) t.data()[i] = T(re.data()[i], im.data()[i]);
  } else {
    t.fill_random(seed);
  }
  return t;
}

template <class T>
bool equal(const Tensor<T, 2>& a, const Tensor<T, 2>& b) {
  if (a.shape() != b.shape()) return false;
  const auto x = a.contiguous(), y = b.contiguous();
  for (index_t i = 0; i < x.numel(); ++i)
    if (x.data()[i] != y.data()[i]) return false;
  return true;
}

struct Case {
  std::vector<int> mesh;  // mesh shape given the communicator size p (filled per p)
  std::vector<Placement> placements;
  bool uneven = false;
};

std::vector<Case> cases_for(int p) {
  std::vector<Case> cs = {{{p}, {Shard(0)}}, {{p}, {Shard(1)}}, {{p}, {Replicate()}}, {{p}, {Shard(0)}, true}};
  if (p == 4 || p == 2) {
    const int a = p == 4 ? 2 : 1;
    const int b = p / a;
    cs.push_back({{a, b}, {Shard(0), Shard(1)}});
    cs.push_back({{a, b}, {Replicate(), Shard(1)}});
    cs.push_back({{a, b}, {Shard(1), Shard(1)}, true});
    cs.push_back({{a, b}, {Shard(0), Replicate()}});
  }
  return cs;
}

}  // namespace

TEMPLATE_TEST_CASE("gather_to and scatter_from equal the full tensor at every root", "[dist][gather][mpi]", float,
                   double, std::complex<double>) {
  using T = TestType;
  for_each_comm([](CommPtr comm) {
    const int p = comm->size();
    const Shape<2> shape{11, 7};
    const auto full = global_of<T>(shape, 42);
    for (const auto& c : cases_for(p)) {
      DeviceMesh mesh(comm, c.mesh);
      ShardSizes sizes;
      if (c.uneven) {
        // Dim sharded over all p ranks: one empty shard, the rest uneven.
        const int d = c.placements.back().dim;
        std::vector<index_t> s(static_cast<std::size_t>(p), 0);
        index_t left = shape[static_cast<std::size_t>(d)];
        for (int r = 0; r < p; ++r) {
          const index_t take = r == p - 1 ? left : (r == 0 ? 0 : std::min<index_t>(left, r + 1));
          s[static_cast<std::size_t>(r)] = take;
          left -= take;
        }
        sizes = ShardSizes(2);
        sizes[static_cast<std::size_t>(d)] = s;
      }
      for (int root = 0; root < p; ++root) {
        INFO("mesh " << c.mesh.size() << "-D, root " << root << ", placements " << fmt::format("{}", fmt::join(c.placements, ",")));
        auto x = DistTensor<T, 2>::scatter_from(comm->rank() == root ? full : Tensor<T, 2>(), root, mesh, c.placements,
                                                sizes);
        CHECK(equal(x.full_tensor(), full));
        const auto g = x.gather_to(root);
        if (comm->rank() == root) CHECK(equal(g, full));
        else CHECK(g.numel() == 0);
      }
    }
  });
}

TEMPLATE_TEST_CASE("gather_to reduces Partial placements; scatter_from creates them", "[dist][gather][mpi]", float,
                   double) {
  using T = TestType;
  for_each_comm([](CommPtr comm) {
    const int p = comm->size();
    const Shape<2> shape{6, 5};
    const auto full = global_of<T>(shape, 5);
    std::vector<std::vector<int>> meshes = {{p}};
    if (p == 4) meshes.push_back({2, 2});
    for (const auto& ms : meshes) {
      DeviceMesh mesh(comm, ms);
      std::vector<Placement> pl(ms.size(), Partial(ReduceOp::sum));
      if (ms.size() == 2) pl[1] = Shard(1);
      // Per-rank genuine contributions: rank r holds (r + 1) * x / sum(r + 1) over the partial dim.
      auto x = DistTensor<T, 2>::scatter_from(comm->rank() == 0 ? full : Tensor<T, 2>(), 0, mesh, pl);
      CHECK(equal(x.full_tensor(), full));
      const int q = mesh.size(0);
      const T w = T(2) * T(mesh.coord(0) + 1) / T(q * (q + 1));
      // The partial value on coordinate 0 only; spread it as w * (value on every coordinate).
      auto y = x.redistribute(std::vector<Placement>(ms.size() == 2 ? std::vector<Placement>{Replicate(), Shard(1)}
                                                                     : std::vector<Placement>{Replicate()}));
      auto yl = y.local().clone();
      for (index_t i = 0; i < yl.numel(); ++i) yl.data()[i] *= w;
      DistTensor<T, 2> part(x.spec(), yl);
      const auto g = part.gather_to(p - 1);
      if (comm->rank() == p - 1) {
        const auto gc = g.contiguous();
        double err = 0;
        for (index_t i = 0; i < gc.numel(); ++i)
          err = std::max(err, static_cast<double>(std::abs(gc.data()[i] - full.data()[i])) / std::max(1.0, static_cast<double>(std::abs(full.data()[i]))));
        CHECK(err <= tol<T>());
      }
    }
  });
}

TEST_CASE("gather_to keeps non-root memory O(local); bad roots are refused on every rank", "[dist][gather][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int p = comm->size();
    DeviceMesh mesh(comm, {p});
    const Shape<2> shape{256, 64};  // 128 KiB of f64
    auto x = DistTensor<double, 2>::random(shape, mesh, {Shard(1)}, 3);  // column shards: packing needed
    const std::size_t local_bytes = static_cast<std::size_t>(x.local().numel()) * 8;
    const std::size_t global_bytes = static_cast<std::size_t>(256 * 64) * 8;
    release_cached_memory();
    reset_peak_memory();
    const std::size_t before = memory_stats().current_bytes;
    const auto g = x.gather_to(0);
    const std::size_t grown = memory_stats().peak_bytes - before;
    if (comm->rank() == 0) {
      CHECK(grown >= global_bytes);
      CHECK(grown <= global_bytes + local_bytes + 4096);
    } else {
      CHECK(grown <= local_bytes + 4096);  // its packed block, never the global tensor
      if (p > 1) CHECK(grown < global_bytes / 2 + 4096);
    }
    // Scatter: the same bound on the receivers.
    release_cached_memory();
    reset_peak_memory();
    const std::size_t before2 = memory_stats().current_bytes;
    auto y = DistTensor<double, 2>::scatter_from(g, 0, mesh, {Shard(1)});
    const std::size_t grown2 = memory_stats().peak_bytes - before2;
    if (comm->rank() != 0) CHECK(grown2 <= local_bytes + 4096);
    CHECK(y.local().numel() == x.local().numel());
    // Bad roots: the same error on every rank, nothing left in a collective.
    CHECK_THROWS_AS(x.gather_to(p), shard::Error);
    CHECK_THROWS_AS(x.gather_to(-1), shard::Error);
    CHECK_THROWS_AS((DistTensor<double, 2>::scatter_from(g, p, mesh, {Shard(0)})), shard::Error);
  });
}

}  // namespace st_dist_mpi_gather
