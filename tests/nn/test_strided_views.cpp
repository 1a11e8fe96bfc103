// Issue 8, compute from user memory (serial part). The kernel families read strided views in
// place: conv forward / backward-filter (direct and im2col kernels, strides, dilation, groups,
// 1-3 spatial dims), the pointwise unary ops and their backward, mse forward / backward. Each
// result on the interior view of a NaN-ghosted padded array equals the result on a contiguous
// copy (bitwise where the order of operations is the same, else to rounding), f32 and f64. And
// no copy is made: shardtensor's allocation high-water mark during a forward on a stable view
// stays below the view's size (on main, conv / mse / unary copied the view first).
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <functional>
#include <limits>
#include <tuple>
#include <vector>

#include <shardtensor/exec/conv.hpp>
#include <shardtensor/exec/pointwise.hpp>
#include <shardtensor/exec/reduce.hpp>
#include <shardtensor/exec/tensor_block.hpp>
#include <shardtensor/nn/functional.hpp>

using namespace shard;
using autograd::Var;

namespace {

/// A padded array [N, C, d0 + 2g, ..] (ghosts NaN) and the view of its interior, random inside.
template <class T, int R>
struct Padded {
  std::vector<T> mem;
  Tensor<T, R> view;
  Padded(const Shape<R>& shape, index_t ghost, std::uint64_t seed, index_t inner_step = 1, RandomInit init = {}) {
    Shape<R> padded = shape;
    for (int d = 2; d < R; ++d) padded[d] += 2 * ghost;
    padded[R - 1] *= inner_step;
    mem.assign(static_cast<std::size_t>(numel(padded)), std::numeric_limits<T>::quiet_NaN());
    Shape<R> st{};
    index_t acc = 1;
    for (int d = R - 1; d >= 0; --d) {
      st[d] = acc;
      acc *= padded[d];
    }
    index_t off = 0;
    for (int d = 2; d < R; ++d) off += ghost * st[d] * (d == R - 1 ? inner_step : 1);
    st[R - 1] = inner_step;
    view = Tensor<T, R>::view(mem.data() + off, shape, st);
    view.fill_random(seed, init);
  }
};

template <class T, int R>
double diff(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  return max_rel_diff(a, b);
}
template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

/// Conv forward and weight gradient on a strided x vs a contiguous copy, for one geometry.
template <class T, int R>
void check_conv(const Shape<R>& xs, index_t cout, const ConvGeometry& g0, index_t inner_step, ConvKernel kernel) {
  constexpr int S = R - 2;
  Padded<T, R> x(xs, 3, 7, inner_step);
  const Tensor<T, R> xc = x.view.contiguous();
  ConvGeometry g = g0;
  g.spatial_dims = S;
  g.batch = xs[0];
  g.in_channels = xs[1];
  g.out_channels = cout;
  for (int d = 0; d < S; ++d) g.in[3 - S + d] = xs[2 + d];
  Shape<R> wshape{};
  wshape[0] = cout;
  wshape[1] = xs[1] / g.groups;
  Shape<R> yshape{};
  yshape[0] = xs[0];
  yshape[1] = cout;
  for (int d = 0; d < S; ++d) {
    const auto e = static_cast<std::size_t>(3 - S + d);
    wshape[2 + d] = g.kernel[e];
    yshape[2 + d] = (g.in[e] + 2 * g.pad_lo[e] - g.dilation[e] * (g.kernel[e] - 1) - 1) / g.stride[e] + 1;
    g.out[e] = yshape[2 + d];
  }
  auto w = Tensor<T, R>::empty(wshape);
  w.fill_random(8);
  auto b = Tensor<T, 1>::empty({cout});
  b.fill_random(9);
  auto gy = Tensor<T, R>::empty(yshape);
  gy.fill_random(10);
  ExecContext& ctx = current_context(Device::cpu());
  const ExecSettings saved = ctx.settings();
  ctx.settings().conv_kernel = kernel;
  auto y_s = Tensor<T, R>::empty(yshape), y_c = Tensor<T, R>::empty(yshape);
  const Block bb = as_block(b);
  exec::conv_forward(g, as_block(x.view), as_block(w), &bb, as_block(y_s), ctx);
  exec::conv_forward(g, as_block(xc), as_block(w), &bb, as_block(y_c), ctx);
  auto gw_s = Tensor<T, R>::empty(wshape), gw_c = Tensor<T, R>::empty(wshape);
  exec::conv_backward_filter(g, as_block(x.view), as_block(gy), as_block(gw_s), ctx);
  exec::conv_backward_filter(g, as_block(xc), as_block(gy), as_block(gw_c), ctx);
  ctx.settings() = saved;
  // The same kernels read the same values in the same order: equal bitwise.
  CHECK(diff(y_s, y_c) == 0.0);
  CHECK(diff(gw_s, gw_c) == 0.0);
}

}  // namespace

