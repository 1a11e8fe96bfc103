// MpiComm (and SelfComm through for_each_comm): every collective against values computed by hand
// from rank numbers, on communicators of every size 1..world.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <numeric>

#include "support/mpi_harness.hpp"

namespace st_comm_mpi_comm {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;

namespace {
// Exclusive prefix sums of counts (displacements of packed blocks).
std::vector<index_t> displs_of(const std::vector<index_t>& counts) {
  std::vector<index_t> d(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}
}  // namespace

TEMPLATE_TEST_CASE("allreduce sum/avg/max/min, out of place, in place and non-blocking", "[comm][mpi]", double, float,
                   std::int32_t, std::int64_t) {
  using T = TestType;
  constexpr DType dt = dtype_of<T>;
  for_each_comm([](CommPtr c) {
    const int r = c->rank(), p = c->size();
    const index_t n = 5;
    std::vector<T> x(n);
    for (index_t i = 0; i < n; ++i) x[i] = static_cast<T>((r + 1) * (i % 2 ? -1 : 1) + 10 * i);
    auto expect = [&](ReduceOp op, index_t i) {
      // values (q+1)*s + 10 i over q = 0..p-1 with s = +-1
      const double s = i % 2 ? -1 : 1;
      const double sum = s * p * (p + 1) / 2.0 + 10.0 * i * p;
      switch (op) {
        case ReduceOp::sum: return sum;
        case ReduceOp::avg: return std::is_integral_v<T> ? std::trunc(sum / p) : sum / p;
        case ReduceOp::max: return s > 0 ? p + 10.0 * i : -1 + 10.0 * i;
        case ReduceOp::min: return s > 0 ? 1 + 10.0 * i : -p + 10.0 * i;
      }
      return 0.0;
    };
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      INFO("op " << reduce_op_name(op) << " size " << p);
      std::vector<T> y(n), z = x, w(n);
      c->allreduce(x.data(), y.data(), n, dt, op);
      c->allreduce(z.data(), z.data(), n, dt, op);
      auto req = c->iallreduce(x.data(), w.data(), n, dt, op);
      CHECK(req.pending() == (c->backend() == "mpi"));
      req.wait();
      req.wait();  // idempotent
      for (index_t i = 0; i < n; ++i) {
        CHECK(static_cast<double>(y[i]) == static_cast<T>(expect(op, i)));
        CHECK(z[i] == y[i]);
        CHECK(w[i] == y[i]);
      }
      // iallreduce completed through test() also runs the avg step
      std::vector<T> t(n);
      auto rt = c->iallreduce(x.data(), t.data(), n, dt, op);
      while (!rt.test()) {}
      CHECK(t == y);
    }
  });
}

TEST_CASE("broadcast, allgather, allgather_value, allgather_vectors", "[comm][mpi]") {
  for_each_comm([](CommPtr c) {
    const int r = c->rank(), p = c->size();
    for (int root = 0; root < p; ++root) {
      std::vector<double> b = {static_cast<double>(r), 2.0 * r};
      c->broadcast(b.data(), 2, DType::f64, root);
      CHECK(b == std::vector<double>{1.0 * root, 2.0 * root});
    }
    std::vector<std::int64_t> g(static_cast<std::size_t>(2 * p));
    const std::int64_t mine[2] = {r, -r};
    c->allgather(mine, 2, g.data(), DType::i64);
    for (int q = 0; q < p; ++q) {
      CHECK(g[static_cast<std::size_t>(2 * q)] == q);
      CHECK(g[static_cast<std::size_t>(2 * q + 1)] == -q);
    }
    const auto vals = c->allgather_value<int>(r * r);
    for (int q = 0; q < p; ++q) CHECK(vals[static_cast<std::size_t>(q)] == q * q);
    // vectors of length q % 3 (some empty) holding q, q+1, ...
    std::vector<index_t> v(static_cast<std::size_t>(r % 3));
    std::iota(v.begin(), v.end(), static_cast<index_t>(r));
    const auto all = c->allgather_vectors(v);
    REQUIRE(static_cast<int>(all.size()) == p);
    for (int q = 0; q < p; ++q) {
      std::vector<index_t> want(static_cast<std::size_t>(q % 3));
      std::iota(want.begin(), want.end(), static_cast<index_t>(q));
      CHECK(all[static_cast<std::size_t>(q)] == want);
    }
  });
}

TEST_CASE("allgatherv / iallgatherv with uneven and zero counts, blocks placed in reverse order", "[comm][mpi]") {
  for_each_comm([](CommPtr c) {
    const int r = c->rank(), p = c->size();
    // rank q contributes q % 3 elements (0 for q = 0 and 3) valued 100 q + k; blocks land in
    // reverse rank order with a one-element gap before each.
    std::vector<index_t> counts(static_cast<std::size_t>(p)), displs(static_cast<std::size_t>(p));
    index_t off = 0;
    for (int q = p - 1; q >= 0; --q) {
      off += 1;
      counts[static_cast<std::size_t>(q)] = q % 3;
      displs[static_cast<std::size_t>(q)] = off;
      off += q % 3;
    }
    std::vector<float> mine(static_cast<std::size_t>(r % 3));
    for (std::size_t k = 0; k < mine.size(); ++k) mine[k] = static_cast<float>(100 * r + static_cast<int>(k));
    std::vector<float> out(static_cast<std::size_t>(off), -1.f), out2(static_cast<std::size_t>(off), -1.f);
    c->allgatherv(mine.data(), r % 3, out.data(), counts, displs, DType::f32);
    auto req = c->iallgatherv(mine.data(), r % 3, out2.data(), counts, displs, DType::f32);
    req.wait();
    std::vector<float> want(static_cast<std::size_t>(off), -1.f);
    for (int q = 0; q < p; ++q)
      for (index_t k = 0; k < q % 3; ++k)
        want[static_cast<std::size_t>(displs[static_cast<std::size_t>(q)] + k)] = static_cast<float>(100 * q + k);
    CHECK(out == want);
    CHECK(out2 == want);
  });
}

TEST_CASE("reduce_scatterv with uneven and zero counts; reduce_scatter", "[comm][mpi]") {
  for_each_comm([](CommPtr c) {
    const int r = c->rank(), p = c->size();
    std::vector<index_t> counts(static_cast<std::size_t>(p));
    for (int q = 0; q < p; ++q) counts[static_cast<std::size_t>(q)] = (q + 1) % 3;  // 1,2,0,1
    const auto displs = displs_of(counts);
    const index_t tot = std::accumulate(counts.begin(), counts.end(), index_t{0});
    // sender s puts s*100 + 10*q + k into block q
    std::vector<double> send(static_cast<std::size_t>(tot));
    for (int q = 0; q < p; ++q)
      for (index_t k = 0; k < counts[static_cast<std::size_t>(q)]; ++k)
        send[static_cast<std::size_t>(displs[static_cast<std::size_t>(q)] + k)] = r * 100.0 + 10.0 * q + k;
    const index_t mine = counts[static_cast<std::size_t>(r)];
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      std::vector<double> recv(static_cast<std::size_t>(mine), -1.0);
      c->reduce_scatterv(send.data(), recv.data(), counts, DType::f64, op);
      for (index_t k = 0; k < mine; ++k) {
        const double base = 10.0 * r + k, ssum = 100.0 * p * (p - 1) / 2;
        const double want = op == ReduceOp::sum ? ssum + p * base
                            : op == ReduceOp::avg ? (ssum + p * base) / p
                            : op == ReduceOp::max ? 100.0 * (p - 1) + base
                                                  : base;
        CHECK(recv[static_cast<std::size_t>(k)] == want);
      }
    }
    // equal counts: every rank gets 2 elements of the sum of s + 10 q + k
    std::vector<std::int32_t> s2(static_cast<std::size_t>(2 * p)), r2(2);
    for (int q = 0; q < p; ++q)
      for (int k = 0; k < 2; ++k) s2[static_cast<std::size_t>(2 * q + k)] = r + 10 * q + k;
    c->reduce_scatter(s2.data(), r2.data(), 2, DType::i32, ReduceOp::sum);
    for (int k = 0; k < 2; ++k) CHECK(r2[static_cast<std::size_t>(k)] == p * (p - 1) / 2 + p * (10 * r + k));
  });
}

