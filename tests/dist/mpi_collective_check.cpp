// Collective consistency checking (debug mode, dist/consistency.hpp; issue 18 item 6): with the
// mode on, a rank that calls an entry point with arguments different from its peers' (or calls
// another entry point) gets shard::Error on EVERY rank within seconds, naming the op, the first
// differing field and which ranks hold which value, and the communicator stays in step. Matching
// calls pass with unchanged results; with the mode off nothing extra is communicated.
// Mismatches are only ever run with the mode ON (off, they would hang or corrupt data).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <complex>

#include <shardtensor/nn/functional.hpp>

#include "dist/collective_check_support.hpp"
#include "dist/counting_comm.hpp"
#include "support/mpi_harness.hpp"

namespace st_dist_mpi_collective_check {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;

namespace {

/// The error message of `f` and the seconds it took.
template <class F>
std::pair<std::string, double> timed_error(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg = error_of(std::forward<F>(f));
  return {msg, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

/// "rank {1}" / "ranks {0,1}" as the message writes them.
std::string ranks(int lo, int hi) {
  std::string s = hi > lo ? "ranks {" : "rank {";
  for (int r = lo; r <= hi; ++r) s += fmt::format("{}{}", r > lo ? "," : "", r);
  return s + "}";
}

}  // namespace

TEST_CASE("consistency: random with a different shape on one rank", "[consistency][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        const int r = comm->rank(), p = comm->size();
        DeviceMesh mesh(comm);
        CheckCollectives on(true);
        const Shape<2> shape = r == p - 1 ? Shape<2>{9, 5} : Shape<2>{8, 5};
        auto [msg, secs] = timed_error([&] { DistTensor<double, 2>::random(shape, mesh, {Shard(0)}, 7); });
        CHECK_THAT(msg, ContainsSubstring("DistTensor::random") && ContainsSubstring("field 'global shape' differs") &&
                            ContainsSubstring(ranks(0, p - 2) + (p > 2 ? " have [8, 5]" : " has [8, 5]")) &&
                            ContainsSubstring(ranks(p - 1, p - 1) + " has [9, 5]"));
        CHECK(secs < 10);
        check_in_step(comm);
        // a different seed only
        CHECK_THAT(error_of([&] { DistTensor<float, 2>::random({8, 5}, mesh, {Shard(0)}, r == 0 ? 1 : 2); }),
                   ContainsSubstring("field 'seed' differs"));
        check_in_step(comm);
      },
      2, 4);
}

TEST_CASE("consistency: redistribute to different placements on one rank", "[consistency][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        const int r = comm->rank(), p = comm->size();
        DeviceMesh mesh(comm);
        CheckCollectives on(true);
        auto x = DistTensor<double, 2>::random({8, 6}, mesh, {Shard(0)}, 3);
        const std::vector<Placement> tgt = r == p - 1 ? std::vector<Placement>{Replicate()}
                                                      : std::vector<Placement>{Shard(1)};
        auto [msg, secs] = timed_error([&] { x.redistribute(tgt); });
        CHECK_THAT(msg, ContainsSubstring("redistribute") && ContainsSubstring("field 'target placements' differs") &&
                            ContainsSubstring(ranks(p - 1, p - 1) + " has [Replicate()]") &&
                            ContainsSubstring(ranks(0, p - 2)) && ContainsSubstring("[Shard(1)]"));
        CHECK(secs < 10);
        check_in_step(comm);
        // a target that is invalid on one rank only (Shard(5) of a 2-D tensor): caught before the
        // local validation that would throw on that rank alone
        const std::vector<Placement> bad = r == 0 ? std::vector<Placement>{Shard(5)} : std::vector<Placement>{Shard(1)};
        CHECK_THAT(error_of([&] { x.redistribute(bad); }), ContainsSubstring("field 'target placements' differs"));
        check_in_step(comm);
        if (p == 4) {  // 2-D mesh: one rank wants other placements on both mesh dims
          DeviceMesh m2(comm, {2, 2});
          auto y = DistTensor<double, 2>::random({8, 8}, m2, {Shard(0), Shard(1)}, 4);
          const std::vector<Placement> t2 = r == 0 ? std::vector<Placement>{Replicate(), Shard(1)}
                                                   : std::vector<Placement>{Shard(1), Shard(0)};
          CHECK_THAT(error_of([&] { y.redistribute(t2); }),
                     ContainsSubstring("rank {0} has [Replicate(), Shard(1)]") &&
                         ContainsSubstring("ranks {1,2,3} have [Shard(1), Shard(0)]"));
          check_in_step(comm);
        }
      },
      2, 4);
}