TEMPLATE_TEST_CASE("conv kernels read strided inputs in place and equal the contiguous result", "[exec][conv][strided]",
                   float, double) {
  using T = TestType;
  for (ConvKernel k : {ConvKernel::automatic, ConvKernel::im2col_blas}) {
    INFO("kernel " << static_cast<int>(k));
    for (index_t inner_step : {index_t{1}, index_t{2}}) {  // 2: a general stride (the front copies)
      INFO("inner step " << inner_step);
      ConvGeometry g;
      g.kernel = {1, 3, 3};
      g.pad_lo = {0, 1, 1};
      check_conv<T, 4>({2, 4, 13, 17}, 5, g, inner_step, k);  // 3x3 'same'
      g.stride = {1, 2, 2};
      check_conv<T, 4>({1, 3, 12, 9}, 2, g, inner_step, k);  // strided conv (im2col)
      g = {};
      g.kernel = {1, 3, 2};
      g.dilation = {1, 2, 1};
      g.groups = 2;
      g.pad_lo = {0, 2, 0};
      check_conv<T, 4>({2, 4, 10, 11}, 6, g, inner_step, k);  // dilation, groups, even kernel
      g = {};
      check_conv<T, 4>({1, 6, 7, 5}, 3, g, inner_step, k);  // 1x1: the direct GEMM path needs dense x
      g = {};
      g.kernel = {1, 1, 5};
      g.pad_lo = {0, 0, 2};
      check_conv<T, 3>({2, 3, 19}, 4, g, inner_step, k);  // 1-D
      g = {};
      g.kernel = {3, 3, 3};
      g.pad_lo = {1, 1, 1};
      check_conv<T, 5>({1, 2, 5, 6, 7}, 3, g, inner_step, k);  // 3-D
    }
  }
}

TEMPLATE_TEST_CASE("unary ops and their backward read strided views in place", "[exec][pointwise][strided]", float,
                   double) {
  using T = TestType;
  using exec::UnaryOp;
  ExecContext& ctx = current_context(Device::cpu());
  for (index_t step : {index_t{1}, index_t{3}}) {
    const Shape<4> shape{2, 3, 9, 300};
    // Signed inputs, and positive ones for sqrt / log / rdiv_scalar.
    Padded<T, 4> xs(shape, 2, 21, step), xp(shape, 2, 23, step, RandomInit::uniform(0.5, 2.0)), g(shape, 1, 22);
    const auto gc = g.view.contiguous();
    for (int o = 0; o <= static_cast<int>(UnaryOp::rdiv_scalar); ++o) {
      const auto op = static_cast<UnaryOp>(o);
      INFO(exec::op_name(op) << ", inner step " << step);
      const double alpha = 0.3;
      const bool positive = op == UnaryOp::sqrt || op == UnaryOp::log || op == UnaryOp::rdiv_scalar;
      const Tensor<T, 4> x = positive ? xp.view : xs.view;
      const Tensor<T, 4> xc = x.contiguous();
      REQUIRE_FALSE(x.is_contiguous());
      auto y_s = Tensor<T, 4>::empty(shape), y_c = Tensor<T, 4>::empty(shape);
      exec::unary(op, alpha, as_block(x), as_block(y_s), ctx);
      exec::unary(op, alpha, as_block(xc), as_block(y_c), ctx);
      CHECK(diff(y_s, y_c) == 0.0);
      // Backward with strided x and dy (y contiguous: it is the op's own result).
      auto dx_s = Tensor<T, 4>::empty(shape), dx_c = Tensor<T, 4>::empty(shape);
      exec::unary_backward(op, alpha, as_block(x), as_block(y_c), as_block(g.view), as_block(dx_s), ctx);
      exec::unary_backward(op, alpha, as_block(xc), as_block(y_c), as_block(gc), as_block(dx_c), ctx);
      CHECK(diff(dx_s, dx_c) == 0.0);
    }
  }
}

