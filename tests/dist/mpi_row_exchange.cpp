// MPI tests of the point-set layer's plumbing (dist/points.hpp): detail::RowExchange (every rank
// receives exactly the rows each source listed for it, grouped by source rank; rows sent several
// times, to self, none at all; f64, f32, i64 and c128 rows; the adjoint is the transpose:
// <E x, y> = <x, E^T y>, and repeated rows get the sum) and BoxPartition (owners with the
// half-open rule, of_grid cuts at shard boundaries, box distances, check_in_partition naming the
// rank and count on every rank). 1..4 ranks, 1-D and 2-D meshes.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <complex>
#include <random>

#include <shardtensor/dist/points.hpp>

#include "support/mpi_harness.hpp"

namespace st_dist_mpi_row_exchange {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;

namespace {

/// A deterministic routing: rank `src` sends to rank `dst` the rows listed here (any order,
/// repeats allowed, sometimes none; rank 1 has no rows at all when P >= 3).
index_t n_rows(int r, int P) { return P >= 3 && r == 1 ? 0 : 5 + 3 * r; }
std::vector<index_t> rows_for(int src, int dst, int P) {
  const index_t n = n_rows(src, P);
  std::vector<index_t> v;
  if (n == 0 || (src + dst) % 3 == 2) return v;  // some pairs exchange nothing
  std::mt19937 g(static_cast<unsigned>(1000 * src + dst));
  const int m = 1 + static_cast<int>(g() % 7);
  for (int i = 0; i < m; ++i) v.push_back(static_cast<index_t>(g() % static_cast<unsigned>(n)));
  return v;
}
double value(int r, index_t row, index_t c) { return 1000.0 * r + 10.0 * static_cast<double>(row) + static_cast<double>(c); }

detail::RowExchange make_exchange(const CommPtr& comm) {
  const int P = comm->size(), me = comm->rank();
  std::vector<index_t> off{0}, rows;
  for (int d = 0; d < P; ++d) {
    const auto v = rows_for(me, d, P);
    rows.insert(rows.end(), v.begin(), v.end());
    off.push_back(static_cast<index_t>(rows.size()));
  }
  return detail::RowExchange(comm, n_rows(me, P), off, rows);
}

}  // namespace

TEST_CASE("RowExchange: rows arrive grouped by source, in the listed order", "[points][row_exchange][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size(), me = comm->rank();
    const auto ex = make_exchange(comm);
    const index_t W = 3;
    auto src = Tensor<double, 2>::empty({n_rows(me, P), W});
    for (index_t i = 0; i < src.shape()[0]; ++i)
      for (index_t c = 0; c < W; ++c) src.data()[i * W + c] = value(me, i, c);
    ExecContext& ctx = current_context(Device::cpu());
    const Block out = ex.forward(as_block(src), ctx);
    index_t expect_rows = 0;
    for (int s = 0; s < P; ++s) expect_rows += static_cast<index_t>(rows_for(s, me, P).size());
    REQUIRE(ex.n_recv() == expect_rows);
    REQUIRE(out.shape[0] == expect_rows);
    const double* o = static_cast<const double*>(out.data);
    bool ok = true;
    index_t at = 0;
    for (int s = 0; s < P; ++s) {
      CHECK(ex.recv_offsets()[static_cast<std::size_t>(s)] == at);
      for (index_t row : rows_for(s, me, P)) {
        for (index_t c = 0; c < W; ++c) ok = ok && o[at * W + c] == value(s, row, c);
        ++at;
      }
    }
    CHECK(ok);
    CHECK(ex.n_send_remote() == ex.n_send() - static_cast<index_t>(rows_for(me, me, P).size()));
    // i64 rows of width 1 ([rows] vectors) and complex rows
    auto ids = Tensor<index_t, 1>::empty({n_rows(me, P)});
    for (index_t i = 0; i < ids.numel(); ++i) ids.data()[i] = 100 * me + i;
    const Block oi = ex.forward(as_block(ids), ctx);
    REQUIRE(oi.rank == 1);
    at = 0;
    ok = true;
    for (int s = 0; s < P; ++s)
      for (index_t row : rows_for(s, me, P)) ok = ok && static_cast<const index_t*>(oi.data)[at++] == 100 * s + row;
    CHECK(ok);
    auto zc = Tensor<std::complex<double>, 2>::empty({n_rows(me, P), 2});
    for (index_t i = 0; i < zc.numel(); ++i) zc.data()[i] = {static_cast<double>(me), static_cast<double>(i)};
    const Block oc = ex.forward(as_block(zc), ctx);
    at = 0;
    ok = true;
    for (int s = 0; s < P; ++s)
      for (index_t row : rows_for(s, me, P)) {
        for (index_t c = 0; c < 2; ++c)
          ok = ok && static_cast<const std::complex<double>*>(oc.data)[at * 2 + c] ==
                         std::complex<double>(s, static_cast<double>(row * 2 + c));
        ++at;
      }
    CHECK(ok);
  });
}