TEST_CASE("alltoallv / ialltoallv with uneven and zero counts; alltoall", "[comm][mpi]") {
  for_each_comm([](CommPtr c) {
    const int r = c->rank(), p = c->size();
    auto cnt = [](int from, int to) { return static_cast<index_t>((from + 2 * to) % 3); };  // 0..2, some zero
    std::vector<index_t> sc(static_cast<std::size_t>(p)), rc(static_cast<std::size_t>(p));
    for (int q = 0; q < p; ++q) {
      sc[static_cast<std::size_t>(q)] = cnt(r, q);
      rc[static_cast<std::size_t>(q)] = cnt(q, r);
    }
    const auto sd = displs_of(sc), rd = displs_of(rc);
    std::vector<std::int64_t> send(static_cast<std::size_t>(std::accumulate(sc.begin(), sc.end(), index_t{0})));
    for (int q = 0; q < p; ++q)
      for (index_t k = 0; k < sc[static_cast<std::size_t>(q)]; ++k)
        send[static_cast<std::size_t>(sd[static_cast<std::size_t>(q)] + k)] = 1000 * r + 10 * q + k;
    const auto nrecv = static_cast<std::size_t>(std::accumulate(rc.begin(), rc.end(), index_t{0}));
    std::vector<std::int64_t> recv(nrecv, -1), recv2(nrecv, -1), want(nrecv);
    for (int q = 0; q < p; ++q)
      for (index_t k = 0; k < rc[static_cast<std::size_t>(q)]; ++k)
        want[static_cast<std::size_t>(rd[static_cast<std::size_t>(q)] + k)] = 1000 * q + 10 * r + k;
    c->alltoallv(send.data(), sc, sd, recv.data(), rc, rd, DType::i64);
    c->ialltoallv(send.data(), sc, sd, recv2.data(), rc, rd, DType::i64).wait();
    CHECK(recv == want);
    CHECK(recv2 == want);

    std::vector<float> a(static_cast<std::size_t>(p)), b(static_cast<std::size_t>(p));
    for (int q = 0; q < p; ++q) a[static_cast<std::size_t>(q)] = static_cast<float>(10 * r + q);
    c->alltoall(a.data(), b.data(), 1, DType::f32);
    for (int q = 0; q < p; ++q) CHECK(b[static_cast<std::size_t>(q)] == static_cast<float>(10 * q + r));
  });
}

