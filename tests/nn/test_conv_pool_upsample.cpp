// Serial tests of the window ops at one rank against the plain local kernels on the full tensor
// (nn/functional/conv_local.hpp, nn/functional/pool_local.hpp, resize_local.hpp), with non-zero padding modes applied by an explicit
// index-mapped padding (and its adjoint for the gradient); the layout algebra of window.hpp.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_nn_test_conv_pool_upsample {

using namespace shard;
using shard::nn::functional::ConvOptions;
using autograd::Var;

namespace {

const DeviceMesh& mesh1() {
  static DeviceMesh m(std::make_shared<SelfComm>(), {1});
  return m;
}
template <class T, int R>
Var<T, R> rnd(const Shape<R>& s, std::uint64_t seed, bool rg = true) {
  return Var<T, R>(DistTensor<T, R>::random(s, mesh1(), {Replicate()}, seed), rg);
}
template <class T, int R>
Tensor<T, R> rnd_t(const Shape<R>& s, std::uint64_t seed) {
  auto t = Tensor<T, R>::empty(s);
  t.fill_random(seed);
  return t;
}
/// Runs backward from y with the output gradient gy.
template <class T, int R>
void backward_with(const Var<T, R>& y, const Tensor<T, R>& gy) {
  y.accumulate_grad(DistTensor<T, R>(y.value().spec(), gy));
  autograd::run_backward(y.node());
}

index_t source(index_t g, index_t n, Boundary m) {
  if (g >= 0 && g < n) return g;
  switch (m) {
    case Boundary::zero: return -1;
    case Boundary::periodic: return ((g % n) + n) % n;
    case Boundary::reflect: return g < 0 ? -g : 2 * (n - 1) - g;
    case Boundary::replicate: return g < 0 ? 0 : n - 1;
  }
  return -1;
}

/// x padded by (lo, hi) per spatial dim with the given modes (explicit index maps).
template <class T, int R>
Tensor<T, R> pad_full(const Tensor<T, R>& x, const Shape<R - 2>& lo, const Shape<R - 2>& hi,
                      const std::array<Boundary, R - 2>& modes, const Tensor<T, R>* adj_src = nullptr,
                      Tensor<T, R>* adj_dst = nullptr) {
  Shape<R> ps = x.shape();
  for (int d = 0; d < R - 2; ++d) ps[2 + d] += lo[d] + hi[d];
  auto out = Tensor<T, R>::zeros(ps);
  for (index_t i = 0; i < out.numel(); ++i) {
    auto idx = unravel(i, ps);
    Shape<R> src = idx;
    bool ok = true;
    for (int d = 0; d < R - 2; ++d) {
      src[2 + d] = source(idx[2 + d] - lo[d], x.size(2 + d), modes[static_cast<std::size_t>(d)]);
      ok = ok && src[2 + d] >= 0;
    }
    if (!ok) continue;
    if (adj_src) adj_dst->at(src) += adj_src->at(idx);  // adjoint: scatter-add the padded gradient
    else out.at(idx) = x.at(src);
  }
  return out;
}

template <class T, int R>
void check_close(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  REQUIRE(a.shape() == b.shape());
  CHECK(max_rel_diff(a, b) <= (std::is_same_v<T, double> ? 1e-12 : 1e-5));
}

template <class T, int R>
void conv_case(const Shape<R>& xs, const Shape<R>& ws, const F::ConvOptions<R - 2>& o, bool with_bias) {
  constexpr int S = R - 2;
  INFO("input " << fmt::format("{}", xs) << " weight " << fmt::format("{}", ws) << " stride "
                << fmt::format("{}", o.stride) << " pad " << fmt::format("{} {}", o.pad_lo, o.pad_hi) << " dil "
                << fmt::format("{}", o.dilation) << " groups " << o.groups);
  auto x = rnd<T, R>(xs, 1), w = rnd<T, R>(ws, 2);
  auto b = rnd<T, 1>({ws[0]}, 3);
  auto y = with_bias ? F::conv(x, w, b, o) : F::conv(x, w, std::nullopt, o);
  // Oracle: explicit padding, then the local kernel without padding.
  const auto xp = pad_full(x.local(), o.pad_lo, o.pad_hi, o.padding_mode);
  ConvOptions<S> p0;
  p0.stride = o.stride;
  p0.dilation = o.dilation;
  p0.groups = o.groups;
  std::optional<Tensor<T, 1>> bl;
  if (with_bias) bl = b.local();
  const auto yref = conv_forward(xp, w.local(), bl, p0);
  check_close(y.local(), yref);
  const auto gy = rnd_t<T, R>(yref.shape(), 4);
  backward_with(y, gy);
  const auto gxp = conv_backward_input(gy, w.local(), detail::spatial_of<S>(xp.shape()), p0);
  auto gx = Tensor<T, R>::zeros(xs);
  pad_full(x.local(), o.pad_lo, o.pad_hi, o.padding_mode, &gxp, &gx);
  check_close(x.grad().local(), gx);
  check_close(w.grad().local(), conv_backward_weight(xp, gy, detail::spatial_of<S>(ws), p0));
  if (with_bias) check_close(b.grad().local(), conv_backward_bias(gy));
}

}  // namespace

