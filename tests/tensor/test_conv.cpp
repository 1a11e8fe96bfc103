// conv_forward / conv_backward_{input,weight,bias} against naive direct loops (fp64 <= 1e-12,
// fp32 <= 1e-5), the adjoint identity, fp64 finite differences, tiling / threading invariance.
#include <catch2/catch_test_macros.hpp>
#include <omp.h>

#include <random>
#include <shardtensor/nn/functional/conv_local.hpp>
#include <shardtensor/tensor/ops.hpp>

#include "tensor/test_conv_reference.hpp"

namespace st_tensor_test_conv {

using namespace shard;
using shard::nn::functional::ConvOptions;
using shard::test::random_tensor;
using shard::test::rel_err;

namespace {

template <int S>
struct ConvCase {
  index_t batch = 2, cin = 4, cout = 8;
  Shape<S> in{}, kernel{};
  ConvOptions<S> p;
};

template <int S>
std::string describe(const ConvCase<S>& c) {
  return fmt::format("in {} kernel {} stride {} dil {} pad_lo {} pad_hi {} groups {} cin {} cout {}", c.in, c.kernel,
                     c.p.stride, c.p.dilation, c.p.pad_lo, c.p.pad_hi, c.p.groups, c.cin, c.cout);
}

template <int S>
bool valid(const ConvCase<S>& c) {
  for (int d = 0; d < S; ++d)
    if (conv_output_extent(c.in[d], c.kernel[d], c.p.stride[d], c.p.dilation[d], c.p.pad_lo[d], c.p.pad_hi[d]) < 1)
      return false;
  return true;
}

/// Forward, input / weight / bias gradients vs references; adjoint identity in fp64.
template <class T, int S>
void check_case(const ConvCase<S>& c, std::uint64_t seed) {
  constexpr int R = S + 2;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  INFO(describe(c) << " dtype " << dtype_name(dtype_of<T>));
  Shape<R> xs{}, ws{};
  xs[0] = c.batch;
  xs[1] = c.cin;
  ws[0] = c.cout;
  ws[1] = c.cin / c.p.groups;
  for (int d = 0; d < S; ++d) {
    xs[2 + d] = c.in[d];
    ws[2 + d] = c.kernel[d];
  }
  auto x = random_tensor<T, R>(xs, seed);
  auto w = random_tensor<T, R>(ws, seed + 1);
  auto b = random_tensor<T, 1>({c.cout}, seed + 2);
  const auto yref = shard::test::ref_conv(x, w, &b, c.p);
  Shape<R> ys = yref.shape();
  auto gy = random_tensor<T, R>(ys, seed + 3);
  const auto gxref = shard::test::ref_conv_backward_input(gy, w, c.in, c.p);
  const auto gwref = shard::test::ref_conv_backward_weight(x, gy, c.kernel, c.p);
  shard::test::for_each_conv_kernel([&] {
    auto y = conv_forward(x, w, b, c.p);
    REQUIRE(y.shape() == yref.shape());
    CHECK(rel_err(y, yref) <= tol);
    auto gx = conv_backward_input(gy, w, c.in, c.p);
    CHECK(rel_err(gx, gxref) <= tol);
    auto gw = conv_backward_weight(x, gy, c.kernel, c.p);
    CHECK(rel_err(gw, gwref) <= tol);
    if constexpr (std::is_same_v<T, double>) {
      // <conv(x), gy> == <x, conv_backward_input(gy)> (no bias).
      const auto y0 = conv_forward(x, w, {}, c.p);
      const double lhs = dot(y0, gy), rhs = dot(x, gx);
      CHECK(std::abs(lhs - rhs) <= 1e-12 * std::max(1.0, std::abs(lhs)));
      // <conv(x), gy> == <w, conv_backward_weight(x, gy)>.
      CHECK(std::abs(lhs - dot(w, gw)) <= 1e-12 * std::max(1.0, std::abs(lhs)));
    }
  });
  auto gb = conv_backward_bias(gy);
  auto gbref = Tensor<double, 1>::zeros({c.cout});
  for (index_t lin = 0; lin < gy.numel(); ++lin) gbref.data()[unravel(lin, gy.shape())[1]] += gy.data()[lin];
  CHECK(rel_err(gb, gbref) <= tol);
}

template <int S>
ConvCase<S> random_case(std::mt19937_64& rng) {
  auto pick = [&](index_t lo, index_t hi) { return std::uniform_int_distribution<index_t>(lo, hi)(rng); };
  ConvCase<S> c;
  const index_t gsel[] = {1, 2, 4};
  c.p.groups = gsel[pick(0, 2)];
  c.cin = 4;
  c.cout = c.p.groups * pick(1, 2);
  for (int d = 0; d < S; ++d) {
    c.kernel[d] = pick(1, 4);
    c.p.stride[d] = pick(1, 3);
    c.p.dilation[d] = pick(1, 2);
    c.p.pad_lo[d] = pick(0, 2);
    c.p.pad_hi[d] = pick(0, 2);
    c.in[d] = pick(S == 3 ? 3 : 4, S == 1 ? 13 : (S == 2 ? 9 : 6));
  }
  return c;
}

}  // namespace

TEST_CASE("conv1d: every kernel/stride/dilation/groups/pad combination vs direct loops", "[conv]") {
  std::uint64_t seed = 100;
  int checked = 0;
  for (index_t k : {1, 2, 3, 4})
    for (index_t s : {1, 2, 3})
      for (index_t dil : {1, 2})
        for (index_t g : {1, 2, 4})
          for (auto [lo, hi] : {std::pair<index_t, index_t>{0, 0}, {1, 0}, {0, 2}, {2, 1}}) {
            ConvCase<1> c;
            c.in = {11};
            c.kernel = {k};
            c.p.stride = {s};
            c.p.dilation = {dil};
            c.p.pad_lo = {lo};
            c.p.pad_hi = {hi};
            c.p.groups = g;
            c.cout = 2 * g;
            check_case<double>(c, seed);
            check_case<float>(c, seed);
            seed += 10;
            ++checked;
          }
  CHECK(checked == 288);
}

TEST_CASE("conv2d: random odd/even kernels, strides 1-3, dilation 1-2, groups 1/2/4, asymmetric pads", "[conv]") {
  std::mt19937_64 rng(2024);
  int checked = 0;
  for (int it = 0; it < 200 && checked < 80; ++it) {
    auto c = random_case<2>(rng);
    if (!valid(c)) continue;
    check_case<double>(c, 1000 + it);
    check_case<float>(c, 1000 + it);
    ++checked;
  }
  CHECK(checked == 80);
}

TEST_CASE("conv3d: random odd/even kernels, strides, dilation, groups, asymmetric pads", "[conv]") {
  std::mt19937_64 rng(77);
  int checked = 0;
  for (int it = 0; it < 200 && checked < 30; ++it) {
    auto c = random_case<3>(rng);
    if (!valid(c)) continue;
    check_case<double>(c, 5000 + it);
    check_case<float>(c, 5000 + it);
    ++checked;
  }
  CHECK(checked == 30);
}

TEST_CASE("conv: 1x1 direct path and batch/group layouts", "[conv]") {
  ConvCase<2> c;
  c.in = {7, 9};
  c.kernel = {1, 1};
  for (index_t g : {1, 2, 4}) {
    c.p.groups = g;
    c.cout = 2 * g;
    check_case<double>(c, 9 + g);
    check_case<float>(c, 9 + g);
  }
  // 1x1 with stride / padding goes through im2col
  c.p.stride = {2, 1};
  c.p.pad_lo = {1, 0};
  c.p.pad_hi = {0, 1};
  check_case<double>(c, 19);
}

TEST_CASE("conv: many channels (several register blocks and k-chunks)", "[conv]") {
  for (index_t g : {1, 2}) {
    ConvCase<2> c;
    c.cin = 40;
    c.cout = 26;
    c.in = {9, 11};
    c.kernel = {3, 2};
    c.p = ConvOptions<2>{.stride = {1, 1}, .dilation = {1, 2}, .pad_lo = {1, 0}, .pad_hi = {1, 2}, .groups = g};
    check_case<double>(c, 300 + g);
    check_case<float>(c, 300 + g);
    c.p.stride = {2, 1};
    check_case<float>(c, 310 + g);
  }
  ConvCase<3> c3;
  c3.cin = 24;
  c3.cout = 10;
  c3.in = {4, 5, 6};
  c3.kernel = {3, 3, 3};
  c3.p = ConvOptions<3>::symmetric(1);
  check_case<float>(c3, 320);
}

TEST_CASE("conv: results do not depend on tiling or the threading policy", "[conv]") {
  ConvCase<2> c;
  c.batch = 2;
  c.cin = 6;
  c.cout = 4;
  c.in = {37, 29};
  c.kernel = {3, 2};
  c.p = ConvOptions<2>{.stride = {1, 2}, .dilation = {2, 1}, .pad_lo = {2, 0}, .pad_hi = {1, 1}, .groups = 2};
  auto x = random_tensor<double, 4>({c.batch, c.cin, 37, 29}, 1);
  auto w = random_tensor<double, 4>({c.cout, c.cin / 2, 3, 2}, 2);
  auto b = random_tensor<double, 1>({c.cout}, 3);
  const auto y_ref = shard::test::ref_conv(x, w, &b, c.p);
  for (std::size_t bytes : {std::size_t{4096}, std::size_t{1} << 14, std::size_t{1} << 24}) {
    for (auto pol : {ConvThreading::tiles, ConvThreading::blas}) shard::test::for_each_conv_kernel([&](ExecContext& ctx) {
      INFO("budget " << bytes << " policy " << static_cast<int>(pol));
      ctx.settings().conv_column_budget = bytes;
      ctx.settings().conv_threading = pol;
      auto y = conv_forward(x, w, b, c.p);
      CHECK(max_rel_diff(y, y_ref) <= 1e-12);
      auto gy = random_tensor<double, 4>(y.shape(), 4);
      CHECK(max_rel_diff(conv_backward_input(gy, w, c.in, c.p),
                         shard::test::ref_conv_backward_input(gy, w, c.in, c.p)) <= 1e-12);
      CHECK(max_rel_diff(conv_backward_weight(x, gy, c.kernel, c.p),
                         shard::test::ref_conv_backward_weight(x, gy, c.kernel, c.p)) <= 1e-12);
    });
  }
  // Same thread count -> bitwise identical weight gradient (deterministic reduction order).
  auto gy = random_tensor<float, 4>({2, 4, 36, 15}, 5);
  auto xf = random_tensor<float, 4>({2, 6, 37, 29}, 6);
  auto g1 = conv_backward_weight(xf, gy, c.kernel, c.p);
  auto g2 = conv_backward_weight(xf, gy, c.kernel, c.p);
  CHECK(max_rel_diff(g1, g2) == 0.0);
  ExecContext tiny(Device::cpu());
  tiny.settings().conv_column_budget = 100;  // below the 4 KiB minimum
  ContextGuard guard(tiny);
  CHECK_THROWS_AS(conv_forward(x, w, b, c.p), Error);
}

TEST_CASE("conv: fp64 finite differences of <conv(x, w, b), gy>", "[conv]") {
  ConvCase<2> c;
  c.batch = 2;
  c.in = {6, 7};
  c.kernel = {3, 2};
  c.p = ConvOptions<2>{.stride = {2, 1}, .dilation = {1, 2}, .pad_lo = {1, 0}, .pad_hi = {0, 2}, .groups = 2};
  auto x = random_tensor<double, 4>({2, 4, 6, 7}, 11);
  auto w = random_tensor<double, 4>({8, 2, 3, 2}, 12);
  auto b = random_tensor<double, 1>({8}, 13);
  auto y = conv_forward(x, w, b, c.p);
  auto gy = random_tensor<double, 4>(y.shape(), 14);
  auto loss = [&] { return dot(conv_forward(x, w, b, c.p), gy); };
  auto gx = conv_backward_input(gy, w, c.in, c.p);
  auto gw = conv_backward_weight(x, gy, c.kernel, c.p);
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
  for (index_t i = 0; i < x.numel(); i += 7) CHECK(std::abs(fd(x.data() + i) - gx.data()[i]) <= 1e-8);
  for (index_t i = 0; i < w.numel(); i += 3) CHECK(std::abs(fd(w.data() + i) - gw.data()[i]) <= 1e-8);
  for (index_t i = 0; i < b.numel(); ++i) CHECK(std::abs(fd(b.data() + i) - gb.data()[i]) <= 1e-8);
}

TEST_CASE("conv: a 2-D problem larger than one tile (1024-wide rows, fp32)", "[conv]") {
  auto x = random_tensor<float, 4>({1, 3, 9, 1030}, 21);
  auto w = random_tensor<float, 4>({5, 3, 3, 3}, 22);
  const auto p = ConvOptions<2>::symmetric(1);
  const auto yref = shard::test::ref_conv(x, w, nullptr, p);
  auto gy = random_tensor<float, 4>(yref.shape(), 23);
  const auto gxref = shard::test::ref_conv_backward_input(gy, w, {9, 1030}, p);
  const auto gwref = shard::test::ref_conv_backward_weight(x, gy, {3, 3}, p);
  for (std::size_t bytes : {std::size_t{1} << 15, std::size_t{1} << 20})
    shard::test::for_each_conv_kernel([&](ExecContext& ctx) {
      ctx.settings().conv_column_budget = bytes;
      CHECK(rel_err(conv_forward(x, w, {}, p), yref) <= 1e-5);
      CHECK(rel_err(conv_backward_input(gy, w, {9, 1030}, p), gxref) <= 1e-5);
      CHECK(rel_err(conv_backward_weight(x, gy, {3, 3}, p), gwref) <= 1e-5);
    });
}

TEST_CASE("conv: bad input gives shard::Error naming the shapes", "[conv][errors]") {
  auto x = random_tensor<double, 4>({1, 4, 5, 5}, 1);
  auto w = random_tensor<double, 4>({8, 4, 3, 3}, 2);
  const auto p = ConvOptions<2>::symmetric(1);
  CHECK_THROWS_AS(conv_forward(x, random_tensor<double, 4>({8, 3, 3, 3}, 2), {}, p), Error);  // channels
  CHECK_THROWS_AS(conv_forward(x, w, {}, ConvOptions<2>::symmetric(1, 1, 1, 3)), Error);        // groups
  CHECK_THROWS_AS(conv_forward(x, random_tensor<double, 4>({6, 1, 3, 3}, 2), {}, ConvOptions<2>::symmetric(0, 1, 1, 4)),
                  Error);  // out channels not divisible by groups
  try {
    conv_forward(x, random_tensor<double, 4>({8, 4, 7, 3}, 2), {}, ConvOptions<2>{});  // kernel > input
    FAIL("expected shard::Error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("conv_forward") != std::string::npos);
    CHECK(msg.find("[5, 5]") != std::string::npos);
    CHECK(msg.find("[7, 3]") != std::string::npos);
  }
  CHECK_THROWS_AS(conv_forward(x, w, {}, ConvOptions<2>{.dilation = {4, 1}, .pad_lo = {1, 1}, .pad_hi = {1, 1}}),
                  Error);  // dilated kernel longer than padded input
  CHECK_THROWS_AS(conv_forward(x, w, {}, ConvOptions<2>{.stride = {0, 1}}), Error);
  CHECK_THROWS_AS(conv_forward(x, w, {}, ConvOptions<2>{.pad_lo = {-1, 0}}), Error);
  CHECK_THROWS_AS(conv_forward(x, w, random_tensor<double, 1>({7}, 3), p), Error);  // bias size
  auto y = conv_forward(x, w, {}, p);
  CHECK_THROWS_AS(conv_backward_input(y, w, {6, 5}, ConvOptions<2>::symmetric(1, 2)), Error);  // wrong gy extent
  CHECK_THROWS_AS(conv_backward_input(random_tensor<double, 4>({1, 7, 5, 5}, 4), w, {5, 5}, p), Error);
  CHECK_THROWS_AS(conv_backward_weight(x, random_tensor<double, 4>({1, 8, 4, 5}, 4), {3, 3}, p), Error);
  CHECK_THROWS_AS(conv_backward_weight(random_tensor<double, 4>({2, 4, 5, 5}, 4), y, {3, 3}, p), Error);  // batch
}

}  // namespace st_tensor_test_conv
