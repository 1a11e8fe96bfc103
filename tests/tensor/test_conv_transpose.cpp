// conv_transpose_forward and its gradients against a naive scatter reference, the adjoint
// identity, fp64 finite differences, and bad input.
#include <catch2/catch_test_macros.hpp>

#include <random>
#include <shardtensor/nn/functional/conv_local.hpp>
#include <shardtensor/tensor/ops.hpp>

#include "tensor/test_conv_reference.hpp"

namespace st_tensor_test_conv_transpose {

using namespace shard;
using shard::nn::functional::ConvOptions;
using shard::test::random_tensor;
using shard::test::rel_err;

namespace {

template <class T, int S>
void check_transpose(index_t cin, index_t cout_g, const Shape<S>& in, const Shape<S>& k, const ConvOptions<S>& p,
                     const Shape<S>& op, std::uint64_t seed) {
  constexpr int R = S + 2;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  INFO("in " << fmt::format("{}", in) << " kernel " << fmt::format("{}", k) << " stride "
             << fmt::format("{}", p.stride) << " dil " << fmt::format("{}", p.dilation) << " lo "
             << fmt::format("{}", p.pad_lo) << " hi " << fmt::format("{}", p.pad_hi) << " op "
             << fmt::format("{}", op) << " groups " << p.groups);
  Shape<R> xs{}, ws{};
  xs[0] = 2;
  xs[1] = cin;
  ws[0] = cin;
  ws[1] = cout_g;
  for (int d = 0; d < S; ++d) {
    xs[2 + d] = in[d];
    ws[2 + d] = k[d];
  }
  auto x = random_tensor<T, R>(xs, seed);
  auto w = random_tensor<T, R>(ws, seed + 1);
  auto b = random_tensor<T, 1>({cout_g * p.groups}, seed + 2);
  const auto out = conv_transpose_output_shape<S>(in, k, p, op);
  const auto yref = shard::test::ref_conv_transpose(x, w, &b, p, out);
  shard::test::for_each_conv_kernel([&] {
  auto y = conv_transpose_forward(x, w, b, p, op);
  CHECK(rel_err(y, yref) <= tol);
  auto gy = random_tensor<T, R>(y.shape(), seed + 3);
  auto gx = conv_transpose_backward_input(gy, w, in, p);
  auto gw = conv_transpose_backward_weight(x, gy, k, p);
  // d<y, gy>/dx is the conv of gy (gather form reference); d/dw likewise.
  CHECK(rel_err(gx, shard::test::ref_conv(gy, w, nullptr, p).slice(Shape<R>{}, xs)) <= tol);
  CHECK(rel_err(gw, shard::test::ref_conv_backward_weight(gy, x, k, p)) <= tol);
  if constexpr (std::is_same_v<T, double>) {
    auto y0 = conv_transpose_forward(x, w, {}, p, op);
    const double lhs = dot(y0, gy);
    CHECK(std::abs(lhs - dot(x, gx)) <= 1e-12 * std::max(1.0, std::abs(lhs)));
    CHECK(std::abs(lhs - dot(w, gw)) <= 1e-12 * std::max(1.0, std::abs(lhs)));
  }
  });
}

}  // namespace

TEST_CASE("conv_transpose1d: kernels 1-4, stride 1-3, dilation 1-2, groups, pads, output_padding", "[conv]") {
  std::uint64_t seed = 1;
  for (index_t k : {1, 2, 3, 4})
    for (index_t s : {1, 2, 3})
      for (index_t dil : {1, 2})
        for (index_t g : {1, 2})
          for (auto [lo, hi] : {std::pair<index_t, index_t>{0, 0}, {1, 0}, {0, 2}}) {
            ConvOptions<1> p{.stride = {s}, .dilation = {dil}, .pad_lo = {lo}, .pad_hi = {hi}, .groups = g};
            for (index_t op = 0; op < std::max(s, dil); ++op) {
              const index_t out = (7 - 1) * s - lo - hi + dil * (k - 1) + op + 1;
              if (out < 1) continue;
              check_transpose<double, 1>(4, 3, {7}, {k}, p, {op}, seed);
              check_transpose<float, 1>(4, 3, {7}, {k}, p, {op}, seed);
              seed += 5;
            }
          }
}

TEST_CASE("conv_transpose2d/3d: random cases", "[conv]") {
  std::mt19937_64 rng(5);
  auto pick = [&](index_t lo, index_t hi) { return std::uniform_int_distribution<index_t>(lo, hi)(rng); };
  int done2 = 0, done3 = 0;
  for (int it = 0; it < 300 && (done2 < 40 || done3 < 15); ++it) {
    const bool three = done2 >= 40;
    const index_t g = pick(0, 1) ? 2 : 1;
    if (!three) {
      ConvOptions<2> p;
      Shape<2> in{}, k{}, op{};
      p.groups = g;
      for (int d = 0; d < 2; ++d) {
        k[d] = pick(1, 4);
        p.stride[d] = pick(1, 3);
        p.dilation[d] = pick(1, 2);
        p.pad_lo[d] = pick(0, 2);
        p.pad_hi[d] = pick(0, 2);
        in[d] = pick(2, 6);
        op[d] = pick(0, std::max(p.stride[d], p.dilation[d]) - 1);
        if ((in[d] - 1) * p.stride[d] - p.pad_lo[d] - p.pad_hi[d] + p.dilation[d] * (k[d] - 1) + op[d] + 1 < 1)
          goto next;
      }
      check_transpose<double, 2>(4, 2, in, k, p, op, 100 + it);
      check_transpose<float, 2>(4, 2, in, k, p, op, 100 + it);
      ++done2;
    } else {
      ConvOptions<3> p;
      Shape<3> in{}, k{}, op{};
      p.groups = g;
      for (int d = 0; d < 3; ++d) {
        k[d] = pick(1, 3);
        p.stride[d] = pick(1, 2);
        p.dilation[d] = pick(1, 2);
        p.pad_lo[d] = pick(0, 1);
        p.pad_hi[d] = pick(0, 1);
        in[d] = pick(2, 4);
        op[d] = pick(0, std::max(p.stride[d], p.dilation[d]) - 1);
        if ((in[d] - 1) * p.stride[d] - p.pad_lo[d] - p.pad_hi[d] + p.dilation[d] * (k[d] - 1) + op[d] + 1 < 1)
          goto next;
      }
      check_transpose<double, 3>(2, 2, in, k, p, op, 900 + it);
      check_transpose<float, 3>(2, 2, in, k, p, op, 900 + it);
      ++done3;
    }
  next:;
  }
  CHECK(done2 == 40);
  CHECK(done3 == 15);
}

TEST_CASE("conv_transpose: fp64 finite differences", "[conv]") {
  const ConvOptions<2> p{.stride = {2, 3}, .dilation = {1, 2}, .pad_lo = {1, 0}, .pad_hi = {0, 1}, .groups = 2};
  auto x = random_tensor<double, 4>({2, 4, 3, 4}, 1);
  auto w = random_tensor<double, 4>({4, 3, 2, 3}, 2);
  auto b = random_tensor<double, 1>({6}, 3);
  const Shape<2> op{1, 0};
  auto y = conv_transpose_forward(x, w, b, p, op);
  auto gy = random_tensor<double, 4>(y.shape(), 4);
  auto loss = [&] { return dot(conv_transpose_forward(x, w, b, p, op), gy); };
  auto gx = conv_transpose_backward_input(gy, w, {3, 4}, p);
  auto gw = conv_transpose_backward_weight(x, gy, {2, 3}, p);
  auto gb = conv_backward_bias(gy);
  const double h = 1e-4;
  auto fd = [&](double* v) {
    const double v0 = *v;
    *v = v0 + h;
    const double lp = loss();
    *v = v0 - h;
    const double lm = loss();
    *v = v0;
    return (lp - lm) / (2 * h);
  };
  for (index_t i = 0; i < x.numel(); i += 5) CHECK(std::abs(fd(x.data() + i) - gx.data()[i]) <= 1e-8);
  for (index_t i = 0; i < w.numel(); i += 3) CHECK(std::abs(fd(w.data() + i) - gw.data()[i]) <= 1e-8);
  for (index_t i = 0; i < b.numel(); ++i) CHECK(std::abs(fd(b.data() + i) - gb.data()[i]) <= 1e-8);
}

TEST_CASE("conv_transpose: bad input", "[conv][errors]") {
  auto x = random_tensor<double, 4>({1, 4, 3, 3}, 1);
  auto w = random_tensor<double, 4>({4, 2, 3, 3}, 2);
  const auto p = ConvOptions<2>::symmetric(0, 2);
  CHECK_THROWS_AS(conv_transpose_forward(x, random_tensor<double, 4>({3, 2, 3, 3}, 2), {}, p), Error);
  CHECK_THROWS_AS(conv_transpose_forward(x, w, {}, p, Shape<2>{2, 0}), Error);  // output_padding >= stride
  CHECK_THROWS_AS(conv_transpose_forward(x, w, {}, ConvOptions<2>::symmetric(4, 1)), Error);  // empty output
  CHECK_THROWS_AS(conv_transpose_forward(x, w, random_tensor<double, 1>({3}, 3), p), Error);
  auto y = conv_transpose_forward(x, w, {}, p);
  CHECK_THROWS_AS(conv_transpose_backward_input(y, w, {9, 3}, p), Error);
  CHECK_THROWS_AS(conv_transpose_backward_weight(random_tensor<double, 4>({2, 4, 3, 3}, 5), y, {3, 3}, p), Error);
}

}  // namespace st_tensor_test_conv_transpose
