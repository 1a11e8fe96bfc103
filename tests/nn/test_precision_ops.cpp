// Mixed precision, op family by op family, at one rank (the sharded cases: mpi_precision.cpp).
// bf16 / f16 are storage dtypes computed in f32 (exec/precision.hpp), so two oracles apply:
//  - emulation (bitwise): an op on bf16 operands equals the f32 op on the same values widened,
//    rounded once; its input and parameter gradients likewise equal the f32 gradients rounded;
//  - accuracy: against the f32 op on the UNROUNDED inputs, within c * u * (|y| + m), u the
//    dtype's unit roundoff (2^-8 bf16, 2^-11 f16) and m the op applied to |inputs| where the op is
//    a sum of products with positive weights (conv, linear, pooling, interpolation, mul, sum):
//    each product carries the two input roundings and the output one rounding (c = 3); norms and
//    activations use m = |x|. For f16 the bound adds c times half its subnormal spacing (values
//    below 6.1e-5 round with an absolute, not a relative, error).
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstring>
#include <tuple>

#include "shardtensor/shardtensor.hpp"
#include "shardtensor/exec/conv.hpp"
#include "shardtensor/exec/pointwise.hpp"
#include "shardtensor/nn/functional.hpp"
#include "shardtensor/nn/fno.hpp"
#include "shardtensor/nn/layers.hpp"