TEMPLATE_TEST_CASE("mse and rel_l2 kernels read strided pred and target in place", "[exec][reduce][strided]", float, double) {
  using T = TestType;
  ExecContext& ctx = current_context(Device::cpu());
  for (index_t step : {index_t{1}, index_t{2}}) {
    INFO("inner step " << step);
    Padded<T, 4> p(Shape<4>{2, 3, 40, 700}, 2, 31, step), t(Shape<4>{2, 3, 40, 700}, 3, 32);
    const auto pc = p.view.contiguous(), tc = t.view.contiguous();
    const double s = exec::sq_diff_sum(as_block(p.view), as_block(t.view), ctx);
    const double sc = exec::sq_diff_sum(as_block(pc), as_block(tc), ctx);
    CHECK(std::abs(s - sc) <= 1e-12 * sc);  // double sums in another order
    const double s2 = exec::sq_diff_sum(as_block(p.view), as_block(tc), ctx);
    CHECK(std::abs(s2 - sc) <= 1e-12 * sc);
    auto gp = Tensor<T, 4>::empty(pc.shape()), gt = Tensor<T, 4>::empty(pc.shape());
    auto gpc = Tensor<T, 4>::empty(pc.shape()), gtc = Tensor<T, 4>::empty(pc.shape());
    exec::mse_backward(0.125, as_block(p.view), as_block(t.view), as_block(gp), as_block(gt), ctx);
    exec::mse_backward(0.125, as_block(pc), as_block(tc), as_block(gpc), as_block(gtc), ctx);
    CHECK(diff(gp, gpc) == 0.0);
    CHECK(diff(gt, gtc) == 0.0);
  }
  for (index_t samples : {index_t{1}, index_t{2}}) {  // rel_l2: per sample (2 = dim 0) and global
    INFO(samples << " samples");
    Padded<T, 4> p(Shape<4>{2, 3, 20, 70}, 2, 33, 1), t(Shape<4>{2, 3, 20, 70}, 1, 34, 2);
    const auto pc = p.view.contiguous(), tc = t.view.contiguous();
    double s[4], sc[4];
    exec::rel_l2_sums(as_block(p.view), as_block(t.view), samples, s, ctx);
    exec::rel_l2_sums(as_block(pc), as_block(tc), samples, sc, ctx);
    for (index_t i = 0; i < 2 * samples; ++i) CHECK(s[i] == sc[i]);  // same order: bitwise
    const double coef[4] = {0.3, -0.2, 0.7, 0.1};
    auto gp = Tensor<T, 4>::empty(pc.shape()), gt = Tensor<T, 4>::empty(pc.shape());
    auto gpc = Tensor<T, 4>::empty(pc.shape()), gtc = Tensor<T, 4>::empty(pc.shape());
    exec::rel_l2_backward(as_block(p.view), as_block(t.view), samples, coef, as_block(gp), as_block(gt), ctx);
    exec::rel_l2_backward(as_block(pc), as_block(tc), samples, coef, as_block(gpc), as_block(gtc), ctx);
    CHECK(diff(gp, gpc) == 0.0);
    CHECK(diff(gt, gtc) == 0.0);
  }
  // Shapes must agree exactly for strided operands (not only element counts).
  Padded<T, 4> a(Shape<4>{1, 2, 4, 6}, 1, 1), b(Shape<4>{1, 2, 6, 4}, 1, 2);
  CHECK_THROWS_AS(exec::sq_diff_sum(as_block(a.view), as_block(b.view), ctx), shard::Error);
}

