// Serial tests of the pointwise ops and activations: forward against plain loops, fp64 finite
// differences of every gradient at one rank, and bad input.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "nn/functional_oracle.hpp"

namespace st_nn_test_pointwise_activation {

using namespace shard;
using shard::test::fn::Body;
using shard::test::fn::Ctx;

namespace {

DeviceMesh self_mesh() { return DeviceMesh(std::make_shared<SelfComm>(), {1}); }
const DeviceMesh& shared_mesh() {
  static DeviceMesh mesh = self_mesh();
  return mesh;
}

template <class T, int R>
autograd::Var<T, R> rnd(const Shape<R>& s, std::uint64_t seed, bool rg = true, RandomInit init = {}) {
  return autograd::Var<T, R>(DistTensor<T, R>::random(s, shared_mesh(), {Replicate()}, seed, init), rg);
}

}  // namespace

TEMPLATE_TEST_CASE("broadcasting binary ops match plain loops", "[nn][pointwise]", float, double) {
  using T = TestType;
  auto x = rnd<T, 4>({2, 3, 4, 5}, 1);
  auto y = rnd<T, 4>({2, 3, 4, 5}, 2, true, RandomInit::uniform(0.5, 1.5));
  auto b = rnd<T, 4>({1, 3, 1, 1}, 3);
  auto c = rnd<T, 1>({5}, 4, true, RandomInit::uniform(0.5, 1.5));
  auto v = rnd<T, 1>({3}, 5);
  auto add = F::add(x, y).local();
  auto sub = F::sub(x, b).local();
  auto mul = F::mul(x, c).local();
  auto div = F::div(x, c).local();
  auto ch = F::mul(x, F::as_channel<4>(v)).local();
  auto rsub = F::sub(b, x).local();
  auto sc = F::div(T(2), F::add(F::mul(F::neg(y), T(3)), T(7))).local();
  for (index_t n = 0; n < 2; ++n)
    for (index_t k = 0; k < 3; ++k)
      for (index_t h = 0; h < 4; ++h)
        for (index_t w = 0; w < 5; ++w) {
          const T xv = x.local()(n, k, h, w), yv = y.local()(n, k, h, w), bv = b.local()(0, k, 0, 0);
          const T cv = c.local()(w), vv = v.local()(k);
          CHECK(add(n, k, h, w) == xv + yv);
          CHECK(sub(n, k, h, w) == xv - bv);
          CHECK(rsub(n, k, h, w) == bv - xv);
          CHECK(mul(n, k, h, w) == xv * cv);
          CHECK(div(n, k, h, w) == xv / cv);
          CHECK(ch(n, k, h, w) == xv * vv);
          CHECK(std::abs(sc(n, k, h, w) - T(2) / (-yv * T(3) + T(7))) <= 4 * std::numeric_limits<T>::epsilon());
        }
}

TEMPLATE_TEST_CASE("activations match their formulas", "[nn][activation]", float, double) {
  using T = TestType;
  auto x = rnd<T, 3>({2, 3, 11}, 7, true, RandomInit::uniform(-4, 4));
  const auto xl = x.local();
  auto check = [&](const autograd::Var<T, 3>& y, auto f) {
    for (index_t i = 0; i < xl.numel(); ++i) {
      const double e = f(static_cast<double>(xl.data()[i]));
      CHECK(std::abs(static_cast<double>(y.local().data()[i]) - e) <= 1e-6 * std::max(1.0, std::abs(e)));
    }
  };
  check(F::relu(x), [](double v) { return v > 0 ? v : 0; });
  check(F::leaky_relu(x, 0.2), [](double v) { return v > 0 ? v : 0.2 * v; });
  check(F::gelu(x), [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); });
  check(F::gelu(x, F::GeluApprox::tanh),
        [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); });
  check(F::silu(x), [](double v) { return v / (1 + std::exp(-v)); });
  check(F::tanh(x), [](double v) { return std::tanh(v); });
  check(F::sigmoid(x), [](double v) { return 1 / (1 + std::exp(-v)); });
  check(F::exp(x), [](double v) { return std::exp(v); });
  check(F::square(x), [](double v) { return v * v; });
}

