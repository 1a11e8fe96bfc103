// The tape itself: accumulation over shared inputs, topological order on a diamond graph,
// freeing after backward, no-grad scope, scalar-loss and freed-graph errors.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_autograd_test_tape {

using namespace shard;
using autograd::Var;
using V1 = Var<double, 1>;
using D1 = DistTensor<double, 1>;

namespace {
DeviceMesh self_mesh() { return DeviceMesh(std::make_shared<SelfComm>()); }

// y = a * b elementwise, recorded.
V1 vmul(const V1& a, const V1& b) {
  D1 out(a.value().spec(), mul(a.local(), b.local()));
  return V1::make(out, "mul", {a.ref(), b.ref()}, [a, b](const D1& g) {
    a.accumulate_grad(D1(a.value().spec(), mul(g.local(), b.local())));
    b.accumulate_grad(D1(b.value().spec(), mul(g.local(), a.local())));
  });
}
// s = sum(a) as a {1} tensor, recorded.
V1 vsum(const V1& a) {
  auto spec = DistSpec(a.value().mesh(), {Replicate()}, {1});
  D1 out(spec, Tensor<double, 1>::full({1}, sum(a.local())));
  return V1::make(out, "sum", {a.ref()}, [a](const D1& g) {
    a.accumulate_grad(D1(a.value().spec(), Tensor<double, 1>::full(a.local().shape(), g.local()(0))));
  });
}
}  // namespace

TEST_CASE("diamond graph: gradients accumulate from both paths", "[autograd]") {
  auto mesh = self_mesh();
  V1 x(D1::random({5}, mesh, {Replicate()}, 3), true);
  // loss = sum(x*x) + sum(x*x*x): dloss/dx = 2x + 3x^2; x is used four times.
  auto x2 = vmul(x, x);
  auto loss_a = vsum(x2);
  auto loss_b = vsum(vmul(x2, x));
  auto loss = V1::make(D1(loss_a.value().spec(), add(loss_a.local(), loss_b.local())), "add",
                       {loss_a.ref(), loss_b.ref()}, [loss_a, loss_b](const D1& g) {
                         loss_a.accumulate_grad(g);
                         loss_b.accumulate_grad(g);
                       });
  loss.backward();
  REQUIRE(x.has_grad());
  for (int i = 0; i < 5; ++i) {
    const double v = x.local()(i);
    CHECK(std::abs(x.grad().local()(i) - (2 * v + 3 * v * v)) < 1e-14);
  }
  // Intermediate gradients are freed as soon as they are consumed; the graph is released.
  CHECK_FALSE(x2.has_grad());
  CHECK_THROWS_WITH(loss.backward(), Catch::Matchers::ContainsSubstring("already freed"));
}

TEST_CASE("gradients accumulate across two backward passes until zero_grad", "[autograd]") {
  auto mesh = self_mesh();
  V1 x(D1::random({4}, mesh, {Replicate()}, 5), true);
  vsum(vmul(x, x)).backward();
  auto g1 = x.grad().local().clone();
  vsum(vmul(x, x)).backward();
  for (int i = 0; i < 4; ++i) CHECK(std::abs(x.grad().local()(i) - 2 * g1(i)) < 1e-14);
  // The first gradient buffer was not written through (it was the op's own tensor).
  CHECK(std::abs(g1(0) - 2 * x.local()(0)) < 1e-14);
  x.zero_grad();
  CHECK_FALSE(x.has_grad());
}

TEST_CASE("no-grad scope records nothing; non-scalar and non-differentiable losses are refused", "[autograd]") {
  auto mesh = self_mesh();
  V1 x(D1::random({4}, mesh, {Replicate()}, 5), true);
  {
    autograd::NoGradGuard ng;
    auto y = vmul(x, x);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.is_leaf());
  }
  CHECK(autograd::grad_enabled());
  auto y = vmul(x, x);
  CHECK(y.requires_grad());
  CHECK_THROWS_WITH(y.backward(), Catch::Matchers::ContainsSubstring("scalar"));
  V1 c(D1::random({1}, mesh, {Replicate()}, 1), false);
  CHECK_THROWS_WITH(vsum(c).backward(), Catch::Matchers::ContainsSubstring("does not require grad"));
}

TEST_CASE("a leaf loss receives the seed gradient", "[autograd]") {
  auto mesh = self_mesh();
  V1 s(D1::random({1}, mesh, {Replicate()}, 2), true);
  s.backward();
  CHECK(s.grad().local()(0) == 1.0);
}

}  // namespace st_autograd_test_tape
