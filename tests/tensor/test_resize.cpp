// Nearest / (bi,tri)linear upsampling (align_corners=false) against a direct formula, the block
// form used by the domain-parallel layer (halo ranges, block == slice of the global result, and
// block adjoints summing to the global adjoint), finite differences, bad input.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <random>
#include <shardtensor/tensor/ops.hpp>
#include <shardtensor/nn/functional/resize_local.hpp>

#include "tensor/test_conv_reference.hpp"

namespace st_tensor_test_resize {

using namespace shard;
using shard::test::random_tensor;
using shard::test::rel_err;

namespace {

/// 1-D source weights of output o (PyTorch's area_pixel_compute_source_index, align_corners=false):
/// a list of (input index, weight).
std::vector<std::pair<index_t, double>> ref_taps(ResizeMode m, index_t f, index_t G, index_t o) {
  if (m == ResizeMode::nearest) return {{static_cast<index_t>(std::floor(static_cast<double>(o) / f)), 1.0}};
  double src = (static_cast<double>(o) + 0.5) * (1.0 / static_cast<double>(f)) - 0.5;
  if (src < 0) src = 0;
  const index_t i0 = static_cast<index_t>(std::floor(src));
  const index_t i1 = i0 < G - 1 ? i0 + 1 : i0;
  const double l1 = src - static_cast<double>(i0);
  return {{i0, 1.0 - l1}, {i1, l1}};
}

/// Direct global upsampling (double), as a sum over the product of per-dim taps.
template <class T, int R>
Tensor<double, R> ref_upsample(const Tensor<T, R>& x, ResizeMode m, const Shape<R - 2>& f) {
  constexpr int S = R - 2;
  Shape<R> ys = x.shape();
  for (int d = 0; d < S; ++d) ys[2 + d] = x.size(2 + d) * f[d];
  auto y = Tensor<double, R>::zeros(ys);
  for (index_t lin = 0; lin < y.numel(); ++lin) {
    const auto yi = unravel(lin, ys);
    std::array<std::vector<std::pair<index_t, double>>, S> taps;
    for (int d = 0; d < S; ++d) taps[d] = ref_taps(m, f[d], x.size(2 + d), yi[2 + d]);
    Shape<S> cnt{};
    for (int d = 0; d < S; ++d) cnt[d] = static_cast<index_t>(taps[d].size());
    double s = 0;
    for (index_t c = 0; c < numel(cnt); ++c) {
      const auto ci = unravel(c, cnt);
      Shape<R> xi = yi;
      double wgt = 1;
      for (int d = 0; d < S; ++d) {
        xi[2 + d] = taps[d][ci[d]].first;
        wgt *= taps[d][ci[d]].second;
      }
      s += wgt * static_cast<double>(x.at(xi));
    }
    y.data()[lin] = s;
  }
  return y;
}

template <class T, int S>
void check_whole(const Shape<S>& in, const Shape<S>& f, ResizeMode m, std::uint64_t seed) {
  constexpr int R = S + 2;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  INFO("in " << fmt::format("{}", in) << " scale " << fmt::format("{}", f) << " mode " << static_cast<int>(m));
  Shape<R> xs{};
  xs[0] = 2;
  xs[1] = 3;
  for (int d = 0; d < S; ++d) xs[2 + d] = in[d];
  auto x = random_tensor<T, R>(xs, seed);
  auto y = upsample(x, m, f);
  CHECK(rel_err(y, ref_upsample(x, m, f)) <= tol);
  auto gy = random_tensor<T, R>(y.shape(), seed + 1);
  auto gx = upsample_backward(gy, m, f, in);
  // Adjoint: <up(x), gy> == <x, up^T(gy)>
  const double lhs = dot(y, gy), rhs = dot(x, gx);
  CHECK(std::abs(lhs - rhs) <= (std::is_same_v<T, double> ? 1e-12 : 1e-5) * std::max(1.0, std::abs(lhs)));
}

}  // namespace

TEST_CASE("upsample: nearest and linear, 1-D/2-D/3-D, scales 1-4, vs direct formula and adjoint", "[resize]") {
  std::uint64_t seed = 7;
  for (auto m : {ResizeMode::nearest, ResizeMode::linear}) {
    for (index_t f : {1, 2, 3, 4})
      for (index_t n : {1, 2, 5}) {
        check_whole<double, 1>({n}, {f}, m, seed);
        check_whole<float, 1>({n}, {f}, m, seed++);
      }
    check_whole<double, 2>({5, 4}, {2, 3}, m, seed);
    check_whole<float, 2>({5, 4}, {2, 3}, m, seed++);
    check_whole<double, 2>({1, 7}, {4, 2}, m, seed);
    check_whole<double, 3>({3, 4, 2}, {2, 2, 3}, m, seed);
    check_whole<float, 3>({3, 4, 2}, {2, 2, 3}, m, seed++);
    check_whole<float, 2>({64, 70}, {2, 2}, m, seed++);  // parallel paths
  }
}

TEST_CASE("resize block form: halo ranges, block == slice of global, adjoints sum to global", "[resize]") {
  std::mt19937_64 rng(3);
  auto pick = [&](index_t lo, index_t hi) { return std::uniform_int_distribution<index_t>(lo, hi)(rng); };
  for (auto m : {ResizeMode::nearest, ResizeMode::linear}) {
    for (int it = 0; it < 30; ++it) {
      const Shape<2> G{pick(1, 9), pick(1, 9)}, f{pick(1, 3), pick(1, 3)};
      auto x = random_tensor<double, 4>({1, 2, G[0], G[1]}, 50 + it);
      auto y = upsample(x, m, f);
      auto gy = random_tensor<double, 4>(y.shape(), 80 + it);
      auto gx = upsample_backward(gy, m, f, G);
      // Split the global output of each dim into 2-3 contiguous parts (some possibly empty).
      std::array<std::vector<index_t>, 2> cuts;
      for (int d = 0; d < 2; ++d) {
        const index_t n = f[d] * G[d];
        index_t a = pick(0, n), b = pick(0, n);
        if (a > b) std::swap(a, b);
        cuts[d] = {0, a, b, n};
      }
      auto gx_sum = Tensor<double, 4>::zeros(gx.shape());
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
          ResizeBlock<2> b;
          b.scale = f;
          b.global_in = G;
          b.out_lo = {cuts[0][i], cuts[1][j]};
          b.out_len = {cuts[0][i + 1] - cuts[0][i], cuts[1][j + 1] - cuts[1][j]};
          Shape<2> in_len{};
          for (int d = 0; d < 2; ++d) {
            auto [lo, hi] = resize_input_range(m, f[d], G[d], b.out_lo[d], b.out_len[d]);
            if (b.out_len[d] == 0) lo = hi = 0;
            // The documented halo: nearest needs no input outside the owners of the outputs,
            // linear at most one cell beyond floor(out / f) on each side.
            if (b.out_len[d] > 0) {
              const index_t own_lo = b.out_lo[d] / f[d], own_hi = (b.out_lo[d] + b.out_len[d] - 1) / f[d] + 1;
              CHECK(lo >= std::max<index_t>(own_lo - (m == ResizeMode::linear), 0));
              CHECK(hi <= std::min<index_t>(own_hi + (m == ResizeMode::linear), G[d]));
            }
            // hold one extra cell of (unneeded) halo where it exists
            lo = std::max<index_t>(lo - 1, 0);
            hi = std::min<index_t>(hi + 1, G[d]);
            b.in_lo[d] = lo;
            in_len[d] = hi - lo;
          }
          auto xb = x.slice({0, 0, b.in_lo[0], b.in_lo[1]}, {1, 2, in_len[0], in_len[1]}).clone();
          auto yb = resize_forward(xb, m, b);
          auto yslice = y.slice({0, 0, b.out_lo[0], b.out_lo[1]}, {1, 2, b.out_len[0], b.out_len[1]});
          if (yb.numel() > 0) CHECK(max_rel_diff(yb, yslice) == 0.0);
          auto gyb = gy.slice({0, 0, b.out_lo[0], b.out_lo[1]}, {1, 2, b.out_len[0], b.out_len[1]}).clone();
          auto gxb = resize_backward(gyb, m, b, in_len);
          auto dst = gx_sum.slice({0, 0, b.in_lo[0], b.in_lo[1]}, {1, 2, in_len[0], in_len[1]});
          zip_into(dst, dst, gxb, [](double a, double c) { return a + c; });
        }
      CHECK(max_rel_diff(gx_sum, gx) <= 1e-12);
    }
  }
}

