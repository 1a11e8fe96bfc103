// The pointwise family computes bf16 / f16 storage natively on the CPU (PointwiseKernels::
// native_low_precision: f32 tiles on the stack, one rounding per result). Oracle: the f32 working
// copy route it replaces, i.e. widen every operand to f32, run the f32 op, round the result once;
// the two must agree bit for bit (NaN-ness only for NaN results) for every unary op forward and
// backward, every binary op contiguous and broadcast, div's rhs gradient, in place, at lengths that
// are one partial tile, several tiles with a tail, and above the OpenMP threshold.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "shardtensor/shardtensor.hpp"
#include "shardtensor/exec/pointwise.hpp"
#include "support/lowp_compare.hpp"

namespace st_exec_test_pointwise_lp {

using namespace shard;
using exec::BinaryOp;
using exec::UnaryOp;
using shard::test::differing;
using shard::test::widened;

namespace {

template <int R>
Tensor<float, R> uniform(const Shape<R>& s, unsigned seed, float lo, float hi) {
  auto t = Tensor<float, R>::empty(s, Device::cpu());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (index_t i = 0; i < t.numel(); ++i) t.data()[i] = d(rng);
  return t;
}
template <class L, int R>
Tensor<L, R> rounded(const Tensor<float, R>& x) {
  auto y = Tensor<L, R>::empty(x.shape(), Device::cpu());
  for (index_t i = 0; i < x.numel(); ++i) y.data()[i] = L(x.data()[i]);
  return y;
}
constexpr UnaryOp kUnary[] = {UnaryOp::neg,        UnaryOp::square,     UnaryOp::sqrt,        UnaryOp::exp,
                              UnaryOp::log,        UnaryOp::abs,        UnaryOp::relu,        UnaryOp::leaky_relu,
                              UnaryOp::gelu,       UnaryOp::gelu_tanh,  UnaryOp::silu,        UnaryOp::tanh,
                              UnaryOp::sigmoid,    UnaryOp::add_scalar, UnaryOp::rsub_scalar, UnaryOp::mul_scalar,
                              UnaryOp::div_scalar, UnaryOp::rdiv_scalar};

}  // namespace

TEMPLATE_TEST_CASE("pointwise: bf16 / f16 computed natively equal the f32 working-copy route bit for bit",
                   "[precision][pointwise]", bf16, f16) {
  using L = TestType;
  auto& ctx = current_context(Device::cpu());
  // 1000: one partial tile; 5000: tiles and a tail; 70001: OpenMP over tiles (> 2^16).
  for (index_t n : {index_t{1000}, index_t{5000}, index_t{70001}}) {
    INFO("dtype " << dtype_name(dtype_of<L>) << ", n " << n);
    // x spans negatives (log / sqrt give NaN there, on both routes), zero crossings and |x| > 1.
    const auto x = rounded<L>(uniform<1>({n}, 1, -3.0f, 3.0f));
    const auto gy = rounded<L>(uniform<1>({n}, 2, -1.0f, 1.0f));
    const auto xw = widened(x), gw = widened(gy);
    for (UnaryOp op : kUnary) {
      INFO("unary op " << exec::op_name(op));
      const double alpha = op == UnaryOp::leaky_relu ? 0.01 : 1.75;
      auto y = Tensor<L, 1>::empty({n}, Device::cpu());
      exec::unary(op, alpha, as_block(x), as_block(y), ctx);
      auto yw = Tensor<float, 1>::empty({n}, Device::cpu());
      exec::unary(op, alpha, as_block(xw), as_block(yw), ctx);
      CHECK(differing(y, yw) == 0);
      // Backward from the rounded output, as the tape saves it.
      const auto yr = widened(y);
      auto dx = Tensor<L, 1>::empty({n}, Device::cpu());
      exec::unary_backward(op, alpha, as_block(x), as_block(y), as_block(gy), as_block(dx), ctx);
      auto dxw = Tensor<float, 1>::empty({n}, Device::cpu());
      exec::unary_backward(op, alpha, as_block(xw), as_block(yr), as_block(gw), as_block(dxw), ctx);
      CHECK(differing(dx, dxw) == 0);
    }
    // In place: y aliases x.
    auto xi = rounded<L>(uniform<1>({n}, 1, -3.0f, 3.0f));
    exec::unary(UnaryOp::gelu, 0, as_block(xi), as_block(xi), ctx);
    auto ref = Tensor<float, 1>::empty({n}, Device::cpu());
    exec::unary(UnaryOp::gelu, 0, as_block(xw), as_block(ref), ctx);
    CHECK(differing(xi, ref) == 0);
  }
}

TEMPLATE_TEST_CASE("pointwise: bf16 / f16 binary ops and div's gradient, contiguous and broadcast, natively",
                   "[precision][pointwise]", bf16, f16) {
  using L = TestType;
  auto& ctx = current_context(Device::cpu());
  for (index_t rows : {index_t{3}, index_t{300}}) {  // 300 x 4 x 64 = 76800 > 2^16: OpenMP over tiles / rows
    INFO("dtype " << dtype_name(dtype_of<L>) << ", rows " << rows);
    const auto a = rounded<L>(uniform<3>({rows, 4, 64}, 3, -2.0f, 2.0f));
    const auto b = rounded<L>(uniform<3>({rows, 4, 64}, 4, 0.25f, 2.0f));
    const auto s = rounded<L>(uniform<3>({1, 4, 1}, 5, 0.5f, 1.5f));  // broadcast over dims 0 and 2
    const auto g = rounded<L>(uniform<3>({rows, 4, 64}, 6, -1.0f, 1.0f));
    const auto aw = widened(a), bw = widened(b), sw = widened(s), gw = widened(g);
    const Shape<3> shape{rows, 4, 64};
    const index_t bshape[3] = {rows, 4, 64}, bstrides[3] = {0, 1, 0};
    const auto bcast = [&](const auto& t) {  // s viewed with a's shape, stride 0 on dims 0 and 2
      const Block b0 = as_block(t);
      return Block::view(b0.dtype, b0.device, b0.data, bshape, 3, bstrides, b0.owner);
    };
    for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div}) {
      INFO("binary op " << exec::op_name(op));
      auto o = Tensor<L, 3>::empty(shape, Device::cpu());
      auto ow = Tensor<float, 3>::empty(shape, Device::cpu());
      exec::binary(op, as_block(a), as_block(b), as_block(o), ctx);
      exec::binary(op, as_block(aw), as_block(bw), as_block(ow), ctx);
      CHECK(differing(o, ow) == 0);
      exec::binary(op, as_block(a), bcast(s), as_block(o), ctx);
      exec::binary(op, as_block(aw), bcast(sw), as_block(ow), ctx);
      CHECK(differing(o, ow) == 0);
    }
    auto o = Tensor<L, 3>::empty(shape, Device::cpu());
    auto ow = Tensor<float, 3>::empty(shape, Device::cpu());
    exec::div_rhs_backward(as_block(g), as_block(a), bcast(s), as_block(o), ctx);
    exec::div_rhs_backward(as_block(gw), as_block(aw), bcast(sw), as_block(ow), ctx);
    CHECK(differing(o, ow) == 0);
    exec::div_rhs_backward(as_block(g), as_block(a), as_block(b), as_block(o), ctx);
    exec::div_rhs_backward(as_block(gw), as_block(aw), as_block(bw), as_block(ow), ctx);
    CHECK(differing(o, ow) == 0);
  }
}