TEMPLATE_TEST_CASE("conv at one rank equals the local kernel on the padded tensor", "[nn][conv]", float, double) {
  using T = TestType;
  using O2 = F::ConvOptions<2>;
  conv_case<T, 4>({2, 4, 7, 9}, {6, 4, 3, 3}, O2::symmetric(1), true);
  conv_case<T, 4>({2, 4, 7, 9}, {3, 4, 2, 2}, O2::same({2, 2}), true);
  conv_case<T, 4>({1, 4, 9, 8}, {6, 2, 4, 3}, O2::symmetric(1, 2, 1, 2), true);
  conv_case<T, 4>({1, 2, 9, 10}, {3, 2, 3, 3}, O2::symmetric(2, 1, 2), false);
  for (Boundary m : {Boundary::periodic, Boundary::reflect, Boundary::replicate}) {
    conv_case<T, 4>({1, 2, 7, 6}, {2, 2, 3, 3}, O2::symmetric(1, 1, 1, 1, m), true);
    conv_case<T, 4>({1, 2, 7, 6}, {2, 2, 4, 2}, O2::symmetric(2, 2, 1, 1, m), true);
  }
  O2 mixed = O2::symmetric(1);
  mixed.padding_mode = {Boundary::periodic, Boundary::reflect};
  mixed.pad_hi = {2, 0};
  conv_case<T, 4>({2, 3, 6, 5}, {2, 3, 3, 3}, mixed, true);
  O2 wide;  // padding wider than the kernel: outputs that read zero padding only
  wide.pad_lo = {3, 0};
  wide.pad_hi = {0, 2};
  wide.stride = {2, 1};
  conv_case<T, 4>({1, 2, 5, 4}, {2, 2, 1, 2}, wide, true);
  conv_case<T, 3>({2, 3, 10}, {4, 3, 3}, F::ConvOptions<1>::symmetric(1, 1, 1, 1, Boundary::periodic), true);
  conv_case<T, 3>({2, 4, 11}, {4, 2, 4}, F::ConvOptions<1>::symmetric(2, 3, 1, 2), true);
  conv_case<T, 5>({1, 2, 5, 4, 6}, {3, 2, 3, 3, 3}, F::ConvOptions<3>::symmetric(1), true);
  conv_case<T, 5>({1, 2, 6, 5, 4}, {2, 2, 2, 3, 2}, F::ConvOptions<3>::symmetric(1, 2, 1, 1, Boundary::replicate),
                  false);
}

