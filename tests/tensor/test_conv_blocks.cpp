// The distributed conv's usage pattern, locally: split the global output of a conv into blocks,
// compute each block from the in-range part of its input range (conv_input_range) with local
// per-side pads (halo data on one side, global padding on the other), and check that the blocks
// reproduce the global output, and that their input / weight gradients, scattered back, sum to
// the global gradients.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <random>
#include <shardtensor/nn/functional/conv_local.hpp>
#include <shardtensor/tensor/ops.hpp>

#include "tensor/test_conv_reference.hpp"

namespace st_tensor_test_conv_blocks {

using namespace shard;
using shard::nn::functional::ConvOptions;
using shard::test::random_tensor;

namespace {

template <class T>
void check_blocks(const Shape<2>& in, const Shape<2>& k, const ConvOptions<2>& p, int cuts0, int cuts1,
                  std::uint64_t seed) {
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  INFO("in " << fmt::format("{}", in) << " kernel " << fmt::format("{}", k) << " stride "
             << fmt::format("{}", p.stride) << " dil " << fmt::format("{}", p.dilation) << " lo "
             << fmt::format("{}", p.pad_lo) << " hi " << fmt::format("{}", p.pad_hi));
  const index_t cin = 4, cout = 6;
  auto x = random_tensor<T, 4>({2, cin, in[0], in[1]}, seed);
  auto w = random_tensor<T, 4>({cout, cin / p.groups, k[0], k[1]}, seed + 1);
  auto b = random_tensor<T, 1>({cout}, seed + 2);
  auto y = conv_forward(x, w, b, p);
  auto gy = random_tensor<T, 4>(y.shape(), seed + 3);
  auto gx = conv_backward_input(gy, w, in, p);
  auto gw = conv_backward_weight(x, gy, k, p);
  auto gx_sum = Tensor<T, 4>::zeros(x.shape());
  auto gw_sum = Tensor<double, 4>::zeros(gw.shape());
  const Shape<2> out{y.size(2), y.size(3)};
  std::array<std::vector<index_t>, 2> cuts;
  const int ncuts[2] = {cuts0, cuts1};
  for (int d = 0; d < 2; ++d)
    for (int c = 0; c <= ncuts[d]; ++c) cuts[d].push_back(out[d] * c / ncuts[d]);  // may give empty blocks
  for (int i = 0; i < ncuts[0]; ++i)
    for (int j = 0; j < ncuts[1]; ++j) {
      const Shape<2> olo{cuts[0][i], cuts[1][j]}, olen{cuts[0][i + 1] - cuts[0][i], cuts[1][j + 1] - cuts[1][j]};
      if (olen[0] == 0 || olen[1] == 0) continue;
      ConvOptions<2> lp = p;
      Shape<2> blo{}, blen{};
      for (int d = 0; d < 2; ++d) {
        const auto [first, end] = conv_input_range(olo[d], olen[d], k[d], p.stride[d], p.dilation[d], p.pad_lo[d]);
        // in-range part (possibly empty: outputs whose windows lie in the padding only)
        blo[d] = std::clamp<index_t>(first, 0, in[d]);
        blen[d] = std::clamp<index_t>(end, 0, in[d]) - blo[d];
        lp.pad_lo[d] = first < 0 ? std::min<index_t>(end, 0) - first : 0;
        lp.pad_hi[d] = end > in[d] ? end - std::max<index_t>(first, in[d]) : 0;
      }
      auto xb = x.slice({0, 0, blo[0], blo[1]}, {2, cin, blen[0], blen[1]}).clone();
      auto yb = conv_forward(xb, w, b, lp);
      REQUIRE(yb.shape() == Shape<4>{2, cout, olen[0], olen[1]});
      CHECK(max_rel_diff(yb, y.slice({0, 0, olo[0], olo[1]}, {2, cout, olen[0], olen[1]})) <= tol);
      auto gyb = gy.slice({0, 0, olo[0], olo[1]}, {2, cout, olen[0], olen[1]}).clone();
      auto gxb = conv_backward_input(gyb, w, blen, lp);
      auto dst = gx_sum.slice({0, 0, blo[0], blo[1]}, {2, cin, blen[0], blen[1]});
      zip_into(dst, dst, gxb, [](T a, T c) { return a + c; });
      auto gwb = shard::test::to_double(conv_backward_weight(xb, gyb, k, lp));
      zip_into(gw_sum, gw_sum, gwb, [](double a, double c) { return a + c; });
    }
  CHECK(max_rel_diff(gx_sum, gx) <= tol);
  CHECK(max_rel_diff(gw_sum, shard::test::to_double(gw)) <= tol);
}

}  // namespace

TEST_CASE("conv on halo-extended blocks reproduces the global conv and its gradients", "[conv]") {
  std::mt19937_64 rng(11);
  auto pick = [&](index_t lo, index_t hi) { return std::uniform_int_distribution<index_t>(lo, hi)(rng); };
  for (int it = 0; it < 40; ++it) {
    ConvOptions<2> p;
    Shape<2> in{}, k{};
    p.groups = it % 3 == 0 ? 2 : 1;
    bool ok = true;
    for (int d = 0; d < 2; ++d) {
      k[d] = pick(1, 4);
      p.stride[d] = pick(1, 3);
      p.dilation[d] = pick(1, 2);
      p.pad_lo[d] = pick(0, 2);
      p.pad_hi[d] = pick(0, 2);
      in[d] = pick(5, 17);
      ok = ok && conv_output_extent(in[d], k[d], p.stride[d], p.dilation[d], p.pad_lo[d], p.pad_hi[d]) >= 1;
    }
    if (!ok) continue;
    shard::test::for_each_conv_kernel([&] {
      check_blocks<double>(in, k, p, 3, 2, 40 + it);
      check_blocks<float>(in, k, p, 2, 4, 40 + it);
    });
  }
}

}  // namespace st_tensor_test_conv_blocks
