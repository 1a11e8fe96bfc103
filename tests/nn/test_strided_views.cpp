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

namespace st_nn_test_strided_views {

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
  exec::conv_backward_weight(g, as_block(x.view), as_block(gy), as_block(gw_s), ctx);
  exec::conv_backward_weight(g, as_block(xc), as_block(gy), as_block(gw_c), ctx);
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
    // (name, op, length of its affine parameters)
    const std::vector<std::tuple<const char*, Fn, index_t>> norms{
        {"batch_norm", [](const Var<T, 4>& x, const Var<T, 1>& w, const Var<T, 1>& b) {
           return F::batch_norm(x, nullptr, nullptr, w, b, true);
         }, 6},
        {"group_norm", [](const Var<T, 4>& x, const Var<T, 1>& w, const Var<T, 1>& b) {
           return F::group_norm(x, 3, w, b);
         }, 6},
        {"instance_norm", [](const Var<T, 4>& x, const Var<T, 1>& w, const Var<T, 1>& b) {
           return F::instance_norm(x, w, b);
         }, 6},
        {"layer_norm over C", [](const Var<T, 4>& x, const Var<T, 1>& w, const Var<T, 1>& b) {
           return F::layer_norm(x, w, b, 1e-5, 1);
         }, 6},
        {"layer_norm over the last dim (no affine)", [](const Var<T, 4>& x, const Var<T, 1>&, const Var<T, 1>&) {
           return F::layer_norm(x, std::nullopt, std::nullopt, 1e-5, -1);
         }, 6},
        // the contiguous x takes the CPU table's row walk of statistics (S == 1), the strided one
        // the general [A, C, S] walk: the same operations in the same order
        {"layer_norm over the last dim, affine, fused GELU", [](const Var<T, 4>& x, const Var<T, 1>& w, const Var<T, 1>& b) {
           return F::layer_norm(x, w, b, 1e-5, -1, F::NormAct::gelu);
         }, 70},
    };
    for (const auto& [name, fn, pc] : norms) {
      INFO(name << ", inner step " << step);
      auto run = [&, fn = fn, pc = pc](const Tensor<T, 4>& xl) {
        Var<T, 4> x(DistTensor<T, 4>::from_local(xl, mesh, {Replicate()}), true);
        Var<T, 1> w(DistTensor<T, 1>::random({pc}, mesh, {Replicate()}, 52), true);
        Var<T, 1> b(DistTensor<T, 1>::random({pc}, mesh, {Replicate()}, 53), true);
        Var<T, 4> g(DistTensor<T, 4>::random(xs, mesh, {Replicate()}, 54), false);
        auto y = fn(x, w, b);
        F::sum(F::mul(y, g)).backward();
        const auto zero = Tensor<T, 1>::zeros({pc});
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

// ---- linear / channel_linear, reductions, concat (issue 8 item 2, the remaining ops) ----

namespace {

/// A view of shape `shape` whose last two dims are transposed in memory (innermost stride > 1,
/// strides not monotone), inside a padded buffer (ghost g on both, NaN outside the view).
template <class T>
struct Transposed4 {
  std::vector<T> mem;
  Tensor<T, 4> view;
  Transposed4(const Shape<4>& s, index_t g, std::uint64_t seed) {
    const index_t ph = s[2] + 2 * g, pw = s[3] + 2 * g;
    mem.assign(static_cast<std::size_t>(s[0] * s[1] * ph * pw), std::numeric_limits<T>::quiet_NaN());
    // memory [N, C, W + 2g, H + 2g]; the view [N, C, H, W] reads (h, w) at w * ph + h.
    view = Tensor<T, 4>::view(mem.data() + g * ph + g, s, Shape<4>{s[1] * ph * pw, ph * pw, 1, ph});
    view.fill_random(seed);
  }
};

/// Strided views of [2, 3, 9, 70]: padded interior (inner step 1), a general inner stride (2),
/// and transposed last dims. name, view; the owner keeps the memory.
template <class T>
struct ReductionViews {
  Padded<T, 4> a{Shape<4>{2, 3, 9, 70}, 2, 61, 1}, b{Shape<4>{2, 3, 9, 70}, 1, 62, 2};
  Transposed4<T> c{Shape<4>{2, 3, 9, 70}, 2, 63};
  std::vector<std::pair<const char*, Tensor<T, 4>>> views() const {
    return {{"padded interior", a.view}, {"inner step 2", b.view}, {"transposed", c.view}};
  }
};

/// y = reduce(x) and dL/dx for L = sum(y * g) (g a fixed random gradient), on a Var from_local(xl).
template <class T, class Fn>
std::pair<Tensor<T, 4>, Tensor<T, 4>> reduce_and_grad(const Tensor<T, 4>& xl, Fn fn) {
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  Var<T, 4> x(DistTensor<T, 4>::from_local(xl, mesh, {Replicate()}), true);
  Var<T, 4> y = fn(x);
  Var<T, 4> g(DistTensor<T, 4>::random(y.value().global_shape(), mesh, {Replicate()}, 64), false);
  F::sum(F::mul(y, g)).backward();
  return {y.value().local().contiguous(), x.grad().local().contiguous()};
}

}  // namespace

TEMPLATE_TEST_CASE("reductions read strided views in place: sum, mean and max equal the contiguous result bitwise",
                   "[nn][reduce][strided]", float, double) {
  using T = TestType;
  ReductionViews<T> rv;
  // Ties for max: a view whose values are a few repeated levels (ties inside rows and across rows).
  Padded<T, 4> tie(Shape<4>{2, 3, 9, 70}, 2, 65);
  for (index_t n = 0; n < 2; ++n)
    for (index_t c = 0; c < 3; ++c)
      for (index_t h = 0; h < 9; ++h)
        for (index_t w = 0; w < 70; ++w) tie.view(n, c, h, w) = static_cast<T>((n + 2 * c + 3 * h + 5 * w) % 7);
  auto views = rv.views();
  views.emplace_back("max ties", tie.view);
  const std::vector<std::vector<int>> dim_sets{{0, 1, 2, 3}, {1}, {2, 3}, {0, 2}, {3}, {-1, 0}};
  for (const auto& [vname, view] : views) {
    REQUIRE_FALSE(view.is_contiguous());
    const Tensor<T, 4> stable = view.declare_stable(), copy = view.contiguous();
    for (const auto& dims : dim_sets) {
      for (int kind = 0; kind < 3; ++kind) {
        INFO(vname << ", dims " << fmt::format("{}", dims) << ", " << (kind == 0 ? "sum" : kind == 1 ? "mean" : "max"));
        auto fn = [&, kind](const Var<T, 4>& x) {
          return kind == 0 ? F::sum(x, dims) : kind == 1 ? F::mean(x, dims) : F::max(x, dims);
        };
        const auto [y_s, gx_s] = reduce_and_grad<T>(stable, fn);
        const auto [y_c, gx_c] = reduce_and_grad<T>(copy, fn);
        REQUIRE(y_s.shape() == y_c.shape());
        // The same values visited in the same order: equal bitwise (NaN ghosts would show).
        CHECK(diff(y_s, y_c) == 0.0);
        CHECK(diff(gx_s, gx_c) == 0.0);
      }
    }
    // The all-dims scalar forms.
    DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
    for (int kind = 0; kind < 3; ++kind) {
      INFO(vname << ", all elements, kind " << kind);
      auto run = [&](const Tensor<T, 4>& xl) {
        Var<T, 4> x(DistTensor<T, 4>::from_local(xl, mesh, {Replicate()}), true);
        auto y = kind == 0 ? F::sum(x) : kind == 1 ? F::mean(x) : F::max(x);
        F::mul(y, T(0.75)).backward();
        return std::pair{y.value().local().data()[0], x.grad().local().contiguous()};
      };
      const auto [v_s, g_s] = run(stable);
      const auto [v_c, g_c] = run(copy);
      CHECK(v_s == v_c);
      CHECK(diff(g_s, g_c) == 0.0);
    }
  }
}

namespace {

/// y = linear(x, w, b) (cdim last) or channel_linear (cdim 1), and every gradient of
/// L = sum(y * g), on a Var from_local(xl).
template <class T, int R>
struct MixResult {
  Tensor<T, R> y, gx;
  Tensor<T, 2> gw;
  Tensor<T, 1> gb;
};
template <class T, int R>
MixResult<T, R> mix_and_grads(const Tensor<T, R>& xl, index_t cout, bool tokens) {
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  const index_t cin = xl.size(tokens ? R - 1 : 1);
  Var<T, R> x(DistTensor<T, R>::from_local(xl, mesh, {Replicate()}), true);
  Var<T, 2> w(DistTensor<T, 2>::random({cout, cin}, mesh, {Replicate()}, 71), true);
  Var<T, 1> b(DistTensor<T, 1>::random({cout}, mesh, {Replicate()}, 72), true);
  Var<T, R> y = tokens ? F::linear(x, w, b) : F::channel_linear(x, w, b);
  Var<T, R> g(DistTensor<T, R>::random(y.value().global_shape(), mesh, {Replicate()}, 73), false);
  F::sum(F::mul(y, g)).backward();
  return {y.value().local().contiguous(), x.grad().local().contiguous(), w.grad().local().contiguous(),
          b.grad().local().contiguous()};
}

/// Rounding bound of a GEMM whose blocking differs from the contiguous call's.
template <class T>
constexpr double gemm_tol() {
  return std::is_same_v<T, double> ? 1e-13 : 1e-5;
}

/// Strided (stable) vs contiguous: dx and db bitwise (they read no x); y and dW bitwise when the
/// view is read as the same GEMMs as the contiguous copy (`same_panels`: one panel per contiguous
/// GEMM, only the leading dimension differs), else to rounding (several smaller GEMMs: BLAS
/// blocks them differently, and dW accumulates over the panels).
template <class T, int R>
void check_mix(const Tensor<T, R>& view, index_t cout, bool tokens, bool same_panels) {
  REQUIRE_FALSE(view.is_contiguous());
  const auto s = mix_and_grads<T, R>(view.declare_stable(), cout, tokens);
  const auto c = mix_and_grads<T, R>(view.contiguous(), cout, tokens);
  CHECK(diff(s.gx, c.gx) == 0.0);
  CHECK(max_rel_diff(s.gb, c.gb) == 0.0);
  if (same_panels) {
    CHECK(diff(s.y, c.y) == 0.0);
    CHECK(max_rel_diff(s.gw, c.gw) == 0.0);
  } else {
    CHECK(diff(s.y, c.y) <= gemm_tol<T>());
    CHECK(max_rel_diff(s.gw, c.gw) <= gemm_tol<T>());
  }
}

}  // namespace

TEMPLATE_TEST_CASE("linear and channel_linear read strided views in place and equal the contiguous result",
                   "[nn][linear][strided]", float, double) {
  using T = TestType;
  // linear on tokens [B, L, C] with rows of the padded width: all token rows collapse to one
  // matrix with lda = C + 4 (one GEMM, as on the contiguous copy).
  {
    INFO("linear, tokens [3, 50, 24] with rows of 28");
    Padded<T, 3> x(Shape<3>{3, 50, 24}, 2, 81);
    check_mix<T, 3>(x.view, 7, true, true);
  }
  {
    INFO("linear, [2, 9, 11, 24] interior of a ghosted [2, 9, 15, 28] array (one panel per row)");
    Padded<T, 4> x(Shape<4>{2, 9, 11, 24}, 2, 82);
    check_mix<T, 4>(x.view, 5, true, false);
  }
  {
    INFO("linear, [40, 16] rows of a [40, 20] array (one panel, as the contiguous GEMM)");
    std::vector<T> mem(40 * 20, std::numeric_limits<T>::quiet_NaN());
    auto v = Tensor<T, 2>::view(mem.data() + 2, {40, 16}, {20, 1});
    v.fill_random(83);
    check_mix<T, 2>(v, 9, true, true);
  }
  {
    INFO("linear, inner stride 2 (copied once)");
    Padded<T, 3> x(Shape<3>{2, 30, 12}, 1, 84, 2);
    check_mix<T, 3>(x.view, 6, true, true);
  }
  // channel_linear on [N, C, H, W]: the interior of a ghosted array (one panel per row), a view
  // padded only in C (one panel per sample, as the contiguous GEMMs), a general inner stride.
  {
    INFO("channel_linear, [2, 6, 13, 17] interior of [2, 6, 17, 21]");
    Padded<T, 4> x(Shape<4>{2, 6, 13, 17}, 2, 85);
    check_mix<T, 4>(x.view, 4, false, false);
  }
  {
    INFO("channel_linear, [2, 6, 221] channels of a [2, 8, 221] array");
    std::vector<T> mem(2 * 8 * 221, std::numeric_limits<T>::quiet_NaN());
    auto v = Tensor<T, 3>::view(mem.data() + 221, {2, 6, 221}, {8 * 221, 221, 1});
    v.fill_random(86);
    check_mix<T, 3>(v, 5, false, true);
  }
  {
    INFO("channel_linear, inner step 2 and transposed (copied once)");
    Padded<T, 4> x(Shape<4>{1, 5, 7, 9}, 1, 87, 2);
    check_mix<T, 4>(x.view, 3, false, true);
    Transposed4<T> t(Shape<4>{2, 5, 7, 9}, 1, 88);
    check_mix<T, 4>(t.view, 3, false, true);
  }
  {
    INFO("channel_linear, 3-D [1, 4, 5, 6, 7] interior");
    Padded<T, 5> x(Shape<5>{1, 4, 5, 6, 7}, 1, 89);
    check_mix<T, 5>(x.view, 3, false, false);
  }
}

TEMPLATE_TEST_CASE("concat reads strided views in place and equals the contiguous result", "[nn][concat][strided]",
                   float, double) {
  using T = TestType;
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  Padded<T, 4> a(Shape<4>{2, 3, 40, 64}, 2, 91), b(Shape<4>{2, 5, 40, 64}, 1, 92, 2);
  auto run = [&](const Tensor<T, 4>& al, const Tensor<T, 4>& bl) {
    Var<T, 4> xa(DistTensor<T, 4>::from_local(al, mesh, {Replicate()}), true);
    Var<T, 4> xb(DistTensor<T, 4>::from_local(bl, mesh, {Replicate()}), true);
    Var<T, 4> g(DistTensor<T, 4>::random({2, 8, 40, 64}, mesh, {Replicate()}, 93), false);
    Var<T, 4> y;
    const std::size_t rise = peak_rise([&] { y = F::concat(xa, xb); });
    F::sum(F::mul(y, g)).backward();
    return std::tuple{y.value().local().contiguous(), xa.grad().local().contiguous(), xb.grad().local().contiguous(),
                      rise};
  };
  const auto [y_s, ga_s, gb_s, rise] = run(a.view.declare_stable(), b.view.declare_stable());
  const auto [y_c, ga_c, gb_c, rise_c] = run(a.view.contiguous(), b.view.contiguous());
  CHECK(diff(y_s, y_c) == 0.0);
  CHECK(diff(ga_s, ga_c) == 0.0);
  CHECK(diff(gb_s, gb_c) == 0.0);
  // The forward allocates its output only: no copy of the inputs.
  const std::size_t ybytes = static_cast<std::size_t>(y_c.numel()) * sizeof(T);
  INFO("output " << ybytes << " B, concat forward +" << rise << " B (contiguous inputs +" << rise_c << " B)");
  CHECK(rise < ybytes + ybytes / 8);
}

TEMPLATE_TEST_CASE("no copy of a stable strided view: linear, channel_linear and reductions allocate less than the view",
                   "[nn][strided][nocopy]", float, double) {
  using T = TestType;
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  const Shape<4> xs{1, 16, 96, 128};  // channels-first interior of a [1, 16, 100, 132] array
  Padded<T, 4> xf(xs, 2, 95);
  const Shape<3> ts{4, 512, 64};  // tokens whose rows are 68 wide (ghost columns)
  Padded<T, 3> tf(ts, 2, 96);
  const std::size_t xbytes = static_cast<std::size_t>(numel(xs)) * sizeof(T);
  const std::size_t tbytes = static_cast<std::size_t>(numel(ts)) * sizeof(T);
  Var<T, 4> x(DistTensor<T, 4>::from_local(xf.view.declare_stable(), mesh, {Replicate()}), true);
  Var<T, 3> t(DistTensor<T, 3>::from_local(tf.view.declare_stable(), mesh, {Replicate()}), true);
  Var<T, 2> w1(DistTensor<T, 2>::random({2, 16}, mesh, {Replicate()}, 97), true);
  Var<T, 2> w2(DistTensor<T, 2>::random({4, 64}, mesh, {Replicate()}, 98), true);
  Var<T, 4> y, s1, m1;
  Var<T, 3> z;
  Var<T, 1> s;
  const std::size_t cl_rise = peak_rise([&] { y = F::channel_linear(x, w1); });
  const std::size_t lin_rise = peak_rise([&] { z = F::linear(t, w2); });
  const std::size_t sum_rise = peak_rise([&] { s1 = F::sum(x, {1}); });
  const std::size_t max_rise = peak_rise([&] { m1 = F::max(x, {2, 3}); });
  const std::size_t all_rise = peak_rise([&] { s = F::mean(x); });
  INFO("x " << xbytes << " B, tokens " << tbytes << " B; channel_linear +" << cl_rise << " B, linear +" << lin_rise
            << " B, sum(dim 1) +" << sum_rise << " B, max(dims 2, 3) +" << max_rise << " B, mean +" << all_rise << " B");
  // Outputs are 1/8 (channel_linear), 1/16 (linear, sum) of the input or less: a copy of the input
  // would lift the peak by >= its size.
  CHECK(cl_rise < xbytes / 4);
  CHECK(lin_rise < tbytes / 4);
  CHECK(sum_rise < xbytes / 4);
  CHECK(max_rise < xbytes / 4);
  CHECK(all_rise < xbytes / 4);
  // Backward reads the saved views (no snapshot was taken): gradients equal those from copies.
  F::add(F::add(F::sum(F::mul(y, y)), F::sum(F::mul(z, z))), F::add(F::add(F::sum(s1), F::sum(m1)), s)).backward();
  CHECK(x.value().local().data() == xf.view.data());
  Var<T, 4> x2(DistTensor<T, 4>::from_local(xf.view.contiguous(), mesh, {Replicate()}), true);
  Var<T, 3> t2(DistTensor<T, 3>::from_local(tf.view.contiguous(), mesh, {Replicate()}), true);
  Var<T, 2> w1b(DistTensor<T, 2>::random({2, 16}, mesh, {Replicate()}, 97), true);
  Var<T, 2> w2b(DistTensor<T, 2>::random({4, 64}, mesh, {Replicate()}, 98), true);
  auto y2 = F::channel_linear(x2, w1b);
  auto z2 = F::linear(t2, w2b);
  F::add(F::add(F::sum(F::mul(y2, y2)), F::sum(F::mul(z2, z2))),
         F::add(F::add(F::sum(F::sum(x2, {1})), F::sum(F::max(x2, {2, 3}))), F::mean(x2)))
      .backward();
  // (channel_linear reads 96 row panels here: its y, and so dx, agree to rounding)
  CHECK(diff(x.grad().local(), x2.grad().local()) <= gemm_tol<T>());
  CHECK(diff(t.grad().local(), t2.grad().local()) == 0.0);
  CHECK(max_rel_diff(w1.grad().local(), w1b.grad().local()) <= gemm_tol<T>());
  CHECK(max_rel_diff(w2.grad().local(), w2b.grad().local()) == 0.0);
}

TEMPLATE_TEST_CASE("upsampling reads strided views in place: nearest and linear equal the contiguous result bitwise",
                   "[nn][upsample][strided]", float, double) {
  using T = TestType;
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  auto check = [&](auto view, auto scale) {
    using Ten = decltype(view);
    constexpr int R = Ten::rank;
    REQUIRE_FALSE(view.is_contiguous());
    for (ResizeMode mode : {ResizeMode::nearest, ResizeMode::linear}) {
      INFO((mode == ResizeMode::nearest ? "nearest" : "linear") << ", rank " << R);
      auto run = [&](const Tensor<T, R>& xl) {
        Var<T, R> x(DistTensor<T, R>::from_local(xl, mesh, {Replicate()}), true);
        auto y = F::upsample(x, mode, scale);
        Var<T, R> g(DistTensor<T, R>::random(y.value().global_shape(), mesh, {Replicate()}, 77), false);
        F::sum(F::mul(y, g)).backward();
        return std::pair{y.value().local().contiguous(), x.grad().local().contiguous()};
      };
      const auto [y_s, g_s] = run(view.declare_stable());
      const auto [y_c, g_c] = run(view.contiguous());
      CHECK(diff(y_s, y_c) == 0.0);
      CHECK(diff(g_s, g_c) == 0.0);
    }
  };
  Padded<T, 3> a(Shape<3>{2, 3, 17}, 2, 101), a2(Shape<3>{2, 3, 17}, 1, 102, 2);
  check(a.view, Shape<1>{3});
  check(a2.view, Shape<1>{2});
  Padded<T, 4> b(Shape<4>{2, 3, 9, 11}, 2, 103), b2(Shape<4>{1, 2, 7, 6}, 1, 104, 3);
  Transposed4<T> bt(Shape<4>{2, 3, 9, 11}, 1, 105);
  check(b.view, Shape<2>{2, 3});
  check(b2.view, Shape<2>{2, 2});
  check(bt.view, Shape<2>{3, 2});
  Padded<T, 5> c(Shape<5>{1, 2, 5, 6, 7}, 1, 106);
  check(c.view, Shape<3>{2, 2, 2});
  // No copy: the forward on a stable view allocates its output (4x the input) and nothing else.
  Padded<T, 4> big(Shape<4>{1, 8, 96, 128}, 2, 107);
  const std::size_t xbytes = static_cast<std::size_t>(big.view.numel()) * sizeof(T);
  Var<T, 4> x(DistTensor<T, 4>::from_local(big.view.declare_stable(), mesh, {Replicate()}), true);
  for (ResizeMode mode : {ResizeMode::nearest, ResizeMode::linear}) {
    Var<T, 4> y;
    const std::size_t rise = peak_rise([&] { y = F::upsample(x, mode, Shape<2>{2, 2}); });
    INFO("input " << xbytes << " B, upsample forward +" << rise << " B (output " << 4 * xbytes << " B)");
    CHECK(rise < 4 * xbytes + xbytes / 4);
  }
}

TEMPLATE_TEST_CASE("neighbourhood attention reads strided q, k, v in place and equals the contiguous result bitwise",
                   "[nn][attention][strided]", float, double) {
  using T = TestType;
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  auto check = [&](auto qv, auto kv, auto vv, const F::NeighborhoodOptions& o) {
    constexpr int R = decltype(qv)::rank;
    auto run = [&](const Tensor<T, R>& ql, const Tensor<T, R>& kl, const Tensor<T, R>& vl) {
      Var<T, R> q(DistTensor<T, R>::from_local(ql, mesh, {Replicate()}), true);
      Var<T, R> k(DistTensor<T, R>::from_local(kl, mesh, {Replicate()}), true);
      Var<T, R> v(DistTensor<T, R>::from_local(vl, mesh, {Replicate()}), true);
      auto y = F::neighborhood_attention(q, k, v, o);
      Var<T, R> g(DistTensor<T, R>::random(y.value().global_shape(), mesh, {Replicate()}, 111), false);
      F::sum(F::mul(y, g)).backward();
      return std::tuple{y.value().local().contiguous(), q.grad().local().contiguous(), k.grad().local().contiguous(),
                        v.grad().local().contiguous()};
    };
    const auto [y_s, gq_s, gk_s, gv_s] = run(qv.declare_stable(), kv.declare_stable(), vv.declare_stable());
    const auto [y_c, gq_c, gk_c, gv_c] = run(qv.contiguous(), kv.contiguous(), vv.contiguous());
    CHECK(diff(y_s, y_c) == 0.0);
    CHECK(diff(gq_s, gq_c) == 0.0);
    CHECK(diff(gk_s, gk_c) == 0.0);
    CHECK(diff(gv_s, gv_c) == 0.0);
  };
  {
    INFO("2-D [2, 9, 8, 2, 5] interiors of ghosted arrays (ghosts on S1, H, D), window 3x3");
    Padded<T, 5> q(Shape<5>{2, 9, 8, 2, 5}, 1, 112), k(Shape<5>{2, 9, 8, 2, 5}, 2, 113), v(Shape<5>{2, 9, 8, 2, 4}, 1, 114);
    check(q.view, k.view, v.view, F::NeighborhoodOptions{{3, 3}, {}, {}, 0});
    check(q.view, k.view, v.view, F::NeighborhoodOptions{{3, 4}, {1, 2}, {true, false}, 0});
  }
  {
    INFO("1-D [2, 17, 3, 4], q with inner step 2 (copied once)");
    Padded<T, 4> q(Shape<4>{2, 17, 3, 4}, 1, 115, 2), k(Shape<4>{2, 17, 3, 4}, 1, 116), v(Shape<4>{2, 17, 3, 4}, 2, 117);
    check(q.view, k.view, v.view, F::NeighborhoodOptions{{5}, {}, {}, 0});
  }
  // No copy: the forward on stable views allocates its output and lse, no copy of q, k or v.
  Padded<T, 5> q(Shape<5>{1, 32, 32, 4, 16}, 1, 118), k(Shape<5>{1, 32, 32, 4, 16}, 1, 119),
      v(Shape<5>{1, 32, 32, 4, 16}, 1, 120);
  const std::size_t qbytes = static_cast<std::size_t>(q.view.numel()) * sizeof(T);
  Var<T, 5> qv(DistTensor<T, 5>::from_local(q.view.declare_stable(), mesh, {Replicate()}), true);
  Var<T, 5> kv(DistTensor<T, 5>::from_local(k.view.declare_stable(), mesh, {Replicate()}), true);
  Var<T, 5> vv(DistTensor<T, 5>::from_local(v.view.declare_stable(), mesh, {Replicate()}), true);
  Var<T, 5> y;
  const std::size_t rise = peak_rise([&] { y = F::neighborhood_attention(qv, kv, vv, F::NeighborhoodOptions{{3, 3}}); });
  INFO("q " << qbytes << " B, neighbourhood attention forward +" << rise << " B");
  CHECK(rise < qbytes + qbytes / 4);  // out (q's size) and lse (1/16); a copy of q, k, v adds 3 x qbytes
}

}  // namespace st_nn_test_strided_views