TEST_CASE("resize: fp64 finite differences of trilinear upsampling", "[resize]") {
  auto x = random_tensor<double, 5>({1, 2, 3, 2, 4}, 5);
  const Shape<3> f{2, 3, 2};
  auto gy = random_tensor<double, 5>(upsample(x, ResizeMode::linear, f).shape(), 6);
  auto gx = upsample_backward(gy, ResizeMode::linear, f, {3, 2, 4});
  for (index_t i = 0; i < x.numel(); ++i) {
    const double v0 = x.data()[i], h = 1e-4;
    x.data()[i] = v0 + h;
    const double lp = dot(upsample(x, ResizeMode::linear, f), gy);
    x.data()[i] = v0 - h;
    const double lm = dot(upsample(x, ResizeMode::linear, f), gy);
    x.data()[i] = v0;
    CHECK(std::abs((lp - lm) / (2 * h) - gx.data()[i]) <= 1e-9);
  }
}

TEST_CASE("resize: bad input", "[resize][errors]") {
  auto x = random_tensor<double, 3>({1, 1, 4}, 1);
  ResizeBlock<1> b;
  b.scale = {2};
  b.global_in = {8};
  b.in_lo = {2};
  b.out_lo = {4};
  b.out_len = {8};  // needs inputs [1, 7) for linear; block holds [2, 6)
  CHECK_THROWS_AS(resize_forward(x, ResizeMode::linear, b), Error);
  CHECK_NOTHROW(resize_forward(x, ResizeMode::nearest, b));  // nearest needs [2, 6)
  b.out_len = {20};                                           // beyond the global output
  CHECK_THROWS_AS(resize_forward(x, ResizeMode::nearest, b), Error);
  CHECK_THROWS_AS(upsample(x, ResizeMode::linear, Shape<1>{0}), Error);
  CHECK_THROWS_AS(resize_input_range(ResizeMode::linear, 2, 4, 6, 3), Error);
  CHECK_THROWS_AS(upsample_backward(x, ResizeMode::nearest, Shape<1>{2}, {4}), Error);  // gy extent != 8
}

}  // namespace st_tensor_test_resize