TEMPLATE_TEST_CASE("pointwise: sum_to (a broadcast operand's gradient) on bf16 / f16 storage, natively",
                   "[precision][pointwise]", bf16, f16) {
  // g [rows, 4, 64] reduced onto [1, 4, 1] (dims 0 and 2 broadcast) and onto [rows, 1, 64]: sums
  // in double of the widened values, rounded double -> float -> storage; bit for bit the f32 route.
  using L = TestType;
  auto& ctx = current_context(Device::cpu());
  for (index_t rows : {index_t{3}, index_t{300}}) {
    INFO("dtype " << dtype_name(dtype_of<L>) << ", rows " << rows);
    const auto g = rounded<L>(uniform<3>({rows, 4, 64}, 7, -1.0f, 1.0f));
    const auto gw = widened(g);
    const index_t vshape[3] = {rows, 4, 64};
    struct Target {
      Shape<3> shape;
      index_t strides[3];
    };
    for (const Target& t : {Target{{1, 4, 1}, {0, 1, 0}}, Target{{rows, 1, 64}, {64, 0, 1}}}) {
      auto d = Tensor<L, 3>::empty(t.shape, Device::cpu());
      auto dw = Tensor<float, 3>::empty(t.shape, Device::cpu());
      const Block bd = as_block(d), bw = as_block(dw);
      exec::sum_to(as_block(g), bd, Block::view(bd.dtype, bd.device, bd.data, vshape, 3, t.strides, bd.owner), ctx);
      exec::sum_to(as_block(gw), bw, Block::view(bw.dtype, bw.device, bw.data, vshape, 3, t.strides, bw.owner), ctx);
      CHECK(differing(d, dw) == 0);
    }
  }
}