TEST_CASE("RowExchange: the adjoint is the transpose (dot-product test), repeats summed", "[points][row_exchange][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size(), me = comm->rank();
    const auto ex = make_exchange(comm);
    const index_t W = 4;
    ExecContext& ctx = current_context(Device::cpu());
    auto x = Tensor<double, 2>::empty({n_rows(me, P), W});
    x.fill_random(7 + static_cast<std::uint64_t>(me), RandomInit::uniform(-1, 1));
    auto y = Tensor<double, 2>::empty({ex.n_recv(), W});
    y.fill_random(70 + static_cast<std::uint64_t>(me), RandomInit::uniform(-1, 1));
    const Block ex_x = ex.forward(as_block(x), ctx);
    auto ety = Tensor<double, 2>::zeros({n_rows(me, P), W});
    ex.adjoint_add(as_block(y), as_block(ety), ctx);
    double d[2] = {0, 0};
    for (index_t i = 0; i < y.numel(); ++i) d[0] += static_cast<const double*>(ex_x.data)[i] * y.data()[i];
    for (index_t i = 0; i < x.numel(); ++i) d[1] += x.data()[i] * ety.data()[i];
    comm->allreduce(d, d, 2, DType::f64, ReduceOp::sum);
    CHECK(std::abs(d[0] - d[1]) <= 1e-12 * std::max(1.0, std::abs(d[0])));
    // all-ones gradients: each source row gets the number of times it was sent
    auto ones = Tensor<double, 2>::empty({ex.n_recv(), 1});
    ones.fill(1.0);
    auto cnt = Tensor<double, 2>::zeros({n_rows(me, P), 1});
    ex.adjoint_add(as_block(ones), as_block(cnt), ctx);
    std::vector<double> want(static_cast<std::size_t>(n_rows(me, P)), 0.0);
    for (int dst = 0; dst < P; ++dst)
      for (index_t r : rows_for(me, dst, P)) want[static_cast<std::size_t>(r)] += 1;
    bool ok = true;
    for (index_t i = 0; i < cnt.numel(); ++i) ok = ok && cnt.data()[i] == want[static_cast<std::size_t>(i)];
    CHECK(ok);
  });
}

TEST_CASE("RowExchange: malformed send lists are refused", "[points][row_exchange][mpi][world]") {
  auto comm = MpiComm::world();
  const int P = comm->size();
  std::vector<index_t> off(static_cast<std::size_t>(P) + 1, 0);
  // a row outside [0, n_src): local check before any message
  off.back() = 1;
  for (int p = 0; p < P; ++p) off[static_cast<std::size_t>(p) + 1] = 1;
  CHECK_THAT(error_of([&] { detail::RowExchange(comm, 2, off, {5}); }), ContainsSubstring("outside"));
  CHECK_THAT(error_of([&] { detail::RowExchange(comm, 2, {0, 1}, {0, 0}); }), ContainsSubstring("send_offsets"));
}