TEST_CASE("consistency: conv padding differing on one rank", "[consistency][conv][mpi]") {
  using V = autograd::Var<double, 4>;
  for_each_comm_size(
      [](CommPtr comm) {
        const int r = comm->rank();
        DeviceMesh mesh(comm);
        CheckCollectives on(true);
        V x(DistTensor<double, 4>::random({1, 2, 12, 8}, mesh, {Shard(2)}, 1), true);
        V w(DistTensor<double, 4>::random({3, 2, 3, 3}, mesh, {Replicate()}, 2), true);
        auto [msg, secs] = timed_error(
            [&] { F::conv2d(x, w, std::nullopt, F::ConvOptions<2>::symmetric(r == 0 ? 2 : 1)); });
        CHECK_THAT(msg, ContainsSubstring("conv2d") && ContainsSubstring("field 'padding' differs") &&
                            ContainsSubstring("rank {0} has lo [2, 2] hi [2, 2]") &&
                            ContainsSubstring("lo [1, 1] hi [1, 1]"));
        CHECK(secs < 10);
        check_in_step(comm);
        // a padding mode differing on one rank
        auto o = F::ConvOptions<2>::symmetric(1);
        if (r == 1) o.padding_mode[0] = Boundary::periodic;
        CHECK_THAT(error_of([&] { F::conv2d(x, w, std::nullopt, o); }),
                   ContainsSubstring("field 'padding mode' differs") && ContainsSubstring("[periodic, zero]"));
        check_in_step(comm);
      },
      2, 4);
}

TEST_CASE("consistency: explicit sizes given to from_local on one rank only", "[consistency][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        const int r = comm->rank(), p = comm->size();
        DeviceMesh mesh(comm);
        CheckCollectives on(true);
        std::vector<index_t> parts;
        for (int q = 0; q < p; ++q) parts.push_back(rows_of(10, p, q));
        auto local = Tensor<double, 2>::zeros({rows_of(10, p, r), 3});
        const ShardSizes sizes = r == 0 ? ShardSizes{parts, {}} : ShardSizes{};
        auto [msg, secs] = timed_error([&] { DistTensor<double, 2>::from_local(local, mesh, {Shard(0)}, sizes); });
        CHECK_THAT(msg, ContainsSubstring("DistTensor::from_local") &&
                            ContainsSubstring("field 'explicit sizes' differs") &&
                            ContainsSubstring("rank {0} has given") && ContainsSubstring(" none"));
        CHECK(secs < 10);
        check_in_step(comm);
        // given alike on every rank: fine
        auto t = DistTensor<double, 2>::from_local(local, mesh, {Shard(0)}, ShardSizes{parts, {}});
        CHECK(t.global_shape() == Shape<2>{10, 3});
        check_in_step(comm);
      },
      2, 4);
}

TEST_CASE("consistency: a rank that skipped a call is caught at the next one", "[consistency][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        const int r = comm->rank();
        DeviceMesh mesh(comm);
        CheckCollectives on(true);
        auto x = DistTensor<double, 2>::random({8, 6}, mesh, {Shard(0)}, 3);
        // rank 0 redistributes twice, the others once and then exchange halos: the second checked
        // call differs in its op
        const std::string msg = error_of([&] {
          auto y = x.redistribute({Shard(1)});
          if (r == 0) y = y.redistribute({Shard(0)});
          else halo_exchange(y, HaloSpec::symmetric({0, 1}, Boundary::zero));
        });
        CHECK_THAT(msg, ContainsSubstring("field 'op' differs") && ContainsSubstring("rank {0} has redistribute") &&
                        ContainsSubstring("halo_exchange"));
        check_in_step(comm);
      },
      2, 4);
  // One ring of a 2x2 mesh shifts once more than the other: the mesh's next checked call shows
  // the rings' different sequence numbers.
  for_each_comm_size(
      [](CommPtr comm) {
        if (comm->size() != 4) return;
        DeviceMesh mesh(comm, {2, 2});
        CheckCollectives on(true);
        auto x = DistTensor<double, 2>::random({8, 8}, mesh, {Shard(0), Shard(1)}, 5);
        const std::string msg = error_of([&] {
          ring_shift(x, {1});
          if (mesh.coord(0) == 0) ring_shift(x, {1});
          x.redistribute({Replicate(), Shard(1)});
        });
        CHECK_THAT(msg, ContainsSubstring("redistribute") && ContainsSubstring("field 'sequence' differs") &&
                            ContainsSubstring("ranks {0,1} have") && ContainsSubstring("ranks {2,3} have"));
        check_in_step(comm);
      },
      4, 4);
}

