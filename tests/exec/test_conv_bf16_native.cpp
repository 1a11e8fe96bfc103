// The bf16 conv kernels on the CPU's bf16 unit (src/exec/conv_cpu_direct.cpp: namespace amx, AMX
// tiles; namespace dot, AVX-512 BF16 vdpbf16ps; cpu_bf16() picks, SHARDTENSOR_CPU_BF16 lowers: ctest
// runs these cases once more at avx512bf16 so an AMX machine checks the vdpbf16ps kernels too) against the
// widened path (ExecSettings::native_low_precision = false: the f32 micro-kernels on the same bf16 values,
// rounded once; bit-identical to f32 on widened inputs, tests/nn/test_precision_ops.cpp). Both
// sum the same exact bf16 products in f32, in different orders, and round once to bf16, so per
// element  |native - widened| <= 2 u |widened| + 2 K 2^-24 M  (u = 2^-8, K the number of summed
// products, M the same op on |operands|). Geometries cover every tile-layout branch: output
// channels <= 16 (1 x 3 C tiles) and > 16 (2 x 2, padded blocks), odd and large input channel
// counts (channel pairs padded to 16), groups, dilation, valid and asymmetric padding, 1-D / 2-D /
// 3-D, a strided input view, several tiles per row (small working-set budget), and for the weight
// gradient an odd number of (tap, channel block) A tiles and of output-channel blocks.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "shardtensor/core/cpu_isa.hpp"
#include "shardtensor/exec/box.hpp"
#include "shardtensor/exec/conv.hpp"
#include "shardtensor/exec/pointwise.hpp"
#include "shardtensor/shardtensor.hpp"

