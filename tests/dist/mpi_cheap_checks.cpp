// The cheap checks that stay on WITHOUT the consistency mode (issue 18 item 6): agreement folded
// into collectives an op makes anyway, so a rank called with other arguments than its peers gets
// shard::Error instead of a hang or silently wrong data, at no extra message.
//   - the norm / loss statistics allreduce carries a key of the call's layout and parameters;
//   - check_all's allgather carries a key (from_local's element type, fill_ghosts' and the halo
//     adjoint's layout and halo);
//   - every point-to-point receive checks the size of what arrived (halo exchanges, ring passes).
// Every case runs with the mode explicitly OFF, at every communicator size 2..world.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <shardtensor/nn/functional.hpp>

#include "dist/collective_check_support.hpp"
#include "dist/counting_comm.hpp"
#include "support/mpi_harness.hpp"
#include "support/tolerance.hpp"

namespace st_dist_mpi_cheap_checks {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;

namespace {

/// "{0,1,2}" for ranks lo..hi.
std::string group(int lo, int hi) {
  std::string s = "{";
  for (int r = lo; r <= hi; ++r) s += fmt::format("{}{}", r > lo ? "," : "", r);
  return s + "}";
}

using V4 = autograd::Var<double, 4>;

}  // namespace

TEST_CASE("cheap checks: random with a different shape on one rank is caught by the next norm",
          "[consistency][cheap][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        const int r = comm->rank(), p = comm->size();
        DeviceMesh mesh(comm);
        CheckCollectives off(false);
        // the last rank asks for 9 rows where the others ask for 8: no communication yet
        const Shape<4> shape = r == p - 1 ? Shape<4>{2, 4, 9, 6} : Shape<4>{2, 4, 8, 6};
        V4 x(DistTensor<double, 4>::random(shape, mesh, {Shard(2)}, 7), true);
        for (auto* name : {"group_norm", "instance_norm"}) {
          const std::string msg = error_of([&] {
            if (std::string(name) == "group_norm") F::group_norm(x, 2);
            else F::instance_norm(x);
          });
          CHECK_THAT(msg, ContainsSubstring(name) && ContainsSubstring("ranks disagree on this call") &&
                              ContainsSubstring(group(0, p - 2) + " vs " + group(p - 1, p - 1)));
          check_in_step(comm);
        }
        // a different eps or group count on rank 0 only
        V4 y(DistTensor<double, 4>::random({2, 4, 8, 6}, mesh, {Shard(2)}, 7), true);
        CHECK_THAT(error_of([&] { F::group_norm(y, 2, std::nullopt, std::nullopt, r == 0 ? 1e-3 : 1e-5); }),
                   ContainsSubstring("group_norm") && ContainsSubstring("{0} vs " + group(1, p - 1)));
        check_in_step(comm);
        // (a different group count changes the size of the allreduce itself: not foldable, only the
        // debug mode catches that one)
        // the loss: a target of another shape on one rank
        auto t = DistTensor<double, 4>::random(shape, mesh, {Shard(2)}, 8);
        auto pred = V4(DistTensor<double, 4>::random(shape, mesh, {Shard(2)}, 9), true);
        CHECK_THAT(error_of([&] { F::rel_l2_loss(pred, V4(t)); }),
                   ContainsSubstring("rel_l2_loss") && ContainsSubstring("ranks disagree"));
        check_in_step(comm);
      },
      2);
}

TEST_CASE("cheap checks: explicit sizes on one rank only are caught by the next norm; equal ones pass",
          "[consistency][cheap][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        const int r = comm->rank(), p = comm->size();
        DeviceMesh mesh(comm);
        CheckCollectives off(false);
        // rank 0 gives sizes that differ from the balanced split (one row moved to the last part)
        std::vector<index_t> parts;
        for (int q = 0; q < p; ++q) parts.push_back(rows_of(12, p, q));
        std::vector<index_t> skew = parts;
        skew[0] -= 1;
        skew.back() += 1;
        const ShardSizes mine = r == 0 ? ShardSizes{{}, {}, skew, {}} : ShardSizes{};
        V4 x(DistTensor<double, 4>::random({1, 2, 12, 5}, mesh, {Shard(2)}, 3, {}, mine), true);
        CHECK_THAT(error_of([&] { F::group_norm(x, 1); }),
                   ContainsSubstring("group_norm") && ContainsSubstring("{0} vs " + group(1, p - 1)));
        check_in_step(comm);
        // sizes given on rank 0 only but equal to the balanced split: the same layout, no error,
        // and the same values as without them
        const ShardSizes same = r == 0 ? ShardSizes{{}, {}, parts, {}} : ShardSizes{};
        V4 a(DistTensor<double, 4>::random({1, 2, 12, 5}, mesh, {Shard(2)}, 3, {}, same), true);
        V4 b(DistTensor<double, 4>::random({1, 2, 12, 5}, mesh, {Shard(2)}, 3), true);
        auto ya = F::group_norm(a, 1).value().full_tensor(), yb = F::group_norm(b, 1).value().full_tensor();
        CHECK(diff_of(ya, yb) <= Tol{1e-12, 1e-12});
      },
      2);
}