TEST_CASE("f32 sigmoid and SiLU (the CPU's vectorised exp): within 3 ulp of exact, and the special values",
          "[nn][activation]") {
  // Dense sweep over [-110, 110] (past where exp(-|x|) is subnormal or 0) plus the special values.
  std::vector<float> v;
  for (float t = -110.0f; t <= 110.0f; t += 0.0137f) v.push_back(t);
  for (float t : {0.0f, -0.0f, 1e-30f, -1e-30f, 87.0f, -87.5f, -88.8f, -103.9f, -104.5f, -150.0f, 104.5f, 1e30f, -1e30f})
    v.push_back(t);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  v.push_back(inf);
  v.push_back(-inf);
  v.push_back(nan);
  const auto n = static_cast<index_t>(v.size());
  auto t = DistTensor<float, 1>::zeros({n}, shared_mesh(), {Replicate()});
  for (index_t i = 0; i < n; ++i) t.local().data()[i] = v[static_cast<std::size_t>(i)];
  const autograd::Var<float, 1> x(t, true);
  const auto sg = F::sigmoid(x), si = F::silu(x);
  auto ulps = [](float got, double want) {
    const double a = std::abs(want);
    const double ulp = a >= 0x1p-126 ? std::ldexp(1.0, std::ilogb(static_cast<float>(a)) - 23) : 0x1p-149;
    return std::abs(static_cast<double>(got) - want) / ulp;
  };
  double worst_sg = 0, worst_si = 0;
  for (index_t i = 0; i < n; ++i) {
    const float xi = v[static_cast<std::size_t>(i)];
    const float gs = sg.value().local().data()[i], gi = si.value().local().data()[i];
    INFO("x = " << xi << ": sigmoid " << gs << ", silu " << gi);
    if (std::isnan(xi)) {
      CHECK(std::isnan(gs));
      CHECK(std::isnan(gi));
      continue;
    }
    if (std::isinf(xi)) {
      CHECK(gs == (xi > 0 ? 1.0f : 0.0f));
      if (xi > 0) CHECK(gi == inf);
      continue;
    }
    const double xd = xi, s = 1.0 / (1.0 + std::exp(-xd));
    CHECK(gs >= 0.0f);
    CHECK(gs <= 1.0f);
    worst_sg = std::max(worst_sg, ulps(gs, s));
    // x * sigmoid(x) is as exact as the product of the rounded sigmoid: where the sigmoid is
    // subnormal (x < -87.3) its own rounding is already coarse, and |x| multiplies it.
    if (xd > -87.0) worst_si = std::max(worst_si, ulps(gi, xd * s));
  }
  INFO("worst sigmoid " << worst_sg << " ulp, silu " << worst_si << " ulp");
  CHECK(worst_sg <= 3.0);
  CHECK(worst_si <= 3.0);
  // The backward (SiLU's and sigmoid's gradients evaluate the same sigmoid): finite and exact
  // enough at a few points (the fp64 finite-difference tests cover the formulas).
  F::sum(si).backward();
  for (index_t i = 0; i < n; ++i) {
    const float xi = v[static_cast<std::size_t>(i)];
    if (!std::isfinite(xi)) continue;
    const double xd = xi, s = 1.0 / (1.0 + std::exp(-xd)), d = s * (1 + xd * (1 - s));
    CHECK(std::abs(static_cast<double>(x.grad().local().data()[i]) - d) <= 1e-6 * std::max(1.0, std::abs(d)));
  }
}

TEST_CASE("f32 exact GELU (the CPU's vectorised normal CDF): within 7 ulp of exact, tail included",
          "[nn][activation]") {
  // Dense sweep over [-16, 16] (past where Phi(x) and exp(-x^2 / 2) vanish in float) plus the
  // special values. The erf form 0.5 x (1 + erf(x / sqrt 2)) was off by up to 1.7e7 ulp for
  // x < -4 (1 + erf cancels); the same sweep pins the vectorised form's relative accuracy there.
  std::vector<float> v;
  for (float t = -16.0f; t <= 16.0f; t += 0.00137f) v.push_back(t);
  for (float t : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.70710677f, -0.70710677f, 0.7071068f, -0.7071068f, -0.7517915f,
                  -13.1f, -14.9f, -15.5f, 15.5f, 1e30f, -1e30f})
    v.push_back(t);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  v.push_back(inf);
  v.push_back(nan);
  const auto n = static_cast<index_t>(v.size());
  auto t = DistTensor<float, 1>::zeros({n}, shared_mesh(), {Replicate()});
  for (index_t i = 0; i < n; ++i) t.local().data()[i] = v[static_cast<std::size_t>(i)];
  const autograd::Var<float, 1> x(t, true);
  const auto y = F::gelu(x);
  F::sum(y).backward();
  auto ulp_of = [](double a) {
    a = std::abs(a);
    return a >= 0x1p-126 ? std::ldexp(1.0, std::ilogb(static_cast<float>(a)) - 23) : 0x1p-149;
  };
  double worst_f = 0, worst_b = 0;
  for (index_t i = 0; i < n; ++i) {
    const float xi = v[static_cast<std::size_t>(i)];
    const float got = y.value().local().data()[i], dgot = x.grad().local().data()[i];
    INFO("x = " << xi << ": gelu " << got << ", gelu' " << dgot);
    if (std::isnan(xi)) {
      CHECK(std::isnan(got));
      CHECK(std::isnan(dgot));
      continue;
    }
    if (std::isinf(xi)) {  // (its derivative is inf * 0, NaN, as in the erf form and on CUDA)
      CHECK(got == inf);
      continue;
    }
    const double xd = xi, cdf = 0.5 * std::erfc(-xd / std::sqrt(2.0)), pdf = std::exp(-0.5 * xd * xd) / std::sqrt(2 * M_PI);
    const double want = xd * cdf, dwant = cdf + xd * pdf;
    // Relative terms where Phi (and exp(-x^2 / 2)) are normal floats; beyond x = -13.1 they are
    // subnormal themselves, so the bound there is absolute (|x| <= 16 times 2^-126).
    if (cdf >= 0x1p-126) worst_f = std::max(worst_f, std::abs(got - want) / ulp_of(want));
    else CHECK(std::abs(got - want) <= 0x1p-122);
    CHECK((xd >= 0 ? got >= 0.0f : got <= 0.0f));
    // the derivative cancels near its zero (x = -0.7518): ulps of its larger term
    const double big = std::max(cdf, std::abs(xd * pdf));
    if (pdf >= 0x1p-126) worst_b = std::max(worst_b, std::abs(dgot - dwant) / ulp_of(big));
    else CHECK(std::abs(dgot - dwant) <= 0x1p-122);
  }
  INFO("worst gelu " << worst_f << " ulp, gelu' " << worst_b << " ulp (of its larger term)");
  CHECK(worst_f <= 7.0);
  CHECK(worst_b <= 7.0);
  CHECK(worst_f > 0.0);  // the sweep reached values the check can see
}