TEMPLATE_TEST_CASE("conv_transpose, pooling and upsampling at one rank equal the local kernels", "[nn][conv]", float,
                   double) {
  using T = TestType;
  {  // transposed conv
    const auto o = F::ConvTransposeOptions<2>::symmetric(1, 2, 1, 2, 1);
    auto x = rnd<T, 4>({2, 4, 5, 6}, 1), w = rnd<T, 4>({4, 3, 3, 4}, 2);
    auto b = rnd<T, 1>({6}, 3);
    auto y = F::conv_transpose(x, w, b, o);
    ConvOptions<2> p = ConvOptions<2>::symmetric(1, 2, 1, 2);
    const Shape<2> op{1, 1};
    const auto yref = conv_transpose_forward(x.local(), w.local(), b.local(), p, op);
    check_close(y.local(), yref);
    const auto gy = rnd_t<T, 4>(yref.shape(), 4);
    backward_with(y, gy);
    check_close(x.grad().local(), conv_transpose_backward_input(gy, w.local(), Shape<2>{5, 6}, p));
    check_close(w.grad().local(), conv_transpose_backward_weight(x.local(), gy, Shape<2>{3, 4}, p));
    check_close(b.grad().local(), conv_backward_bias(gy));
  }
  for (bool cip : {true, false}) {  // pooling
    PoolParams<2> p{.kernel = {3, 2}, .stride = {2, 2}, .pad_lo = {1, 0}, .pad_hi = {1, 1}, .count_include_pad = cip};
    auto x = rnd<T, 4>({2, 3, 7, 9}, 5);
    auto ya = F::avg_pool(x, p);
    check_close(ya.local(), avg_pool_forward(x.local(), p));
    const auto ga = rnd_t<T, 4>(ya.local().shape(), 6);
    backward_with(ya, ga);
    check_close(x.grad().local(), avg_pool_backward(ga, Shape<2>{7, 9}, p));
    auto x2 = rnd<T, 4>({2, 3, 7, 9}, 7);
    auto ym = F::max_pool(x2, p);
    const auto ref = max_pool_forward(x2.local(), p);
    check_close(ym.local(), ref.values);
    backward_with(ym, ga);
    check_close(x2.grad().local(), max_pool_backward(ga, ref.indices, Shape<2>{7, 9}, p));
  }
  for (ResizeMode m : {ResizeMode::nearest, ResizeMode::linear}) {  // upsampling
    auto x = rnd<T, 5>({1, 2, 3, 4, 5}, 8);
    const Shape<3> f{2, 3, 1};
    auto y = F::upsample(x, m, f);
    check_close(y.local(), upsample(x.local(), m, f));
    const auto gy = rnd_t<T, 5>(y.local().shape(), 9);
    backward_with(y, gy);
    check_close(x.grad().local(), upsample_backward(gy, m, f, Shape<3>{3, 4, 5}));
  }
}

TEST_CASE("anchor rule layouts", "[nn][conv][window]") {
  using F::WindowDim;
  const auto L = ShardLayout::from_sizes({4, 3, 3});
  // stride-1 'same' convs keep the layout, odd and even kernels
  CHECK(F::detail::anchor_output_sizes(L, WindowDim{3, 1, 1, 1, 1}, 10) == L.sizes());
  CHECK(F::detail::anchor_output_sizes(L, WindowDim{4, 1, 1, 1, 2}, 10) == L.sizes());
  CHECK(F::detail::anchor_output_sizes(L, WindowDim{3, 1, 2, 2, 2}, 10) == L.sizes());
  // 2x2 pooling halves the boundaries (rounded up): 4,3,3 -> 2,2,1
  CHECK(F::detail::anchor_output_sizes(L, WindowDim{2, 2}, 5) == std::vector<index_t>{2, 2, 1});
  // empty parts own no outputs
  CHECK(F::detail::anchor_output_sizes(ShardLayout::from_sizes({0, 5, 0, 5}), WindowDim{3, 1, 1, 1, 1}, 10) ==
        std::vector<index_t>{0, 5, 0, 5});
  // the transposed layout maps back onto x's under the conv's anchor rule
  for (index_t k : {1, 2, 3, 4, 5})
    for (index_t s : {1, 2, 3})
      for (index_t pl : {0, 1, 2})
        for (index_t op : {0, 1}) {
          if (op >= s) continue;
          const WindowDim w{k, s, 1, pl, pl};
          const index_t G = 10, gy = (G - 1) * s - 2 * pl + (k - 1) + op + 1;
          if (gy < 1) continue;
          const auto ys = F::detail::transpose_output_sizes(L, w, gy);
          CHECK(F::detail::anchor_output_sizes(ShardLayout::from_sizes(ys), w, G) == L.sizes());
        }
  CHECK_THROWS_AS(F::detail::window_output_extent("conv2d", 3, WindowDim{5, 1, 1, 0, 0}, 0), Error);
  CHECK(F::detail::window_output_extent("conv2d", 3, WindowDim{5, 1, 1, 1, 1}, 0) == 1);
}