namespace st_nn_test_precision_ops {

using namespace shard;
namespace F = shard::nn::functional;
using autograd::Var;

namespace {

const DeviceMesh& mesh1() {
  static DeviceMesh m(std::make_shared<SelfComm>(), {1});
  return m;
}
template <int R>
DistTensor<float, R> rnd(const Shape<R>& s, std::uint64_t seed, double lo = -1, double hi = 1) {
  return DistTensor<float, R>::random(s, mesh1(), {Replicate()}, seed, RandomInit::uniform(lo, hi));
}
template <class L> constexpr double unit_roundoff() { return std::is_same_v<L, bf16> ? 1.0 / 256 : 1.0 / 2048; }
/// Half the spacing of the dtype's subnormals: the absolute error of rounding a value below the
/// normal range (f16 from 6.1e-5 down; large tensors of uniform values have some there).
template <class L> constexpr double subnormal_half_ulp() { return std::is_same_v<L, bf16> ? 0.0 : 0x1p-25; }

template <class L, int R>
Var<float, R> widened_leaf(const Var<L, R>& v) {
  return Var<float, R>(shard::cast<float>(v.value()), true);
}
template <class T, int R>
DistTensor<float, R> abs_of(const DistTensor<T, R>& x) {
  auto y = shard::cast<float>(x);
  auto l = y.local();
  for (index_t i = 0; i < l.numel(); ++i) l.data()[i] = std::fabs(l.data()[i]);
  return y;
}
/// got == rounded(want), bit for bit.
template <class L, int R>
void require_rounded_equal(const DistTensor<L, R>& got, const DistTensor<float, R>& want, const char* what) {
  const auto w = shard::cast<L>(want);
  const auto g = got.local().contiguous(), wl = w.local().contiguous();
  REQUIRE(g.numel() == wl.numel());
  index_t bad = 0, first = -1;
  for (index_t i = 0; i < g.numel(); ++i)
    if (g.data()[i].bits != wl.data()[i].bits) {
      if (first < 0) first = i;
      ++bad;
    }
  INFO(what << ": " << bad << " of " << g.numel() << " elements differ from the rounded f32 result (first at "
            << first << ")");
  CHECK(bad == 0);
}

enum class Mag { abs_op, abs_x };
template <class V> struct var_rank;
template <class T, int R> struct var_rank<Var<T, R>> { static constexpr int value = R; };

/// Runs `op` (a generic lambda over Vars of one dtype) on L operands made from `inputs`, on their
/// widened f32 copies and on the unrounded f32 inputs; checks the emulation oracle for the output
/// and every input gradient, and the accuracy bound for the output.
/// |got - want| <= c u (|want| + m) elementwise (the accuracy oracle), for L results.
template <class L, int R>
double worst_ratio(const DistTensor<L, R>& got, const DistTensor<float, R>& want, const DistTensor<float, R>& m,
                   double c) {
  const auto gl = shard::cast<float>(got).local(), wl = want.local(), ml = m.local();
  double worst = 0;
  for (index_t i = 0; i < gl.numel(); ++i) {
    const double err = std::fabs(double(gl.data()[i]) - wl.data()[i]);
    const double tol = c * (unit_roundoff<L>() * (std::fabs(wl.data()[i]) + ml.data()[i]) + subnormal_half_ulp<L>()) + 1e-30;
    worst = std::max(worst, err / tol);
  }
  return worst;
}

/// exact_grads = false for ops whose backward is two rounded steps (a broadcast operand's
/// gradient: the product, then its sum over the broadcast dims): their input gradients are
/// checked against the accuracy bound, with m = the gradient of the op on |inputs| seeded by |g|.
template <class L, class Op, int... Rs>
void check_op(const char* name, Op op, double c, Mag mag, bool exact_grads, const DistTensor<float, Rs>&... inputs) {
  INFO("op " << name << ", dtype " << dtype_name(dtype_of<L>));
  const double u = unit_roundoff<L>();
  auto lp = std::make_tuple(Var<L, Rs>(shard::cast<L>(inputs), true)...);
  auto up = std::apply([](const auto&... v) { return std::make_tuple(widened_leaf(v)...); }, lp);
  auto y = std::apply(op, lp);
  auto y32 = std::apply(op, up);
  constexpr int RO = var_rank<std::remove_cvref_t<decltype(y32)>>::value;
  require_rounded_equal(y.value(), y32.value(), "forward");
  // Gradients: seed g (representable in L) through sum(y * g) in both precisions.
  const auto g = shard::cast<L>(rnd<RO>(y32.value().global_shape(), 991));
  F::sum(F::mul(y, Var<L, RO>(g, false))).backward();
  F::sum(F::mul(y32, Var<float, RO>(shard::cast<float>(g), false))).backward();
  if (exact_grads) {
    std::apply(
        [&](const auto&... a) {
          std::apply([&](const auto&... b) { (require_rounded_equal(a.grad(), b.grad(), "gradient"), ...); }, up);
        },
        lp);
  } else {
    auto absv = std::make_tuple(Var<float, Rs>(abs_of(inputs), true)...);
    F::sum(F::mul(std::apply(op, absv), Var<float, RO>(abs_of(g), false))).backward();
    std::apply(
        [&](const auto&... a) {
          std::apply(
              [&](const auto&... b) {
                std::apply(
                    [&](const auto&... m) {
                      double w = 0;
                      ((w = std::max(w, worst_ratio(a.grad(), b.grad(), m.grad(), 2 * c))), ...);
                      INFO("worst gradient error / bound = " << w);
                      CHECK(w <= 1.0);
                    },
                    absv);
              },
              up);
        },
        lp);
  }
  // Accuracy against the unrounded inputs.
  auto ref = std::apply(op, std::make_tuple(Var<float, Rs>(inputs, false)...));
  const DistTensor<float, RO> m =
      mag == Mag::abs_op ? std::apply(op, std::make_tuple(Var<float, Rs>(abs_of(inputs), false)...)).value()
                         : abs_of(std::get<0>(std::make_tuple(inputs...)));
  const auto yl = shard::cast<float>(y.value()).local(), rl = ref.value().local(), ml = m.local();
  double worst = 0;
  for (index_t i = 0; i < yl.numel(); ++i) {
    const double err = std::fabs(double(yl.data()[i]) - rl.data()[i]);
    const double tol = c * (u * (std::fabs(rl.data()[i]) + ml.data()[i]) + subnormal_half_ulp<L>()) + 1e-30;
    worst = std::max(worst, err / tol);
  }
  INFO("worst error / bound = " << worst);
  CHECK(worst <= 1.0);
  CHECK(worst > 0.0);  // the bound is exercised: bf16 / f16 really rounded something
}

}  // namespace

TEMPLATE_TEST_CASE("precision: every op family in bf16 / f16 against f32", "[precision][nn]", bf16, f16) {
  using L = TestType;
  // The emulation oracle is exact for the widened kernels; bf16 conv on AMX tiles sums in another
  // order and is checked against them in tests/exec/test_conv_native_low_precision.cpp.
  ExecContext widened;
  widened.settings().native_low_precision = false;
  ContextGuard guard(widened);
  const auto x4 = rnd<4>({2, 4, 9, 8}, 1), w4 = rnd<4>({6, 4, 3, 3}, 2, -0.3, 0.3);
  const auto b1 = rnd<1>({6}, 3, -0.2, 0.2);
  SECTION("conv2d (halo padding 1, bias)") {
    check_op<L>("conv2d", [](const auto& x, const auto& w, const auto& b) {
      return F::conv(x, w, std::optional(b), F::ConvOptions<2>::symmetric(1));
    }, 3, Mag::abs_op, true, x4, w4, b1);
  }
  SECTION("conv3d, stride 2") {
    const auto x5 = rnd<5>({1, 3, 7, 6, 5}, 4), w5 = rnd<5>({4, 3, 3, 3, 3}, 5, -0.3, 0.3);
    check_op<L>("conv3d", [](const auto& x, const auto& w) {
      return F::conv(x, w, std::nullopt, F::ConvOptions<3>::symmetric(1, 2));
    }, 3, Mag::abs_op, true, x5, w5);
  }
  SECTION("conv_transpose2d, stride 2") {
    const auto wt = rnd<4>({4, 6, 2, 2}, 6, -0.3, 0.3);
    check_op<L>("conv_transpose2d", [](const auto& x, const auto& w) {
      F::ConvTransposeOptions<2> o;
      o.stride = {2, 2};
      return F::conv_transpose(x, w, std::nullopt, o);
    }, 3, Mag::abs_op, true, x4, wt);
  }
  SECTION("channel linear (GEMM)") {
    const auto wl = rnd<2>({5, 4}, 7, -0.5, 0.5);
    const auto bl = rnd<1>({5}, 8, -0.2, 0.2);
    check_op<L>("channel_linear", [](const auto& x, const auto& w, const auto& b) {
      return F::channel_linear(x, w, std::optional(b));
    }, 3, Mag::abs_op, true, x4, wl, bl);
  }
  SECTION("group_norm with affine parameters") {
    const auto wn = rnd<1>({4}, 9, 0.5, 1.5), bn = rnd<1>({4}, 10, -0.5, 0.5);
    check_op<L>("group_norm", [](const auto& x, const auto& w, const auto& b) {
      return F::group_norm(x, 2, std::optional(w), std::optional(b));
    }, 32, Mag::abs_x, true, x4, wn, bn);  // c 32: normalising amplifies input rounding by |x| / sigma
  }
  SECTION("batch_norm: training, f32 running statistics, then eval") {
    const auto wn = rnd<1>({4}, 12, 0.5, 1.5), bn = rnd<1>({4}, 13, -0.5, 0.5);
    auto stat = [](float v) {
      auto t = DistTensor<float, 1>::zeros({4}, mesh1(), {Replicate()});
      t.local().fill(v);
      return t;
    };
    // each call with fresh running statistics (master_t: f32 buffers for every model dtype)
    check_op<L>("batch_norm", [&](const auto& x, const auto& w, const auto& b) {
      auto rm = stat(0.f), rv = stat(1.f);
      return F::batch_norm(x, &rm, &rv, std::optional(w), std::optional(b), true);
    }, 32, Mag::abs_x, true, x4, wn, bn);
    // The running statistics of the bf16 / f16 model are updated from the same f64 statistics as
    // the f32 model's on the widened values: the same f32 bits. Eval then normalises with them:
    // the rounded f32 eval result.
    const auto xl = shard::cast<L>(x4);
    auto rm_l = stat(0.25f), rv_l = stat(2.f), rm_f = stat(0.25f), rv_f = stat(2.f);
    for (int step = 0; step < 3; ++step) {
      F::batch_norm(Var<L, 4>(xl, false), &rm_l, &rv_l, std::nullopt, std::nullopt, true, 0.3);
      F::batch_norm(Var<float, 4>(shard::cast<float>(xl), false), &rm_f, &rv_f, std::nullopt, std::nullopt, true, 0.3);
    }
    const auto a = rm_l.local(), b = rm_f.local(), c = rv_l.local(), d = rv_f.local();
    for (index_t i = 0; i < 4; ++i) {
      CHECK(std::memcmp(&a.data()[i], &b.data()[i], sizeof(float)) == 0);
      CHECK(std::memcmp(&c.data()[i], &d.data()[i], sizeof(float)) == 0);
    }
    CHECK(a.data()[0] != 0.25f);  // really updated
    const auto ye = F::batch_norm(Var<L, 4>(xl, false), &rm_l, &rv_l, std::nullopt, std::nullopt, false).value();
    const auto yf =
        F::batch_norm(Var<float, 4>(shard::cast<float>(xl), false), &rm_f, &rv_f, std::nullopt, std::nullopt, false).value();
    require_rounded_equal(ye, yf, "batch_norm eval");
  }
  SECTION("layer_norm over channels") {
    check_op<L>("layer_norm", [](const auto& x) { return F::layer_norm(x, std::nullopt, std::nullopt); }, 32,
                Mag::abs_x, true, x4);
  }
  SECTION("silu and gelu") {
    check_op<L>("silu", [](const auto& x) { return F::silu(x); }, 4, Mag::abs_x, true, x4);
    check_op<L>("gelu", [](const auto& x) { return F::gelu(x); }, 4, Mag::abs_x, true, x4);
  }
  SECTION("broadcast mul and add") {
    const auto s = rnd<4>({1, 4, 1, 8}, 11);
    check_op<L>("mul", [](const auto& a, const auto& b) { return F::mul(a, b); }, 3, Mag::abs_op, false, x4, s);
    check_op<L>("add", [](const auto& a, const auto& b) { return F::add(a, b); }, 3, Mag::abs_op, false, x4, s);
  }
  SECTION("pooling and upsampling") {
    PoolParams<2> p;
    p.kernel = {2, 2};
    check_op<L>("avg_pool2d", [p](const auto& x) { return F::avg_pool(x, p); }, 3, Mag::abs_op, true, x4);
    check_op<L>("max_pool2d", [p](const auto& x) { return F::max_pool(x, p); }, 3, Mag::abs_op, true, x4);
    check_op<L>("upsample_linear", [](const auto& x) { return F::upsample_linear(x, Shape<2>{2, 2}); }, 3,
                Mag::abs_op, true, x4);
  }
  SECTION("large tensors: the storage dtype in place (elementwise, norms, pooling, upsampling)") {
    // > 2^18 elements: unary / binary ops, norms, pooling and resize read and write the storage
    // dtype in place (their CPU tables' takes_storage / native_low_precision); the emulation
    // oracle stays bit for bit.
    const auto xl = rnd<4>({2, 8, 144, 128}, 21), yl = rnd<4>({2, 8, 144, 128}, 22, 0.5, 1.5);
    check_op<L>("silu (large)", [](const auto& x) { return F::silu(x); }, 4, Mag::abs_x, true, xl);
    check_op<L>("mul (large)", [](const auto& a, const auto& b) { return F::mul(a, b); }, 3, Mag::abs_op, true, xl, yl);
    check_op<L>("div (large)", [](const auto& a, const auto& b) { return F::div(a, b); }, 4, Mag::abs_op, true, xl, yl);
    PoolParams<2> p;
    p.kernel = {2, 2};
    check_op<L>("avg_pool2d (large)", [p](const auto& x) { return F::avg_pool(x, p); }, 3, Mag::abs_op, true, xl);
    check_op<L>("max_pool2d (large)", [p](const auto& x) { return F::max_pool(x, p); }, 3, Mag::abs_op, true, xl);
    check_op<L>("upsample_nearest (large)", [](const auto& x) { return F::upsample_nearest(x, Shape<2>{2, 2}); },
                3, Mag::abs_op, true, xl);
    const auto wn = rnd<1>({8}, 23, 0.5, 1.5), bn = rnd<1>({8}, 24, -0.5, 0.5);
    check_op<L>("group_norm (in place)", [](const auto& x, const auto& w, const auto& b) {
      return F::group_norm(x, 4, std::optional(w), std::optional(b));
    }, 32, Mag::abs_x, true, xl, wn, bn);
  }
  SECTION("sum over dims") {
    check_op<L>("sum", [](const auto& x) { return F::sum(x, std::vector<int>{2, 3}); }, 3, Mag::abs_op, true, x4);
  }
}

TEMPLATE_TEST_CASE("precision: a bf16 / f16 module keeps f32 masters; casts on the tape bring f32 gradients",
                   "[precision][nn]", bf16, f16) {
  using L = TestType;
  nn::Conv2d<L> conv(mesh1(), 4, 6, Shape<2>{3, 3}, F::ConvOptions<2>::symmetric(1), true, 42);
  nn::Conv2d<float> ref(mesh1(), 4, 6, Shape<2>{3, 3}, F::ConvOptions<2>::symmetric(1), true, 42);
  static_assert(std::is_same_v<typename nn::Conv2d<L>::param_type, float>);
  const auto ps = conv.named_parameters();
  REQUIRE(ps.size() == 2);
  // The same f32 initial values as the f32 module (masters are f32).
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const auto a = ps[i].param->full_value_host(), b = ref.named_parameters()[i].param->full_value_host();
    REQUIRE(a.numel() == b.numel());
    for (index_t k = 0; k < a.numel(); ++k) REQUIRE(a(k) == b(k));
  }
  const auto x = shard::cast<L>(rnd<4>({2, 4, 6, 6}, 5));
  auto y = conv(Var<L, 4>(x, false));
  F::sum(y).backward();
  // Oracle: F::conv on the weights rounded to L by hand; the master's gradient is the rounded
  // weight's gradient widened (the cast's backward).
  auto wl = Var<L, 4>(shard::cast<L>(conv.weight().value()), true);
  auto bl = Var<L, 1>(shard::cast<L>(conv.bias()->value()), true);
  auto y2 = F::conv(Var<L, 4>(x, false), wl, std::optional(bl), F::ConvOptions<2>::symmetric(1));
  F::sum(y2).backward();
  const auto gw = conv.weight().grad().local(), gw2 = shard::cast<float>(wl.grad()).local();
  REQUIRE(gw.numel() == gw2.numel());
  for (index_t k = 0; k < gw.numel(); ++k) REQUIRE(gw.data()[k] == gw2.data()[k]);
  const auto gb = conv.bias()->grad().local(), gb2 = shard::cast<float>(bl.grad()).local();
  for (index_t k = 0; k < gb.numel(); ++k) REQUIRE(gb.data()[k] == gb2.data()[k]);
}

