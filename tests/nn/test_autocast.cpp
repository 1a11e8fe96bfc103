// shard::Autocast (nn/functional/autocast.hpp; issue 18 item 1): a scoped compute-dtype policy for
// f32 models. Inside the scope the autocast families (conv, conv_transpose, linear,
// channel_linear, ring / Ulysses / neighbourhood attention) cast f32 operands to bf16 / f16 on the
// tape, compute there, and cast the result back; gradients come back in f32. Oracles:
//  - wiring (bitwise): the op under autocast equals the explicit route cast<f32>(op(cast<L>(..)))
//    in forward and every gradient;
//  - accuracy: against the f32 op, within c * u * (|y| + m) with m the op on |inputs| (the
//    inputs' and output's roundings; u = 2^-8 bf16, 2^-11 f16);
//  - scope: outside it, under Autocast(f32), and for f64 operands, results are the plain ones
//    bit for bit; bad policies are a shard::Error.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstring>

#include "shardtensor/nn/functional.hpp"
#include "shardtensor/nn/unet.hpp"
#include "shardtensor/shardtensor.hpp"

namespace st_nn_test_autocast {

using namespace shard;
namespace F = shard::nn::functional;
using autograd::Var;
using Catch::Matchers::ContainsSubstring;

namespace {

const DeviceMesh& mesh1() {
  static DeviceMesh m(std::make_shared<SelfComm>(), {1});
  return m;
}
template <class T, int R>
DistTensor<T, R> rnd(const Shape<R>& s, std::uint64_t seed) {
  return DistTensor<T, R>::random(s, mesh1(), {Replicate()}, seed, RandomInit::uniform(-1, 1));
}
template <class L> constexpr double unit_roundoff() { return std::is_same_v<L, bf16> ? 1.0 / 256 : 1.0 / 2048; }

template <class T, int R>
bool bit_equal(const DistTensor<T, R>& a, const DistTensor<T, R>& b) {
  const auto x = a.local().contiguous(), y = b.local().contiguous();
  return x.numel() == y.numel() && std::memcmp(x.data(), y.data(), sizeof(T) * static_cast<std::size_t>(x.numel())) == 0;
}

/// max |a - b| / (|b| + m) over the elements (m: the magnitude term).
template <int R>
double worst_rel(const DistTensor<float, R>& a, const DistTensor<float, R>& b, const DistTensor<float, R>& m) {
  const auto x = a.local(), y = b.local(), z = m.local();
  double w = 0;
  for (index_t i = 0; i < x.numel(); ++i)
    w = std::max(w, std::fabs(double(x.data()[i]) - y.data()[i]) / (std::fabs(y.data()[i]) + z.data()[i] + 1e-30));
  return w;
}

template <int R>
DistTensor<float, R> abs_of(const DistTensor<float, R>& t) {
  auto y = t.redistribute(t.placements());
  auto l = y.local();
  for (index_t i = 0; i < l.numel(); ++i) l.data()[i] = std::fabs(l.data()[i]);
  return y;
}

/// Runs op over f32 leaves (x, w, b) three ways: under Autocast(L), explicitly through casts to
/// L, and plainly in f32; returns the three outputs and x/w/b gradients (seeded with g).
template <class L, int RX, int RW, class Op>
void check_family(const char* name, Op op, const Shape<RX>& xs, const Shape<RW>& ws, index_t nb, const Shape<RX>& ys,
                  double c) {
  INFO(name << " in " << dtype_name(dtype_of<L>));
  const auto x = rnd<float, RX>(xs, 1), w = rnd<float, RW>(ws, 2), b = rnd<float, 1>({nb}, 3);
  const auto g = rnd<float, RX>(ys, 4);
  struct Out {
    DistTensor<float, RX> y, dx;
    DistTensor<float, RW> dw;
    DistTensor<float, 1> db;
  };
  auto run = [&](int mode) {  // 0: autocast, 1: explicit casts, 2: plain f32
    Var<float, RX> xv(x, true);
    Var<float, RW> wv(w, true);
    Var<float, 1> bv(b, true);
    Var<float, RX> y;
    if (mode == 0) {
      Autocast ac(dtype_of<L>);
      CHECK(autocast_dtype() == dtype_of<L>);
      y = op(xv, wv, bv);
    } else if (mode == 1) {
      y = F::cast<float>(op(F::cast<L>(xv), F::cast<L>(wv), F::cast<L>(bv)));
    } else {
      y = op(xv, wv, bv);
    }
    F::sum(F::mul(y, Var<float, RX>(g, false))).backward();
    return Out{y.value(), xv.grad(), wv.grad(), bv.grad()};
  };
  const Out a = run(0), e = run(1), f = run(2);
  CHECK(autocast_dtype() == DType::f32);  // restored at the end of the scope
  // wiring: bit for bit the explicit cast route, forward and every gradient (all f32)
  CHECK(bit_equal(a.y, e.y));
  CHECK(bit_equal(a.dx, e.dx));
  CHECK(bit_equal(a.dw, e.dw));
  CHECK(bit_equal(a.db, e.db));
  // accuracy of the forward against f32: m = the op on |x|, |w|, |b|
  Var<float, RX> ax(abs_of(x), false);
  Var<float, RW> aw(abs_of(w), false);
  Var<float, 1> ab(abs_of(b), false);
  const auto m = op(ax, aw, ab).value();
  const double worst = worst_rel(a.y, f.y, m);
  INFO("worst |autocast - f32| / (|f32| + m) = " << worst);
  CHECK(worst <= c * unit_roundoff<L>());
  CHECK(worst > 0);  // really computed in L
}

}  // namespace

TEMPLATE_TEST_CASE("autocast: conv, conv_transpose, linear, channel_linear compute in bf16 / f16 on f32 operands",
                   "[autocast][precision][nn]", bf16, f16) {
  using L = TestType;
  check_family<L, 4, 4>(
      "conv2d",
      [](const auto& x, const auto& w, const auto& b) { return F::conv2d(x, w, b, F::ConvOptions<2>::symmetric(1)); },
      Shape<4>{2, 6, 10, 9}, Shape<4>{5, 6, 3, 3}, 5, Shape<4>{2, 5, 10, 9}, 3.0);
  check_family<L, 5, 5>(
      "conv3d",
      [](const auto& x, const auto& w, const auto& b) { return F::conv3d(x, w, b, F::ConvOptions<3>::symmetric(1)); },
      Shape<5>{1, 3, 6, 5, 4}, Shape<5>{4, 3, 3, 3, 3}, 4, Shape<5>{1, 4, 6, 5, 4}, 3.0);
  check_family<L, 4, 4>(
      "conv_transpose2d",
      [](const auto& x, const auto& w, const auto& b) {
        F::ConvTransposeOptions<2> o;
        o.stride = {2, 2};
        return F::conv_transpose2d(x, w, b, o);
      },
      Shape<4>{1, 4, 5, 6}, Shape<4>{4, 3, 2, 2}, 3, Shape<4>{1, 3, 10, 12}, 3.0);
  check_family<L, 4, 2>(
      "channel_linear", [](const auto& x, const auto& w, const auto& b) { return F::channel_linear(x, w, b); },
      Shape<4>{2, 7, 5, 3}, Shape<2>{4, 7}, 4, Shape<4>{2, 4, 5, 3}, 3.0);
  check_family<L, 3, 2>(
      "linear", [](const auto& x, const auto& w, const auto& b) { return F::linear(x, w, b); }, Shape<3>{2, 9, 12},
      Shape<2>{5, 12}, 5, Shape<3>{2, 9, 5}, 3.0);
}

TEMPLATE_TEST_CASE("autocast: attention computes in bf16 / f16 with f32 statistics, gradients in f32",
                   "[autocast][precision][nn]", bf16, f16) {
  using L = TestType;
  const double u = unit_roundoff<L>();
  const auto q = rnd<float, 4>({1, 20, 2, 8}, 11), k = rnd<float, 4>({1, 20, 2, 8}, 12),
             v = rnd<float, 4>({1, 20, 2, 8}, 13), g = rnd<float, 4>({1, 20, 2, 8}, 14);
  for (int fam = 0; fam < 3; ++fam) {
    INFO((fam == 0 ? "ring_attention" : fam == 1 ? "ulysses_attention" : "neighborhood_attention") << " in "
                                                                                                   << dtype_name(dtype_of<L>));
    auto att = [&](const auto& a, const auto& b, const auto& c) {
      if (fam == 0) return F::ring_attention(a, b, c);
      if (fam == 1) return F::ulysses_attention(a, b, c);
      return F::neighborhood_attention(a, b, c, F::NeighborhoodOptions{.window = {7}});
    };
    auto run = [&](int mode) {
      Var<float, 4> qv(q, true), kv(k, true), vv(v, true);
      Var<float, 4> y;
      if (mode == 0) {
        Autocast ac(dtype_of<L>);
        y = att(qv, kv, vv);
      } else if (mode == 1) {
        y = F::cast<float>(att(F::cast<L>(qv), F::cast<L>(kv), F::cast<L>(vv)));
      } else {
        y = att(qv, kv, vv);
      }
      F::sum(F::mul(y, Var<float, 4>(g, false))).backward();
      return std::vector<DistTensor<float, 4>>{y.value(), qv.grad(), kv.grad(), vv.grad()};
    };
    const auto a = run(0), e = run(1), f = run(2);
    const char* what[] = {"out", "dq", "dk", "dv"};
    for (std::size_t t = 0; t < 4; ++t) {
      INFO(what[t]);
      CHECK(bit_equal(a[t], e[t]));
      const auto x = a[t].local(), y = f[t].local();
      double mx = 0, err = 0;
      for (index_t i = 0; i < y.numel(); ++i) {
        mx = std::max(mx, double(std::fabs(y.data()[i])));
        err = std::max(err, std::fabs(double(x.data()[i]) - y.data()[i]));
      }
      INFO("max error " << err << ", max |f32| " << mx);
      // the inputs are rounded here too (unlike the storage-dtype test): a few more roundings
      CHECK(err <= (t == 0 ? 4.0 : 24.0) * u * mx);
      CHECK(err > 0);
    }
  }
}

TEST_CASE("autocast: scope, nesting, f64 operands and other families are untouched", "[autocast][precision][nn]") {
  const auto x = rnd<float, 4>({1, 3, 8, 8}, 21), w = rnd<float, 4>({2, 3, 3, 3}, 22);
  const auto opt = F::ConvOptions<2>::symmetric(1);
  auto conv = [&] { return F::conv2d(Var<float, 4>(x), Var<float, 4>(w), std::nullopt, opt).value(); };
  const auto plain = conv();
  {
    Autocast ac(DType::bf16);
    const auto on = conv();
    CHECK_FALSE(bit_equal(on, plain));
    {
      Autocast off(DType::f32);  // nested: off inside
      CHECK(autocast_dtype() == DType::f32);
      CHECK(bit_equal(conv(), plain));
    }
    CHECK(autocast_dtype() == DType::bf16);
    CHECK(bit_equal(conv(), on));
    // f64 operands are not autocast
    const auto xd = shard::cast<double>(x), wd = shard::cast<double>(w);
    const auto yd = F::conv2d(Var<double, 4>(xd), Var<double, 4>(wd), std::nullopt, opt).value();
    Autocast off(DType::f32);
    CHECK(bit_equal(yd, F::conv2d(Var<double, 4>(xd), Var<double, 4>(wd), std::nullopt, opt).value()));
  }
  CHECK(autocast_dtype() == DType::f32);
  CHECK(bit_equal(conv(), plain));
  // other families stay f32 inside the scope (here: a norm and a pointwise op)
  {
    const auto gn = F::group_norm(Var<float, 4>(x), 3).value();
    const auto sg = F::silu(Var<float, 4>(x)).value();
    Autocast ac(DType::bf16);
    CHECK(bit_equal(F::group_norm(Var<float, 4>(x), 3).value(), gn));
    CHECK(bit_equal(F::silu(Var<float, 4>(x)).value(), sg));
  }
  // bad policies
  for (DType bad : {DType::f64, DType::i32, DType::c64})
    CHECK_THROWS_WITH(Autocast(bad), ContainsSubstring("Autocast") && ContainsSubstring("bf16 or f16"));
  CHECK(autocast_dtype() == DType::f32);
}

TEST_CASE("autocast: an f32 U-Net trains under Autocast(bf16) with f32 gradients close to f32's",
          "[autocast][precision][nn]") {
  nn::UNetOptions uo;
  uo.in_channels = 1;
  uo.out_channels = 1;
  uo.base_width = 8;
  uo.depth = 2;
  nn::UNet<float, 2> model(mesh1(), uo, 5);
  const auto x = rnd<float, 4>({2, 1, 32, 32}, 31), y = rnd<float, 4>({2, 1, 32, 32}, 32);
  auto grads = [&](bool ac) {
    model.zero_grad();
    Var<float, 1> loss;
    {
      std::optional<Autocast> scope;
      if (ac) scope.emplace(DType::bf16);
      loss = F::mse_loss(model.forward(Var<float, 4>(x)), Var<float, 4>(y));
    }
    loss.backward();  // outside the scope: backward follows the recorded casts
    std::vector<double> gn;
    for (auto& p : model.parameters()) {
      const auto gf = p->full_grad_host();  // f32: the masters' gradients
      double s = 0;
      for (index_t i = 0; i < gf.numel(); ++i) s += double(gf.data()[i]) * gf.data()[i];
      gn.push_back(s);
    }
    return std::make_pair(static_cast<double>(loss.value().local().data()[0]), gn);
  };
  const auto [v32, g32] = grads(false);
  const auto [vbf, gbf] = grads(true);
  INFO("loss f32 " << v32 << ", autocast bf16 " << vbf);
  CHECK(std::fabs(vbf - v32) <= 2e-2 * v32);
  CHECK(vbf != v32);
  REQUIRE(g32.size() == gbf.size());
  for (std::size_t i = 0; i < g32.size(); ++i) {
    INFO("parameter " << i << ": |g|^2 f32 " << g32[i] << ", autocast " << gbf[i]);
    CHECK(std::isfinite(gbf[i]));
    CHECK(std::fabs(std::sqrt(gbf[i]) - std::sqrt(g32[i])) <= 5e-2 * std::sqrt(g32[i]) + 1e-6);
  }
}

}  // namespace st_nn_test_autocast
