// avg_pool / max_pool forward and backward against naive loops, adjoint identity, finite
// differences, ties and NaN, bad input.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <shardtensor/tensor/ops.hpp>
#include <shardtensor/nn/functional/pool_local.hpp>

#include "tensor/test_conv_reference.hpp"

namespace st_tensor_test_pool {

using namespace shard;
using shard::test::random_tensor;
using shard::test::rel_err;

namespace {

/// Naive pooling: for each output, visit the window cells inside the input.
template <class T, int R>
void ref_pool(const Tensor<T, R>& x, const PoolParams<R - 2>& p, Tensor<double, R>& avg, Tensor<double, R>& mx,
              Tensor<std::int64_t, R>& arg) {
  constexpr int S = R - 2;
  Shape<S> in{}, out{};
  const auto st = p.effective_stride();
  Shape<R> ys = x.shape();
  for (int d = 0; d < S; ++d) {
    in[d] = x.size(2 + d);
    out[d] = (in[d] + p.pad_lo[d] + p.pad_hi[d] - p.kernel[d]) / st[d] + 1;
    ys[2 + d] = out[d];
  }
  avg = Tensor<double, R>::zeros(ys);
  mx = Tensor<double, R>::zeros(ys);
  arg = Tensor<std::int64_t, R>::zeros(ys);
  for (index_t lin = 0; lin < avg.numel(); ++lin) {
    const auto yi = unravel(lin, ys);
    double s = 0, best = -INFINITY;
    index_t cnt = 0, barg = -1;
    for (index_t kl = 0; kl < numel(p.kernel); ++kl) {
      const auto kk = unravel(kl, p.kernel);
      Shape<R> xi = yi;
      Shape<S> ii{};
      for (int d = 0; d < S; ++d) ii[d] = xi[2 + d] = yi[2 + d] * st[d] + kk[d] - p.pad_lo[d];
      if (!shard::test::in_box<S>(ii, in)) continue;
      const double v = static_cast<double>(x.at(xi));
      s += v;
      ++cnt;
      if (barg < 0 || v > best) {
        best = v;
        barg = ravel(ii, in);
      }
    }
    avg.data()[lin] = s / static_cast<double>(p.count_include_pad ? numel(p.kernel) : cnt);
    mx.data()[lin] = best;
    arg.data()[lin] = barg;
  }
}

template <class T, int S>
void check_pool(index_t planes_c, const Shape<S>& in, const PoolParams<S>& p, std::uint64_t seed) {
  constexpr int R = S + 2;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  INFO("in " << fmt::format("{}", in) << " kernel " << fmt::format("{}", p.kernel) << " stride "
             << fmt::format("{}", p.stride) << " lo " << fmt::format("{}", p.pad_lo) << " hi "
             << fmt::format("{}", p.pad_hi) << " include_pad " << p.count_include_pad);
  Shape<R> xs{};
  xs[0] = 2;
  xs[1] = planes_c;
  for (int d = 0; d < S; ++d) xs[2 + d] = in[d];
  auto x = random_tensor<T, R>(xs, seed);
  Tensor<double, R> avg, mx;
  Tensor<std::int64_t, R> arg;
  ref_pool(x, p, avg, mx, arg);
  auto ya = avg_pool_forward(x, p);
  CHECK(rel_err(ya, avg) <= tol);
  auto ym = max_pool_forward(x, p);
  CHECK(rel_err(ym.values, mx) == 0.0);
  bool same_idx = true;
  for (index_t i = 0; i < arg.numel(); ++i) same_idx = same_idx && arg.data()[i] == ym.indices.data()[i];
  CHECK(same_idx);

  auto gy = random_tensor<T, R>(ya.shape(), seed + 1);
  auto gxa = avg_pool_backward(gy, in, p);
  auto gxm = max_pool_backward(gy, ym.indices, in, p);
  // Naive scatter references of both backward passes.
  auto ra = Tensor<double, R>::zeros(xs), rm = Tensor<double, R>::zeros(xs);
  const auto st = p.effective_stride();
  for (index_t lin = 0; lin < gy.numel(); ++lin) {
    const auto yi = unravel(lin, gy.shape());
    const double g = static_cast<double>(gy.data()[lin]);
    index_t cnt = 0;
    for (int pass = 0; pass < 2; ++pass)
      for (index_t kl = 0; kl < numel(p.kernel); ++kl) {
        const auto kk = unravel(kl, p.kernel);
        Shape<R> xi = yi;
        Shape<S> ii{};
        for (int d = 0; d < S; ++d) ii[d] = xi[2 + d] = yi[2 + d] * st[d] + kk[d] - p.pad_lo[d];
        if (!shard::test::in_box<S>(ii, in)) continue;
        if (pass == 0) ++cnt;
        else ra.at(xi) += g / static_cast<double>(p.count_include_pad ? numel(p.kernel) : cnt);
      }
    Shape<R> xi = yi;
    const auto mi = unravel(static_cast<index_t>(arg.data()[lin]), in);
    for (int d = 0; d < S; ++d) xi[2 + d] = mi[d];
    rm.at(xi) += g;
  }
  CHECK(rel_err(gxa, ra) <= tol);
  CHECK(rel_err(gxm, rm) <= tol);
  if constexpr (std::is_same_v<T, double>) {
    const double lhs = dot(ya, gy);
    CHECK(std::abs(lhs - dot(x, gxa)) <= 1e-12 * std::max(1.0, std::abs(lhs)));
    CHECK(std::abs(dot(ym.values, gy) - dot(x, gxm)) <= 1e-12 * std::max(1.0, std::abs(lhs)));
  }
}

}  // namespace

TEST_CASE("pool1d: kernels 1-4, strides 1-3, pads, count_include_pad", "[pool]") {
  std::uint64_t seed = 3;
  for (index_t k : {1, 2, 3, 4})
    for (index_t s : {1, 2, 3})
      for (index_t lo = 0; lo < k; ++lo)
        for (index_t hi = 0; hi < k; ++hi)
          for (bool inc : {true, false}) {
            PoolParams<1> p{.kernel = {k}, .stride = {s}, .pad_lo = {lo}, .pad_hi = {hi}, .count_include_pad = inc};
            check_pool<double, 1>(3, {10}, p, seed);
            check_pool<float, 1>(3, {10}, p, seed);
            seed += 2;
          }
}

TEST_CASE("pool2d/3d: random kernels, strides, asymmetric pads", "[pool]") {
  std::mt19937_64 rng(9);
  auto pick = [&](index_t lo, index_t hi) { return std::uniform_int_distribution<index_t>(lo, hi)(rng); };
  for (int it = 0; it < 40; ++it) {
    PoolParams<2> p;
    for (int d = 0; d < 2; ++d) {
      p.kernel[d] = pick(1, 4);
      p.stride[d] = pick(0, 3);  // 0 = kernel
      p.pad_lo[d] = pick(0, p.kernel[d] - 1);
      p.pad_hi[d] = pick(0, p.kernel[d] - 1);
    }
    p.count_include_pad = it % 2 == 0;
    check_pool<double, 2>(2, {pick(4, 9), pick(4, 9)}, p, 100 + it);
    check_pool<float, 2>(2, {pick(4, 9), pick(4, 9)}, p, 100 + it);
  }
  for (int it = 0; it < 15; ++it) {
    PoolParams<3> p;
    for (int d = 0; d < 3; ++d) {
      p.kernel[d] = pick(1, 3);
      p.stride[d] = pick(1, 2);
      p.pad_lo[d] = pick(0, p.kernel[d] - 1);
      p.pad_hi[d] = pick(0, p.kernel[d] - 1);
    }
    p.count_include_pad = it % 2 == 1;
    check_pool<double, 3>(2, {pick(3, 6), pick(3, 6), pick(3, 6)}, p, 500 + it);
    check_pool<float, 3>(2, {pick(3, 6), pick(3, 6), pick(3, 6)}, p, 500 + it);
  }
}

TEST_CASE("pool: a large plane takes the parallel paths", "[pool]") {
  PoolParams<2> p{.kernel = {3, 3}, .stride = {2, 2}, .pad_lo = {1, 1}, .pad_hi = {1, 0}, .count_include_pad = false};
  check_pool<float, 2>(3, {130, 121}, p, 42);
}

TEST_CASE("max_pool: ties pick the first maximum, NaN propagates", "[pool]") {
  auto x = Tensor<double, 4>::full({1, 1, 4, 4}, 2.0);
  PoolParams<2> p{.kernel = {2, 2}, .stride = {1, 1}};
  auto r = max_pool_forward(x, p);
  for (index_t o0 = 0; o0 < 3; ++o0)
    for (index_t o1 = 0; o1 < 3; ++o1) CHECK(r.indices(0, 0, o0, o1) == o0 * 4 + o1);
  x(0, 0, 1, 1) = std::numeric_limits<double>::quiet_NaN();
  r = max_pool_forward(x, p);
  CHECK(std::isnan(r.values(0, 0, 0, 0)));
  CHECK(r.indices(0, 0, 0, 0) == 5);
  CHECK(!std::isnan(r.values(0, 0, 2, 2)));
}

TEST_CASE("pool: fp64 finite differences of avg pooling", "[pool]") {
  PoolParams<2> p{.kernel = {3, 2}, .stride = {2, 1}, .pad_lo = {1, 0}, .pad_hi = {2, 1}, .count_include_pad = false};
  auto x = random_tensor<double, 4>({2, 2, 5, 6}, 3);
  auto gy = random_tensor<double, 4>(avg_pool_forward(x, p).shape(), 4);
  auto gx = avg_pool_backward(gy, {5, 6}, p);
  for (index_t i = 0; i < x.numel(); i += 3) {
    const double v0 = x.data()[i], h = 1e-4;
    x.data()[i] = v0 + h;
    const double lp = dot(avg_pool_forward(x, p), gy);
    x.data()[i] = v0 - h;
    const double lm = dot(avg_pool_forward(x, p), gy);
    x.data()[i] = v0;
    CHECK(std::abs((lp - lm) / (2 * h) - gx.data()[i]) <= 1e-9);
  }
}

TEST_CASE("pool: bad input", "[pool][errors]") {
  auto x = random_tensor<double, 4>({1, 2, 4, 4}, 1);
  CHECK_THROWS_AS(avg_pool_forward(x, PoolParams<2>{.kernel = {5, 2}}), Error);                      // kernel > input
  CHECK_THROWS_AS(max_pool_forward(x, PoolParams<2>{.kernel = {2, 2}, .pad_lo = {2, 0}}), Error);   // pad >= kernel
  CHECK_THROWS_AS(max_pool_forward(x, PoolParams<2>{.kernel = {0, 2}}), Error);
  CHECK_THROWS_AS(avg_pool_forward(x, PoolParams<2>{.kernel = {2, 2}, .stride = {-1, 1}}), Error);
  auto r = max_pool_forward(x, PoolParams<2>{.kernel = {2, 2}});
  CHECK_THROWS_AS(max_pool_backward(r.values, r.indices, {6, 6}, PoolParams<2>{.kernel = {2, 2}}), Error);
  r.indices.data()[0] = 99;
  CHECK_THROWS_AS(max_pool_backward(r.values, r.indices, {4, 4}, PoolParams<2>{.kernel = {2, 2}}), Error);
  CHECK_THROWS_AS(avg_pool_backward(r.values, {6, 4}, PoolParams<2>{.kernel = {2, 2}}), Error);
}

}  // namespace st_tensor_test_pool
