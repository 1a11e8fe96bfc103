// Serial tests of the normalisations: forward (and running statistics) against plain loops, fp64
// finite differences of every gradient (input, weight, bias) at one rank, and bad input.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <utility>

#include "nn/functional_oracle.hpp"

namespace st_nn_test_norm {

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

// Plain normalisation of x [N, C, L] (L = flattened spatial) over index sets given by key(n, c, l).
template <class T, class Key>
std::vector<double> naive_norm(const Tensor<T, 3>& x, const Tensor<T, 1>& w, const Tensor<T, 1>& b, Key key, int K,
                               double eps, std::vector<double>* mean_out = nullptr,
                               std::vector<double>* var_out = nullptr) {
  const index_t N = x.size(0), C = x.size(1), L = x.size(2);
  std::vector<double> s(K, 0), q(K, 0), cnt(K, 0);
  for (index_t n = 0; n < N; ++n)
    for (index_t c = 0; c < C; ++c)
      for (index_t l = 0; l < L; ++l) {
        s[key(n, c, l)] += x(n, c, l);
        cnt[key(n, c, l)] += 1;
      }
  for (int k = 0; k < K; ++k) s[k] /= cnt[k];
  for (index_t n = 0; n < N; ++n)
    for (index_t c = 0; c < C; ++c)
      for (index_t l = 0; l < L; ++l) {
        const double d = x(n, c, l) - s[key(n, c, l)];
        q[key(n, c, l)] += d * d;
      }
  for (int k = 0; k < K; ++k) q[k] /= cnt[k];
  if (mean_out) *mean_out = s;
  if (var_out) *var_out = q;
  std::vector<double> y;
  for (index_t n = 0; n < N; ++n)
    for (index_t c = 0; c < C; ++c)
      for (index_t l = 0; l < L; ++l) {
        const int k = key(n, c, l);
        y.push_back((x(n, c, l) - s[k]) / std::sqrt(q[k] + eps) * w(c) + b(c));
      }
  return y;
}

template <class T>
void check_close(const Tensor<T, 3>& y, const std::vector<double>& want, double tol) {
  REQUIRE(static_cast<std::size_t>(y.numel()) == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(std::abs(y.data()[i] - want[i]) <= tol);
}

}  // namespace

TEMPLATE_TEST_CASE("norms match plain loops", "[nn][norm]", float, double) {
  using T = TestType;
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  const index_t N = 3, C = 4, L = 10;
  auto x = rnd<T, 3>({N, C, L}, 1, true, RandomInit::uniform(-2, 3));
  auto w = rnd<T, 1>({C}, 2);
  auto b = rnd<T, 1>({C}, 3);
  const double eps = 1e-5;
  SECTION("batch norm, training and eval, with running statistics") {
    std::vector<double> mean, var;
    auto want = naive_norm(x.local(), w.local(), b.local(), [](index_t, index_t c, index_t) { return int(c); },
                           int(C), eps, &mean, &var);
    auto rm = DistTensor<T, 1>::zeros({C}, mesh1(), {Replicate()});
    auto rv = DistTensor<T, 1>::zeros({C}, mesh1(), {Replicate()});
    rv.local().fill(T(1));
    check_close(F::batch_norm(x, &rm, &rv, w, b, true, 0.25, eps).local(), want, tol);
    for (index_t c = 0; c < C; ++c) {
      CHECK(std::abs(rm.local()(c) - 0.25 * mean[c]) <= tol);
      CHECK(std::abs(rv.local()(c) - (0.75 + 0.25 * var[c] * 30 / 29)) <= tol);
    }
    auto ye = F::batch_norm(x, &rm, &rv, w, b, false, 0.25, eps).local();
    for (index_t n = 0; n < N; ++n)
      for (index_t c = 0; c < C; ++c)
        for (index_t l = 0; l < L; ++l) {
          const double e = (x.local()(n, c, l) - rm.local()(c)) / std::sqrt(rv.local()(c) + eps) * w.local()(c) +
                           b.local()(c);
          CHECK(std::abs(ye(n, c, l) - e) <= tol);
        }
  }
  SECTION("group norm with 2 groups, instance norm, layer norm over channels and tokens") {
    check_close(F::group_norm(x, 2, w, b, eps).local(),
                naive_norm(x.local(), w.local(), b.local(),
                           [](index_t n, index_t c, index_t) { return int(n * 2 + c / 2); }, int(N * 2), eps),
                tol);
    check_close(F::instance_norm(x, w, b, eps).local(),
                naive_norm(x.local(), w.local(), b.local(),
                           [C](index_t n, index_t c, index_t) { return int(n * C + c); }, int(N * C), eps),
                tol);
    check_close(F::layer_norm(x, w, b, eps).local(),
                naive_norm(x.local(), w.local(), b.local(),
                           [L](index_t n, index_t, index_t l) { return int(n * L + l); }, int(N * L), eps),
                tol);
    // Tokens [N, L, C]: normalise the last dim (transpose the plain reference).
    auto tok = rnd<T, 3>({N, L, C}, 9);
    auto yt = F::layer_norm(tok, w, b, eps, -1).local();
    auto xt = Tensor<T, 3>::empty({N, C, L});
    for (index_t n = 0; n < N; ++n)
      for (index_t c = 0; c < C; ++c)
        for (index_t l = 0; l < L; ++l) xt(n, c, l) = tok.local()(n, l, c);
    auto want = naive_norm(xt, w.local(), b.local(), [L](index_t n, index_t, index_t l) { return int(n * L + l); },
                           int(N * L), eps);
    for (index_t n = 0; n < N; ++n)
      for (index_t c = 0; c < C; ++c)
        for (index_t l = 0; l < L; ++l) CHECK(std::abs(yt(n, l, c) - want[(n * C + c) * L + l]) <= tol);
  }
}

TEST_CASE("norm gradients match finite differences (fp64, one rank)", "[nn][norm][fd]") {
  Body<double> body = [](Ctx<double>& c) {
    auto x = c.act<4>({2, 4, 3, 3}, true, RandomInit::uniform(-1, 2));
    auto w = c.param<1>({4});
    auto b = c.param<1>({4});
    auto w3 = c.param<1>({3});
    std::vector<Placement> rep(1, Replicate());
    auto rm = DistTensor<double, 1>::random({4}, c.mesh(), rep, 5);
    auto rv = DistTensor<double, 1>::random({4}, c.mesh(), rep, 6, RandomInit::uniform(0.5, 1.5));
    c.output(F::batch_norm(x, &rm, &rv, w, b, false));  // eval first: running stats not yet updated
    c.output(F::batch_norm(x, &rm, &rv, w, b, true));
    c.output(F::group_norm(x, 2, w, b));
    c.output(F::instance_norm(x, w, b));
    c.output(F::layer_norm(x, w, b));
    c.output(F::group_norm(x, 1));
    c.output(F::layer_norm(x, w3, std::nullopt, 1e-5, -1));
  };
  test::fn::check_finite_differences(mesh1(), test::fn::reference_layout(), body, 40);
}

TEMPLATE_TEST_CASE("a norm with a fused activation (and residual) equals the norm, add and activation ops",
                   "[nn][norm][fused]", float, double) {
  // Forward and every gradient (x, w, b, residual) of F::*_norm(..., act, residual) against
  // activate(a, F::add(F::*_norm(...), residual)) (the ops of nn/functional/activation.hpp and
  // pointwise.hpp). Every activation the norms fuse (and none, with a residual), every norm kind,
  // with and without affine parameters, with and without a residual.
  using T = TestType;
  using V = autograd::Var<T, 4>;
  using OptV = std::optional<V>;
  // Bit for bit on the CPU: the fused kernels round z to the activation's type (float for f32),
  // add the residual in it and evaluate the pointwise family's formulas: exactly the roundings of
  // the three-op route.
  const double tol = 0;
  const std::pair<nn::Activation, F::NormAct> acts[] = {
      {nn::Activation::silu, F::NormAct::silu},       {nn::Activation::gelu, F::NormAct::gelu},
      {nn::Activation::relu, F::NormAct::relu},       {nn::Activation::tanh, F::NormAct::tanh},
      {nn::Activation::sigmoid, F::NormAct::sigmoid}, {nn::Activation::identity, F::NormAct::none},
      {nn::Activation::gelu_tanh, F::NormAct::gelu_tanh}};
  using Fn = std::function<V(const V&, F::NormAct, const OptV&)>;
  const auto w = rnd<T, 1>({4}, 3, true, RandomInit::uniform(0.5, 1.5));
  const auto b = rnd<T, 1>({4}, 4);
  const auto w3 = rnd<T, 1>({3}, 13, true, RandomInit::uniform(0.5, 1.5));
  const auto b3 = rnd<T, 1>({3}, 14);
  auto rm = DistTensor<T, 1>::random({4}, mesh1(), {Replicate()}, 5);
  auto rv = DistTensor<T, 1>::random({4}, mesh1(), {Replicate()}, 6, RandomInit::uniform(0.5, 1.5));
  const std::pair<const char*, Fn> norms[] = {
      {"group", [&](const V& x, F::NormAct a, const OptV& r) { return F::group_norm(x, 2, w, b, 1e-5, a, r); }},
      {"group, no affine",
       [&](const V& x, F::NormAct a, const OptV& r) { return F::group_norm(x, 1, std::nullopt, std::nullopt, 1e-5, a, r); }},
      {"instance", [&](const V& x, F::NormAct a, const OptV& r) { return F::instance_norm(x, w, b, 1e-5, a, r); }},
      {"layer", [&](const V& x, F::NormAct a, const OptV& r) { return F::layer_norm(x, w, b, 1e-5, 1, a, r); }},
      {"layer over the last dim",  // the CPU table's row walk (one statistic per contiguous row)
       [&](const V& x, F::NormAct a, const OptV& r) { return F::layer_norm(x, w3, b3, 1e-5, -1, a, r); }},
      {"batch",
       [&](const V& x, F::NormAct a, const OptV& r) {
         return F::batch_norm(x, nullptr, nullptr, w, b, true, 0.1, 1e-5, a, r);
       }},
      {"batch eval",
       [&](const V& x, F::NormAct a, const OptV& r) { return F::batch_norm(x, &rm, &rv, w, b, false, 0.1, 1e-5, a, r); }}};
  const auto gy = DistTensor<T, 4>::random({2, 4, 5, 3}, mesh1(), {Replicate()}, 9);
  for (const bool with_res : {false, true}) {
    for (const auto& [act, code] : acts) {
      if (!with_res && code == F::NormAct::none) continue;  // the plain norm
      for (const auto& [name, norm] : norms) {
        INFO(nn::activation_name(act) << " after " << name << " norm" << (with_res ? " plus a residual" : ""));
        auto run = [&](bool fused) {
          V x = rnd<T, 4>({2, 4, 5, 3}, 7, true, RandomInit::uniform(-1, 2));
          V r = rnd<T, 4>({2, 4, 5, 3}, 8, true, RandomInit::uniform(-1.5, 1.5));
          w.zero_grad();
          b.zero_grad();
          w3.zero_grad();
          b3.zero_grad();
          V y = fused ? norm(x, code, with_res ? OptV(r) : std::nullopt)
                      : nn::activate(act, with_res ? F::add(norm(x, F::NormAct::none, std::nullopt), r)
                                                   : norm(x, F::NormAct::none, std::nullopt));
          F::sum(F::mul(y, V(gy, false))).backward();
          auto grad_of = [](const auto& p) {  // an unused operand: zeros
            using P = std::decay_t<decltype(p.value().local())>;
            return p.has_grad() ? p.grad().local().contiguous() : P::zeros(p.value().local().shape());
          };
          const bool last = std::string(name) == "layer over the last dim";
          return std::tuple{y.value().local().contiguous(), x.grad().local().contiguous(), grad_of(last ? w3 : w),
                            grad_of(last ? b3 : b), grad_of(r)};
        };
        const auto [yf, dxf, dwf, dbf, drf] = run(true);
        const auto [yu, dxu, dwu, dbu, dru] = run(false);
        auto close = [&](const auto& a, const auto& e, const char* what) {
          double worst = 0, scale = 1;
          for (index_t i = 0; i < e.numel(); ++i) scale = std::max(scale, std::abs(double(e.data()[i])));
          for (index_t i = 0; i < e.numel(); ++i)
            worst = std::max(worst, std::abs(double(a.data()[i]) - double(e.data()[i])));
          INFO(what << ": worst difference " << worst << " against a scale of " << scale);
          CHECK(worst <= tol * scale);
        };
        close(yf, yu, "y");
        close(dxf, dxu, "dx");
        close(dwf, dwu, "dw");
        close(dbf, dbu, "db");
        close(drf, dru, "the residual's gradient");
        if (with_res) CHECK(drf.numel() > 0);
      }
    }
  }
}

TEST_CASE("fused norm activations: finite differences (fp64, one rank) and the module path", "[nn][norm][fused][fd]") {
  Body<double> body = [](Ctx<double>& c) {
    auto x = c.act<4>({2, 4, 3, 3}, true, RandomInit::uniform(-1, 2));
    auto w = c.param<1>({4});
    auto b = c.param<1>({4});
    c.output(F::group_norm(x, 2, w, b, 1e-5, F::NormAct::silu));
    c.output(F::batch_norm(x, nullptr, nullptr, w, b, true, 0.1, 1e-5, F::NormAct::gelu));
    c.output(F::layer_norm(x, w, b, 1e-5, 1, F::NormAct::tanh));
    c.output(F::instance_norm(x, w, b, 1e-5, F::NormAct::sigmoid));
    c.output(F::group_norm(x, 1, std::nullopt, std::nullopt, 1e-5, F::NormAct::gelu_tanh));
    auto r = c.act<4>({2, 4, 3, 3}, true, RandomInit::uniform(-1, 1));  // a residual before the activation
    c.output(F::group_norm(x, 2, w, b, 1e-5, F::NormAct::silu, r));
    c.output(F::layer_norm(x, w, b, 1e-5, 1, F::NormAct::none, r));
  };
  test::fn::check_finite_differences(mesh1(), test::fn::reference_layout(), body, 40);

  // The module path: forward_act is one op (one tape node, not two) with the values of the module
  // followed by the activation; nn::norm_then_activate takes it where the fusion is on for the
  // tensor's device (by default CUDA only; SHARDTENSOR_FUSED_NORM_ACT=1 / 0 force it) and for
  // the affine norms only (Identity: the activation alone).
  nn::GroupNorm<double, 4> gn(mesh1(), 2, 4);
  nn::Identity<double, 4> id;
  auto x = rnd<double, 4>({2, 4, 3, 3}, 11);
  const auto fused = gn.forward_act(x, nn::Activation::silu);
  const auto two = nn::activate(nn::Activation::silu, gn.forward(x));
  CHECK(fused.node()->name == "group_norm");
  CHECK(two.node()->name == "silu");
  const auto a = fused.value().local().contiguous(), e = two.value().local().contiguous();
  for (index_t i = 0; i < a.numel(); ++i) CHECK(a.data()[i] == e.data()[i]);
  const auto chosen = nn::norm_then_activate<double, 4>(gn, nn::Activation::silu, x);
  CHECK(chosen.node()->name == (nn::fused_norm_act_on(Device::cpu()) ? "group_norm" : "silu"));
  CHECK(nn::fused_norm_act_on(Device::cuda(0)) == (std::getenv("SHARDTENSOR_FUSED_NORM_ACT") == nullptr ||
                                                   std::string(std::getenv("SHARDTENSOR_FUSED_NORM_ACT")) != "0"));
  const auto via_id = nn::norm_then_activate<double, 4>(id, nn::Activation::silu, x);
  CHECK(via_id.node()->name == "silu");
  // norm_add_activate: one op with the residual where the fusion is on, else norm, add, activation.
  auto r = rnd<double, 4>({2, 4, 3, 3}, 12);
  const auto three = nn::activate(nn::Activation::silu, F::add(gn.forward(x), r));
  const auto one = gn.forward_act(x, nn::Activation::silu, r);
  CHECK(one.node()->name == "group_norm");
  const auto a3 = one.value().local().contiguous(), e3 = three.value().local().contiguous();
  for (index_t i = 0; i < a3.numel(); ++i) CHECK(a3.data()[i] == e3.data()[i]);
  const auto chosen3 = nn::norm_add_activate<double, 4>(gn, nn::Activation::silu, x, r);
  CHECK(chosen3.node()->name == (nn::fused_norm_act_on(Device::cpu()) ? "group_norm" : "silu"));
}

TEST_CASE("a norm whose residual is its own input (y = act(norm(x) + x)) equals the separate ops",
          "[nn][norm][fused]") {
  // Both gradients reach x (through the norm and as the residual), accumulated on the leaf.
  const auto w = rnd<double, 1>({4}, 3, true, RandomInit::uniform(0.5, 1.5));
  const auto b = rnd<double, 1>({4}, 4);
  auto run = [&](bool fused) {
    auto x = rnd<double, 4>({2, 4, 5, 3}, 7, true, RandomInit::uniform(-1, 2));
    w.zero_grad();
    b.zero_grad();
    auto y = fused ? F::group_norm(x, 2, w, b, 1e-5, F::NormAct::silu, x)
                   : nn::activate(nn::Activation::silu, F::add(F::group_norm(x, 2, w, b), x));
    F::sum(F::mul(y, y)).backward();
    return std::tuple{y.value().local().contiguous(), x.grad().local().contiguous(), w.grad().local().contiguous(),
                      b.grad().local().contiguous()};
  };
  const auto [yf, dxf, dwf, dbf] = run(true);
  const auto [yu, dxu, dwu, dbu] = run(false);
  for (index_t i = 0; i < yu.numel(); ++i) CHECK(yf.data()[i] == yu.data()[i]);
  for (index_t i = 0; i < dxu.numel(); ++i) CHECK(std::abs(dxf.data()[i] - dxu.data()[i]) <= 1e-14);
  for (index_t i = 0; i < dwu.numel(); ++i) CHECK(dwf.data()[i] == dwu.data()[i]);
  for (index_t i = 0; i < dbu.numel(); ++i) CHECK(dbf.data()[i] == dbu.data()[i]);
}

namespace {
/// A user's activation module (its forward could be anything): never fused.
struct MyAct : nn::ActivationModule<double, 4> {
  MyAct() : nn::ActivationModule<double, 4>(nn::Activation::silu) {}
  autograd::Var<double, 4> forward(const autograd::Var<double, 4>& x) override { return F::tanh(x); }
};
}  // namespace

TEST_CASE("which activation modules a norm may fuse (Sequential)", "[nn][norm][fused]") {
  using nn::fusable_activation;
  CHECK(fusable_activation<double, 4>(nn::SiLU<double, 4>()) == F::NormAct::silu);
  CHECK(fusable_activation<double, 4>(nn::ReLU<double, 4>()) == F::NormAct::relu);
  CHECK(fusable_activation<double, 4>(nn::Tanh<double, 4>()) == F::NormAct::tanh);
  CHECK(fusable_activation<double, 4>(nn::Sigmoid<double, 4>()) == F::NormAct::sigmoid);
  CHECK(fusable_activation<double, 4>(nn::GELU<double, 4>()) == F::NormAct::gelu);
  CHECK(fusable_activation<double, 4>(nn::GELU<double, 4>(F::GeluApprox::tanh)) == F::NormAct::gelu_tanh);
  CHECK(fusable_activation<double, 4>(nn::ActivationModule<double, 4>(nn::Activation::gelu)) == F::NormAct::gelu);
  CHECK(fusable_activation<double, 4>(nn::Identity<double, 4>()) == F::NormAct::none);
  // GELU's tanh approximation has its own kind (it reported plain gelu before stop 45).
  CHECK(nn::GELU<double, 4>(F::GeluApprox::tanh).kind() == nn::Activation::gelu_tanh);
  CHECK(nn::GELU<double, 4>().kind() == nn::Activation::gelu);
  CHECK(std::string(nn::activation_name(nn::Activation::gelu_tanh)) == "gelu_tanh");
  CHECK(fusable_activation<double, 4>(nn::ActivationModule<double, 4>(nn::Activation::gelu_tanh)) ==
        F::NormAct::gelu_tanh);
  {
    autograd::Var<double, 4> x(DistTensor<double, 4>::random({1, 2, 3, 3}, mesh1(), {Replicate()}, 9), false);
    const auto got = nn::activate(nn::Activation::gelu_tanh, x).value().local();
    const auto want = F::gelu(x, F::GeluApprox::tanh).value().local();
    const auto exact = F::gelu(x).value().local();
    CHECK(max_rel_diff(got, want) == 0.0);
    CHECK(max_rel_diff(got, exact) > 0.0);
  }
  CHECK(fusable_activation<double, 4>(MyAct()) == F::NormAct::none);
  CHECK(fusable_activation<double, 4>(nn::GroupNorm<double, 4>(mesh1(), 2, 4)) == F::NormAct::none);
}

TEST_CASE("norms refuse bad input", "[nn][norm][errors]") {
  using V = autograd::Var<double, 4>;
  V x(DistTensor<double, 4>::random({2, 4, 3, 3}, mesh1(), {Replicate()}, 1), true);
  V xc(DistTensor<double, 4>::random({2, 4, 3, 3}, mesh1(), {Shard(1)}, 1), true);
  auto w3 = rnd<double, 1>({3}, 2);
  auto w4 = rnd<double, 1>({4}, 3);
  auto rm = DistTensor<double, 1>::zeros({4}, mesh1(), {Replicate()});
  auto rm3 = DistTensor<double, 1>::zeros({3}, mesh1(), {Replicate()});
  CHECK_THROWS_AS(F::batch_norm(x, &rm, &rm, w3, w4, true), shard::Error);   // 3 weights for 4 channels
  CHECK_THROWS_AS(F::batch_norm(x, &rm3, &rm3, w4, w4, true), shard::Error); // running stats of 3
  CHECK_THROWS_AS(F::batch_norm(x, nullptr, nullptr, w4, w4, false), shard::Error);  // eval without stats
  CHECK_THROWS_AS(F::group_norm(x, 3, w4, w4), shard::Error);                // 4 channels in 3 groups
  CHECK_THROWS_AS(F::group_norm(xc, 2, w4, w4), shard::Error);               // channels sharded
  CHECK_THROWS_AS(F::layer_norm(xc, w4, w4), shard::Error);
  CHECK_THROWS_AS(F::instance_norm(x, w3), shard::Error);
  CHECK_THROWS_AS(F::layer_norm(x, w4, std::nullopt, 1e-5, -1), shard::Error);  // last dim has 3, not 4
  // A fused activation the norm kernels do not know.
  CHECK_THROWS_AS(F::group_norm(x, 2, w4, w4, 1e-5, static_cast<F::NormAct>(3)), shard::Error);
  // A residual of another shape or layout than the input.
  V r3(DistTensor<double, 4>::random({2, 4, 3, 2}, mesh1(), {Replicate()}, 4), true);
  CHECK_THROWS_AS(F::group_norm(x, 2, w4, w4, 1e-5, F::NormAct::silu, r3), shard::Error);
  CHECK_THROWS_AS(F::group_norm(x, 2, w4, w4, 1e-5, F::NormAct::silu, xc), shard::Error);
}

}  // namespace st_nn_test_norm