TEST_CASE("precision: mixed storage dtypes are refused at the kernel fronts", "[precision][nn]") {
  auto& ctx = current_context(Device::cpu());
  auto xb = Tensor<bf16, 4>::empty({1, 2, 4, 4}, Device::cpu());
  auto wh = Tensor<f16, 4>::empty({2, 2, 3, 3}, Device::cpu());
  auto yb = Tensor<bf16, 4>::empty({1, 2, 2, 2}, Device::cpu());
  ConvGeometry g;
  CHECK_THROWS_WITH(exec::conv_forward(g, as_block(xb), as_block(wh), nullptr, as_block(yb), ctx),
                    Catch::Matchers::ContainsSubstring("conv_forward") &&
                        Catch::Matchers::ContainsSubstring("share one storage dtype"));
  auto af = Tensor<float, 1>::empty({4}, Device::cpu());
  auto ab = Tensor<bf16, 1>::empty({4}, Device::cpu());
  CHECK_THROWS_WITH(exec::binary(exec::BinaryOp::add, as_block(af), as_block(ab), as_block(ab), ctx),
                    Catch::Matchers::ContainsSubstring("add") && Catch::Matchers::ContainsSubstring("bf16"));
}

TEMPLATE_TEST_CASE("precision: attention (local, neighbourhood) in bf16 / f16 against f32", "[precision][nn]", bf16,
                   f16) {
  // The softmax statistics (lse) stay f32; out is rounded once; the backward reads the rounded
  // out (delta = dout . out), so the f32-emulation oracle is not bitwise here: bounds relative to
  // the largest magnitude, from u and the reduction length.
  using L = TestType;
  const double u = unit_roundoff<L>();
  const auto q = rnd<4>({1, 24, 2, 8}, 21), k = rnd<4>({1, 24, 2, 8}, 22), v = rnd<4>({1, 24, 2, 8}, 23);
  const auto g = shard::cast<L>(rnd<4>({1, 24, 2, 8}, 24));
  auto run = [&](auto tag, bool nbhd) {
    using T = decltype(tag);
    auto mk = [](const DistTensor<float, 4>& t) { return Var<T, 4>(shard::cast<T>(shard::cast<L>(t)), true); };
    auto qv = mk(q), kv = mk(k), vv = mk(v);
    auto y = nbhd ? F::neighborhood_attention(qv, kv, vv, F::NeighborhoodOptions{.window = {7}})
                  : F::ring_attention(qv, kv, vv);
    F::sum(F::mul(y, Var<T, 4>(shard::cast<T>(g), false))).backward();
    return std::vector<DistTensor<float, 4>>{shard::cast<float>(y.value()), shard::cast<float>(qv.grad()),
                                              shard::cast<float>(kv.grad()), shard::cast<float>(vv.grad())};
  };
  for (bool nbhd : {false, true}) {
    INFO((nbhd ? "neighborhood_attention" : "ring_attention (one rank: local)") << ", " << dtype_name(dtype_of<L>));
    const auto lo = run(L{}, nbhd), hi = run(float{}, nbhd);
    const char* what[] = {"out", "dq", "dk", "dv"};
    for (std::size_t t = 0; t < 4; ++t) {
      const auto a = lo[t].local(), b = hi[t].local();
      double mx = 0, err = 0;
      for (index_t i = 0; i < b.numel(); ++i) {
        mx = std::max(mx, double(std::fabs(b.data()[i])));
        err = std::max(err, std::fabs(double(a.data()[i]) - b.data()[i]));
      }
      INFO(what[t] << ": max error " << err << ", max |f32| " << mx);
      // out: one rounding of each weighted sum (plus the rounded inputs to the scores, which are
      // exact here: both runs start from the same L values); gradients: about 4 rounded steps.
      CHECK(err <= (t == 0 ? 2.0 : 16.0) * u * mx);
      CHECK(err > 0);  // the low-precision path really rounded
    }
  }
}