// ---- PyTorch parity of the resampling additions (issue 34): an independent reference written
// from PyTorch's own formulas (aten/src/ATen/native/Pool.h pooling_output_shape, AvgPool /
// MaxPool kernels; UpSample.h area_pixel_compute_scale / area_pixel_compute_source_index /
// nearest_idx / guard_index_and_lambda / cubic_convolution1/2 with A = -0.75), plus tiny
// hand-checked cases and adjoint identities. Symmetric padding, as PyTorch.
namespace {

/// PyTorch's pooling_output_shape (dilation 1).
index_t pt_pool_out(index_t L, index_t k, index_t p, index_t s, bool ceil) {
  const index_t num = L + 2 * p - (k - 1) - 1 + (ceil ? s - 1 : 0);
  index_t out = num / s + 1;  // num >= 0 here
  if (ceil && (out - 1) * s >= L + p) --out;
  return out;
}

/// PyTorch's avg_pool2d / max_pool2d on one [H, W] plane (symmetric padding p, stride s).
std::vector<double> pt_pool2d(const std::vector<double>& x, index_t H, index_t W, index_t k0, index_t k1, index_t s0,
                              index_t s1, index_t p0, index_t p1, bool ceil, bool cip, bool mx, index_t& OH,
                              index_t& OW) {
  OH = pt_pool_out(H, k0, p0, s0, ceil);
  OW = pt_pool_out(W, k1, p1, s1, ceil);
  std::vector<double> y(static_cast<std::size_t>(OH * OW));
  for (index_t oh = 0; oh < OH; ++oh)
    for (index_t ow = 0; ow < OW; ++ow) {
      index_t hs = oh * s0 - p0, ws = ow * s1 - p1;
      index_t he = std::min(hs + k0, H + p0), we = std::min(ws + k1, W + p1);
      const index_t pool_size = (he - hs) * (we - ws);
      hs = std::max<index_t>(hs, 0);
      ws = std::max<index_t>(ws, 0);
      he = std::min(he, H);
      we = std::min(we, W);
      double acc = mx ? -1e300 : 0;
      for (index_t h = hs; h < he; ++h)
        for (index_t w = ws; w < we; ++w) {
          const double v = x[static_cast<std::size_t>(h * W + w)];
          acc = mx ? std::max(acc, v) : acc + v;
        }
      if (!mx) acc /= static_cast<double>(cip ? pool_size : (he - hs) * (we - ws));
      y[static_cast<std::size_t>(oh * OW + ow)] = acc;
    }
  return y;
}

/// One dim of PyTorch's interpolation: the source taps (index, weight) of output o.
struct PtAxis {
  ResizeMode mode;
  index_t in, out;
  std::optional<double> scale_factor;  ///< set: scale_factor given (recompute_scale_factor unset)
  bool align;
  std::vector<std::pair<index_t, double>> taps(index_t o) const {
    if (mode == ResizeMode::nearest) {  // nearest_idx (float arithmetic)
      const float sc = scale_factor ? static_cast<float>(1.0 / *scale_factor)
                                    : static_cast<float>(in) / static_cast<float>(out);
      const index_t i = std::min<index_t>(static_cast<index_t>(std::floor(static_cast<float>(o) * sc)), in - 1);
      return {{i, 1.0}};
    }
    // area_pixel_compute_scale (opmath = double for the double reference)
    const double sc = align ? (out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0)
                            : (scale_factor ? 1.0 / *scale_factor : static_cast<double>(in) / out);
    const bool cubic = mode == ResizeMode::cubic;
    double src = align ? sc * o : sc * (o + 0.5) - 0.5;  // area_pixel_compute_source_index
    if (!align && !cubic && src < 0) src = 0;
    const index_t i0 = std::min<index_t>(static_cast<index_t>(std::floor(src)), in - 1);  // guard_index_and_lambda
    const double t = std::min(std::max(src - static_cast<double>(i0), 0.0), 1.0);
    if (!cubic) return {{i0, 1.0 - t}, {i0 < in - 1 ? i0 + 1 : i0, t}};
    const double A = -0.75;
    auto cc1 = [A](double v) { return ((A + 2) * v - (A + 3)) * v * v + 1; };
    auto cc2 = [A](double v) { return ((A * v - 5 * A) * v + 8 * A) * v - 4 * A; };
    const double w[4] = {cc2(t + 1.0), cc1(t), cc1(1.0 - t), cc2(1.0 - t + 1.0)};
    std::vector<std::pair<index_t, double>> r;
    for (int k = 0; k < 4; ++k) r.push_back({std::clamp<index_t>(i0 - 1 + k, 0, in - 1), w[k]});
    return r;
  }
};

/// Direct interpolation of x[N, C, in...] (double) as the product of per-dim taps.
template <class T, int R>
Tensor<double, R> pt_interpolate(const Tensor<T, R>& x, const std::array<PtAxis, R - 2>& ax) {
  constexpr int S = R - 2;
  Shape<R> ys = x.shape();
  for (int d = 0; d < S; ++d) ys[2 + d] = ax[d].out;
  auto y = Tensor<double, R>::zeros(ys);
  for (index_t lin = 0; lin < y.numel(); ++lin) {
    const auto yi = unravel(lin, ys);
    std::array<std::vector<std::pair<index_t, double>>, S> taps;
    Shape<S> cnt{};
    for (int d = 0; d < S; ++d) {
      taps[d] = ax[d].taps(yi[2 + d]);
      cnt[d] = static_cast<index_t>(taps[d].size());
    }
    double s = 0;
    for (index_t c = 0; c < numel(cnt); ++c) {
      const auto ci = unravel(c, cnt);
      Shape<R> xi = yi;
      double wgt = 1;
      for (int d = 0; d < S; ++d) {
        xi[2 + d] = taps[d][static_cast<std::size_t>(ci[d])].first;
        wgt *= taps[d][static_cast<std::size_t>(ci[d])].second;
      }
      s += wgt * static_cast<double>(x.at(xi));
    }
    y.data()[lin] = s;
  }
  return y;
}

template <class T, int R>
double dot_d(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  double s = 0;
  for (index_t i = 0; i < a.numel(); ++i) s += static_cast<double>(a.data()[i]) * static_cast<double>(b.data()[i]);
  return s;
}

template <class T>
std::vector<double> values_of(const Tensor<T, 3>& t) {
  std::vector<double> v;
  for (index_t i = 0; i < t.numel(); ++i) v.push_back(static_cast<double>(t.data()[i]));
  return v;
}

/// One interpolation case at one rank: F::interpolate (and the local interpolate) equal the
/// reference; the backward is the adjoint: <R x, gy> == <x, R^T gy>.
template <class T, int R>
void interp_case(const Shape<R>& xs, const InterpolateOptions<R - 2>& o) {
  constexpr int S = R - 2;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 2e-6;
  INFO("input " << fmt::format("{}", xs) << " mode " << static_cast<int>(o.mode) << " size "
                << fmt::format("{}", o.size) << " align " << o.align_corners);
  std::array<PtAxis, S> ax;
  bool has_size = false;
  for (int d = 0; d < S; ++d) has_size = has_size || o.size[d] != 0;
  for (int d = 0; d < S; ++d) {
    const index_t in = xs[2 + d];
    ax[d] = has_size ? PtAxis{o.mode, in, o.size[d], std::nullopt, o.align_corners}
                     : PtAxis{o.mode, in, static_cast<index_t>(std::floor(in * o.scale_factor[d])),
                              o.scale_factor[d], o.align_corners};
  }
  auto x = rnd<T, R>(xs, 11);
  auto y = F::interpolate(x, o);
  const auto ref = pt_interpolate<T, R>(x.local(), ax);
  REQUIRE(y.local().shape() == ref.shape());
  double err = 0, mag = 0;
  for (index_t i = 0; i < ref.numel(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(y.local().data()[i]) - ref.data()[i]));
    mag = std::max(mag, std::abs(ref.data()[i]));
  }
  CHECK(err <= tol * std::max(1.0, mag));
  check_close(interpolate(x.local(), o), y.local().contiguous());
  const auto gy = rnd_t<T, R>(y.local().shape(), 12);
  backward_with(y, gy);
  const double lhs = dot_d(y.local(), gy), rhs = dot_d(x.local(), x.grad().local());
  CHECK(std::abs(lhs - rhs) <= tol * 10 * std::max(1.0, std::abs(lhs)));
  Shape<S> in{};
  for (int d = 0; d < S; ++d) in[d] = xs[2 + d];
  check_close(interpolate_backward(gy, o, in), x.grad().local().contiguous());
}

}  // namespace

