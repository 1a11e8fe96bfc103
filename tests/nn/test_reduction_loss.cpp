// Serial tests of reductions and losses: forward against plain loops, tie handling of max,
// fp64 finite differences of every gradient at one rank, and bad input.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>

#include "nn/functional_oracle.hpp"

namespace st_nn_test_reduction_loss {

using namespace shard;
using shard::test::fn::Body;
using shard::test::fn::Ctx;

namespace {

const DeviceMesh& mesh1() {
  static DeviceMesh m(std::make_shared<SelfComm>(), {1});
  return m;
}
template <class T, int R>
autograd::Var<T, R> rnd(const Shape<R>& s, std::uint64_t seed, bool rg = true, RandomInit init = {}) {
  return autograd::Var<T, R>(DistTensor<T, R>::random(s, mesh1(), {Replicate()}, seed, init), rg);
}

}  // namespace

TEMPLATE_TEST_CASE("sum, mean and max match plain loops", "[nn][reduction]", float, double) {
  using T = TestType;
  auto x = rnd<T, 4>({2, 3, 4, 5}, 1);
  const auto& xl = x.local();
  auto s23 = F::sum(x, {2, 3}).local();
  auto m0 = F::mean(x, {0, -1}).local();
  auto mx = F::max(x, {1, 2}).local();
  REQUIRE(s23.shape() == Shape<4>{2, 3, 1, 1});
  REQUIRE(m0.shape() == Shape<4>{1, 3, 4, 1});
  REQUIRE(mx.shape() == Shape<4>{2, 1, 1, 5});
  const double eps = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  for (index_t n = 0; n < 2; ++n)
    for (index_t c = 0; c < 3; ++c) {
      double s = 0;
      for (index_t h = 0; h < 4; ++h)
        for (index_t w = 0; w < 5; ++w) s += xl(n, c, h, w);
      CHECK(std::abs(s23(n, c, 0, 0) - s) <= eps * 20);
    }
  for (index_t c = 0; c < 3; ++c)
    for (index_t h = 0; h < 4; ++h) {
      double s = 0;
      for (index_t n = 0; n < 2; ++n)
        for (index_t w = 0; w < 5; ++w) s += xl(n, c, h, w);
      CHECK(std::abs(m0(0, c, h, 0) - s / 10) <= eps);
    }
  for (index_t n = 0; n < 2; ++n)
    for (index_t w = 0; w < 5; ++w) {
      T m = -1e30f;
      for (index_t c = 0; c < 3; ++c)
        for (index_t h = 0; h < 4; ++h) m = std::max(m, xl(n, c, h, w));
      CHECK(mx(n, 0, 0, w) == m);
    }
  double tot = 0;
  for (index_t i = 0; i < xl.numel(); ++i) tot += xl.data()[i];
  auto all = F::sum(x);
  REQUIRE(all.value().global_shape() == Shape<1>{1});
  CHECK(std::abs(all.local()(0) - tot) <= eps * 100);
  CHECK(std::abs(F::mean(x).local()(0) - tot / 120) <= eps);
}

TEST_CASE("max splits the gradient equally between ties", "[nn][reduction]") {
  auto x = rnd<double, 3>({2, 3, 4}, 3, true);
  x.local().fill(0.5);
  x.local()(0, 1, 2) = 0.25;  // one position below the max
  auto m = F::max(x, {1, 2});
  F::sum(m).backward();
  const auto& g = x.grad().local();
  for (index_t c = 0; c < 3; ++c)
    for (index_t h = 0; h < 4; ++h) {
      const double want0 = (c == 1 && h == 2) ? 0.0 : 1.0 / 11;
      CHECK(std::abs(g(0, c, h) - want0) <= 1e-15);
      CHECK(std::abs(g(1, c, h) - 1.0 / 12) <= 1e-15);
    }
}

TEMPLATE_TEST_CASE("mse and relative L2 losses match their formulas", "[nn][loss]", float, double) {
  using T = TestType;
  auto p = rnd<T, 3>({3, 2, 5}, 1);
  auto t = rnd<T, 3>({3, 2, 5}, 2);
  double se = 0, num[3] = {0, 0, 0}, den[3] = {0, 0, 0};
  for (index_t n = 0; n < 3; ++n)
    for (index_t i = 0; i < 10; ++i) {
      const double d = p.local().data()[n * 10 + i] - t.local().data()[n * 10 + i];
      const double tv = t.local().data()[n * 10 + i];
      se += d * d;
      num[n] += d * d;
      den[n] += tv * tv;
    }
  const double mse = se / 30;
  double per = 0;
  for (int n = 0; n < 3; ++n) per += std::sqrt(num[n] / den[n]) / 3;
  const double glob = std::sqrt((num[0] + num[1] + num[2]) / (den[0] + den[1] + den[2]));
  const double eps = std::is_same_v<T, float> ? 1e-6 : 1e-14;
  auto l1 = F::mse_loss(p, t);
  REQUIRE(l1.value().global_shape() == Shape<1>{1});
  CHECK(l1.value().placements()[0].is_replicate());
  CHECK(std::abs(l1.local()(0) - mse) <= eps);
  CHECK(std::abs(F::mse_loss(p, t, F::Reduction::sum).local()(0) - se) <= eps * 30);
  CHECK(std::abs(F::rel_l2_loss(p, t).local()(0) - per) <= eps);
  CHECK(std::abs(F::rel_l2_loss(p, t, F::RelL2Mode::global).local()(0) - glob) <= eps);
}

TEST_CASE("reduction and loss gradients match finite differences (fp64, one rank)", "[nn][reduction][loss][fd]") {
  Body<double> body = [](Ctx<double>& c) {
    auto x = c.act<4>({2, 3, 4, 5});
    auto t = c.act<4>({2, 3, 4, 5});
    c.output(F::sum(x, {2, 3}));
    c.output(F::mean(x, {0, 2}));
    c.output(F::max(x, {1, 3}));
    c.output(F::sum(x));
    c.output(F::mean(x));
    c.output(F::max(x));
    c.output(F::mse_loss(x, t));
    c.output(F::rel_l2_loss(x, t));
    c.output(F::rel_l2_loss(x, t, F::RelL2Mode::global));
  };
  test::fn::check_finite_differences(mesh1(), test::fn::reference_layout(), body, 40);
}

TEST_CASE("reductions and losses refuse bad input", "[nn][reduction][loss][errors]") {
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  using V = autograd::Var<double, 4>;
  V x(DistTensor<double, 4>::random({2, 3, 4, 5}, mesh, {Shard(2)}, 1), true);
  V xw(DistTensor<double, 4>::random({2, 3, 4, 5}, mesh, {Shard(3)}, 2), true);
  V other(DistTensor<double, 4>::random({2, 3, 4, 6}, mesh, {Shard(2)}, 3), true);
  CHECK_THROWS_AS(F::sum(x, {4}), shard::Error);
  CHECK_THROWS_AS(F::sum(x, {2, -2}), shard::Error);
  CHECK_THROWS_AS(F::max(F::sum(x, {2}), {3}), shard::Error);  // max of a Partial(sum)
  CHECK_THROWS_AS(F::mse_loss(x, other), shard::Error);
  CHECK_THROWS_AS(F::mse_loss(x, xw), shard::Error);
  CHECK_THROWS_AS(F::rel_l2_loss(x, other), shard::Error);
  CHECK_THROWS_AS(F::sum(x, {2}).backward(), shard::Error);  // non-scalar loss
  auto l = F::mse_loss(x, x.detach());
  l.backward();
  CHECK_THROWS_AS(l.backward(), shard::Error);  // the graph was freed
}

}  // namespace st_nn_test_reduction_loss
