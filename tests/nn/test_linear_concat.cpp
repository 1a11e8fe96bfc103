// Serial tests of channel mixing (channel_linear, linear) and concat: forward against plain loops,
// fp64 finite differences of every gradient at one rank, and bad input.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>

#include "nn/functional_oracle.hpp"

namespace st_nn_test_linear_concat {

using namespace shard;
using shard::test::fn::Body;
using shard::test::fn::Ctx;

namespace {

const DeviceMesh& mesh1() {
  static DeviceMesh m(std::make_shared<SelfComm>(), {1});
  return m;
}
template <class T, int R>
autograd::Var<T, R> rnd(const Shape<R>& s, std::uint64_t seed, bool rg = true) {
  return autograd::Var<T, R>(DistTensor<T, R>::random(s, mesh1(), {Replicate()}, seed), rg);
}

}  // namespace

TEMPLATE_TEST_CASE("channel_linear and linear match plain loops", "[nn][linear]", float, double) {
  using T = TestType;
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  auto x = rnd<T, 4>({2, 3, 4, 5}, 1);
  auto w = rnd<T, 2>({6, 3}, 2);
  auto b = rnd<T, 1>({6}, 3);
  auto y = F::channel_linear(x, w, b).local();
  auto y0 = F::channel_linear(x, w).local();
  REQUIRE(y.shape() == Shape<4>{2, 6, 4, 5});
  for (index_t n = 0; n < 2; ++n)
    for (index_t o = 0; o < 6; ++o)
      for (index_t h = 0; h < 4; ++h)
        for (index_t s = 0; s < 5; ++s) {
          double acc = 0;
          for (index_t c = 0; c < 3; ++c) acc += double(w.local()(o, c)) * x.local()(n, c, h, s);
          CHECK(std::abs(y0(n, o, h, s) - acc) <= tol);
          CHECK(std::abs(y(n, o, h, s) - acc - b.local()(o)) <= tol);
        }
  auto tok = rnd<T, 3>({2, 7, 3}, 4);
  auto yt = F::linear(tok, w, b).local();
  REQUIRE(yt.shape() == Shape<3>{2, 7, 6});
  for (index_t n = 0; n < 2; ++n)
    for (index_t l = 0; l < 7; ++l)
      for (index_t o = 0; o < 6; ++o) {
        double acc = b.local()(o);
        for (index_t c = 0; c < 3; ++c) acc += double(w.local()(o, c)) * tok.local()(n, l, c);
        CHECK(std::abs(yt(n, l, o) - acc) <= tol);
      }
}

TEMPLATE_TEST_CASE("concat places its inputs side by side", "[nn][concat]", float, double) {
  using T = TestType;
  auto a = rnd<T, 4>({2, 3, 4, 5}, 1);
  auto b = rnd<T, 4>({2, 1, 4, 5}, 2);
  auto c = rnd<T, 4>({2, 2, 4, 5}, 3, false);
  auto y = F::concat({a, b, c}).local();
  REQUIRE(y.shape() == Shape<4>{2, 6, 4, 5});
  auto y3 = F::concat(a, a, 3).local();
  REQUIRE(y3.shape() == Shape<4>{2, 3, 4, 10});
  for (index_t n = 0; n < 2; ++n)
    for (index_t h = 0; h < 4; ++h)
      for (index_t w = 0; w < 5; ++w) {
        for (index_t k = 0; k < 3; ++k) CHECK(y(n, k, h, w) == a.local()(n, k, h, w));
        CHECK(y(n, 3, h, w) == b.local()(n, 0, h, w));
        for (index_t k = 0; k < 2; ++k) CHECK(y(n, 4 + k, h, w) == c.local()(n, k, h, w));
        for (index_t k = 0; k < 3; ++k) CHECK(y3(n, k, h, w + 5) == a.local()(n, k, h, w));
      }
}

TEST_CASE("linear and concat gradients match finite differences (fp64, one rank)", "[nn][linear][concat][fd]") {
  Body<double> body = [](Ctx<double>& c) {
    auto x = c.act<4>({2, 3, 4, 3});
    auto y = c.act<4>({2, 2, 4, 3});
    auto w = c.param<2>({4, 3});
    auto w2 = c.param<2>({2, 4});
    auto b = c.param<1>({4});
    auto tok = c.act<3>({2, 5, 3});
    c.output(F::channel_linear(x, w, b));
    c.output(F::channel_linear(F::tanh(F::channel_linear(x, w)), w2));
    c.output(F::linear(tok, w, b));
    c.output(F::concat({x, y, F::relu(x)}));
  };
  test::fn::check_finite_differences(mesh1(), test::fn::reference_layout(), body, 30);
}

TEST_CASE("channel mixing and concat refuse bad input", "[nn][linear][concat][errors]") {
  using V = autograd::Var<double, 4>;
  V x(DistTensor<double, 4>::random({2, 3, 4, 5}, mesh1(), {Replicate()}, 1), true);
  V xs2(DistTensor<double, 4>::random({2, 3, 4, 5}, mesh1(), {Shard(2)}, 1), true);
  V xc(DistTensor<double, 4>::random({2, 3, 4, 5}, mesh1(), {Shard(1)}, 1), true);
  V other(DistTensor<double, 4>::random({2, 3, 4, 6}, mesh1(), {Replicate()}, 1), true);
  auto w = rnd<double, 2>({6, 3}, 2);
  auto w_bad = rnd<double, 2>({6, 4}, 2);
  auto b_bad = rnd<double, 1>({5}, 3);
  autograd::Var<double, 2> w_sh(DistTensor<double, 2>::random({6, 3}, mesh1(), {Shard(0)}, 2), true);
  CHECK_THROWS_AS(F::channel_linear(x, w_bad), shard::Error);  // 4 input channels expected, 3 given
  CHECK_THROWS_AS(F::channel_linear(x, w, b_bad), shard::Error);
  CHECK_THROWS_AS(F::channel_linear(xc, w), shard::Error);     // sharded channels
  CHECK_THROWS_AS(F::channel_linear(x, w_sh), shard::Error);   // weight not replicated
  CHECK_THROWS_AS(F::linear(x, w), shard::Error);              // last dim is 5, not 3
  CHECK_THROWS_AS(F::concat(x, other), shard::Error);          // spatial extents differ
  CHECK_THROWS_AS(F::concat(x, xs2), shard::Error);            // placements differ
  CHECK_THROWS_AS(F::concat(xs2, xs2, 2), shard::Error);       // along a sharded dim
  CHECK_THROWS_AS(F::concat(std::vector<V>{}), shard::Error);
}

}  // namespace st_nn_test_linear_concat
