// The conv kernel family on CUDA (cuDNN) against the CPU implementation: forward, backward-data,
// backward-filter, bias gradient and the transposed conv with its adjoints, 1/2/3-D, stride,
// dilation, groups and asymmetric padding; fp32 <= 1e-5 with TF32 off, fp64 <= 1e-10; the
// deterministic setting gives bitwise identical repeated results. Skips (with a message) when
// the build has no CUDA or no GPU is visible.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/shardtensor.hpp>

#include "tensor/test_conv_reference.hpp"

namespace st_tensor_cuda_conv {

using namespace shard;
using shard::nn::functional::ConvOptions;

namespace {

#define SHARD_REQUIRE_GPU()                                                                             \
  do {                                                                                                  \
    if (!cuda_compiled()) SKIP("shardtensor was built without CUDA (SHARDTENSOR_ENABLE_CUDA=OFF)");     \
    if (cuda_device_count() == 0) SKIP("no CUDA device visible: cuDNN conv tests skipped");             \
  } while (0)

template <class T>
constexpr double tol() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-10;
}

/// One conv problem: input [batch, cin, in...], weight [cout, cin/groups, kernel...].
template <int S>
struct Case {
  const char* name;
  index_t batch, cin, cout;
  Shape<S> in, kernel;
  ConvOptions<S> p;
};

/// Runs every family entry point on the CPU and on the GPU (fresh CUDA context, TF32 off) and
/// compares; also the transposed conv (weights [cin, cout/groups, k]) on the same geometry.
template <class T, int S>
void compare(const Case<S>& c) {
  constexpr int R = S + 2;
  INFO("case " << c.name << " dtype " << dtype_name(dtype_of<T>));
  const Device gpu = Device::cuda(0);
  ExecContext gctx(gpu);
  gctx.settings().allow_tf32 = false;
  ContextGuard guard(gctx);

  Shape<R> xs{}, ws{};
  xs[0] = c.batch;
  xs[1] = c.cin;
  ws[0] = c.cout;
  ws[1] = c.cin / c.p.groups;
  for (int d = 0; d < S; ++d) {
    xs[2 + d] = c.in[d];
    ws[2 + d] = c.kernel[d];
  }
  auto x = shard::test::random_tensor<T, R>(xs, 1);
  auto w = shard::test::random_tensor<T, R>(ws, 2);
  auto b = shard::test::random_tensor<T, 1>({c.cout}, 3);
  const auto y = conv_forward(x, w, b, c.p);
  auto gy = shard::test::random_tensor<T, R>(y.shape(), 4);
  const auto gx = conv_backward_input(gy, w, c.in, c.p);
  const auto gw = conv_backward_weight(x, gy, c.kernel, c.p);
  const auto gb = conv_backward_bias(gy);

  const auto dx = x.to(gpu), dw = w.to(gpu), dgy = gy.to(gpu);
  const auto db = b.to(gpu);
  const auto dy = conv_forward(dx, dw, db, c.p);
  CHECK(dy.device() == gpu);
  CHECK(max_rel_diff(dy.to(Device::cpu()), y) <= tol<T>());
  CHECK(max_rel_diff(conv_backward_input(dgy, dw, c.in, c.p).to(Device::cpu()), gx) <= tol<T>());
  CHECK(max_rel_diff(conv_backward_weight(dx, dgy, c.kernel, c.p).to(Device::cpu()), gw) <= tol<T>());
  CHECK(max_rel_diff(conv_backward_bias(dgy).to(Device::cpu()), gb) <= tol<T>());

  // The transposed conv with weight [cin, cout/groups, k] on an input in the conv's output
  // space (cin channels): backward-data used as a forward op, and its two adjoints.
  Shape<R> wts{};
  wts[0] = c.cin;
  wts[1] = c.cout / c.p.groups;
  for (int d = 0; d < S; ++d) wts[2 + d] = c.kernel[d];
  auto wt = shard::test::random_tensor<T, R>(wts, 5);
  auto bt = shard::test::random_tensor<T, 1>({c.cout}, 6);
  Shape<R> xts = y.shape();
  xts[1] = c.cin;
  auto xt_in = shard::test::random_tensor<T, R>(xts, 8);
  Shape<S> yext{};
  for (int d = 0; d < S; ++d) yext[d] = y.size(2 + d);
  const auto yt = conv_transpose_forward(xt_in, wt, bt, c.p);
  const auto dyt = conv_transpose_forward(xt_in.to(gpu), wt.to(gpu), bt.to(gpu), c.p);
  CHECK(max_rel_diff(dyt.to(Device::cpu()), yt) <= tol<T>());
  auto gyt = shard::test::random_tensor<T, R>(yt.shape(), 9);
  CHECK(max_rel_diff(conv_transpose_backward_input(gyt.to(gpu), wt.to(gpu), yext, c.p).to(Device::cpu()),
                     conv_transpose_backward_input(gyt, wt, yext, c.p)) <= tol<T>());
  CHECK(max_rel_diff(conv_transpose_backward_weight(xt_in.to(gpu), gyt.to(gpu), c.kernel, c.p).to(Device::cpu()),
                     conv_transpose_backward_weight(xt_in, gyt, c.kernel, c.p)) <= tol<T>());
}

ConvOptions<2> p2(Shape<2> stride, Shape<2> dil, Shape<2> lo, Shape<2> hi, index_t groups) {
  return ConvOptions<2>{.stride = stride, .dilation = dil, .pad_lo = lo, .pad_hi = hi, .groups = groups};
}

}  // namespace

