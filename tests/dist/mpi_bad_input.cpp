// Bad input gives shard::Error on EVERY rank of the communicator, never a hang — including input
// that is bad on one rank only. After each error the communicator is still in step (checked by
// a collective), which proves no rank was left behind in a collective.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "support/mpi_harness.hpp"

namespace st_dist_mpi_bad_input {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;

namespace {
// Every rank of `comm` must be here; fails if any is not (or is out of step).
void check_in_step(const CommPtr& comm) {
  int one = 1;
  comm->allreduce_inplace(&one, 1, ReduceOp::sum);
  CHECK(one == comm->size());
}
}  // namespace

TEST_CASE("DeviceMesh: mesh size != communicator size, on every rank", "[dist][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int r = comm->rank(), p = comm->size();
    CHECK_THAT(error_of([&] { DeviceMesh(comm, {p + 1}); }),
               ContainsSubstring("DeviceMesh") && ContainsSubstring(fmt::format("the communicator has {}", p)));
    check_in_step(comm);
    CHECK_THAT(error_of([&] { DeviceMesh(comm, {2, p}); }), ContainsSubstring("DeviceMesh"));
    check_in_step(comm);
    // bad on the last rank only: every rank throws, with that rank's message
    const std::vector<int> shape = r == p - 1 ? std::vector<int>{p, 2} : std::vector<int>{p};
    CHECK_THAT(error_of([&] { DeviceMesh(comm, shape); }),
               ContainsSubstring("DeviceMesh") && ContainsSubstring("holds") &&
                   ContainsSubstring(fmt::format("detected on rank {}", p - 1)));
    check_in_step(comm);
    // a zero extent on rank 0 only
    CHECK_THAT(error_of([&] { DeviceMesh(comm, r == 0 ? std::vector<int>{p, 0} : std::vector<int>{p, 1}); }),
               ContainsSubstring("non-positive"));
    check_in_step(comm);
  });
}

TEST_CASE("DeviceMesh: mesh shape differing across ranks, on every rank", "[dist][errors][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        const int r = comm->rank(), p = comm->size();
        const std::vector<int> shape = r == p - 1 ? std::vector<int>{p, 1} : std::vector<int>{1, p};
        CHECK_THAT(error_of([&] { DeviceMesh(comm, shape); }),
                   ContainsSubstring("DeviceMesh") && ContainsSubstring("differs"));
        check_in_step(comm);
        // differing number of dims
        const std::vector<int> s2 = r == 0 ? std::vector<int>{p} : std::vector<int>{p, 1};
        CHECK_THAT(error_of([&] { DeviceMesh(comm, s2); }), ContainsSubstring("differs"));
        check_in_step(comm);
      },
      2);
}

TEST_CASE("placement dim out of range, on every rank", "[dist][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int r = comm->rank();
    DeviceMesh mesh(comm);
    const auto full = Tensor<double, 2>::zeros({9, 7});
    CHECK_THAT(error_of([&] { DistTensor<double, 2>::distribute(full, mesh, {Shard(2)}); }),
               ContainsSubstring("DistSpec") && ContainsSubstring("Shard(2)"));
    CHECK_THAT(error_of([&] { DistTensor<double, 2>::random({9, 7}, mesh, {Shard(-1)}, 1); }),
               ContainsSubstring("DistSpec"));
    CHECK_THAT(error_of([&] { DistTensor<double, 2>::zeros({9, 7}, mesh, {Shard(0), Shard(1)}); }),
               ContainsSubstring("DistSpec") && ContainsSubstring("placements for a 1-D mesh"));
    auto ok = DistTensor<double, 2>::distribute(full, mesh, {Shard(0)});
    CHECK_THAT(error_of([&] { ok.redistribute({Shard(3)}); }), ContainsSubstring("DistSpec"));
    check_in_step(comm);
    // from_local checks collectively: bad on one rank only still throws everywhere
    auto local = Tensor<double, 2>::zeros({2, 7});
    CHECK_THAT(error_of([&] {
                 DistTensor<double, 2>::from_local(local, mesh, {r == 0 ? Shard(2) : Shard(0)});
               }),
               ContainsSubstring("DistTensor::from_local") && ContainsSubstring("Shard(2)"));
    check_in_step(comm);
    CHECK_THAT(error_of([&] { DistTensor<double, 2>::from_local(local, mesh, {Shard(0), Replicate()}); }),
               ContainsSubstring("DistTensor::from_local") && ContainsSubstring("2 placements"));
    check_in_step(comm);
  });
}