TEMPLATE_TEST_CASE("precision: native channel mixing (1x1 conv) and token linear (row chunks) agree with the GEMM route",
                   "[precision][linear]", bf16, f16) {
  // ExecSettings::native_low_precision routes bf16 / f16 channel_linear on the CPU through the conv
  // table (AMX tiles for bf16 where the CPU has them) without whole-tensor f32 copies; the GEMM
  // route (setting off) is the emulation oracle. Both sum exact products in f32 and round once,
  // so they agree within 2 u |ref| + 2 K 2^-24 m (K = the reduction length, m = |op| on |inputs|).
  using L = TestType;
  const double u = unit_roundoff<L>();
  const auto x = rnd<4>({3, 40, 9, 11}, 31);
  const auto w = rnd<2>({36, 40}, 32, -0.3, 0.3);
  const auto b = rnd<1>({36}, 33, -0.2, 0.2);
  const auto g = shard::cast<L>(rnd<4>({3, 36, 9, 11}, 34));
  struct Out {
    DistTensor<float, 4> y, gx;
    DistTensor<float, 2> gw;
    DistTensor<float, 1> gb;
  };
  auto run = [&](bool native, bool absolute) {
    ExecContext ctx;
    ctx.settings().native_low_precision = native;
    ContextGuard guard(ctx);
    Var<L, 4> xv(shard::cast<L>(absolute ? abs_of(x) : x), true);
    Var<L, 2> wv(shard::cast<L>(absolute ? abs_of(w) : w), true);
    Var<L, 1> bv(shard::cast<L>(absolute ? abs_of(b) : b), true);
    auto y = F::channel_linear(xv, wv, std::optional(bv));
    F::sum(F::mul(y, Var<L, 4>(absolute ? shard::cast<L>(abs_of(g)) : g, false))).backward();
    return Out{shard::cast<float>(y.value()), shard::cast<float>(xv.grad()), shard::cast<float>(wv.grad()),
               shard::cast<float>(bv.grad())};
  };
  const Out nat = run(true, false), ref = run(false, false), mag = run(false, true);
  auto worst = [&](const auto& a, const auto& r, const auto& m, double k) {
    const auto al = a.local(), rl = r.local(), ml = m.local();
    double wr = 0;
    for (index_t i = 0; i < al.numel(); ++i) {
      const double tol = 2 * u * std::fabs(rl.data()[i]) + 2 * k * std::ldexp(1.0, -24) * ml.data()[i] + 1e-30;
      wr = std::max(wr, std::fabs(double(al.data()[i]) - rl.data()[i]) / tol);
    }
    return wr;
  };
  CHECK(worst(nat.y, ref.y, mag.y, 40) <= 1.0);
  CHECK(worst(nat.gx, ref.gx, mag.gx, 36) <= 1.0);
  CHECK(worst(nat.gw, ref.gw, mag.gw, 3 * 99) <= 1.0);
  CHECK(worst(nat.gb, ref.gb, mag.gb, 3 * 99) <= 1.0);

  // Tokens (linear over the last dim): the native route runs the GEMMs on f32 row chunks (2400
  // rows here, 1638 per chunk) and accumulates the weight gradient over the chunks in f32.
  const auto xt = rnd<3>({4, 600, 40}, 35);
  const auto gt = shard::cast<L>(rnd<3>({4, 600, 36}, 36));
  struct TOut {
    DistTensor<float, 3> y, gx;
    DistTensor<float, 2> gw;
    DistTensor<float, 1> gb;
  };
  auto run_tokens = [&](bool native, bool absolute) {
    ExecContext ctx;
    ctx.settings().native_low_precision = native;
    ContextGuard guard(ctx);
    Var<L, 3> xv(shard::cast<L>(absolute ? abs_of(xt) : xt), true);
    Var<L, 2> wv(shard::cast<L>(absolute ? abs_of(w) : w), true);
    Var<L, 1> bv(shard::cast<L>(absolute ? abs_of(b) : b), true);
    auto y = F::linear(xv, wv, std::optional(bv));
    F::sum(F::mul(y, Var<L, 3>(absolute ? shard::cast<L>(abs_of(gt)) : gt, false))).backward();
    return TOut{shard::cast<float>(y.value()), shard::cast<float>(xv.grad()), shard::cast<float>(wv.grad()),
                shard::cast<float>(bv.grad())};
  };
  const TOut tn = run_tokens(true, false), tr = run_tokens(false, false), tm = run_tokens(false, true);
  CHECK(worst(tn.y, tr.y, tm.y, 40) <= 1.0);
  CHECK(worst(tn.gx, tr.gx, tm.gx, 36) <= 1.0);
  CHECK(worst(tn.gw, tr.gw, tm.gw, 2400) <= 1.0);
  CHECK(worst(tn.gb, tr.gb, tm.gb, 2400) <= 1.0);
}

