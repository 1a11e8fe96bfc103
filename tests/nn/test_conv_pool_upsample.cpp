// Serial tests of the window ops at one rank against the plain local kernels on the full tensor
// (nn/functional/conv_local.hpp, nn/functional/pool_local.hpp, resize_local.hpp), with non-zero padding modes applied by an explicit
// index-mapped padding (and its adjoint for the gradient); the layout algebra of window.hpp.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

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