namespace st_exec_test_conv_bf16_native {

using namespace shard;

namespace {

struct Case {
  std::string name;
  ConvGeometry g;
  bool strided_x = false;  ///< x as the interior of a larger array (read in place)
  std::size_t budget = std::size_t{1} << 20;
};

ConvGeometry geom(int dims, index_t n, index_t cin, index_t cout, index_t groups, std::array<index_t, 3> in,
                  std::array<index_t, 3> k, std::array<index_t, 3> pad, std::array<index_t, 3> dil = {1, 1, 1}) {
  ConvGeometry g;
  g.spatial_dims = dims;
  g.batch = n;
  g.in_channels = cin;
  g.out_channels = cout;
  g.groups = groups;
  for (int d = 0; d < 3; ++d) {
    const bool used = d >= 3 - dims;
    g.in[d] = used ? in[d] : 1;
    g.kernel[d] = used ? k[d] : 1;
    g.pad_lo[d] = used ? pad[d] : 0;
    g.dilation[d] = used ? dil[d] : 1;
    // "same"-style output when pad = dil * (k - 1) / 2, smaller when pad is smaller
    g.out[d] = used ? in[d] + 2 * pad[d] - dil[d] * (k[d] - 1) : 1;
  }
  return g;
}

index_t vol(const std::array<index_t, 3>& e) { return e[0] * e[1] * e[2]; }

/// bf16 values in [-1, 1) from a fixed generator (f32 master, rounded by exec::convert).
Block bf16_random(index_t n, std::uint64_t seed, bool absolute = false) {
  Block f = Block::allocate(DType::f32, Device::cpu(), &n, 1);
  float* p = static_cast<float*>(f.data);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (index_t i = 0; i < n; ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const float v = static_cast<float>((s >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
    p[i] = absolute ? std::fabs(v) : v;
  }
  Block b = Block::allocate(DType::bf16, Device::cpu(), &n, 1);
  exec::convert(f, b, current_context());
  return b;
}
Block abs_of(const Block& b) {
  Block r = Block::allocate(DType::bf16, Device::cpu(), b.shape.data(), b.rank);
  const auto* s = static_cast<const bf16*>(b.data);
  auto* d = static_cast<bf16*>(r.data);
  for (index_t i = 0; i < b.numel(); ++i) d[i].bits = static_cast<std::uint16_t>(s[i].bits & 0x7fffu);
  return r;
}
std::vector<float> to_f32(const Block& b) {
  std::vector<float> r(static_cast<std::size_t>(b.numel()));
  const auto* s = static_cast<const bf16*>(b.data);
  for (index_t i = 0; i < b.numel(); ++i) r[static_cast<std::size_t>(i)] = static_cast<float>(s[i]);
  return r;
}
Block zeros(index_t n) {
  Block b = Block::allocate(DType::bf16, Device::cpu(), &n, 1);
  std::memset(b.data, 0, static_cast<std::size_t>(n) * 2);
  return b;
}

/// got within 2 u |want| + 2 K 2^-24 m of want, elementwise; returns the worst error / bound.
double worst(const Block& got, const Block& want, const Block& m, double k) {
  const auto gv = to_f32(got), wv = to_f32(want), mv = to_f32(m);
  double w = 0;
  for (std::size_t i = 0; i < gv.size(); ++i) {
    const double tol = 2.0 / 256 * std::fabs(wv[i]) + 2 * k * std::ldexp(1.0, -24) * mv[i] + 1e-30;
    w = std::max(w, std::fabs(double(gv[i]) - wv[i]) / tol);
  }
  return w;
}

/// x as the block to hand the front: contiguous, or a strided interior view of a larger array.
Block x_operand(const Case& c, const Block& dense, std::vector<Block>& keep) {
  if (!c.strided_x) return dense;
  const ConvGeometry& g = c.g;
  const int S = g.spatial_dims;
  // rank 2 + S view with each spatial extent padded by 2 in the parent (the halo interior shape)
  std::vector<index_t> shape{g.batch, g.in_channels}, pshape{g.batch, g.in_channels};
  for (int d = 3 - S; d < 3; ++d) shape.push_back(g.in[d]), pshape.push_back(g.in[d] + 2);
  Block parent = Block::allocate(DType::bf16, Device::cpu(), pshape);
  std::memset(parent.data, 0xff, static_cast<std::size_t>(parent.numel()) * 2);  // NaN outside the view
  std::vector<index_t> strides(static_cast<std::size_t>(2 + S));
  index_t st = 1;
  for (int d = 1 + S; d >= 0; --d) strides[static_cast<std::size_t>(d)] = st, st *= pshape[static_cast<std::size_t>(d)];
  index_t off = 0;
  for (int d = 2; d < 2 + S; ++d) off += strides[static_cast<std::size_t>(d)];
  Block v = Block::view(DType::bf16, Device::cpu(), static_cast<bf16*>(parent.data) + off, shape.data(), 2 + S,
                        strides.data(), parent.owner);
  exec::box_copy(v, Block::view(DType::bf16, Device::cpu(), dense.data, shape.data(), 2 + S), current_context());
  keep.push_back(parent);
  return v;
}

}  // namespace

TEST_CASE("conv bf16 on the CPU's bf16 unit (AMX or AVX-512 BF16) agrees with the widened f32 kernels",
          "[precision][conv][bf16unit]") {
  if (cpu_bf16() == CpuBf16::widened)
    SKIP("the CPU's bf16 unit is 'widened' (no AMX-BF16 / AVX-512 BF16 in use, or level below avx512)");
  UNSCOPED_INFO("bf16 unit: " << to_string(cpu_bf16()) << ", CPU " << cpu_model_name());
  const std::vector<Case> cases = {
      {"2d 32->32 3x3 (2x2 C tiles)", geom(2, 2, 32, 32, 1, {1, 13, 21}, {1, 3, 3}, {0, 1, 1})},
      {"2d 3->5 5x5 odd channels", geom(2, 1, 3, 5, 1, {1, 11, 9}, {1, 5, 5}, {0, 2, 2})},
      {"3d 16->16 3^3", geom(3, 1, 16, 16, 1, {6, 7, 9}, {3, 3, 3}, {1, 1, 1})},
      {"1d 70->40 k7 dilation 2 (padded pairs, 4 m-blocks)", geom(1, 2, 70, 40, 1, {1, 1, 50}, {1, 1, 7}, {0, 0, 6}, {1, 1, 2})},
      {"2d groups 2, 24->36", geom(2, 2, 24, 36, 2, {1, 8, 10}, {1, 3, 3}, {0, 1, 1})},
      {"2d valid 3x3 (no padding), 40->20", geom(2, 1, 40, 20, 1, {1, 9, 8}, {1, 3, 3}, {0, 0, 0})},
      {"2d strided input view", geom(2, 2, 8, 17, 1, {1, 10, 12}, {1, 3, 3}, {0, 1, 1}), true},
      {"2d many tiles (4 KiB budget)", geom(2, 1, 6, 18, 1, {1, 37, 70}, {1, 3, 3}, {0, 1, 1}), false, 4096},
      {"3d 1x1x1 conv 33->47", geom(3, 1, 33, 47, 1, {3, 4, 5}, {1, 1, 1}, {0, 0, 0})},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const ConvGeometry& g = c.g;
    const index_t nx = g.batch * g.in_channels * vol(g.in), ny = g.batch * g.out_channels * vol(g.out);
    const index_t nw = g.out_channels * (g.in_channels / g.groups) * vol(g.kernel);
    const Block x = bf16_random(nx, 1), w = bf16_random(nw, 2), gy = bf16_random(ny, 3), bias = bf16_random(g.out_channels, 4);
    const Block bx = bf16_random(g.in_channels, 5);
    const Block ax = abs_of(x), aw = abs_of(w), agy = abs_of(gy), ab = abs_of(bias), abx = abs_of(bx);
    std::vector<Block> keep;
    ExecContext native, widened;
    native.settings().conv_column_budget = widened.settings().conv_column_budget = c.budget;
    widened.settings().native_low_precision = false;
    const Block xin = x_operand(c, x, keep);
    const index_t taps = vol(g.kernel), kf = (g.in_channels / g.groups) * taps, kb = (g.out_channels / g.groups) * taps;
    const index_t kw = g.batch * vol(g.out);
    // forward (+ bias)
    Block y1 = zeros(ny), y2 = zeros(ny), my = zeros(ny);
    exec::conv_forward(g, xin, w, &bias, y1, native);
    exec::conv_forward(g, x, w, &bias, y2, widened);
    exec::conv_forward(g, ax, aw, &ab, my, widened);
    const double wf = worst(y1, y2, my, static_cast<double>(kf));
    CHECK(wf <= 1.0);
    // input gradient (+ the transposed conv's bias)
    Block gx1 = zeros(nx), gx2 = zeros(nx), mgx = zeros(nx);
    exec::conv_backward_input(g, gy, w, &bx, gx1, native);
    exec::conv_backward_input(g, gy, w, &bx, gx2, widened);
    exec::conv_backward_input(g, agy, aw, &abx, mgx, widened);
    const double wi = worst(gx1, gx2, mgx, static_cast<double>(kb));
    CHECK(wi <= 1.0);
    // weight gradient
    Block gw1 = zeros(nw), gw2 = zeros(nw), mgw = zeros(nw);
    exec::conv_backward_weight(g, xin, gy, gw1, native);
    exec::conv_backward_weight(g, x, gy, gw2, widened);
    exec::conv_backward_weight(g, ax, agy, mgw, widened);
    const double ww = worst(gw1, gw2, mgw, static_cast<double>(kw));
    CHECK(ww <= 1.0);
    // the widened results themselves are sane: not all zero (the oracle is exercised)
    const auto y2v = to_f32(y2), gw2v = to_f32(gw2);
    double sy = 0, sw = 0;
    for (float v : y2v) sy += std::fabs(v);
    for (float v : gw2v) sw += std::fabs(v);
    CHECK(sy > 0);
    CHECK(sw > 0);
    UNSCOPED_INFO(c.name << ": worst / bound fwd " << wf << " bwd-input " << wi << " wgrad " << ww);
  }
}

TEST_CASE("conv bf16 on the CPU's bf16 unit: NaN and infinity propagate like the widened kernels",
          "[precision][conv][bf16unit]") {
  if (cpu_bf16() == CpuBf16::widened) SKIP("the CPU's bf16 unit is 'widened'");
  const ConvGeometry g = geom(2, 1, 4, 20, 1, {1, 6, 7}, {1, 3, 3}, {0, 1, 1});
  const index_t nx = 4 * 42, ny = 20 * 42, nw = 20 * 4 * 9;
  Block x = bf16_random(nx, 7), w = bf16_random(nw, 8);
  auto* xp = static_cast<bf16*>(x.data);
  xp[10] = bf16(std::numeric_limits<float>::infinity());
  xp[100].bits = 0x7fc0;  // NaN
  ExecContext native, widened;
  widened.settings().native_low_precision = false;
  Block y1 = zeros(ny), y2 = zeros(ny);
  exec::conv_forward(g, x, w, nullptr, y1, native);
  exec::conv_forward(g, x, w, nullptr, y2, widened);
  const auto a = to_f32(y1), b = to_f32(y2);
  index_t mismatched = 0, nonfinite = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    nonfinite += !std::isfinite(b[i]);
    if (std::isfinite(a[i]) != std::isfinite(b[i]) || std::isnan(a[i]) != std::isnan(b[i])) ++mismatched;
  }
  CHECK(nonfinite > 0);
  CHECK(mismatched == 0);
}

}  // namespace st_exec_test_conv_bf16_native