TEST_CASE("pooling ceil_mode: PyTorch's output size, divisors and hand-checked values", "[nn][pool][ceil]") {
  // The output-size rule, including the "last window starts inside the image" decrement.
  CHECK(pt_pool_out(5, 2, 0, 2, true) == 3);
  CHECK(pt_pool_out(3, 2, 1, 2, true) == 2);  // ceil gives 3, the last window would start at 3 = L
  CHECK(pt_pool_out(6, 3, 1, 3, true) == 3);
  for (index_t L = 1; L <= 12; ++L)
    for (index_t k = 1; k <= 4; ++k)
      for (index_t s = 1; s <= 3; ++s)
        for (index_t p = 0; 2 * p <= k; ++p) {
          if (L + 2 * p < k) continue;
          for (bool ceil : {false, true}) {
            PoolParams<1> pp{.kernel = {k}, .stride = {s}, .pad_lo = {p}, .pad_hi = {p}, .ceil_mode = ceil};
            INFO("L " << L << " k " << k << " s " << s << " p " << p << " ceil " << ceil);
            CHECK(pool_output_shape<1>({L}, pp)[0] == pt_pool_out(L, k, p, s, ceil));
          }
        }
  auto tiny = [](std::vector<double> v, PoolParams<1> p, bool mx) {
    auto t = Tensor<double, 3>::empty({1, 1, static_cast<index_t>(v.size())});
    for (std::size_t i = 0; i < v.size(); ++i) t.data()[i] = v[i];
    auto x = Var<double, 3>(DistTensor<double, 3>::distribute(t, mesh1(), {Replicate()}), false);
    return values_of(F::resolve(mx ? F::max_pool(x, p) : F::avg_pool(x, p)).local());
  };
  // avg_pool1d([1..5], k=2, s=2, ceil_mode=True) = [1.5, 3.5, 5] (the last window holds one cell)
  CHECK(tiny({1, 2, 3, 4, 5}, {.kernel = {2}, .stride = {2}, .ceil_mode = true}, false) ==
        std::vector<double>{1.5, 3.5, 5});
  // k=3, s=2, p=1 on [1, 2, 3, 4]: windows [-1, 2), [1, 4), [3, 6): the last clipped to L + p = 5
  // (divisor 2) with count_include_pad, to L = 4 (divisor 1) without.
  CHECK(tiny({1, 2, 3, 4}, {.kernel = {3}, .stride = {2}, .pad_lo = {1}, .pad_hi = {1}, .ceil_mode = true}, false) ==
        std::vector<double>{1, 3, 2});
  CHECK(tiny({1, 2, 3, 4},
             {.kernel = {3}, .stride = {2}, .pad_lo = {1}, .pad_hi = {1}, .count_include_pad = false,
              .ceil_mode = true},
             false) == std::vector<double>{1.5, 3, 4});
  CHECK(tiny({1, 2, 3, 4}, {.kernel = {3}, .stride = {2}, .pad_lo = {1}, .pad_hi = {1}, .ceil_mode = true}, true) ==
        std::vector<double>{2, 4, 4});
  // Random 2-D planes against the reference, and the adjoint identity of the gradient.
  for (bool mx : {false, true})
    for (bool cip : {true, false})
      for (auto [H, W, k0, k1, s0, s1, p0, p1] : std::vector<std::array<index_t, 8>>{
               {7, 9, 3, 2, 2, 2, 1, 1}, {6, 5, 2, 3, 2, 2, 1, 1}, {5, 8, 3, 3, 3, 2, 1, 0}, {4, 4, 2, 2, 3, 3, 0, 1}}) {
        INFO("H " << H << " W " << W << " k " << k0 << "," << k1 << " s " << s0 << "," << s1 << " p " << p0 << ","
                  << p1 << " max " << mx << " cip " << cip);
        const PoolParams<2> p{.kernel = {k0, k1}, .stride = {s0, s1}, .pad_lo = {p0, p1}, .pad_hi = {p0, p1},
                              .count_include_pad = cip, .ceil_mode = true};
        auto x = rnd<double, 4>({1, 1, H, W}, 21);
        auto y = mx ? F::max_pool(x, p) : F::avg_pool(x, p);
        std::vector<double> xv(x.local().data(), x.local().data() + H * W);
        index_t OH = 0, OW = 0;
        const auto ref = pt_pool2d(xv, H, W, k0, k1, s0, s1, p0, p1, true, cip, mx, OH, OW);
        REQUIRE(y.local().size(2) == OH);
        REQUIRE(y.local().size(3) == OW);
        double err = 0;
        for (index_t i = 0; i < OH * OW; ++i) err = std::max(err, std::abs(y.local().data()[i] - ref[static_cast<std::size_t>(i)]));
        CHECK(err <= 1e-14);
        const auto gy = rnd_t<double, 4>(y.local().shape(), 22);
        backward_with(y, gy);
        CHECK(std::abs(dot_d(y.local(), gy) - dot_d(x.local(), x.grad().local())) <= 1e-12);
      }
}