TEST_CASE("explicit sizes that do not sum to the global extent, on every rank", "[dist][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int r = comm->rank(), p = comm->size();
    DeviceMesh mesh(comm);
    const auto full = Tensor<float, 2>::zeros({9, 7});
    std::vector<index_t> bad(static_cast<std::size_t>(p), 1);  // sums to p != 9
    CHECK_THAT(error_of([&] { DistTensor<float, 2>::distribute(full, mesh, {Shard(0)}, -1, {bad, {}}); }),
               ContainsSubstring("ShardLayout::from_sizes") && ContainsSubstring("global extent is 9"));
    CHECK_THAT(error_of([&] { DistTensor<float, 2>::distribute(full, mesh, {Shard(0)}, 0, {bad, {}}); }),
               ContainsSubstring("from_sizes"));
    CHECK_THAT(error_of([&] { DistTensor<float, 2>::zeros({9, 7}, mesh, {Shard(1)}, {{}, bad}); }),
               ContainsSubstring("from_sizes"));
    std::vector<index_t> wrong_count(static_cast<std::size_t>(p + 1), 0);
    wrong_count[0] = 9;
    CHECK_THAT(error_of([&] { DistTensor<float, 2>::zeros({9, 7}, mesh, {Shard(0)}, {wrong_count, {}}); }),
               ContainsSubstring("DistSpec") && ContainsSubstring("sizes were given"));
    auto ok = DistTensor<float, 2>::distribute(full, mesh, {Shard(0)});
    CHECK_THAT(error_of([&] { ok.redistribute({Shard(1)}, {{}, bad}); }), ContainsSubstring("from_sizes"));
    check_in_step(comm);
    // from_local with sizes that disagree with the local extents — given on one rank only.
    const index_t mine = balanced_size(9, p, r);
    auto local = Tensor<float, 2>::zeros({mine, 7});
    std::vector<index_t> good(static_cast<std::size_t>(p));
    for (int q = 0; q < p; ++q) good[static_cast<std::size_t>(q)] = balanced_size(9, p, q);
    CHECK_NOTHROW(DistTensor<float, 2>::from_local(local, mesh, {Shard(0)}, {good, {}}));
    std::vector<index_t> off_by_one = good;
    off_by_one.back() += 1;
    CHECK_THAT(error_of([&] {
                 DistTensor<float, 2>::from_local(local, mesh, {Shard(0)},
                                                  r == p - 1 ? ShardSizes{off_by_one, {}} : ShardSizes{good, {}});
               }),
               ContainsSubstring("DistTensor::from_local") && ContainsSubstring("do not match"));
    check_in_step(comm);
    CHECK_THAT(error_of([&] { DistTensor<float, 2>::from_local(local, mesh, {Shard(0)}, {good}); }),
               ContainsSubstring("DistTensor::from_local"));
    check_in_step(comm);
  });
}

TEST_CASE("from_local with local shapes that disagree across ranks, on every rank", "[dist][errors][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        const int r = comm->rank(), p = comm->size();
        DeviceMesh mesh(comm);
        // replicated dim 1 with a different extent on the last rank only
        auto a = Tensor<double, 2>::zeros({3, r == p - 1 ? 6 : 7});
        CHECK_THAT(error_of([&] { DistTensor<double, 2>::from_local(a, mesh, {Shard(0)}); }),
                   ContainsSubstring("DistTensor::from_local") && ContainsSubstring("dim 1") &&
                       ContainsSubstring("disagree"));
        check_in_step(comm);
        // fully replicated / Partial tensors whose shapes differ on rank 0 only
        auto b = Tensor<double, 2>::zeros({r == 0 ? 4 : 5, 7});
        CHECK_THAT(error_of([&] { DistTensor<double, 2>::from_local(b, mesh, {Replicate()}); }),
                   ContainsSubstring("disagree"));
        CHECK_THAT(error_of([&] { DistTensor<double, 2>::from_local(b, mesh, {Partial()}); }),
                   ContainsSubstring("disagree"));
        check_in_step(comm);
        // placements that differ on the last rank only
        auto f = Tensor<double, 2>::zeros({3, 7});
        CHECK_THAT(error_of([&] {
                     DistTensor<double, 2>::from_local(f, mesh, {r == p - 1 ? Partial() : Replicate()});
                   }),
                   ContainsSubstring("DistTensor::from_local") && ContainsSubstring("placements [Replicate()] differ"));
        check_in_step(comm);
        // 2-D mesh: ranks that share a part of a sharded dim must agree on its extent
        if (p == 4) {
          DeviceMesh m22(comm, {2, 2});
          auto c = Tensor<double, 2>::zeros({r == 3 ? 2 : 3, 4});
          CHECK_THAT(error_of([&] { DistTensor<double, 2>::from_local(c, m22, {Shard(0), Replicate()}); }),
                     ContainsSubstring("disagree"));
          check_in_step(comm);
        }
      },
      2);
}

TEST_CASE("other bad input: distribute root out of range, mismatched meshes", "[dist][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int p = comm->size();
    DeviceMesh mesh(comm);
    const auto full = Tensor<double, 2>::zeros({4, 4});
    CHECK_THAT(error_of([&] { DistTensor<double, 2>::distribute(full, mesh, {Shard(0)}, p); }),
               ContainsSubstring("distribute") && ContainsSubstring("root"));
    auto a = DistTensor<double, 2>::distribute(full, mesh, {Shard(0)});
    DeviceMesh other(comm);
    CHECK_THAT(error_of([&] { a.redistribute(DistSpec(other, {Replicate()}, {4, 4})); }),
               ContainsSubstring("redistribute") && ContainsSubstring("different meshes"));
    CHECK_THAT(error_of([&] { a.redistribute(DistSpec(mesh, {Replicate()}, {4, 5})); }),
               ContainsSubstring("redistribute") && ContainsSubstring("global shapes differ"));
    check_in_step(comm);
  });
}

}  // namespace st_dist_mpi_bad_input