TEST_CASE("BoxPartition: owners, half-open slabs, box distances", "[points][box_partition][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, {P});
    const auto part = BoxPartition::uniform(mesh, {0.0, -1.0}, {1.0, 1.0}, {0, -1});
    for (int r = 0; r < P; ++r) {
      const double mid[2] = {(r + 0.5) / P, 0.3};
      CHECK(part.owner(mid) == r);
      const double lo_edge[2] = {part.lo(r, 0), -1.0};
      CHECK(part.owner(lo_edge) == r);  // a cut belongs to the upper slab
      CHECK(part.dist2_to_box(r, mid) == 0.0);
    }
    const double top[2] = {1.0, 1.0};
    CHECK(part.owner(top) == P - 1);  // the domain's upper edge belongs to the last slab
    const double out[2] = {1.5, 0.0}, nan[2] = {std::nan(""), 0.0};
    CHECK(part.owner(out) == -1);
    CHECK(part.owner(nan) == -1);
    CHECK(part.dist2_to_box(P - 1, out) == 0.25);
    if (P >= 3) CHECK(std::abs(part.box_dist2(0, 2) - std::pow(1.0 / P, 2)) < 1e-15);
    // 2-D mesh over (x, y)
    if (P == 4) {
      DeviceMesh m2(comm, {2, 2});
      const auto p2 = BoxPartition::uniform(m2, {0, 0, 0}, {2, 2, 2}, {1, 0, -1});  // mesh dim 1 cuts x, 0 cuts y
      const double p[3] = {1.5, 0.5, 1.0};                                        // x upper, y lower
      CHECK(p2.owner(p) == m2.rank_of({0, 1}));
    }
  });
}

TEST_CASE("BoxPartition::of_grid cuts at the grid's shard boundaries (uneven)", "[points][box_partition][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, {P});
    std::vector<index_t> sizes;
    index_t n = 0;
    for (int r = 0; r < P; ++r) {
      sizes.push_back(r == 1 ? 0 : 2 + r);
      n += sizes.back();
    }
    ShardSizes ss(4);
    ss[2] = sizes;
    DistSpec grid(mesh, {Shard(2)}, {1, 3, n, 5}, ss);
    const auto part = BoxPartition::of_grid(grid, {2, 3}, {0.0, 0.0}, {static_cast<double>(n), 1.0});
    index_t off = 0;
    for (int r = 0; r < P; ++r) {
      CHECK(part.lo(r, 0) == static_cast<double>(off));
      off += sizes[static_cast<std::size_t>(r)];
      CHECK(part.hi(r, 0) == static_cast<double>(off));
      CHECK(part.lo(r, 1) == 0.0);
      CHECK(part.hi(r, 1) == 1.0);
    }
    // a grid dim sharded by no mesh dim of size > 1 while the mesh has ranks: refused
    if (P > 1) {
      DistSpec rep(mesh, {Shard(1)}, {1, 3, n, 5});
      CHECK_THAT(error_of([&] { BoxPartition::of_grid(rep, {2, 3}, {0.0, 0.0}, {1.0, 1.0}); }),
                 ContainsSubstring("does not shard"));
    }
  });
}

TEST_CASE("check_in_partition names the rank and the count, on every rank", "[points][box_partition][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size(), me = comm->rank();
    DeviceMesh mesh(comm, {P});
    const auto part = BoxPartition::uniform(mesh, {0.0}, {1.0}, {0});
    std::vector<index_t> counts(static_cast<std::size_t>(P), 3);
    const DistSpec spec = point_spec(mesh, counts, 1);
    auto pts = Tensor<double, 2>::empty({3, 1});
    for (index_t i = 0; i < 3; ++i) pts.data()[i] = (me + 0.25 + 0.25 * static_cast<double>(i)) / P;
    CHECK_NOTHROW(check_in_partition(spec, as_block(pts), part, "test"));
    // the last rank holds two points of rank 0's box
    if (me == P - 1) pts.data()[0] = pts.data()[1] = 0.0;
    if (P > 1 || me == 0) {
      if (P == 1) pts.data()[0] = pts.data()[1] = 2.0;  // outside the domain
      CHECK_THAT(error_of([&] { check_in_partition(spec, as_block(pts), part, "test"); }),
                 ContainsSubstring(fmt::format("rank {}: 2 point(s)", P - 1)));
    }
    pts.data()[0] = std::nan("");
    CHECK_THAT(error_of([&] { check_in_partition(spec, as_block(pts), part, "test"); }),
               ContainsSubstring("rank 0: ") && ContainsSubstring("NaN"));
  });
}

}  // namespace st_dist_mpi_row_exchange