TEMPLATE_TEST_CASE("interpolate: PyTorch's maps (scales, sizes, align_corners, bicubic) and hand-checked values",
                   "[nn][upsample][interpolate]", float, double) {
  using T = TestType;
  using O1 = InterpolateOptions<1>;
  using O2 = InterpolateOptions<2>;
  auto run1 = [](std::vector<double> v, const O1& o) {
    auto x = Tensor<T, 3>::empty({1, 1, static_cast<index_t>(v.size())});
    for (std::size_t i = 0; i < v.size(); ++i) x.data()[i] = static_cast<T>(v[i]);
    return values_of(interpolate(x, o));
  };
  // Hand-checked (dyadic values: exact in float and double).
  CHECK(run1({0, 1}, O1{.mode = ResizeMode::linear, .scale_factor = {2.0}}) == std::vector<double>{0, 0.25, 0.75, 1});
  CHECK(run1({0, 1, 2}, O1{.mode = ResizeMode::linear, .size = {5}, .align_corners = true}) ==
        std::vector<double>{0, 0.5, 1, 1.5, 2});
  CHECK(run1({10, 20, 30}, O1{.mode = ResizeMode::nearest, .size = {2}}) == std::vector<double>{10, 20});
  CHECK(run1({10, 20, 30, 40}, O1{.mode = ResizeMode::nearest, .scale_factor = {1.5}}) ==
        std::vector<double>{10, 10, 20, 30, 30, 40});
  {  // bicubic 1x4 -> 1x7 with align_corners: t = 0.5 weights (-0.09375, 0.59375, 0.59375, -0.09375)
    auto x = Tensor<T, 4>::empty({1, 1, 1, 4});
    const double xv[4] = {1, 2, 4, 8};
    for (int i = 0; i < 4; ++i) x.data()[i] = static_cast<T>(xv[i]);
    const auto y = interpolate(x, O2{.mode = ResizeMode::cubic, .size = {1, 7}, .align_corners = true});
    std::vector<double> got;
    for (index_t i = 0; i < y.numel(); ++i) got.push_back(static_cast<double>(y.data()[i]));
    CHECK(got == std::vector<double>{1, 1.3125, 2, 2.71875, 4, 6.1875, 8});
  }
  // Random tensors against the reference.
  for (bool ac : {false, true}) {
    interp_case<T, 3>({1, 2, 7}, {.mode = ResizeMode::linear, .scale_factor = {1.7}, .align_corners = ac});
    interp_case<T, 3>({1, 2, 7}, {.mode = ResizeMode::linear, .size = {3}, .align_corners = ac});
    interp_case<T, 4>({1, 2, 5, 6}, {.mode = ResizeMode::linear, .scale_factor = {2.5, 0.6}, .align_corners = ac});
    interp_case<T, 4>({1, 2, 5, 6}, {.mode = ResizeMode::cubic, .scale_factor = {1.3, 2.0}, .align_corners = ac});
    interp_case<T, 4>({1, 2, 5, 6}, {.mode = ResizeMode::cubic, .size = {3, 11}, .align_corners = ac});
    interp_case<T, 4>({1, 1, 1, 4}, {.mode = ResizeMode::cubic, .size = {1, 9}, .align_corners = ac});
    interp_case<T, 5>({1, 1, 3, 4, 2},
                      {.mode = ResizeMode::linear, .scale_factor = {1.5, 0.75, 2.0}, .align_corners = ac});
  }
  interp_case<T, 3>({1, 2, 7}, {.mode = ResizeMode::nearest, .scale_factor = {2.3}});
  interp_case<T, 4>({1, 2, 5, 6}, {.mode = ResizeMode::nearest, .size = {7, 4}});
  interp_case<T, 5>({1, 1, 3, 4, 2}, {.mode = ResizeMode::nearest, .scale_factor = {0.7, 1.5, 3.0}});
  // Integer factors through upsample: bicubic equals the general map with scale_factor = f.
  auto x = rnd<T, 4>({1, 2, 4, 5}, 31);
  check_close(F::upsample(x, ResizeMode::cubic, {2, 3}).local().contiguous(),
              interpolate(x.local(), O2{.mode = ResizeMode::cubic, .scale_factor = {2.0, 3.0}}));
}

}  // namespace st_nn_test_conv_pool_upsample