TEST_CASE("cheap checks: conv padding differing on one rank is caught by the receive-size check",
          "[consistency][cheap][conv][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        const int r = comm->rank(), p = comm->size();
        DeviceMesh mesh(comm);
        CheckCollectives off(false);
        V4 x(DistTensor<double, 4>::random({1, 2, 12, 8}, mesh, {Shard(2)}, 1), true);
        V4 w(DistTensor<double, 4>::random({3, 2, 5, 5}, mesh, {Replicate()}, 2), true);
        // A 5-wide kernel: the middle rank (rank 1; at 2 ranks the last) pads by 1 (halo 1 below,
        // 3 above), the others by 2 (2 and 2). Each side of each link then sends another number of
        // planes than its peer expects: every rank receives a message of the wrong size. (Where
        // one side's halo would be 0, no message is sent at all, and the peer waits: only the
        // debug mode or the watchdog catch that.)
        const int bad = 1;
        const std::string msg = error_of(
            [&] { F::conv2d(x, w, std::nullopt, F::ConvOptions<2>::symmetric(r == bad ? 1 : 2)); });
        INFO(msg);
        CHECK_THAT(msg, ContainsSubstring("ranks disagree on this exchange") && ContainsSubstring("expected"));
        check_in_step(comm);
        (void)p;
      },
      2, 3);
}

TEST_CASE("cheap checks: fill_ghosts with another halo, from_local with another element type",
          "[consistency][cheap][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        const int r = comm->rank(), p = comm->size();
        DeviceMesh mesh(comm);
        CheckCollectives off(false);
        auto x = DistTensor<double, 2>::random({12, 5}, mesh, {Shard(0)}, 4);
        const index_t wdt = r == p - 1 ? 2 : 1;
        const HaloSpec h = HaloSpec::symmetric({wdt, 0}, Boundary::zero);
        auto ghosted = Tensor<double, 2>::zeros({x.local().size(0) + 2 * wdt, 5});
        const std::string msg = error_of([&] { fill_ghosts(x, ghosted, h); });
        CHECK_THAT(msg, ContainsSubstring("fill_ghosts") && ContainsSubstring("ranks disagree on this call") &&
                            ContainsSubstring("lo=[2, 0]") && ContainsSubstring("lo=[1, 0]") &&
                            ContainsSubstring(fmt::format("rank {{{}}} has", p - 1)));
        check_in_step(comm);
        // from_local: rank 0 wraps floats, the others doubles
        std::string m2;
        if (r == 0)
          m2 = error_of([&] { DistTensor<float, 2>::from_local(Tensor<float, 2>::zeros({2, 3}), mesh, {Shard(0)}); });
        else
          m2 = error_of([&] { DistTensor<double, 2>::from_local(Tensor<double, 2>::zeros({2, 3}), mesh, {Shard(0)}); });
        CHECK_THAT(m2, ContainsSubstring("DistTensor::from_local") && ContainsSubstring("rank {0} has DistTensor<f32, 2>") &&
                           ContainsSubstring("DistTensor<f64, 2>"));
        check_in_step(comm);
      },
      2);
}

TEST_CASE("cheap checks ride on the collectives the ops make anyway", "[consistency][cheap][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        auto counting = std::make_shared<CountingComm>(comm);
        DeviceMesh mesh(counting);
        CheckCollectives off(false);
        V4 x(DistTensor<double, 4>::random({2, 4, 8, 6}, mesh, {Shard(2)}, 7), true);
        counting->reset();
        auto y = F::group_norm(x, 2);
        // two statistics allreduces (mean, variance), nothing else
        CHECK(counting->total() == 2);
        CHECK(counting->counts().count("allreduce") == 1);
        CHECK(counting->counts().at("allreduce") == 2);
        // and the matching call's values equal the one-rank result
        auto full = DistTensor<double, 4>::random({2, 4, 8, 6}, DeviceMesh(std::make_shared<SelfComm>()), {Replicate()}, 7);
        auto ref = F::group_norm(V4(full), 2).value().local();
        CHECK(diff_of(y.value().full_tensor(), ref) <= Tol{1e-12, 1e-12});
      },
      2);
}

}  // namespace st_dist_mpi_cheap_checks