TEST_CASE("precision: a bf16 SpectralConv runs in f32 (FFTs, spectral multiply) and rounds once",
          "[precision][fno]") {
  // The policy of nn/fno.hpp: the layer widens its bf16 input on the tape, runs the f32 layer with
  // the f32 master weight and rounds the output once; the master's gradient is the f32 layer's
  // gradient for the widened output gradient.
  nn::SpectralConv<bf16, 2> lo(mesh1(), 3, 4, Shape<2>{3, 3}, 7);
  nn::SpectralConv<float, 2> hi(mesh1(), 3, 4, Shape<2>{3, 3}, 7);
  REQUIRE(lo.weight().value().global_shape() == hi.weight().value().global_shape());
  const auto xb = shard::cast<bf16>(rnd<4>({2, 3, 12, 10}, 41));
  const auto g = shard::cast<bf16>(rnd<4>({2, 4, 12, 10}, 42));
  auto ylo = lo.forward(Var<bf16, 4>(xb, false));
  auto yhi = hi.forward(Var<float, 4>(shard::cast<float>(xb), false));
  require_rounded_equal(ylo.value(), yhi.value(), "spectral conv forward");
  F::sum(F::mul(ylo, Var<bf16, 4>(g, false))).backward();
  F::sum(F::mul(yhi, Var<float, 4>(shard::cast<float>(g), false))).backward();
  const auto a = lo.weight().grad().local(), b = hi.weight().grad().local();
  REQUIRE(a.numel() == b.numel());
  double worst = 0, scale = 0;
  for (index_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, std::fabs(double(a.data()[i]) - b.data()[i]));
    scale = std::max(scale, std::fabs(double(b.data()[i])));
  }
  // the same f32 computation on the same values: equal up to f32 summation order (none here)
  CHECK(worst <= 1e-6 * scale);
  CHECK(scale > 0);
}