TEST_CASE("pointwise gradients match finite differences (fp64, one rank)", "[nn][pointwise][fd]") {
  Body<double> body = [](Ctx<double>& c) {
    auto x = c.act<4>({2, 3, 4, 5});
    auto y = c.act<4>({2, 3, 4, 5}, true, RandomInit::uniform(0.5, 1.5));
    auto b = c.param<4>({1, 3, 1, 1});
    auto w = c.param<1>({5}, true, RandomInit::uniform(0.5, 1.5));
    auto v = c.param<1>({3});
    c.output(F::add(x, y));
    c.output(F::sub(b, x));
    c.output(F::mul(x, F::as_channel<4>(v)));
    c.output(F::div(x, y));
    c.output(F::div(b, w));
    c.output(F::mul(F::sub(F::div(2.0, y), F::neg(F::add(x, 1.5))), 0.5));
    c.output(F::sub(F::square(x), F::log(y)));
    c.output(F::add(F::sqrt(y), F::exp(x)));
  };
  test::fn::check_finite_differences(self_mesh(), test::fn::reference_layout(), body, 30);
}

TEST_CASE("activation gradients match finite differences (fp64, one rank)", "[nn][activation][fd]") {
  Body<double> body = [](Ctx<double>& c) {
    auto x = c.act<3>({2, 3, 6}, true, RandomInit::uniform(-3, 3));
    c.output(F::relu(x));
    c.output(F::leaky_relu(x, 0.1));
    c.output(F::gelu(x));
    c.output(F::gelu(x, F::GeluApprox::tanh));
    c.output(F::silu(x));
    c.output(F::tanh(x));
    c.output(F::sigmoid(x));
  };
  test::fn::check_finite_differences(self_mesh(), test::fn::reference_layout(), body, 36);
}

TEST_CASE("pointwise ops refuse bad operands", "[nn][pointwise][errors]") {
  auto mesh = self_mesh();
  auto x = autograd::Var<double, 4>(DistTensor<double, 4>::random({2, 3, 4, 5}, mesh, {Shard(2)}, 1), true);
  auto x3 = autograd::Var<double, 4>(DistTensor<double, 4>::random({2, 3, 4, 5}, mesh, {Shard(3)}, 1), true);
  auto bad = autograd::Var<double, 4>(DistTensor<double, 4>::random({2, 3, 4, 6}, mesh, {Replicate()}, 2), true);
  auto bad_c = autograd::Var<double, 1>(DistTensor<double, 1>::random({4}, mesh, {Replicate()}, 3), true);
  CHECK_THROWS_AS(F::add(x, bad), shard::Error);     // shapes do not broadcast
  CHECK_THROWS_AS(F::mul(x, x3), shard::Error);      // one mesh dim shards different dims
  CHECK_THROWS_AS(F::mul(x, F::as_channel<4>(bad_c)), shard::Error);  // 4 channels against 3
  auto part = F::sum(x, {2});                        // Partial(sum) over the mesh dim
  CHECK_THROWS_AS(F::mul(part, part), shard::Error);
  CHECK_THROWS_AS(F::relu(part), shard::Error);
  CHECK_THROWS_AS(F::add(part, 1.0), shard::Error);
  CHECK_NOTHROW(F::add(part, part));                 // linear in Partial(sum): allowed
  CHECK_NOTHROW(F::mul(part, 2.0));
  try {
    F::add(x, bad);
    FAIL("no error");
  } catch (const shard::Error& e) {
    CHECK(std::string(e.what()).find("add") != std::string::npos);
  }
}

}  // namespace st_nn_test_pointwise_activation