TEMPLATE_TEST_CASE("cuDNN conv 2-D matches the CPU family (stride, dilation, groups, padding)", "[cuda][conv]", float,
                   double) {
  SHARD_REQUIRE_GPU();
  const Case<2> cases[] = {
      {"3x3 pad 1", 2, 4, 6, {11, 9}, {3, 3}, ConvOptions<2>::symmetric(1)},
      {"no pad", 1, 3, 5, {8, 10}, {3, 2}, ConvOptions<2>::symmetric(0)},
      {"stride 2", 2, 4, 4, {13, 12}, {3, 3}, ConvOptions<2>::symmetric(1, 2)},
      {"dilation 2", 1, 2, 3, {12, 11}, {3, 3}, ConvOptions<2>::symmetric(2, 1, 2)},
      {"groups 2", 2, 4, 6, {9, 9}, {3, 3}, ConvOptions<2>::symmetric(1, 1, 1, 2)},
      {"depthwise", 1, 4, 4, {9, 7}, {3, 3}, ConvOptions<2>::symmetric(1, 1, 1, 4)},
      {"asymmetric pads", 2, 3, 4, {10, 9}, {3, 3}, p2({1, 1}, {1, 1}, {2, 0}, {0, 1}, 1)},
      {"mixed", 2, 6, 4, {15, 11}, {3, 2}, p2({1, 2}, {2, 1}, {2, 0}, {1, 1}, 2)},
      {"strided slack", 1, 2, 2, {10, 10}, {3, 3}, p2({3, 2}, {1, 1}, {0, 1}, {1, 0}, 1)},
      {"1x1", 3, 5, 7, {6, 5}, {1, 1}, ConvOptions<2>::symmetric(0)},
  };
  for (const auto& c : cases) compare<TestType, 2>(c);
}

TEMPLATE_TEST_CASE("cuDNN conv 1-D and 3-D match the CPU family", "[cuda][conv]", float, double) {
  SHARD_REQUIRE_GPU();
  compare<TestType, 1>({"1-D pad 1", 2, 3, 4, {17}, {3}, ConvOptions<1>::symmetric(1)});
  compare<TestType, 1>({"1-D stride/dil/groups/asym", 2, 4, 6, {23}, {3},
                        ConvOptions<1>{.stride = {2}, .dilation = {2}, .pad_lo = {3}, .pad_hi = {0}, .groups = 2}});
  compare<TestType, 3>({"3-D 3^3 pad 1", 1, 3, 4, {7, 6, 8}, {3, 3, 3}, ConvOptions<3>::symmetric(1)});
  compare<TestType, 3>({"3-D stride 2 groups 2 asym", 2, 4, 4, {9, 7, 8}, {3, 2, 3},
                        ConvOptions<3>{.stride = {2, 1, 2}, .dilation = {1, 2, 1}, .pad_lo = {1, 0, 2},
                                      .pad_hi = {0, 1, 1}, .groups = 2}});
}

TEST_CASE("cuDNN conv: deterministic setting gives bitwise identical repeated results", "[cuda][conv]") {
  SHARD_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  ExecContext ctx(gpu);
  ctx.settings().deterministic = true;
  ContextGuard guard(ctx);
  const auto p = ConvOptions<2>::symmetric(1, 1, 1, 2);
  auto x = shard::test::random_tensor<float, 4>({4, 8, 64, 48}, 1).to(gpu);
  auto w = shard::test::random_tensor<float, 4>({16, 4, 3, 3}, 2).to(gpu);
  auto y = conv_forward(x, w, {}, p);
  auto gy = shard::test::random_tensor<float, 4>(y.shape(), 3).to(gpu);
  const auto gx1 = conv_backward_input(gy, w, {64, 48}, p).to(Device::cpu());
  const auto gw1 = conv_backward_weight(x, gy, {3, 3}, p).to(Device::cpu());
  const auto gb1 = conv_backward_bias(gy).to(Device::cpu());
  const auto y1 = conv_forward(x, w, {}, p).to(Device::cpu());
  for (int rep = 0; rep < 3; ++rep) {
    CHECK(max_rel_diff(conv_forward(x, w, {}, p).to(Device::cpu()), y1) == 0.0);
    CHECK(max_rel_diff(conv_backward_input(gy, w, {64, 48}, p).to(Device::cpu()), gx1) == 0.0);
    CHECK(max_rel_diff(conv_backward_weight(x, gy, {3, 3}, p).to(Device::cpu()), gw1) == 0.0);
    CHECK(max_rel_diff(conv_backward_bias(gy).to(Device::cpu()), gb1) == 0.0);
  }
}

TEST_CASE("cuDNN conv: operands on different devices give shard::Error naming the devices", "[cuda][conv][errors]") {
  SHARD_REQUIRE_GPU();
  auto x = shard::test::random_tensor<float, 4>({1, 2, 5, 5}, 1);
  auto w = shard::test::random_tensor<float, 4>({3, 2, 3, 3}, 2);
  const auto p = ConvOptions<2>::symmetric(1);
  CHECK_THROWS_AS(conv_forward(x.to(Device::cuda(0)), w, {}, p), Error);
  CHECK_THROWS_AS(conv_forward(x, w.to(Device::cuda(0)), {}, p), Error);
  auto b = shard::test::random_tensor<float, 1>({3}, 3);
  CHECK_THROWS_AS(conv_forward(x.to(Device::cuda(0)), w.to(Device::cuda(0)), b, p), Error);
}

#undef SHARD_REQUIRE_GPU  // file-local: unity builds put several test files in one TU

}  // namespace st_tensor_cuda_conv