TEMPLATE_TEST_CASE("precision: bf16 / f16 attention in per-sample chunks equals the whole-tensor route",
                   "[precision][nn]", bf16, f16) {
  // With native_low_precision the attention front takes its f32 working copies a few samples at a
  // time (here one: a sample's [H, N, D] block is above 2^16 elements). Every sample is computed
  // on its own either way, so out and the gradients are bit for bit those of the whole-tensor route.
  using L = TestType;
  const auto q = rnd<4>({3, 2200, 2, 16}, 51), k = rnd<4>({3, 2200, 2, 16}, 52), v = rnd<4>({3, 2200, 2, 16}, 53);
  const auto g = shard::cast<L>(rnd<4>({3, 2200, 2, 16}, 54));
  auto run = [&](bool native) {
    ExecContext ctx;
    ctx.settings().native_low_precision = native;
    ContextGuard guard(ctx);
    auto mk = [](const DistTensor<float, 4>& t) { return Var<L, 4>(shard::cast<L>(t), true); };
    auto qv = mk(q), kv = mk(k), vv = mk(v);
    auto y = F::ring_attention(qv, kv, vv);
    F::sum(F::mul(y, Var<L, 4>(g, false))).backward();
    return std::vector<DistTensor<float, 4>>{shard::cast<float>(y.value()), shard::cast<float>(qv.grad()),
                                              shard::cast<float>(kv.grad()), shard::cast<float>(vv.grad())};
  };
  const auto chunked = run(true), whole = run(false);
  const char* what[] = {"out", "dq", "dk", "dv"};
  for (std::size_t t = 0; t < 4; ++t) {
    const auto a = chunked[t].local(), b = whole[t].local();
    REQUIRE(a.numel() == b.numel());
    index_t bad = 0;
    for (index_t i = 0; i < a.numel(); ++i) bad += std::memcmp(a.data() + i, b.data() + i, sizeof(float)) != 0;
    INFO(what[t] << ": " << bad << " of " << a.numel() << " elements differ");
    CHECK(bad == 0);
  }
}