TEST_CASE("pointwise: the native bf16 route allocates no f32 working copies", "[precision][pointwise]") {
  // The point of the native route: a bf16 op over 2^20 elements needs its result and nothing
  // tensor-sized besides (the F32Work route took 4 MiB f32 copies per operand, or 256 KiB chunks).
  auto& ctx = current_context(Device::cpu());
  const index_t n = index_t{1} << 20;
  const auto x = rounded<bf16>(uniform<1>({n}, 1, -3.0f, 3.0f));
  const auto gy = rounded<bf16>(uniform<1>({n}, 2, -1.0f, 1.0f));
  auto y = Tensor<bf16, 1>::empty({n}, Device::cpu());
  auto dx = Tensor<bf16, 1>::empty({n}, Device::cpu());
  reset_peak_memory(DeviceKind::cpu);
  const std::size_t before = memory_stats(DeviceKind::cpu).current_bytes;
  exec::unary(UnaryOp::gelu, 0, as_block(x), as_block(y), ctx);
  exec::unary_backward(UnaryOp::gelu, 0, as_block(x), as_block(y), as_block(gy), as_block(dx), ctx);
  exec::binary(BinaryOp::mul, as_block(x), as_block(gy), as_block(y), ctx);
  auto red = Tensor<bf16, 1>::empty({1}, Device::cpu());  // a scalar's gradient: sum_to over every element
  const index_t all = n, zero = 0;
  const Block br = as_block(red);
  exec::sum_to(as_block(gy), br, Block::view(br.dtype, br.device, br.data, &all, 1, &zero, br.owner), ctx);
  const std::size_t extra = memory_stats(DeviceKind::cpu).peak_bytes - before;
  INFO("bytes allocated beyond the operands at the peak: " << extra);
  CHECK(extra < 64 * 1024);
}

TEST_CASE("pointwise: mixed storage dtypes are still refused on the native route", "[precision][pointwise]") {
  auto& ctx = current_context(Device::cpu());
  const auto x = rounded<bf16>(uniform<1>({64}, 1, -1.0f, 1.0f));
  const auto h = rounded<f16>(uniform<1>({64}, 2, -1.0f, 1.0f));
  auto yb = Tensor<bf16, 1>::empty({64}, Device::cpu());
  auto yh = Tensor<f16, 1>::empty({64}, Device::cpu());
  CHECK_THROWS_WITH(exec::unary(UnaryOp::exp, 0, as_block(x), as_block(yh), ctx),
                    Catch::Matchers::ContainsSubstring("exp") && Catch::Matchers::ContainsSubstring("bf16") &&
                        Catch::Matchers::ContainsSubstring("f16"));
  CHECK_THROWS_WITH(exec::binary(BinaryOp::add, as_block(x), as_block(h), as_block(yb), ctx),
                    Catch::Matchers::ContainsSubstring("add") && Catch::Matchers::ContainsSubstring("storage dtype"));
  auto shorter = Tensor<bf16, 1>::empty({32}, Device::cpu());
  CHECK_THROWS_WITH(exec::unary(UnaryOp::exp, 0, as_block(x), as_block(shorter), ctx),
                    Catch::Matchers::ContainsSubstring("exp"));
}

}  // namespace st_exec_test_pointwise_lp