TEST_CASE("sendrecv ring (periodic and open), isend/irecv to every peer", "[comm][mpi]") {
  for_each_comm([](CommPtr c) {
    const int r = c->rank(), p = c->size();
    const int right = (r + 1) % p, left = (r + p - 1) % p;
    double send[2] = {1.0 * r, -1.0 * r}, recv[2] = {-7, -7};
    c->sendrecv(send, 2, right, recv, 2, left, DType::f64, 3);
    CHECK(recv[0] == left);
    CHECK(recv[1] == -left);
    // open chain: rank 0 receives nothing, the last rank sends nothing
    double got = -7;
    c->sendrecv(send, 1, r + 1 < p ? r + 1 : -1, &got, 1, r > 0 ? r - 1 : -1, DType::f64, 0);
    CHECK(got == (r > 0 ? r - 1 : -7));

    // every rank sends its rank (tagged by destination) to every rank, itself included
    std::vector<std::int32_t> out(static_cast<std::size_t>(p)), in(static_cast<std::size_t>(p), -1);
    std::vector<Request> reqs;
    for (int q = 0; q < p; ++q) reqs.push_back(c->irecv(&in[static_cast<std::size_t>(q)], 1, DType::i32, q, 10 + r));
    for (int q = 0; q < p; ++q) {
      out[static_cast<std::size_t>(q)] = 100 * r + q;
      reqs.push_back(c->isend(&out[static_cast<std::size_t>(q)], 1, DType::i32, q, 10 + q));
    }
    wait_all(reqs);
    for (int q = 0; q < p; ++q) CHECK(in[static_cast<std::size_t>(q)] == 100 * q + r);
    for (auto& rq : reqs) CHECK_FALSE(rq.pending());
    c->barrier();
  });
}

TEST_CASE("split: colour groups ordered by key; negative colour gives no communicator", "[comm][mpi]") {
  for_each_comm([](CommPtr c) {
    const int r = c->rank(), p = c->size();
    // parity groups, ordered by descending rank
    auto sub = c->split(r % 2, p - r);
    REQUIRE(sub != nullptr);
    const int group_size = (p + 1 - r % 2) / 2;
    CHECK(sub->size() == group_size);
    const auto members = sub->allgather_value<int>(r);
    for (int i = 0; i < group_size; ++i) {
      CHECK(members[static_cast<std::size_t>(i)] % 2 == r % 2);
      if (i > 0) CHECK(members[static_cast<std::size_t>(i)] < members[static_cast<std::size_t>(i - 1)]);
    }
    CHECK(members[static_cast<std::size_t>(sub->rank())] == r);
    // only rank 0 gets a communicator
    auto only0 = c->split(r == 0 ? 0 : -1, 0);
    CHECK((only0 != nullptr) == (r == 0));
    if (only0) CHECK(only0->size() == 1);
  });
}

TEST_CASE("check_all throws on every rank with the failing rank's message", "[comm][mpi][errors]") {
  for_each_comm([](CommPtr c) {
    const int r = c->rank(), p = c->size();
    CHECK_NOTHROW(c->check_all(true, "op_ok", ""));
    const int bad = p - 1;
    const std::string msg = error_of([&] { c->check_all(r != bad, "my_op", fmt::format("rank {} is unhappy", r)); });
    CHECK_THAT(msg, ContainsSubstring("my_op") && ContainsSubstring(fmt::format("rank {} is unhappy", bad)) &&
                        ContainsSubstring(fmt::format("detected on rank {} of {}", bad, p)));
    // two failing ranks: the lowest one's message wins
    const std::string m2 = error_of([&] { c->check_all(r == 0 && p > 1, "my_op", fmt::format("from {}", r)); });
    if (p > 1) CHECK_THAT(m2, ContainsSubstring("from 1 (detected on rank 1"));
    else CHECK_THAT(m2, ContainsSubstring("from 0 (detected on rank 0"));
    int one = 1;
    c->allreduce_inplace(&one, 1, ReduceOp::sum);  // still in step
    CHECK(one == p);
  });
}