TEMPLATE_TEST_CASE("precision: compute copies of parameters are converted once per step and refreshed after a step",
                   "[precision][nn]", bf16, f16) {
  using L = TestType;
  // A layer applied twice in one forward shares one converted weight; an optimiser step (a
  // version bump of the master) makes the next use convert again. Bit for bit the uncached route.
  nn::Conv2d<L> conv(mesh1(), 4, 4, Shape<2>{3, 3}, F::ConvOptions<2>::symmetric(1), true, 42);
  nn::Conv2d<L> nocache(mesh1(), 4, 4, Shape<2>{3, 3}, F::ConvOptions<2>::symmetric(1), true, 42);
  nocache.cache_compute_copies(false);
  optim::AdamW<float> oa(conv.parameters(), {.lr = 1e-2});
  optim::AdamW<float> ob(nocache.parameters(), {.lr = 1e-2});
  const auto x = shard::cast<L>(rnd<4>({2, 4, 6, 6}, 5));
  const void* first_use = nullptr;
  for (int step = 0; step < 3; ++step) {
    oa.zero_grad();
    ob.zero_grad();
    auto run = [&](nn::Conv2d<L>& m) {
      auto y = m(m(Var<L, 4>(x, false)));  // the weight used twice
      auto loss = F::sum(F::mul(F::cast<float>(y), F::cast<float>(y)));
      loss.backward();
      return loss.value().local().data()[0];
    };
    const float la = run(conv), lb = run(nocache);
    CHECK(la == lb);
    const auto ga = conv.weight().grad().local(), gb = nocache.weight().grad().local();
    for (index_t k = 0; k < ga.numel(); ++k) REQUIRE(ga.data()[k] == gb.data()[k]);
    oa.step();
    ob.step();
    const auto wa = conv.weight().value().local(), wb = nocache.weight().value().local();
    for (index_t k = 0; k < wa.numel(); ++k) REQUIRE(wa.data()[k] == wb.data()[k]);
  }
  // The cache itself: two uses share the converted block; a bumped master converts again.
  struct Probe : nn::Conv2d<L> {
    using nn::Conv2d<L>::Conv2d;
    auto copy() const { return this->compute_copy(this->weight()); }
    const void* use() const { return copy().value().local().data(); }
  };
  Probe p(mesh1(), 4, 4, Shape<2>{3, 3}, F::ConvOptions<2>::symmetric(1), true, 42);
  first_use = p.use();
  CHECK(p.use() == first_use);
  p.weight().value().local().data()[0] += 1.0f;
  p.weight().value().local().bump_version();  // a write through the raw pointer, declared
  const auto w2 = p.copy();
  CHECK(w2.value().local().data() != first_use);
  CHECK(static_cast<float>(w2.value().local().data()[0]) ==
        static_cast<float>(static_cast<L>(p.weight().value().local().data()[0])));
}

}  // namespace st_nn_test_precision_ops
