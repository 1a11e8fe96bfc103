// SelfComm: every collective of a one-rank group is a (possibly displaced) local copy.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <numeric>
#include <shardtensor/shardtensor.hpp>

namespace st_comm_test_self_comm {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("SelfComm collectives are local copies", "[comm][self]") {
  SelfComm c;
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  CHECK(c.backend() == "self");
  const std::vector<double> x = {1.5, -2.0, 3.25};

  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
    std::vector<double> y(3, 0.0);
    c.allreduce(x.data(), y.data(), 3, DType::f64, op);
    CHECK(y == x);
    std::vector<double> z = x;
    c.allreduce(z.data(), z.data(), 3, DType::f64, op);  // in place
    CHECK(z == x);
    std::vector<double> w(3, 0.0);
    c.iallreduce(x.data(), w.data(), 3, DType::f64, op).wait();
    CHECK(w == x);
  }
  std::vector<double> b = x;
  c.broadcast(b.data(), 3, DType::f64, 0);
  CHECK(b == x);

  std::vector<double> g(3, 0.0);
  c.allgather(x.data(), 3, g.data(), DType::f64);
  CHECK(g == x);

  // allgatherv with a displacement; zero count too.
  std::vector<float> xf = {7.f, 8.f};
  std::vector<float> gv(5, -1.f);
  const std::vector<index_t> cnt = {2}, dsp = {2};
  c.allgatherv(xf.data(), 2, gv.data(), cnt, dsp, DType::f32);
  CHECK(gv == std::vector<float>{-1.f, -1.f, 7.f, 8.f, -1.f});
  std::vector<float> gz(2, -1.f);
  const std::vector<index_t> zero = {0}, zd = {0};
  c.allgatherv(xf.data(), 0, gz.data(), zero, zd, DType::f32);
  CHECK(gz == std::vector<float>{-1.f, -1.f});
  std::vector<float> gi(5, -1.f);
  c.iallgatherv(xf.data(), 2, gi.data(), cnt, dsp, DType::f32).wait();
  CHECK(gi == gv);

  std::vector<double> rs(3, 0.0);
  const std::vector<index_t> rsc = {3};
  c.reduce_scatterv(x.data(), rs.data(), rsc, DType::f64, ReduceOp::sum);
  CHECK(rs == x);
  std::vector<double> rs2(3, 0.0);
  c.reduce_scatter(x.data(), rs2.data(), 3, DType::f64, ReduceOp::max);
  CHECK(rs2 == x);

  // alltoallv with displacements on both sides.
  std::vector<std::int32_t> src = {1, 2, 3, 4}, dst(4, 0);
  const std::vector<index_t> sc = {2}, sd = {1}, rc = {2}, rd = {2};
  c.alltoallv(src.data(), sc, sd, dst.data(), rc, rd, DType::i32);
  CHECK(dst == std::vector<std::int32_t>{0, 0, 2, 3});
  std::vector<std::int32_t> dst2(4, 0);
  c.ialltoallv(src.data(), sc, sd, dst2.data(), rc, rd, DType::i32).wait();
  CHECK(dst2 == dst);
  std::vector<std::int32_t> dst3(4, 0);
  c.alltoall(src.data(), dst3.data(), 4, DType::i32);
  CHECK(dst3 == src);

  std::vector<double> sr(3, 0.0);
  c.sendrecv(x.data(), 3, 0, sr.data(), 3, 0, DType::f64, 5);
  CHECK(sr == x);
  std::vector<double> none(3, 9.0);
  c.sendrecv(x.data(), 3, -1, none.data(), 3, -1, DType::f64, 0);  // no peers: nothing moves
  CHECK(none == std::vector<double>(3, 9.0));
  c.barrier();

  CHECK(c.allgather_value<int>(42) == std::vector<int>{42});
  CHECK(c.allgather_vectors({3, 1, 4}) == std::vector<std::vector<index_t>>{{3, 1, 4}});
  CHECK(c.split(3, 0)->size() == 1);
  CHECK(c.split(-1, 0) == nullptr);
}

TEST_CASE("SelfComm isend/irecv match by tag, in any order", "[comm][self]") {
  SelfComm c;
  std::vector<double> a = {1, 2}, b = {3, 4, 5}, ra(2), rb(3);
  auto r1 = c.irecv(rb.data(), 3, DType::f64, 0, /*tag=*/2);
  CHECK_FALSE(r1.test());
  auto s1 = c.isend(a.data(), 2, DType::f64, 0, 1);
  auto s2 = c.isend(b.data(), 3, DType::f64, 0, 2);
  a[0] = -1;  // the send buffer is free for reuse after isend on SelfComm (copied)
  auto r2 = c.irecv(ra.data(), 2, DType::f64, 0, 1);
  r1.wait();
  r2.wait();
  s1.wait();
  s2.wait();
  CHECK(ra == std::vector<double>{1, 2});
  CHECK(rb == std::vector<double>{3, 4, 5});
  CHECK_FALSE(r1.pending());
}

TEST_CASE("SelfComm errors name the op", "[comm][self][errors]") {
  SelfComm c;
  double x = 1, y = 0;
  CHECK_THROWS_WITH(c.broadcast(&x, 1, DType::f64, 1), ContainsSubstring("SelfComm::broadcast"));
  CHECK_THROWS_WITH(c.isend(&x, 1, DType::f64, 1), ContainsSubstring("SelfComm::isend"));
  CHECK_THROWS_WITH(c.irecv(&y, 1, DType::f64, 2), ContainsSubstring("SelfComm::irecv"));
  CHECK_THROWS_WITH(c.irecv(&y, 1, DType::f64, 0, 9).wait(), ContainsSubstring("no matching send"));
  CHECK_THROWS_WITH(c.sendrecv(&x, 1, 1, &y, 1, 0, DType::f64, 0), ContainsSubstring("SelfComm::sendrecv"));
  const std::vector<index_t> two = {1, 1}, d2 = {0, 1};
  CHECK_THROWS_WITH(c.allgatherv(&x, 1, &y, two, d2, DType::f64), ContainsSubstring("SelfComm::allgatherv"));
  CHECK_THROWS_WITH(c.reduce_scatterv(&x, &y, two, DType::f64, ReduceOp::sum),
                    ContainsSubstring("SelfComm::reduce_scatterv"));
  // check_all on one rank: throws with the message when not ok, silent when ok.
  CHECK_NOTHROW(c.check_all(true, "myop", "unused"));
  CHECK_THROWS_WITH(c.check_all(false, "myop", "bad thing"),
                    ContainsSubstring("myop") && ContainsSubstring("bad thing") && ContainsSubstring("rank 0 of 1"));
}

}  // namespace st_comm_test_self_comm