TEST_CASE("MpiComm duplicates the user's communicator; MPI errors become shard::Error", "[comm][mpi][errors][world]") {
  CHECK_FALSE(mpi_init_if_needed());  // the test main initialised MPI already
  MPI_Comm user;
  MPI_Comm_split(MPI_COMM_WORLD, 0, 0, &user);
  {
    MpiComm c(user);
    CHECK(c.native() != user);
    int cmp = MPI_UNEQUAL;
    MPI_Comm_compare(c.native(), user, &cmp);
    CHECK(cmp == MPI_CONGRUENT);
    CHECK(c.size() == world_size());
    double x = 1;
    CHECK_THROWS_WITH(c.broadcast(&x, 1, DType::f64, c.size()), ContainsSubstring("broadcast"));
    const std::vector<index_t> one = {1};
    if (c.size() > 1)
      CHECK_THROWS_WITH(c.allgatherv(&x, 1, &x, one, one, DType::f64), ContainsSubstring("allgatherv"));
    CHECK_THROWS_WITH(c.isend(&x, 1, DType::f64, -1), ContainsSubstring("isend"));
    CHECK_THROWS_WITH(c.irecv(&x, 1, DType::f64, c.size()), ContainsSubstring("irecv"));
    CHECK_THROWS_WITH(c.allreduce(&x, &x, 1, DType::f16, ReduceOp::sum),
                      ContainsSubstring("reductions on f16 are not supported"));
    CHECK_THROWS_WITH(c.allreduce(&x, &x, -1, DType::f64, ReduceOp::sum), ContainsSubstring("allreduce"));
    c.barrier();
  }
  // the user's communicator is untouched and still works after the MpiComm is gone
  int v = 1, s = 0;
  MPI_Allreduce(&v, &s, 1, MPI_INT, MPI_SUM, user);
  CHECK(s == world_size());
  MPI_Comm_free(&user);
  CHECK_THROWS_WITH(MpiComm(MPI_COMM_NULL), ContainsSubstring("MpiComm"));
  auto w = MpiComm::world();
  CHECK(w->size() == world_size());
  CHECK(w->backend() == "mpi");
}

TEST_CASE("a point-to-point message of another size than expected is a shard::Error at the receiver",
          "[comm][mpi][errors]") {
  // The receive-size check (issue 18 item 6): always on, folded into the receive. Shorter messages
  // used to complete silently with stale data after them; longer ones were MPI_ERR_TRUNCATE.
  for_each_comm_size(
      [](CommPtr c) {
        const int r = c->rank(), p = c->size();
        const int to = (r + 1) % p, from = (r + p - 1) % p;
        std::vector<double> send(12, r), recv(10, -1.0);
        for (const index_t n : {index_t{8}, index_t{12}}) {
          // rank 0 sends n elements, every other rank the 10 that everyone expects: rank 1 fails
          const index_t mine = r == 0 ? n : 10;
          auto rq = c->irecv(recv.data(), 10, DType::f64, from, 5);
          auto sq = c->isend(send.data(), mine, DType::f64, to, 5);
          const std::string msg = error_of([&] { rq.wait(); });
          sq.wait();
          if (r == 1) {
            CHECK_THAT(msg, ContainsSubstring("rank 0 sent") && ContainsSubstring("expected 10 elements") &&
                                ContainsSubstring("ranks disagree"));
            CHECK_THAT(msg, ContainsSubstring(n < 10 ? "sent 8 elements" : "sent more elements"));
          } else {
            CHECK(msg.empty());
          }
          // sendrecv: the same check
          const std::string m2 = error_of([&] { c->sendrecv(send.data(), mine, to, recv.data(), 10, from, DType::f64, 6); });
          if (r == 1) CHECK_THAT(m2, ContainsSubstring("MPI_Sendrecv") && ContainsSubstring("rank 0 sent"));
          else CHECK(m2.empty());
        }
        // a receive abandoned while pending (its owner threw) is cancelled, not left to write later
        {
          auto rq = c->irecv(recv.data(), 10, DType::f64, from, 7);
        }
        int one = 1;
        c->allreduce_inplace(&one, 1, ReduceOp::sum);  // still in step
        CHECK(one == p);
      },
      2);
}

}  // namespace st_comm_mpi_comm