TEST_CASE("consistency: matching calls pass and give the unchecked results", "[consistency][mpi]") {
  using C = std::complex<double>;
  using V = autograd::Var<double, 4>;
  for_each_comm_size([](CommPtr comm) {
    const int p = comm->size();
    DeviceMesh mesh(comm);
    // Runs every covered entry point; returns this rank's result blocks, flattened.
    auto run = [&] {
      std::vector<double> out;
      auto put = [&out](const auto& t) {
        const auto c = t.contiguous();
        for (index_t i = 0; i < c.numel(); ++i) {
          if constexpr (std::is_same_v<std::decay_t<decltype(c.data()[0])>, C>) {
            out.push_back(c.data()[i].real());
            out.push_back(c.data()[i].imag());
          } else {
            out.push_back(static_cast<double>(c.data()[i]));
          }
        }
      };
      auto x = DistTensor<double, 2>::random({9, 6}, mesh, {Shard(0)}, 11);
      put(x.redistribute({Shard(1)}).local());
      put(x.full_tensor());
      put(halo_exchange(x, HaloSpec::symmetric({2, 1}, Boundary::periodic)));
      const auto g = x.gather_to(0);
      if (comm->rank() == 0) put(g);
      put(DistTensor<double, 2>::scatter_from(g, 0, mesh, {Shard(1)}).local());
      put(DistTensor<double, 2>::zeros({5, 4}, mesh, {Shard(0)}).local());
      put(DistTensor<double, 2>::distribute(x.full_tensor(), mesh, {Shard(1)}).local());
      put(DistTensor<double, 2>::from_local(x.local(), mesh, {Shard(0)}).local());
      put(ring_shift(x, {0}));
      // conv forward + backward (stencil halo plan and its adjoint)
      V xi(DistTensor<double, 4>::random({1, 2, 12, 8}, mesh, {Shard(2)}, 1), true);
      V w(DistTensor<double, 4>::random({3, 2, 3, 3}, mesh, {Replicate()}, 2), true);
      auto y = F::conv2d(xi, w, std::nullopt, F::ConvOptions<2>::symmetric(1));
      F::sum(y).backward();
      put(y.local());
      put(xi.grad().local());
      put(w.grad().local());
      // distributed FFT and neighbour queries
      auto spectrum = rfftn(DistTensor<double, 2>::random({8, 6}, mesh, {Shard(0)}, 9));
      put(spectrum.local());
      put(fftn(spectrum).local());
      auto pts = DistTensor<double, 2>::random({4 * p + 3, 3}, mesh, {Shard(0)}, 13);
      put(knn(pts, pts, 3).indices.local());
      put(radius_neighbors(pts, pts, 0.8, 5).indices.local());
      return out;
    };
    std::vector<double> off, on;
    {
      CheckCollectives c(false);
      off = run();
    }
    {
      CheckCollectives c(true);
      on = run();
    }
    CHECK(on == off);
    check_in_step(comm);
  });
}

TEST_CASE("consistency: the mode costs one allgather per checked call, nothing when off", "[consistency][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    auto counting = std::make_shared<CountingComm>(comm);
    DeviceMesh mesh(counting);
    auto x = DistTensor<double, 2>::random({8, 6}, mesh, {Shard(0)}, 3);
    auto count = [&](bool checking) {
      CheckCollectives c(checking);
      counting->reset();
      x.redistribute({Shard(1)});
      return counting->counts();
    };
    const auto off = count(false), on = count(true);
    auto n = [](const CountingComm::Counts& c, const char* k) { return c.count(k) ? c.at(k) : 0; };
    CHECK(n(on, "allgather") == n(off, "allgather") + (comm->size() > 1 ? 1 : 0));
    auto others = [&](const CountingComm::Counts& c) {
      int t = 0;
      for (const auto& [k, v] : c) t += k == "allgather" ? 0 : v;
      return t;
    };
    CHECK(others(on) == others(off));
    // off: a local constructor stays local even when the ranks disagree (no communication at all)
    {
      CheckCollectives c(false);
      counting->reset();
      DistTensor<double, 2>::random(comm->rank() == 0 ? Shape<2>{9, 5} : Shape<2>{8, 5}, mesh, {Shard(0)}, 1);
      CHECK(counting->total() == 0);
    }
    check_in_step(comm);
  });
}

}  // namespace st_dist_mpi_collective_check
