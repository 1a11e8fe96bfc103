// The profiler's collective rows at 1-4 ranks: per-rank calls and payload bytes of MpiComm's
// collectives (the bytes each call must move, which differ between ranks for the v-collectives),
// and a redistribute's row with the collective it runs counted inside it.
#include <catch2/catch_test_macros.hpp>

#include <map>
#include <shardtensor/exec/profiler.hpp>

#include "support/mpi_harness.hpp"

namespace st_exec_mpi_profiler {

using namespace shard;
using namespace shard::test;

namespace {
std::map<std::string, ProfileRow> by_key(const std::vector<ProfileRow>& rows) {
  std::map<std::string, ProfileRow> m;
  for (const auto& r : rows) m.emplace(r.category + ":" + r.label(), r);
  return m;
}
}  // namespace

TEST_CASE("profiler: per-rank collective calls and payload bytes", "[profiler][mpi]") {
  for_each_comm_size([](CommPtr c) {
    const int r = c->rank(), p = c->size();
    const index_t n = 1000 + 10 * r;  // allreduce counts must agree: use a common one below
    std::vector<float> a(1000, 1.0f);
    std::vector<double> g(static_cast<std::size_t>(p) * 3);
    std::vector<double> mine{1.0 * r, 2.0, 3.0};
    // alltoallv: rank r sends (r + 1 + j) floats to rank j.
    std::vector<index_t> sc(static_cast<std::size_t>(p)), sd(sc.size()), rc(sc.size()), rd(sc.size());
    index_t st = 0, rt = 0;
    for (int j = 0; j < p; ++j) {
      const auto uj = static_cast<std::size_t>(j);
      sc[uj] = r + 1 + j;
      rc[uj] = j + 1 + r;
      sd[uj] = st;
      rd[uj] = rt;
      st += sc[uj];
      rt += rc[uj];
    }
    std::vector<float> sbuf(static_cast<std::size_t>(st), 1.0f), rbuf(static_cast<std::size_t>(rt));

    Profiler prof;
    c->allreduce(a.data(), a.data(), 1000, DType::f32, ReduceOp::sum);
    c->allreduce(a.data(), a.data(), 1000, DType::f32, ReduceOp::max);
    c->allgather(mine.data(), 3, g.data(), DType::f64);
    c->alltoallv(sbuf.data(), sc, sd, rbuf.data(), rc, rd, DType::f32);
    auto req = c->iallreduce(a.data(), a.data(), 250, DType::f32, ReduceOp::sum);
    req.wait();
    const auto m = by_key(prof.rows());
    (void)n;

    REQUIRE(m.count("comm:allreduce"));
    CHECK(m.at("comm:allreduce").calls == 2);
    CHECK(m.at("comm:allreduce").bytes == 2 * 1000 * 4);
    CHECK(m.at("comm:allgather").calls == 1);
    CHECK(m.at("comm:allgather").bytes == 3 * 8);
    CHECK(m.at("comm:alltoallv").calls == 1);
    CHECK(m.at("comm:alltoallv").bytes == static_cast<std::uint64_t>(st) * 4);  // differs per rank
    CHECK(m.at("comm:iallreduce").calls == 1);
    CHECK(m.at("comm:iallreduce").bytes == 250 * 4);
    for (const auto& [k, row] : m) {
      INFO(k);
      CHECK(row.host_us >= 0);
      CHECK(row.device_calls == 0);
    }
    // The per-rank totals, gathered: rank j moved (j + 1) * p + p (p - 1) / 2 floats in the alltoallv.
    const auto all = c->allgather_value<std::uint64_t>(m.at("comm:alltoallv").bytes);
    for (int j = 0; j < p; ++j)
      CHECK(all[static_cast<std::size_t>(j)] ==
            static_cast<std::uint64_t>(4 * ((j + 1) * p + p * (p - 1) / 2)));
  });
}

TEST_CASE("profiler: a redistribute row holds the collective it runs", "[profiler][mpi]") {
  for_each_comm_size([](CommPtr c) {
    const int p = c->size();
    DeviceMesh mesh(c);
    auto x = DistTensor<float, 2>::random({8, 6}, mesh, {Shard(0)}, 5);
    Profiler prof;
    auto y = x.redistribute({Replicate()});
    const auto m = by_key(prof.rows());
    if (p == 1) {
      // One rank: Shard(0) over one rank is the whole tensor; nothing to communicate.
      CHECK(m.count("comm:allgatherv") + m.count("comm:allgather") <= 1);
      return;
    }
    REQUIRE(m.count("redistribute:redistribute"));
    CHECK(m.at("redistribute:redistribute").calls == 1);
    std::uint64_t comm_calls = 0, comm_bytes = 0;
    double comm_us = 0;
    for (const auto& [k, row] : m)
      if (row.category == "comm") {
        comm_calls += row.calls;
        comm_bytes += row.bytes;
        comm_us += row.host_us;
      }
    CHECK(comm_calls >= 1);
    CHECK(comm_bytes == static_cast<std::uint64_t>(x.local().numel()) * 4);  // this rank's shard, gathered
    CHECK(comm_us <= m.at("redistribute:redistribute").host_us);
    CHECK(y.local().numel() == 48);
  });
}

}  // namespace st_exec_mpi_profiler