namespace {
/// Bytes shardtensor's host allocations rose above their level before `f` (its high-water mark).
template <class F>
std::size_t peak_rise(F&& f) {
  const std::size_t before = memory_stats().current_bytes;
  reset_peak_memory();
  f();
  return memory_stats().peak_bytes - before;
}
}  // namespace

TEMPLATE_TEST_CASE("no copy of a stable strided view: conv, unary and mse forwards allocate less than the view",
                   "[nn][strided][nocopy]", float, double) {
  using T = TestType;
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  const Shape<4> xs{1, 16, 96, 128};  // the interior of a [1, 16, 100, 132] array
  Padded<T, 4> xf(xs, 2, 41), tf(Shape<4>{1, 1, 96, 128}, 2, 42);
  const std::size_t xbytes = static_cast<std::size_t>(numel(xs)) * sizeof(T);
  Var<T, 4> x(DistTensor<T, 4>::from_local(xf.view.declare_stable(), mesh, {Replicate()}), true);
  Var<T, 4> w(DistTensor<T, 4>::random({1, 16, 3, 3}, mesh, {Replicate()}, 5), true);
  Var<T, 1> b(DistTensor<T, 1>::random({1}, mesh, {Replicate()}, 6), true);
  Var<T, 4> t(DistTensor<T, 4>::from_local(tf.view.declare_stable(), mesh, {Replicate()}), false);
  ExecContext& ctx = current_context(Device::cpu());
  const ExecSettings saved = ctx.settings();
  ctx.settings().conv_column_budget = 64 << 10;  // keep the engine's scratch small and fixed
  F::ConvOptions<2> o = F::ConvOptions<2>::symmetric(1);
  Var<T, 4> y;
  const std::size_t conv_rise = peak_rise([&] { y = F::conv(x, w, b, o); });
  Var<T, 1> loss;
  const std::size_t mse_rise = peak_rise([&] { loss = F::mse_loss(F::resolve(x), x); });
  Var<T, 4> a;
  const std::size_t tanh_rise = peak_rise([&] { a = F::tanh(x); });
  const std::size_t loss_rise = peak_rise([&] { loss = F::mse_loss(y, t); });
  ctx.settings() = saved;
  INFO("input " << xbytes << " B; conv forward +" << conv_rise << " B, mse(x, x) +" << mse_rise << " B, tanh +"
                << tanh_rise << " B, mse(y, t) +" << loss_rise);
  // conv's output is 1/16 of x: a copy of x would lift the peak by >= xbytes.
  CHECK(conv_rise < xbytes / 2);
  CHECK(mse_rise < xbytes / 16);
  CHECK(tanh_rise < xbytes + xbytes / 4);  // the output itself, no copy of x besides
  CHECK(loss_rise < xbytes / 16);
  // Backward gives the same gradients as from contiguous library memory.
  loss.backward();
  Var<T, 4> x2(DistTensor<T, 4>::from_local(xf.view.contiguous(), mesh, {Replicate()}), true);
  Var<T, 4> w2(DistTensor<T, 4>::random({1, 16, 3, 3}, mesh, {Replicate()}, 5), true);
  Var<T, 1> b2(DistTensor<T, 1>::random({1}, mesh, {Replicate()}, 6), true);
  Var<T, 4> t2(DistTensor<T, 4>::from_local(tf.view.contiguous(), mesh, {Replicate()}), false);
  F::mse_loss(F::conv(x2, w2, b2, o), t2).backward();
  CHECK(diff(x.grad().local(), x2.grad().local()) == 0.0);
  CHECK(diff(w.grad().local(), w2.grad().local()) == 0.0);
}

