// bf16 / f16 storage through the vendor libraries on CUDA, at the public fronts: the GEMM family
// (src/cuda/gemm_cuda.cpp: cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F; kernels/gemm.cu's
// epilogues templated on the storage type) and the conv family (src/cuda/conv_cuda.cpp: cuDNN
// descriptors of the storage type with an f32 compute type). Oracle: the same op in f32 on the
// widened operands (what the f32 working-copy route computes). Tensor cores sum in another order
// than the f32 kernels, so |got - f32| <= 2u |y| + 2 K 2^-24 m, K the reduction length, m the op
// on |operands| (u = 2^-8 bf16, 2^-11 f16); the epilogues bit for bit the f32 result rounded once.
// Needs a GPU (cuBLAS, cuDNN): skips without one; the project's own kernels among these also run
// in the simulator lane (tests/gpusim/cuda_sim_precision.cpp).
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/shardtensor.hpp>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <random>
#include <tuple>
#include <type_traits>

#include "shardtensor/exec/conv.hpp"
#include "shardtensor/exec/gemm.hpp"

namespace st_exec_cuda_lowp_libraries {

using namespace shard;

namespace {

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped")

template <class L, int R>
Tensor<L, R> random_lp(const Shape<R>& s, unsigned seed) {
  auto t = Tensor<L, R>::empty(s);
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (index_t i = 0; i < t.numel(); ++i) t.data()[i] = L(d(g));
  return t;
}
/// max over elements of |got - want| / (2u|want| + 2 K 2^-24 mag).
template <class L, int R>
double worst_ratio(const Tensor<L, R>& got_d, const Tensor<float, R>& want_d, const Tensor<float, R>& mag_d, double u,
                   index_t k) {
  const auto got = got_d.to(Device::cpu());
  const auto want = want_d.to(Device::cpu()), mag = mag_d.to(Device::cpu());
  double worst = 0;
  for (index_t i = 0; i < got.numel(); ++i) {
    const double w = want.data()[i], e = std::fabs(static_cast<double>(static_cast<float>(got.data()[i])) - w);
    const double tol = 2 * u * std::fabs(w) + 2.0 * static_cast<double>(k) * 0x1p-24 * mag.data()[i] + 1e-30;
    worst = std::max(worst, e / tol);
  }
  return worst;
}
template <class L, int R>
Tensor<float, R> widened(const Tensor<L, R>& t, bool absolute = false) {
  auto w = Tensor<float, R>::empty(t.shape());
  for (index_t i = 0; i < t.numel(); ++i) {
    const float v = static_cast<float>(t.data()[i]);
    w.data()[i] = absolute ? std::fabs(v) : v;
  }
  return w;
}

}  // namespace

TEMPLATE_TEST_CASE("cuda gemm: bf16 / f16 storage through cuBLAS with f32 accumulation", "[cuda][gemm][precision]",
                   bf16, f16) {
  REQUIRE_GPU();
  using L = TestType;
  const double u = std::is_same_v<L, bf16> ? 1.0 / 256 : 1.0 / 2048;
  const Device dev = Device::cuda(0);
  auto& ctx = current_context(dev);
  const index_t batch = 3, m = 37, k = 129, n = 45;
  for (auto [ta, tb, beta] : {std::tuple{Trans::no, Trans::no, 0.0},
                              std::tuple{Trans::yes, Trans::no, 0.0},
                              std::tuple{Trans::no, Trans::yes, 0.5}}) {
    INFO("ta " << (ta == Trans::yes) << ", tb " << (tb == Trans::yes) << ", beta " << beta);
    const Shape<3> sa = ta == Trans::no ? Shape<3>{batch, m, k} : Shape<3>{batch, k, m};
    const Shape<3> sb = tb == Trans::no ? Shape<3>{batch, k, n} : Shape<3>{batch, n, k};
    const auto ha = random_lp<L, 3>(sa, 1), hb = random_lp<L, 3>(sb, 2), hc = random_lp<L, 3>(Shape<3>{batch, m, n}, 3);
    exec::GemmGeometry g{ta, tb, 1.0, beta};
    auto c = hc.to(dev);
    exec::gemm(g, as_block(ha.to(dev)), as_block(hb.to(dev)), as_block(c), ctx);
    auto cf = widened(hc).to(dev);
    exec::gemm(g, as_block(widened(ha).to(dev)), as_block(widened(hb).to(dev)), as_block(cf), ctx);
    auto cm = widened(hc, true).to(dev);
    exec::gemm(exec::GemmGeometry{ta, tb, 1.0, std::fabs(beta)}, as_block(widened(ha, true).to(dev)),
               as_block(widened(hb, true).to(dev)), as_block(cm), ctx);
    ctx.synchronize();
    const double worst = worst_ratio(c, cf, cm, u, k);
    INFO("worst error / bound " << worst);
    CHECK(worst <= 1.0);
  }
  // The epilogues through the front: bit for bit the f32 route rounded once.
  const index_t A = 2, C = 6, S = 33;
  const auto hy = random_lp<L, 1>(Shape<1>{A * C * S}, 4), hbias = random_lp<L, 1>(Shape<1>{C}, 5);
  auto y = hy.to(dev);
  auto yf = widened(hy).to(dev);
  exec::add_bias(exec::BiasGeometry{A, C, S}, as_block(hbias.to(dev)), as_block(y), ctx);
  exec::add_bias(exec::BiasGeometry{A, C, S}, as_block(widened(hbias).to(dev)), as_block(yf), ctx);
  auto db = Tensor<L, 1>::empty({C}, dev);
  auto dbf = Tensor<float, 1>::empty({C}, dev);
  exec::bias_grad(exec::BiasGeometry{A, C, S}, as_block(y), as_block(db), ctx);
  exec::bias_grad(exec::BiasGeometry{A, C, S}, as_block(widened(y.to(Device::cpu())).to(dev)), as_block(dbf), ctx);
  ctx.synchronize();
  const auto gy = y.to(Device::cpu()), wy = yf.to(Device::cpu());
  for (index_t i = 0; i < gy.numel(); ++i) REQUIRE(gy(i).bits == L(wy(i)).bits);
  const auto gdb = db.to(Device::cpu()), wdb = dbf.to(Device::cpu());
  for (index_t c2 = 0; c2 < C; ++c2) CHECK(gdb(c2).bits == L(wdb(c2)).bits);
}

TEMPLATE_TEST_CASE("cuda conv: bf16 / f16 storage through cuDNN with f32 accumulation", "[cuda][conv][precision]",
                   bf16, f16) {
  REQUIRE_GPU();
  using L = TestType;
  const double u = std::is_same_v<L, bf16> ? 1.0 / 256 : 1.0 / 2048;
  const Device dev = Device::cuda(0);
  auto& ctx = current_context(dev);
  for (int case_ = 0; case_ < 2; ++case_) {  // 2-D stride 1, pad 1 (halo-style); 3-D stride 2, asymmetric pad
    ConvGeometry g;
    g.batch = 2;
    g.in_channels = 6;
    g.out_channels = 8;
    if (case_ == 0) {
      g.spatial_dims = 2;
      g.in = {1, 17, 13};
      g.kernel = {1, 3, 3};
      g.pad_lo = {0, 1, 1};
    } else {
      g.spatial_dims = 3;
      g.in = {7, 9, 8};
      g.kernel = {3, 3, 3};
      g.stride = {2, 2, 2};
      g.pad_lo = {1, 0, 1};
    }
    for (int d = 0; d < 3; ++d) {
      const auto e = static_cast<std::size_t>(d);
      g.out[e] = (g.in[e] + 2 * g.pad_lo[e] - g.kernel[e]) / g.stride[e] + 1;
    }
    INFO("case " << case_);
    const index_t nx = g.batch * g.in_channels * g.in[0] * g.in[1] * g.in[2];
    const index_t ny = g.batch * g.out_channels * g.out[0] * g.out[1] * g.out[2];
    const index_t nw = g.out_channels * g.in_channels * g.kernel[0] * g.kernel[1] * g.kernel[2];
    const index_t red = g.in_channels * g.kernel[0] * g.kernel[1] * g.kernel[2];  // forward reduction length
    const auto hx = random_lp<L, 1>(Shape<1>{nx}, 11), hw = random_lp<L, 1>(Shape<1>{nw}, 12),
               hgy = random_lp<L, 1>(Shape<1>{ny}, 13), hb = random_lp<L, 1>(Shape<1>{g.out_channels}, 14);
    const auto x = hx.to(dev), w = hw.to(dev), gy = hgy.to(dev), b = hb.to(dev);
    const auto xf = widened(hx).to(dev), wf = widened(hw).to(dev), gyf = widened(hgy).to(dev), bf = widened(hb).to(dev);
    const auto xa = widened(hx, true).to(dev), wa = widened(hw, true).to(dev), gya = widened(hgy, true).to(dev),
               ba = widened(hb, true).to(dev);
    auto y = Tensor<L, 1>::empty({ny}, dev);
    auto yf = Tensor<float, 1>::empty({ny}, dev), ya = Tensor<float, 1>::empty({ny}, dev);
    const Block bb = as_block(b), bbf = as_block(bf), bba = as_block(ba);
    exec::conv_forward(g, as_block(x), as_block(w), &bb, as_block(y), ctx);
    exec::conv_forward(g, as_block(xf), as_block(wf), &bbf, as_block(yf), ctx);
    exec::conv_forward(g, as_block(xa), as_block(wa), &bba, as_block(ya), ctx);
    // cuDNN alone (no bias): its output rounded once to L from an f32 accumulation.
    auto y0 = Tensor<L, 1>::empty({ny}, dev);
    auto y0f = Tensor<float, 1>::empty({ny}, dev), y0a = Tensor<float, 1>::empty({ny}, dev);
    exec::conv_forward(g, as_block(x), as_block(w), nullptr, as_block(y0), ctx);
    exec::conv_forward(g, as_block(xf), as_block(wf), nullptr, as_block(y0f), ctx);
    exec::conv_forward(g, as_block(xa), as_block(wa), nullptr, as_block(y0a), ctx);
    auto gx = Tensor<L, 1>::empty({nx}, dev);
    auto gxf = Tensor<float, 1>::empty({nx}, dev), gxa = Tensor<float, 1>::empty({nx}, dev);
    exec::conv_backward_input(g, as_block(gy), as_block(w), nullptr, as_block(gx), ctx);
    exec::conv_backward_input(g, as_block(gyf), as_block(wf), nullptr, as_block(gxf), ctx);
    exec::conv_backward_input(g, as_block(gya), as_block(wa), nullptr, as_block(gxa), ctx);
    auto gw = Tensor<L, 1>::empty({nw}, dev);
    auto gwf = Tensor<float, 1>::empty({nw}, dev), gwa = Tensor<float, 1>::empty({nw}, dev);
    exec::conv_backward_weight(g, as_block(x), as_block(gy), as_block(gw), ctx);
    exec::conv_backward_weight(g, as_block(xf), as_block(gyf), as_block(gwf), ctx);
    exec::conv_backward_weight(g, as_block(xa), as_block(gya), as_block(gwa), ctx);
    ctx.synchronize();
    const index_t red_w = g.batch * g.out[0] * g.out[1] * g.out[2];
    const index_t red_x = g.out_channels * g.kernel[0] * g.kernel[1] * g.kernel[2];
    // With a bias the forward rounds twice, as PyTorch's bf16 conv does (cuDNN's output in L, then
    // the bias kernel's sum in L): |y - want| <= u |conv| + 2u |want| + 2 (K + 1) 2^-24 mag, where
    // conv = want - b can be much larger than want when the bias cancels it (the H100 run of
    // 89c5c67 failed this case with the one-rounding bound: bf16 21.1, f16 2.7).
    const double ry0 = worst_ratio(y0, y0f, y0a, u, red);
    double ry = 0;
    {
      const auto got = y.to(Device::cpu());
      const auto want = yf.to(Device::cpu()), conv = y0f.to(Device::cpu()), mag = ya.to(Device::cpu());
      for (index_t i = 0; i < got.numel(); ++i) {
        const double wv = want.data()[i];
        const double e = std::fabs(static_cast<double>(static_cast<float>(got.data()[i])) - wv);
        const double tol = u * std::fabs(static_cast<double>(conv.data()[i])) + 2 * u * std::fabs(wv) +
                           2.0 * static_cast<double>(red + 1) * 0x1p-24 * mag.data()[i] + 1e-30;
        ry = std::max(ry, e / tol);
      }
    }
    const double rx = worst_ratio(gx, gxf, gxa, u, red_x), rw = worst_ratio(gw, gwf, gwa, u, red_w);
    INFO("worst error / bound: forward without bias " << ry0 << ", forward with bias (two roundings) " << ry
                                                      << ", input gradient " << rx << ", weight gradient " << rw);
    std::printf("cuda conv %s case %d: worst error / bound: forward without bias %.3g, with bias %.3g, input "
                "gradient %.3g, weight gradient %.3g\n",
                std::is_same_v<L, bf16> ? "bf16" : "f16", case_, ry0, ry, rx, rw);
    CHECK(ry0 <= 1.0);
    CHECK(ry <= 1.0);
    CHECK(rx <= 1.0);
    CHECK(rw <= 1.0);
  }
}

}  // namespace st_exec_cuda_lowp_libraries
