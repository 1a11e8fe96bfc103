// The pool and resize families read and write bf16 / f16 storage in place on the CPU
// (PoolKernels / ResizeKernels::takes_storage). Oracle: the f32 working-copy route they replace,
// i.e. widen every operand to f32, run the f32 op, round the result once; the two must agree bit
// for bit (NaN-ness only for NaN results), max pooling's argmax indices exactly. Geometries: 2-D
// and 3-D windows, strides, padding with and without count_include_pad, windows that overlap (the
// gradients add several outputs per cell), ties and NaN in max pooling, plane counts above the
// OpenMP threshold; resize nearest and linear over whole grids, an interior block of a global grid,
// and a strided input view read in place. Also: no f32 working copies are allocated, and a mix of
// storage dtypes is refused.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "shardtensor/exec/pool.hpp"
#include "shardtensor/exec/resize.hpp"
#include "shardtensor/shardtensor.hpp"
#include "support/lowp_compare.hpp"

namespace st_exec_test_pool_resize_lp {

using namespace shard;
using shard::test::differing;
using shard::test::widened;

namespace {

/// n values of dtype L: uniform in [lo, hi), or (levels > 0) one of `levels` evenly spaced values
/// so that max pooling meets ties; every 97th value NaN when `nans`.
template <class L>
Tensor<L, 1> values(index_t n, unsigned seed, float lo, float hi, int levels = 0, bool nans = false) {
  auto t = Tensor<L, 1>::empty({n}, Device::cpu());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::uniform_int_distribution<int> q(0, levels > 0 ? levels - 1 : 0);
  for (index_t i = 0; i < n; ++i) {
    float v = levels > 0 ? lo + (hi - lo) * static_cast<float>(q(rng)) / static_cast<float>(levels) : d(rng);
    if (nans && i % 97 == 41) v = std::numeric_limits<float>::quiet_NaN();
    t.data()[i] = L(v);
  }
  return t;
}
template <class L>
Tensor<L, 1> empty_lp(index_t n) {
  return Tensor<L, 1>::empty({n}, Device::cpu());
}
Tensor<float, 1> empty_f(index_t n) { return Tensor<float, 1>::empty({n}, Device::cpu()); }

index_t vol(const std::array<index_t, 3>& e) { return e[0] * e[1] * e[2]; }

struct PoolCase {
  const char* name;
  exec::PoolGeometry g;
};
exec::PoolGeometry pool_geometry(index_t planes, std::array<index_t, 3> in, std::array<index_t, 3> k,
                                 std::array<index_t, 3> s, std::array<index_t, 3> p, bool include_pad) {
  exec::PoolGeometry g;
  g.planes = planes;
  g.in = in;
  g.kernel = k;
  g.stride = s;
  g.pad_lo = p;
  g.count_include_pad = include_pad;
  for (int d = 0; d < 3; ++d) {
    const auto u = static_cast<std::size_t>(d);
    g.out[u] = (in[u] + 2 * p[u] - k[u]) / s[u] + 1;
  }
  return g;
}

}  // namespace

TEMPLATE_TEST_CASE("pool: bf16 / f16 read in place equal the f32 working-copy route bit for bit", "[precision][pool]",
                   bf16, f16) {
  using L = TestType;
  auto& ctx = current_context(Device::cpu());
  const PoolCase cases[] = {
      {"2-D 3x3 stride 2 pad 1, padding counted", pool_geometry(6, {1, 17, 19}, {1, 3, 3}, {1, 2, 2}, {0, 1, 1}, true)},
      {"2-D 3x3 stride 2 pad 1, padding not counted",
       pool_geometry(6, {1, 17, 19}, {1, 3, 3}, {1, 2, 2}, {0, 1, 1}, false)},
      {"3-D 2x3x2 stride 1x2x1 pad 0x1x1 (overlapping windows)",
       pool_geometry(3, {7, 9, 8}, {2, 3, 2}, {1, 2, 1}, {0, 1, 1}, false)},
      {"2-D 2x2 stride 2, 64 planes of 64x64 (OpenMP; the old route's plane chunks)",
       pool_geometry(64, {1, 64, 64}, {1, 2, 2}, {1, 2, 2}, {0, 0, 0}, true)},
  };
  for (const auto& c : cases) {
    const auto& g = c.g;
    const index_t nin = g.planes * vol(g.in), nout = g.planes * vol(g.out);
    INFO("dtype " << dtype_name(dtype_of<L>) << ", " << c.name);
    const auto x = values<L>(nin, 1, -3.0f, 3.0f);
    const auto gy = values<L>(nout, 2, -1.0f, 1.0f);
    const auto xw = widened(x), gw = widened(gy);
    // Average pooling, forward and backward.
    auto y = empty_lp<L>(nout);
    auto yw = empty_f(nout);
    exec::avg_pool_forward(g, as_block(x), as_block(y), ctx);
    exec::avg_pool_forward(g, as_block(xw), as_block(yw), ctx);
    CHECK(differing(y, yw) == 0);
    auto gx = empty_lp<L>(nin);
    auto gxw = empty_f(nin);
    exec::avg_pool_backward(g, as_block(gy), as_block(gx), ctx);
    exec::avg_pool_backward(g, as_block(gw), as_block(gxw), ctx);
    CHECK(differing(gx, gxw) == 0);
    // Max pooling on values with ties (8 levels) and NaN: the same argmax, the same values.
    const auto xt = values<L>(nin, 3, -2.0f, 2.0f, 8, true);
    const auto xtw = widened(xt);
    auto idx = Tensor<std::int64_t, 1>::empty({nout}, Device::cpu());
    auto idxw = Tensor<std::int64_t, 1>::empty({nout}, Device::cpu());
    exec::max_pool_forward(g, as_block(xt), as_block(y), as_block(idx), ctx);
    exec::max_pool_forward(g, as_block(xtw), as_block(yw), as_block(idxw), ctx);
    CHECK(differing(y, yw) == 0);
    index_t idx_bad = 0;
    for (index_t i = 0; i < nout; ++i) idx_bad += idx.data()[i] == idxw.data()[i] ? 0 : 1;
    CHECK(idx_bad == 0);
    // Max pooling's gradient: overlapping windows add several outputs into one cell (in float on
    // the f32 route, rounded once), so the accumulation type is visible here.
    exec::max_pool_backward(g, as_block(gy), as_block(idx), as_block(gx), ctx);
    exec::max_pool_backward(g, as_block(gw), as_block(idx), as_block(gxw), ctx);
    CHECK(differing(gx, gxw) == 0);
  }
}

TEST_CASE("pool: max pooling's bf16 gradient sums in float, not in bf16", "[precision][pool]") {
  // A cell chosen by several windows receives 1 + 2^-8 + 2^-8: added in bf16 (ulp(1) = 2^-7) each
  // 2^-8 alone is lost to rounding (1 + 2^-8 ties to 1), in float the sum is 1 + 2^-7, which bf16
  // holds exactly. Windows 3 wide, stride 1, over 5 cells with the maximum in the middle.
  auto& ctx = current_context(Device::cpu());
  const auto g = pool_geometry(1, {1, 1, 5}, {1, 1, 3}, {1, 1, 1}, {0, 0, 0}, true);  // 3 outputs, all pick cell 2
  auto x = Tensor<bf16, 1>::empty({5}, Device::cpu());
  const float xv[5] = {0, 1, 4, 1, 0};
  for (int i = 0; i < 5; ++i) x.data()[i] = bf16(xv[i]);
  auto y = Tensor<bf16, 1>::empty({3}, Device::cpu());
  auto idx = Tensor<std::int64_t, 1>::empty({3}, Device::cpu());
  exec::max_pool_forward(g, as_block(x), as_block(y), as_block(idx), ctx);
  for (int o = 0; o < 3; ++o) REQUIRE(idx.data()[o] == 2);
  auto gy = Tensor<bf16, 1>::empty({3}, Device::cpu());
  gy.data()[0] = bf16(1.0f);
  gy.data()[1] = bf16(1.0f / 256);
  gy.data()[2] = bf16(1.0f / 256);
  auto gx = Tensor<bf16, 1>::empty({5}, Device::cpu());
  exec::max_pool_backward(g, as_block(gy), as_block(idx), as_block(gx), ctx);
  CHECK(static_cast<float>(gx.data()[2]) == 1.0f + 1.0f / 128);
  CHECK(static_cast<float>(gx.data()[0]) == 0.0f);
  CHECK(static_cast<float>(gx.data()[1]) == 0.0f);
}

TEMPLATE_TEST_CASE("resize: bf16 / f16 read in place equal the f32 working-copy route bit for bit",
                   "[precision][resize]", bf16, f16) {
  using L = TestType;
  auto& ctx = current_context(Device::cpu());
  for (ResizeMode mode : {ResizeMode::nearest, ResizeMode::linear}) {
    // (a) a whole 3-D grid, scales 2 x 3 x 2; (b) an interior block of a global 2-D grid (the
    // outputs [5, 12) x [3, 17) of a 2x upsampling of 11 x 13), as a sharded upsample computes it;
    // (c) 96 planes of 32 x 32 upsampled 2x2 (OpenMP).
    std::vector<exec::ResizeGeometry> geoms;
    exec::ResizeGeometry a;
    a.mode = mode;
    a.planes = 4;
    a.scale = {2, 3, 2};
    a.global_in = a.in_len = {5, 4, 6};
    a.out_len = {10, 12, 12};
    geoms.push_back(a);
    exec::ResizeGeometry b;
    b.mode = mode;
    b.planes = 3;
    b.scale = {1, 2, 2};
    b.global_in = {1, 11, 13};
    b.out_lo = {0, 5, 3};
    b.out_len = {1, 7, 14};
    for (int d = 1; d < 3; ++d) {
      const auto u = static_cast<std::size_t>(d);
      const auto [lo, hi] = resize_input_range(mode, b.scale[u], b.global_in[u], b.out_lo[u], b.out_len[u]);
      b.in_lo[u] = lo;
      b.in_len[u] = hi - lo;
    }
    geoms.push_back(b);
    exec::ResizeGeometry c;
    c.mode = mode;
    c.planes = 96;
    c.scale = {1, 2, 2};
    c.global_in = c.in_len = {1, 32, 32};
    c.out_len = {1, 64, 64};
    geoms.push_back(c);
    for (std::size_t k = 0; k < geoms.size(); ++k) {
      const auto& g = geoms[k];
      INFO("dtype " << dtype_name(dtype_of<L>) << ", mode " << (mode == ResizeMode::linear ? "linear" : "nearest")
                    << ", geometry " << k);
      const index_t nin = g.planes * vol(g.in_len), nout = g.planes * vol(g.out_len);
      const auto x = values<L>(nin, 5, -3.0f, 3.0f);
      const auto gy = values<L>(nout, 6, -1.0f, 1.0f);
      const auto xw = widened(x), gw = widened(gy);
      auto y = empty_lp<L>(nout);
      auto yw = empty_f(nout);
      exec::resize_forward(g, as_block(x), as_block(y), ctx);
      exec::resize_forward(g, as_block(xw), as_block(yw), ctx);
      CHECK(differing(y, yw) == 0);
      auto gx = empty_lp<L>(nin);
      auto gxw = empty_f(nin);
      exec::resize_backward(g, as_block(gy), as_block(gx), ctx);
      exec::resize_backward(g, as_block(gw), as_block(gxw), ctx);
      CHECK(differing(gx, gxw) == 0);
    }
    // A strided input: the interior [2, 3, 6, 7] of a halo-padded [2, 3, 8, 9] array, read in
    // place, equals the f32 op on the widened contiguous interior.
    exec::ResizeGeometry s;
    s.mode = mode;
    s.planes = 6;
    s.scale = {1, 2, 3};
    s.global_in = s.in_len = {1, 6, 7};
    s.out_len = {1, 12, 21};
    const auto padded = values<L>(2 * 3 * 8 * 9, 7, -2.0f, 2.0f);
    const index_t shape[4] = {2, 3, 6, 7}, strides[4] = {3 * 8 * 9, 8 * 9, 9, 1};
    const Block pb = as_block(padded);
    const Block xs = Block::view(pb.dtype, pb.device, static_cast<L*>(pb.data) + 9 + 1, shape, 4, strides, pb.owner);
    auto interior = empty_f(6 * 6 * 7);
    for (index_t p = 0; p < 6; ++p)
      for (index_t i = 0; i < 6; ++i)
        for (index_t j = 0; j < 7; ++j)
          interior.data()[(p * 6 + i) * 7 + j] = static_cast<float>(padded.data()[p * 72 + (i + 1) * 9 + j + 1]);
    auto y = empty_lp<L>(6 * 12 * 21);
    auto yw = empty_f(6 * 12 * 21);
    exec::resize_forward(s, xs, as_block(y), ctx);
    exec::resize_forward(s, as_block(interior), as_block(yw), ctx);
    CHECK(differing(y, yw) == 0);
  }
}

TEST_CASE("pool / resize: bf16 in place allocates no f32 working copies; mixed dtypes are refused",
          "[precision][pool][resize]") {
  auto& ctx = current_context(Device::cpu());
  // 256 planes of 64 x 64 (1 Mi bf16 elements): the f32 route held 256 KiB f32 chunks of input and
  // output (plane chunks) or whole-tensor copies; in place the only allocation is the result.
  const auto g = pool_geometry(256, {1, 64, 64}, {1, 2, 2}, {1, 2, 2}, {0, 0, 0}, true);
  const index_t nin = g.planes * vol(g.in), nout = g.planes * vol(g.out);
  const auto x = values<bf16>(nin, 1, -1.0f, 1.0f);
  const auto gy = values<bf16>(nout, 2, -1.0f, 1.0f);
  auto y = empty_lp<bf16>(nout);
  auto gx = empty_lp<bf16>(nin);
  auto idx = Tensor<std::int64_t, 1>::empty({nout}, Device::cpu());
  exec::ResizeGeometry r;
  r.mode = ResizeMode::linear;
  r.planes = 256;
  r.scale = {1, 2, 2};
  r.global_in = r.in_len = {1, 32, 32};
  r.out_len = {1, 64, 64};
  reset_peak_memory(DeviceKind::cpu);
  const std::size_t before = memory_stats(DeviceKind::cpu).current_bytes;
  exec::avg_pool_forward(g, as_block(x), as_block(y), ctx);
  exec::avg_pool_backward(g, as_block(gy), as_block(gx), ctx);
  exec::max_pool_forward(g, as_block(x), as_block(y), as_block(idx), ctx);
  exec::max_pool_backward(g, as_block(gy), as_block(idx), as_block(gx), ctx);
  exec::resize_forward(r, as_block(y), as_block(gx), ctx);
  exec::resize_backward(r, as_block(gx), as_block(y), ctx);
  const std::size_t extra = memory_stats(DeviceKind::cpu).peak_bytes - before;
  INFO("bytes allocated beyond the operands at the peak: " << extra);
  CHECK(extra < 64 * 1024);

  // bf16 input, f16 output: a missing cast, refused with both dtypes named.
  auto yh = empty_lp<f16>(nout);
  CHECK_THROWS_WITH(exec::avg_pool_forward(g, as_block(x), as_block(yh), ctx),
                    Catch::Matchers::ContainsSubstring("avg_pool_forward") &&
                        Catch::Matchers::ContainsSubstring("share one storage dtype"));
  auto gxh = empty_lp<f16>(nin);
  CHECK_THROWS_WITH(exec::resize_backward(r, as_block(y), as_block(gxh), ctx),
                    Catch::Matchers::ContainsSubstring("resize_backward") &&
                        Catch::Matchers::ContainsSubstring("share one storage dtype"));
  // bf16 beside f32: refused too (no silent conversion).
  auto yf = empty_f(nout);
  CHECK_THROWS_WITH(exec::max_pool_forward(g, as_block(x), as_block(yf), as_block(idx), ctx),
                    Catch::Matchers::ContainsSubstring("max_pool_forward"));
}

}  // namespace st_exec_test_pool_resize_lp