TEMPLATE_TEST_CASE("norms read strided views in place: batch, group, instance and layer norm equal the contiguous result",
                   "[nn][norm][strided]", float, double) {
  using T = TestType;
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  const Shape<4> xs{2, 6, 9, 70};
  for (index_t step : {index_t{1}, index_t{2}}) {
    Padded<T, 4> xf(xs, 2, 51, step);
    REQUIRE_FALSE(xf.view.is_contiguous());
    using Fn = std::function<Var<T, 4>(const Var<T, 4>&, const Var<T, 1>&, const Var<T, 1>&)>;
    const std::vector<std::pair<const char*, Fn>> norms{
        {"batch_norm", [](const Var<T, 4>& x, const Var<T, 1>& w, const Var<T, 1>& b) {
           return F::batch_norm(x, nullptr, nullptr, w, b, true);
         }},
        {"group_norm", [](const Var<T, 4>& x, const Var<T, 1>& w, const Var<T, 1>& b) {
           return F::group_norm(x, 3, w, b);
         }},
        {"instance_norm", [](const Var<T, 4>& x, const Var<T, 1>& w, const Var<T, 1>& b) {
           return F::instance_norm(x, w, b);
         }},
        {"layer_norm over C", [](const Var<T, 4>& x, const Var<T, 1>& w, const Var<T, 1>& b) {
           return F::layer_norm(x, w, b, 1e-5, 1);
         }},
        {"layer_norm over the last dim (no affine)", [](const Var<T, 4>& x, const Var<T, 1>&, const Var<T, 1>&) {
           return F::layer_norm(x, std::nullopt, std::nullopt, 1e-5, -1);
         }},
    };
    for (const auto& [name, fn] : norms) {
      INFO(name << ", inner step " << step);
      auto run = [&, fn = fn](const Tensor<T, 4>& xl) {
        Var<T, 4> x(DistTensor<T, 4>::from_local(xl, mesh, {Replicate()}), true);
        Var<T, 1> w(DistTensor<T, 1>::random({6}, mesh, {Replicate()}, 52), true);
        Var<T, 1> b(DistTensor<T, 1>::random({6}, mesh, {Replicate()}, 53), true);
        Var<T, 4> g(DistTensor<T, 4>::random(xs, mesh, {Replicate()}, 54), false);
        auto y = fn(x, w, b);
        F::sum(F::mul(y, g)).backward();
        const auto zero = Tensor<T, 1>::zeros({6});
        return std::tuple{y.value().local().contiguous(), x.grad().local().contiguous(),
                          w.has_grad() ? w.grad().local().contiguous() : zero,
                          b.has_grad() ? b.grad().local().contiguous() : zero};
      };
      const auto [y_s, gx_s, gw_s, gb_s] = run(xf.view.declare_stable());
      const auto [y_c, gx_c, gw_c, gb_c] = run(xf.view.contiguous());
      // The same sums in the same order: equal bitwise.
      CHECK(diff(y_s, y_c) == 0.0);
      CHECK(diff(gx_s, gx_c) == 0.0);
      CHECK(max_rel_diff(gw_s, gw_c) == 0.0);
      CHECK(max_rel_diff(gb_s, gb_c) == 0.0);
    }
  }
  // No copy: the forward of a norm on a stable view allocates its output, not a copy of x.
  Padded<T, 4> xf(xs, 2, 55);
  const std::size_t xbytes = static_cast<std::size_t>(numel(xs)) * sizeof(T);
  Var<T, 4> x(DistTensor<T, 4>::from_local(xf.view.declare_stable(), mesh, {Replicate()}), true);
  Var<T, 4> y;
  const std::size_t rise = peak_rise([&] { y = F::group_norm(x, 3); });
  INFO("input " << xbytes << " B, group_norm forward +" << rise << " B");
  CHECK(rise < xbytes + xbytes / 4);
}
