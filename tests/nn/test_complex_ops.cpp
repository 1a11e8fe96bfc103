// Serial tests of the complex ops (nn/functional/complex.hpp) and of tensor/ops.hpp on complex
// tensors: forward values and every gradient against closed forms written out here (the PyTorch
// convention, grad = dL/dRe + i dL/dIm), fp64 central finite differences of that convention,
// overload resolution (complex overloads win over the real templates), and bad input.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <complex>
#include <functional>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>
#include "support/complex_fill.hpp"

namespace st_nn_test_complex_ops {

using namespace shard;
using autograd::Var;
using shard::test::rnd_cplx;
using shard::test::rnd_real;
using Catch::Matchers::ContainsSubstring;

namespace {

const DeviceMesh& mesh1() {
  static DeviceMesh m(std::make_shared<SelfComm>(), {1});
  return m;
}

template <class X, int R>
Var<X, R> leaf(const Tensor<X, R>& t, bool rg = true) {
  return Var<X, R>(DistTensor<X, R>::distribute(t, mesh1(), {Replicate()}), rg);
}

/// max_i |got_i - want_i| / max(1, max|want|) for a tensor against a closed form per element.
template <class X, int R, class F>
double err_vs(const Tensor<X, R>& got, F&& want) {
  const auto g = got.contiguous();
  double num = 0, den = 1;
  for (index_t i = 0; i < g.numel(); ++i) {
    const auto w = std::complex<double>(want(i));
    num = std::max(num, std::abs(std::complex<double>(g.data()[i]) - w));
    den = std::max(den, std::abs(w));
  }
  return num / den;
}

template <class T> constexpr double tol() { return std::is_same_v<T, double> ? 1e-12 : 1e-5; }

/// Real loss of a complex output: sum Re(conj(p) y) (its gradient with respect to y is p).
template <class T, int R>
Var<T, 1> loss_c(const Var<std::complex<T>, R>& y, const Var<std::complex<T>, R>& p) {
  return F::sum(F::real(F::mul(F::conj(p), y)));
}
/// Real loss of a real output: sum(q y) (gradient q).
template <class T, int R>
Var<T, 1> loss_r(const Var<T, R>& y, const Var<T, R>& q) {
  return F::sum(F::mul(y, q));
}

}  // namespace

TEMPLATE_TEST_CASE("complex ops: forward and gradients against closed forms", "[nn][complex]", float, double) {
  using T = TestType;
  using C = std::complex<T>;
  const Shape<2> sh{3, 4};
  const auto zt = rnd_cplx<T, 2>(sh, 1), wt = rnd_cplx<T, 2>(sh, 2), pt = rnd_cplx<T, 2>(sh, 3);
  const auto rt = rnd_real<T, 2>(sh, 4), r2t = rnd_real<T, 2>(sh, 5), qt = rnd_real<T, 2>(sh, 6);
  auto z = leaf(zt), w = leaf(wt), r = leaf(rt), r2 = leaf(r2t);
  auto p = leaf(pt, false);
  auto q = leaf(qt, false);
  const C* Z = zt.data();
  const C* W = wt.data();
  const C* P = pt.data();
  const T* Rr = rt.data();
  const T* R2 = r2t.data();
  const T* Q = qt.data();
  const double eps = tol<T>();
  auto reset = [&] {
    for (auto* v : {&z, &w}) v->zero_grad();
    for (auto* v : {&r, &r2}) v->zero_grad();
  };

  SECTION("real / imag") {
    auto y = F::real(z);
    CHECK(err_vs(y.local(), [&](index_t i) { return Z[i].real(); }) <= eps);
    loss_r(y, q).backward();
    CHECK(err_vs(z.grad().local(), [&](index_t i) { return C(Q[i], 0); }) <= eps);
    reset();
    auto yi = F::imag(z);
    CHECK(err_vs(yi.local(), [&](index_t i) { return Z[i].imag(); }) <= eps);
    loss_r(yi, q).backward();
    CHECK(err_vs(z.grad().local(), [&](index_t i) { return C(0, Q[i]); }) <= eps);
  }
  SECTION("complex(re, im)") {
    auto y = F::complex(r, r2);
    CHECK(err_vs(y.local(), [&](index_t i) { return C(Rr[i], R2[i]); }) == 0);
    loss_c(y, p).backward();
    CHECK(err_vs(r.grad().local(), [&](index_t i) { return P[i].real(); }) <= eps);
    CHECK(err_vs(r2.grad().local(), [&](index_t i) { return P[i].imag(); }) <= eps);
  }
  SECTION("conj") {
    auto y = F::conj(z);
    CHECK(err_vs(y.local(), [&](index_t i) { return std::conj(Z[i]); }) == 0);
    loss_c(y, p).backward();
    CHECK(err_vs(z.grad().local(), [&](index_t i) { return std::conj(P[i]); }) <= eps);
  }
  SECTION("abs_squared / abs") {
    auto y = F::abs_squared(z);
    CHECK(err_vs(y.local(), [&](index_t i) { return std::norm(Z[i]); }) <= eps);
    loss_r(y, q).backward();
    CHECK(err_vs(z.grad().local(), [&](index_t i) { return T(2) * Q[i] * Z[i]; }) <= eps);
    reset();
    auto a = F::abs(z);
    CHECK(err_vs(a.local(), [&](index_t i) { return std::abs(Z[i]); }) <= eps);
    loss_r(a, q).backward();
    CHECK(err_vs(z.grad().local(), [&](index_t i) { return Q[i] * Z[i] / std::abs(Z[i]); }) <= eps);
  }
  SECTION("abs at zero has gradient zero (like torch)") {
    auto zz = leaf(Tensor<C, 2>::zeros(sh));
    auto a = F::abs(zz);
    CHECK(err_vs(a.local(), [](index_t) { return 0.0; }) == 0);
    loss_r(a, q).backward();
    CHECK(err_vs(zz.grad().local(), [](index_t) { return 0.0; }) == 0);
  }
  SECTION("add / sub / mul") {
    auto y = F::add(z, w);
    CHECK(err_vs(y.local(), [&](index_t i) { return Z[i] + W[i]; }) <= eps);
    loss_c(y, p).backward();
    CHECK(err_vs(z.grad().local(), [&](index_t i) { return P[i]; }) <= eps);
    CHECK(err_vs(w.grad().local(), [&](index_t i) { return P[i]; }) <= eps);
    reset();
    auto d = F::sub(z, w);
    CHECK(err_vs(d.local(), [&](index_t i) { return Z[i] - W[i]; }) <= eps);
    loss_c(d, p).backward();
    CHECK(err_vs(z.grad().local(), [&](index_t i) { return P[i]; }) <= eps);
    CHECK(err_vs(w.grad().local(), [&](index_t i) { return -P[i]; }) <= eps);
    reset();
    auto m = F::mul(z, w);
    CHECK(err_vs(m.local(), [&](index_t i) { return Z[i] * W[i]; }) <= eps);
    loss_c(m, p).backward();
    CHECK(err_vs(z.grad().local(), [&](index_t i) { return P[i] * std::conj(W[i]); }) <= eps);
    CHECK(err_vs(w.grad().local(), [&](index_t i) { return P[i] * std::conj(Z[i]); }) <= eps);
  }
  SECTION("complex * real tensor") {
    auto m = F::mul(z, r);
    CHECK(err_vs(m.local(), [&](index_t i) { return Z[i] * Rr[i]; }) <= eps);
    loss_c(m, p).backward();
    CHECK(err_vs(z.grad().local(), [&](index_t i) { return P[i] * Rr[i]; }) <= eps);
    CHECK(err_vs(r.grad().local(), [&](index_t i) { return (P[i] * std::conj(Z[i])).real(); }) <= eps);
    reset();
    auto m2 = F::mul(r, z);
    CHECK(err_vs(m2.local(), [&](index_t i) { return Z[i] * Rr[i]; }) <= eps);
  }
  SECTION("scalars: real and complex") {
    const C s(T(0.5), T(-1.25));
    auto y = F::mul(z, s);
    CHECK(err_vs(y.local(), [&](index_t i) { return s * Z[i]; }) <= eps);
    loss_c(y, p).backward();
    CHECK(err_vs(z.grad().local(), [&](index_t i) { return std::conj(s) * P[i]; }) <= eps);
    reset();
    auto y2 = F::mul(s, z);
    CHECK(err_vs(y2.local(), [&](index_t i) { return s * Z[i]; }) <= eps);
    auto y3 = F::mul(z, T(3));
    CHECK(err_vs(y3.local(), [&](index_t i) { return T(3) * Z[i]; }) <= eps);
    loss_c(y3, p).backward();
    CHECK(err_vs(z.grad().local(), [&](index_t i) { return T(3) * P[i]; }) <= eps);
    auto y4 = F::mul(T(2), z);
    CHECK(err_vs(y4.local(), [&](index_t i) { return T(2) * Z[i]; }) <= eps);
  }
  SECTION("sum / mean, and backward() of a complex scalar differentiates its real part") {
    auto s = F::sum(z);
    std::complex<double> want = 0;
    for (index_t i = 0; i < zt.numel(); ++i) want += std::complex<double>(Z[i]);
    CHECK(std::abs(std::complex<double>(s.local().data()[0]) - want) <= eps * 12);
    s.backward();  // grad of Re(sum z): 1 + 0i everywhere
    CHECK(err_vs(z.grad().local(), [](index_t) { return 1.0; }) == 0);
    reset();
    auto m = F::mean(z);
    CHECK(std::abs(std::complex<double>(m.local().data()[0]) - want / 12.0) <= eps);
    F::imag(m).backward();  // d Im(mean)/dz: i / 12
    CHECK(err_vs(z.grad().local(), [](index_t) { return std::complex<double>(0, 1.0 / 12); }) <= eps);
  }
}

TEST_CASE("complex ops: fp64 central finite differences of the gradient convention", "[nn][complex][fd]") {
  using C = std::complex<double>;
  const Shape<2> sh{2, 3};
  const auto zt = rnd_cplx<double, 2>(sh, 11), wt = rnd_cplx<double, 2>(sh, 12), pt = rnd_cplx<double, 2>(sh, 13);
  const auto qt = rnd_real<double, 2>(sh, 14);
  auto p = leaf(pt, false);
  auto q = leaf(qt, false);
  // loss(z, w) for each op; the gradient of z (and w) must be dL/dRe + i dL/dIm.
  const std::vector<std::pair<const char*, std::function<Var<double, 1>(const Var<C, 2>&, const Var<C, 2>&)>>> ops = {
      {"mul", [&](const Var<C, 2>& a, const Var<C, 2>& b) { return loss_c(F::mul(a, b), p); }},
      {"abs", [&](const Var<C, 2>& a, const Var<C, 2>&) { return loss_r(F::abs(a), q); }},
      {"abs_squared", [&](const Var<C, 2>& a, const Var<C, 2>&) { return loss_r(F::abs_squared(a), q); }},
      {"mul(z, real)", [&](const Var<C, 2>& a, const Var<C, 2>& b) { return loss_c(F::mul(a, F::real(b)), p); }},
  };
  const double h = 1e-6;
  for (const auto& [name, f] : ops) {
    INFO(name);
    auto z = leaf(zt), w = leaf(wt);
    f(z, w).backward();
    for (int which = 0; which < 2; ++which) {
      const auto& base = which == 0 ? zt : wt;
      auto& v = which == 0 ? z : w;
      if (!v.has_grad()) continue;
      const auto g = v.grad().local().contiguous();
      for (index_t i = 0; i < base.numel(); ++i)
        for (const C dir : {C(1, 0), C(0, 1)}) {
          auto eval = [&](double sgn) {
            autograd::NoGradGuard ng;
            auto t = base.clone();
            t.data()[i] += sgn * h * dir;
            auto a = leaf(which == 0 ? t : zt, false), b = leaf(which == 0 ? wt : t, false);
            return static_cast<double>(f(a, b).local().data()[0]);
          };
          const double fd = (eval(1) - eval(-1)) / (2 * h);
          const double an = dir.real() != 0 ? g.data()[i].real() : g.data()[i].imag();
          INFO("input " << which << " element " << i << " direction " << dir);
          CHECK(std::abs(fd - an) <= 1e-7 * std::max(1.0, std::abs(an)));
        }
    }
  }
}

TEST_CASE("complex ops: bad input", "[nn][complex][errors]") {
  using C = std::complex<double>;
  auto z = leaf(rnd_cplx<double, 2>({3, 4}, 1));
  auto w = leaf(rnd_cplx<double, 2>({4, 3}, 2));
  auto r = leaf(rnd_real<double, 2>({4, 3}, 3));
  auto err = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const shard::Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(err([&] { (void)F::max(z); }), ContainsSubstring("max") && ContainsSubstring("no order"));
  CHECK_THAT(err([&] { (void)F::max(z, {0}); }), ContainsSubstring("no order"));
  CHECK_THAT(err([&] { (void)F::add(z, w); }), ContainsSubstring("add") && ContainsSubstring("global shape"));
  CHECK_THAT(err([&] { (void)F::mul(z, w); }), ContainsSubstring("mul"));
  CHECK_THAT(err([&] { (void)F::mul(z, r); }), ContainsSubstring("mul"));
  CHECK_THAT(err([&] { (void)F::complex(r, F::real(z)); }), ContainsSubstring("complex"));
  // Partial inputs: nonlinear ops refuse them.
  auto zp = Var<C, 2>(DistTensor<C, 2>::distribute(rnd_cplx<double, 2>({3, 4}, 5), mesh1(), {Partial()}), true);
  CHECK_THAT(err([&] { (void)F::abs(zp); }), ContainsSubstring("Partial"));
  CHECK_THAT(err([&] { (void)F::abs_squared(zp); }), ContainsSubstring("Partial"));
  CHECK_THAT(err([&] { (void)F::mul(zp, zp); }), ContainsSubstring("Partial"));
  CHECK(err([&] { (void)F::conj(zp); }).empty());
}

TEST_CASE("tensor ops on complex tensors (host)", "[tensor][complex]") {
  using C = std::complex<double>;
  auto x = rnd_cplx<double, 2>({5, 3}, 21), y = rnd_cplx<double, 2>({5, 3}, 22);
  auto y0 = y.clone();
  axpy(C(2, -1), x, y);
  for (index_t i = 0; i < y.numel(); ++i) CHECK(std::abs(y.data()[i] - (y0.data()[i] + C(2, -1) * x.data()[i])) < 1e-14);
  auto s = x.clone();
  scale(s, C(0, 1));
  for (index_t i = 0; i < s.numel(); ++i) CHECK(s.data()[i] == C(0, 1) * x.data()[i]);
  auto m = mul(x, y0);
  auto a = add(x, y0), d = sub(x, y0);
  C want = 0;
  for (index_t i = 0; i < x.numel(); ++i) {
    CHECK(m.data()[i] == x.data()[i] * y0.data()[i]);
    CHECK(a.data()[i] == x.data()[i] + y0.data()[i]);
    CHECK(d.data()[i] == x.data()[i] - y0.data()[i]);
    want += x.data()[i];
  }
  const std::complex<double> got = sum(x);
  CHECK(std::abs(got - want) < 1e-13);
  CHECK(max_rel_diff(x, x) == 0);
  CHECK(max_rel_diff(a, x) > 0);
  auto xf = rnd_cplx<float, 1>({4}, 23);
  CHECK(std::abs(sum(xf) - std::complex<double>(xf.data()[0]) - std::complex<double>(xf.data()[1]) -
                 std::complex<double>(xf.data()[2]) - std::complex<double>(xf.data()[3])) < 1e-6);
}

}  // namespace st_nn_test_complex_ops
