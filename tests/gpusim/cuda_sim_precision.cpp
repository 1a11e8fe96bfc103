// gpusim lane (and shardtensor_cuda_tests on a real GPU): the mixed-precision kernels on CUDA:
// exec::convert between f32, f64, bf16 and f16 (kernels/pointwise.cu, bit-level roundings of
// src/kernels_api/convert_ops.hpp) equals the CPU table bit for bit, including ties, f16
// subnormals, overflow and NaN; box_add on bf16 / f16 (kernels/box.cu) equals the CPU's; a bf16
// pointwise op matches the CPU's; the pointwise kernels templated on bf16 / f16 storage equal the
// CUDA f32 op rounded once; the norm, pool and resize kernels, the GEMM epilogues and the conv
// helper kernels on bf16 / f16 equal the f32 working-copy route; the attention (SIMT kernels:
// native_low_precision off) and neighbourhood attention kernels on bf16 / f16 are within one ulp of it.
#include <catch2/catch_template_test_macros.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "exec/box_kernels.hpp"
#include "kernels_api/conv.hpp"
#include "kernels_api/gemm.hpp"
#include "gpusim_support.hpp"
#include "support/lowp_compare.hpp"
#include "shardtensor/exec/attention.hpp"
#include "shardtensor/exec/neighborhood.hpp"
#include "shardtensor/exec/norm.hpp"
#include "shardtensor/exec/pointwise.hpp"
#include "shardtensor/exec/pool.hpp"
#include "shardtensor/exec/resize.hpp"

namespace st_gpusim_cuda_sim_precision {

using namespace gpusim;

namespace {

/// Values lo + (hi - lo) (1 + sin(phase i + offset)) / 2 of dtype L on the host (i the flat index).
template <class L, int R>
Tensor<L, R> wave(const Shape<R>& shape, float lo, float hi, float phase, float offset) {
  auto t = Tensor<L, R>::empty(shape);
  for (index_t i = 0; i < t.numel(); ++i)
    t.data()[i] = L(lo + (hi - lo) * (0.5f + 0.5f * std::sin(phase * static_cast<float>(i) + offset)));
  return t;
}
/// A bf16 / f16 tensor (host or device) widened to f32, on the device: the f32 route's operand.
template <class L, int R>
Tensor<float, R> widened_on_gpu(const Tensor<L, R>& t) {
  const auto h = t.to(Device::cpu());
  auto w = Tensor<float, R>::empty(h.shape());
  for (index_t i = 0; i < h.numel(); ++i) w.data()[i] = static_cast<float>(h.data()[i]);
  return w.to(gpu());
}

std::vector<float> probes() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1.0f + 1.0f / 2048,
                          65504.0f, 65519.0f, 65520.0f, 1e30f, -1e30f, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                          5.9604644775390625e-8f, 2.98023223876953125e-8f, 8.940696716308594e-8f, 6.1e-5f,
                          3.0517578125e-5f, std::numeric_limits<float>::denorm_min()};
  for (int i = 0; i < 200; ++i) v.push_back(std::ldexp(1.0f + static_cast<float>(i) / 512.0f, (i % 40) - 28) *
                                            (i % 2 ? -1.0f : 1.0f));
  return v;
}

template <class T>
std::vector<std::uint16_t> bits_of(const Tensor<T, 1>& t) {
  const auto h = t.to(Device::cpu());
  std::vector<std::uint16_t> out(static_cast<std::size_t>(h.numel()));
  std::memcpy(out.data(), h.data(), out.size() * 2);
  return out;
}

}  // namespace

TEST_CASE("gpusim precision: exec::convert on CUDA equals the CPU bit for bit", "[gpusim][precision]") {
  GPUSIM_REQUIRE_GPU();
  const auto v = probes();
  const index_t n = static_cast<index_t>(v.size());
  auto h32 = Tensor<float, 1>::empty({n});
  for (index_t i = 0; i < n; ++i) h32(i) = v[static_cast<std::size_t>(i)];
  const auto d32 = h32.to(gpu());
  auto hb = Tensor<bf16, 1>::empty({n});
  auto hh = Tensor<f16, 1>::empty({n});
  auto db = Tensor<bf16, 1>::empty({n}, gpu());
  auto dh = Tensor<f16, 1>::empty({n}, gpu());
  exec::convert(as_block(h32), as_block(hb), hctx());
  exec::convert(as_block(h32), as_block(hh), hctx());
  exec::convert(as_block(d32), as_block(db), gctx());
  exec::convert(as_block(d32), as_block(dh), gctx());
  gctx().synchronize();
  const auto cb = bits_of(hb), gb = bits_of(db);
  const auto ch = bits_of(hh), gh = bits_of(dh);
  int bad_b = 0, bad_h = 0;
  for (std::size_t i = 0; i < cb.size(); ++i) {
    if (std::isnan(v[i])) continue;  // NaN payloads may differ; NaN-ness is checked below
    bad_b += cb[i] != gb[i];
    bad_h += ch[i] != gh[i];
  }
  CHECK(bad_b == 0);
  CHECK(bad_h == 0);
  // Back to f32 and to f64 on the device: exact widening, as on the CPU.
  auto w32 = Tensor<float, 1>::empty({n}, gpu());
  auto w64 = Tensor<double, 1>::empty({n}, gpu());
  exec::convert(as_block(dh), as_block(w32), gctx());
  exec::convert(as_block(db), as_block(w64), gctx());
  gctx().synchronize();
  const auto hw32 = w32.to(Device::cpu());
  const auto hw64 = w64.to(Device::cpu());
  for (index_t i = 0; i < n; ++i) {
    const float f = v[static_cast<std::size_t>(i)];
    if (std::isnan(f)) {
      CHECK(std::isnan(hw32(i)));
      CHECK(std::isnan(hw64(i)));
      continue;
    }
    CHECK(hw32(i) == static_cast<float>(hh(i)));
    CHECK(hw64(i) == static_cast<double>(static_cast<float>(hb(i))));
  }
}

TEST_CASE("gpusim precision: box_add on bf16 / f16 and a bf16 pointwise op match the CPU", "[gpusim][precision]") {
  GPUSIM_REQUIRE_GPU();
  const index_t n = 300;
  auto a32 = Tensor<float, 1>::empty({n});
  auto b32 = Tensor<float, 1>::empty({n});
  for (index_t i = 0; i < n; ++i) {
    a32(i) = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
    b32(i) = std::cos(0.11f * static_cast<float>(i)) * 0.01f;
  }
  auto ha = Tensor<bf16, 1>::empty({n});
  auto hb = Tensor<bf16, 1>::empty({n});
  exec::convert(as_block(a32), as_block(ha), hctx());
  exec::convert(as_block(b32), as_block(hb), hctx());
  auto da = ha.to(gpu());
  auto dbb = hb.to(gpu());
  const auto& cpu_box = exec::kernels_for<exec::BoxKernels>(Device::cpu(), "test");
  const auto& gpu_box = exec::kernels_for<exec::BoxKernels>(gpu(), "test");
  cpu_box.add(as_block(ha), as_block(hb), hctx());
  gpu_box.add(as_block(da), as_block(dbb), gctx());
  gctx().synchronize();
  CHECK(bits_of(ha) == bits_of(da));
  auto hh = Tensor<f16, 1>::empty({n});
  auto hh2 = Tensor<f16, 1>::empty({n});
  exec::convert(as_block(a32), as_block(hh), hctx());
  exec::convert(as_block(b32), as_block(hh2), hctx());
  auto dh = hh.to(gpu());
  auto dh2 = hh2.to(gpu());
  cpu_box.add(as_block(hh), as_block(hh2), hctx());
  gpu_box.add(as_block(dh), as_block(dh2), gctx());
  gctx().synchronize();
  CHECK(bits_of(hh) == bits_of(dh));
  // relu through the f32 working copies: exact on both devices.
  auto hy = Tensor<bf16, 1>::empty({n});
  auto dy = Tensor<bf16, 1>::empty({n}, gpu());
  exec::unary(exec::UnaryOp::relu, 0.0, as_block(ha), as_block(hy), hctx());
  exec::unary(exec::UnaryOp::relu, 0.0, as_block(da), as_block(dy), gctx());
  gctx().synchronize();
  CHECK(bits_of(hy) == bits_of(dy));
}

TEST_CASE("gpusim precision: Tensor axpy and sum on bf16 / f16 device tensors match the CPU",
          "[gpusim][precision]") {
  GPUSIM_REQUIRE_GPU();
  const index_t n = 257;
  auto x32 = Tensor<float, 1>::empty({n});
  auto y32 = Tensor<float, 1>::empty({n});
  for (index_t i = 0; i < n; ++i) {
    x32(i) = std::sin(0.3f * static_cast<float>(i));
    y32(i) = std::cos(0.7f * static_cast<float>(i)) * 4.0f;
  }
  auto hx = Tensor<bf16, 1>::empty({n});
  auto hy = Tensor<bf16, 1>::empty({n});
  exec::convert(as_block(x32), as_block(hx), hctx());
  exec::convert(as_block(y32), as_block(hy), hctx());
  auto dx = hx.to(gpu());
  auto dy = hy.to(gpu());
  axpy(bf16(0.75f), hx, hy);  // the gradient accumulation of the tape (autograd/variable.hpp)
  axpy(bf16(0.75f), dx, dy);
  const auto back = dy.to(Device::cpu());
  // One rounding on both devices; the device may contract a*x+y into an FMA: one bf16 ulp apart
  // at most.
  for (index_t i = 0; i < n; ++i) {
    const float c = static_cast<float>(hy(i)), g = static_cast<float>(back(i));
    CHECK(std::abs(c - g) <= std::abs(c) / 128.0f + 1e-30f);
  }
  CHECK(std::abs(static_cast<double>(shard::sum(dy)) - static_cast<double>(shard::sum(hy))) <= 1e-3);
}

TEMPLATE_TEST_CASE("gpusim precision: bf16 / f16 pointwise kernels computed natively on CUDA", "[gpusim][precision]",
                   bf16, f16) {
  // kernels/pointwise.cu templated on the storage type (Storage<S>: load widens, store rounds
  // once): every unary op forward and backward, every binary op contiguous and broadcast, and
  // div's rhs gradient, on bf16 / f16 operands. Oracle on the device: the CUDA f32 op on the
  // widened operands, rounded once, bit for bit (NaN-ness only where it is NaN). Against the CPU
  // table: bit for bit for the correctly rounded ops (+ - * /, sqrt, scalar ops, relu, abs, neg);
  // the transcendental ones (exp, log, tanh, sigmoid, silu, gelu) differ in f32 between CUDA's
  // libdevice and glibc, so within one bf16 / f16 ulp there.
  GPUSIM_REQUIRE_GPU();
  using L = TestType;
  const index_t rows = 3, cols = 4, inner = 37, n = rows * cols * inner;  // 444: a partial last block
  const Shape<3> sh{rows, cols, inner};
  auto to_lp = [&](float lo, float hi, float phase) { return wave<L, 3>(sh, lo, hi, phase, 0.3f); };
  const auto hx = to_lp(-3.0f, 3.0f, 0.71f), hg = to_lp(-1.0f, 1.0f, 0.37f), hp = to_lp(0.25f, 2.0f, 0.53f);
  auto hs = Tensor<L, 3>::empty({1, cols, 1});
  for (index_t c = 0; c < cols; ++c) hs.data()[c] = L(0.5f + 0.25f * static_cast<float>(c));
  const auto dx = hx.to(gpu()), dg = hg.to(gpu()), dp = hp.to(gpu()), ds = hs.to(gpu());
  const auto wx = widened_on_gpu(hx), wg = widened_on_gpu(hg), wp = widened_on_gpu(hp), ws = widened_on_gpu(hs);
  const index_t shape[3] = {rows, cols, inner}, bstr[3] = {0, 1, 0};
  auto bcast = [&](const auto& s) {
    const Block b = as_block(s);
    return Block::view(b.dtype, b.device, b.data, shape, 3, bstr, b.owner);
  };
  // Elements of the device result g that are not L(f32 device result w), bit for bit.
  auto not_rounded = [&](const Tensor<L, 3>& g, const Tensor<float, 3>& w) {
    const auto gh = g.to(Device::cpu());
    const auto wh = w.to(Device::cpu());
    index_t bad = 0;
    for (index_t i = 0; i < n; ++i) {
      const float v = wh.data()[i];
      if (std::isnan(v)) bad += std::isnan(static_cast<float>(gh.data()[i])) ? 0 : 1;
      else bad += gh.data()[i].bits == L(v).bits ? 0 : 1;
    }
    return bad;
  };
  // Elements of the device result g farther than `ulps` units of L from the CPU result c.
  auto off_cpu = [&](const Tensor<L, 3>& c, const Tensor<L, 3>& g, int ulps) {
    const auto gh = g.to(Device::cpu());
    index_t bad = 0;
    for (index_t i = 0; i < n; ++i) {
      const float cv = static_cast<float>(c.data()[i]), gv = static_cast<float>(gh.data()[i]);
      if (std::isnan(cv) || std::isnan(gv)) {
        bad += std::isnan(cv) == std::isnan(gv) ? 0 : 1;
        continue;
      }
      const int diff = std::abs(static_cast<int>(c.data()[i].bits) - static_cast<int>(gh.data()[i].bits));
      const bool same_sign = (c.data()[i].bits & 0x8000) == (gh.data()[i].bits & 0x8000);
      bad += (cv == gv || (same_sign && diff <= ulps)) ? 0 : 1;
    }
    return bad;
  };
  for (int k = 0; k <= static_cast<int>(exec::UnaryOp::rdiv_scalar); ++k) {
    const auto op = static_cast<exec::UnaryOp>(k);
    INFO("unary op " << exec::op_name(op));
    using U = exec::UnaryOp;
    const bool transcendental = op == U::exp || op == U::log || op == U::gelu || op == U::gelu_tanh ||
                                op == U::silu || op == U::tanh || op == U::sigmoid;
    const double alpha = op == U::leaky_relu ? 0.01 : 1.75;
    auto cy = Tensor<L, 3>::empty(sh), cd = Tensor<L, 3>::empty(sh);
    auto gy = Tensor<L, 3>::empty(sh, gpu()), gd = Tensor<L, 3>::empty(sh, gpu());
    auto wy = Tensor<float, 3>::empty(sh, gpu()), wd = Tensor<float, 3>::empty(sh, gpu());
    exec::unary(op, alpha, as_block(hx), as_block(cy), hctx());
    exec::unary(op, alpha, as_block(dx), as_block(gy), gctx());
    exec::unary(op, alpha, as_block(wx), as_block(wy), gctx());
    exec::unary_backward(op, alpha, as_block(hx), as_block(cy), as_block(hg), as_block(cd), hctx());
    exec::unary_backward(op, alpha, as_block(dx), as_block(gy), as_block(dg), as_block(gd), gctx());
    const auto wgy = widened_on_gpu(gy);  // the backward's saved output is the rounded one
    exec::unary_backward(op, alpha, as_block(wx), as_block(wgy), as_block(wg), as_block(wd), gctx());
    gctx().synchronize();
    CHECK(not_rounded(gy, wy) == 0);
    CHECK(not_rounded(gd, wd) == 0);
    CHECK(off_cpu(cy, gy, transcendental ? 1 : 0) == 0);
    if (!transcendental) CHECK(off_cpu(cd, gd, 0) == 0);
  }
  for (auto op : {exec::BinaryOp::add, exec::BinaryOp::sub, exec::BinaryOp::mul, exec::BinaryOp::div}) {
    INFO("binary op " << exec::op_name(op));
    auto co = Tensor<L, 3>::empty(sh);
    auto go = Tensor<L, 3>::empty(sh, gpu());
    auto wo = Tensor<float, 3>::empty(sh, gpu());
    exec::binary(op, as_block(hx), as_block(hp), as_block(co), hctx());
    exec::binary(op, as_block(dx), as_block(dp), as_block(go), gctx());
    exec::binary(op, as_block(wx), as_block(wp), as_block(wo), gctx());
    gctx().synchronize();
    CHECK(not_rounded(go, wo) == 0);
    CHECK(off_cpu(co, go, 0) == 0);
    exec::binary(op, as_block(hx), bcast(hs), as_block(co), hctx());
    exec::binary(op, as_block(dx), bcast(ds), as_block(go), gctx());
    exec::binary(op, as_block(wx), bcast(ws), as_block(wo), gctx());
    gctx().synchronize();
    CHECK(not_rounded(go, wo) == 0);
    CHECK(off_cpu(co, go, 0) == 0);
  }
  auto co = Tensor<L, 3>::empty(sh);
  auto go = Tensor<L, 3>::empty(sh, gpu());
  auto wo = Tensor<float, 3>::empty(sh, gpu());
  exec::div_rhs_backward(as_block(hg), as_block(hx), bcast(hs), as_block(co), hctx());
  exec::div_rhs_backward(as_block(dg), as_block(dx), bcast(ds), as_block(go), gctx());
  exec::div_rhs_backward(as_block(wg), as_block(wx), bcast(ws), as_block(wo), gctx());
  gctx().synchronize();
  CHECK(not_rounded(go, wo) == 0);
  CHECK(off_cpu(co, go, 0) == 0);
}

/// n doubles in device memory (the norm family's statistics on a GPU context).
struct DevStats {
  Tensor<double, 1> t;
  explicit DevStats(std::size_t n) : t(Tensor<double, 1>::zeros({static_cast<index_t>(n)}, gpu())) {}
  double* p() { return t.data(); }
  std::vector<double> get() const {
    gctx().synchronize();
    const auto h = t.to(Device::cpu());
    return std::vector<double>(h.data(), h.data() + h.numel());
  }
  void set(const std::vector<double>& v) {
    auto h = Tensor<double, 1>::empty({static_cast<index_t>(v.size())});
    std::copy(v.begin(), v.end(), h.data());
    t = h.to(gpu());
  }
};

TEMPLATE_TEST_CASE("gpusim precision: bf16 / f16 norm kernels read and write the storage type on CUDA",
                   "[gpusim][precision]", bf16, f16) {
  // kernels/norm.cu templated on the storage type (the CUDA table takes_storage, as the CPU's):
  // on the device, every result equals the f32 working-copy route (the same kernels on the
  // widened operands; apply and dx rounded once more) bit for bit, sums exactly (same values, same
  // tree); against the CPU table the sums agree to 1e-12 and apply / dx within one ulp.
  GPUSIM_REQUIRE_GPU();
  using L = TestType;
  const index_t A = 3, C = 4, S = 45;
  auto lp = [](index_t m, float lo, float hi, float phase) { return wave<L, 1>({m}, lo, hi, phase, 0.2f); };
  const index_t n = A * C * S;
  const auto hx = lp(n, -2.0f, 3.0f, 0.61f), hg = lp(n, -1.0f, 1.0f, 0.29f), hw = lp(C, 0.5f, 1.5f, 1.3f),
             hb = lp(C, -0.5f, 0.5f, 0.7f);
  const auto dx = hx.to(gpu()), dg = hg.to(gpu()), dw = hw.to(gpu()), db = hb.to(gpu());
  const auto wx = widened_on_gpu(hx), wg = widened_on_gpu(hg), ww = widened_on_gpu(hw), wb = widened_on_gpu(hb);
  auto rounded_equal = [&](const Tensor<L, 1>& got, const Tensor<float, 1>& f32) {
    const auto g = got.to(Device::cpu());
    const auto f = f32.to(Device::cpu());
    index_t bad = 0;
    for (index_t i = 0; i < g.numel(); ++i) bad += g.data()[i].bits == L(f.data()[i]).bits ? 0 : 1;
    return bad;
  };
  auto within_ulp = [&](const Tensor<L, 1>& cpu_r, const Tensor<L, 1>& got) {
    const auto g = got.to(Device::cpu());
    index_t bad = 0;
    for (index_t i = 0; i < g.numel(); ++i) {
      const int d = std::abs(static_cast<int>(cpu_r.data()[i].bits) - static_cast<int>(g.data()[i].bits));
      bad += (d <= 1 || static_cast<float>(cpu_r.data()[i]) == static_cast<float>(g.data()[i])) ? 0 : 1;
    }
    return bad;
  };
  for (auto [kind, G, name] : {std::tuple{exec::NormKind::batch, index_t{1}, "batch"},
                               std::tuple{exec::NormKind::group, index_t{2}, "group"},
                               std::tuple{exec::NormKind::layer, index_t{1}, "layer"}}) {
    INFO("norm " << name << ", dtype " << dtype_name(dtype_of<L>));
    exec::NormGeom g;
    g.kind = kind;
    g.A = A;
    g.C = C;
    g.S = S;
    g.G = G;
    const auto K = static_cast<std::size_t>(g.stats());
    // Device statistics for the GPU calls (the norm family keeps them on the context's device).
    DevStats sn(K), sf(K), smean(K), sinv(K);
    std::vector<double> sc(K);
    exec::norm_sums(g, as_block(dx), nullptr, sn.p(), gctx());
    exec::norm_sums(g, as_block(wx), nullptr, sf.p(), gctx());
    exec::norm_sums(g, as_block(hx), nullptr, sc.data(), hctx());
    CHECK(sn.get() == sf.get());
    CHECK(rel_err(sn.get(), sc) <= 1e-12);
    const double cnt = static_cast<double>(n) / static_cast<double>(K);
    std::vector<double> mean(K), invstd(K);
    for (std::size_t k = 0; k < K; ++k) mean[k] = sn.get()[k] / cnt;
    smean.set(mean);
    exec::norm_sums(g, as_block(dx), smean.p(), sn.p(), gctx());
    exec::norm_sums(g, as_block(wx), smean.p(), sf.p(), gctx());
    CHECK(sn.get() == sf.get());
    for (std::size_t k = 0; k < K; ++k) invstd[k] = 1.0 / std::sqrt(sn.get()[k] / cnt + 1e-5);
    sinv.set(invstd);
    const Block bw = as_block(dw), bb = as_block(db), fw = as_block(ww), fb = as_block(wb);
    const Block cw = as_block(hw), cb = as_block(hb);
    auto y = Tensor<L, 1>::empty({n}, gpu());
    auto yf = Tensor<float, 1>::empty({n}, gpu());
    auto yc = Tensor<L, 1>::empty({n});
    exec::norm_apply(g, as_block(dx), &bw, &bb, nullptr, smean.p(), sinv.p(), as_block(y), gctx());
    exec::norm_apply(g, as_block(wx), &fw, &fb, nullptr, smean.p(), sinv.p(), as_block(yf), gctx());
    exec::norm_apply(g, as_block(hx), &cw, &cb, nullptr, mean.data(), invstd.data(), as_block(yc), hctx());
    gctx().synchronize();
    CHECK(rounded_equal(y, yf) == 0);
    CHECK(within_ulp(yc, y) == 0);
    DevStats sg(K), sgx(K), gw(static_cast<std::size_t>(C)), gb(static_cast<std::size_t>(C)), sgf(K), sgxf(K),
        gwf(static_cast<std::size_t>(C)), gbf(static_cast<std::size_t>(C));
    exec::norm_backward_sums(g, as_block(dx), as_block(dg), &bw, &bb, nullptr, smean.p(), sinv.p(), sg.p(), sgx.p(), gw.p(), gb.p(),
                             gctx());
    exec::norm_backward_sums(g, as_block(wx), as_block(wg), &fw, &fb, nullptr, smean.p(), sinv.p(), sgf.p(), sgxf.p(), gwf.p(),
                             gbf.p(), gctx());
    CHECK(sg.get() == sgf.get());
    CHECK(sgx.get() == sgxf.get());
    CHECK(gw.get() == gwf.get());
    CHECK(gb.get() == gbf.get());
    const auto hsg = sg.get(), hsgx = sgx.get();
    auto gx = Tensor<L, 1>::empty({n}, gpu());
    auto gxf = Tensor<float, 1>::empty({n}, gpu());
    auto gxc = Tensor<L, 1>::empty({n});
    exec::norm_backward_dx(g, as_block(dx), as_block(dg), &bw, &bb, nullptr, smean.p(), sinv.p(), sg.p(), sgx.p(), 1.0 / cnt,
                           as_block(gx), nullptr, gctx());
    exec::norm_backward_dx(g, as_block(wx), as_block(wg), &fw, &fb, nullptr, smean.p(), sinv.p(), sg.p(), sgx.p(), 1.0 / cnt,
                           as_block(gxf), nullptr, gctx());
    exec::norm_backward_dx(g, as_block(hx), as_block(hg), &cw, &cb, nullptr, mean.data(), invstd.data(), hsg.data(), hsgx.data(),
                           1.0 / cnt, as_block(gxc), nullptr, hctx());
    gctx().synchronize();
    CHECK(rounded_equal(gx, gxf) == 0);
    CHECK(within_ulp(gxc, gx) == 0);
  }
  // load_f64 / store_f64 (running statistics, parameters): exact widening, double -> float -> L.
  DevStats l64(static_cast<std::size_t>(C));
  exec::load_f64(as_block(dw), l64.p(), gctx());
  const auto h64 = l64.get();
  for (index_t c = 0; c < C; ++c) CHECK(h64[static_cast<std::size_t>(c)] == static_cast<double>(static_cast<float>(hw(c))));
  const double st[4] = {1.0 + 1.0 / 256 + 1e-12, -2.5, 3.0e-6, 0.0625};  // the first: a tie after double -> float
  DevStats sst(4);
  sst.set({st[0], st[1], st[2], st[3]});
  auto sd = Tensor<L, 1>::empty({4}, gpu());
  exec::store_f64(sst.p(), as_block(sd), gctx());
  const auto sh = sd.to(Device::cpu());
  for (int i = 0; i < 4; ++i) CHECK(sh(i).bits == L(static_cast<float>(st[i])).bits);
}

TEMPLATE_TEST_CASE("gpusim precision: the GEMM epilogues (bias add, bias gradient) on bf16 / f16 storage",
                   "[gpusim][precision]", bf16, f16) {
  // kernels/gemm.cu templated on the storage type, called through its firewall (the cuBLAS glue
  // that calls them on a GPU is not in the simulator build): y + b rounded once, and the bias
  // gradient summed in double and rounded through float, equal the f32 kernels on the widened
  // operands rounded once, bit for bit.
  GPUSIM_REQUIRE_GPU();
  using L = TestType;
  const index_t A = 3, C = 5, S = 41, n = A * C * S;
  const int code = std::is_same_v<L, bf16> ? 2 : 3;
  auto lp = [](index_t m, float lo, float hi, float phase) { return wave<L, 1>({m}, lo, hi, phase, 0.4f); };
  const auto hy = lp(n, -2.0f, 2.0f, 0.83f), hb = lp(C, -1.0f, 1.0f, 1.7f);
  auto dy = hy.to(gpu());
  const auto db = hb.to(gpu());
  auto wy = widened_on_gpu(hy);
  const auto wb = widened_on_gpu(hb);
  void* s = gctx().stream().handle;
  REQUIRE(kernels::gemm::add_bias(code, A, C, S, db.data(), dy.data(), s) == 0);
  REQUIRE(kernels::gemm::add_bias(0, A, C, S, wb.data(), wy.data(), s) == 0);
  auto gb = Tensor<L, 1>::empty({C}, gpu());
  auto gbf = Tensor<float, 1>::empty({C}, gpu());
  REQUIRE(kernels::gemm::bias_grad(code, A, C, S, dy.data(), gb.data(), s) == 0);
  auto wy2 = widened_on_gpu(dy);  // the f32 route reads the rounded y
  REQUIRE(kernels::gemm::bias_grad(0, A, C, S, wy2.data(), gbf.data(), s) == 0);
  gctx().synchronize();
  const auto y = dy.to(Device::cpu()), yf = wy.to(Device::cpu());
  index_t bad = 0;
  for (index_t i = 0; i < n; ++i) bad += y(i).bits == L(yf(i)).bits ? 0 : 1;
  CHECK(bad == 0);
  const auto g = gb.to(Device::cpu()), gf = gbf.to(Device::cpu());
  for (index_t c = 0; c < C; ++c) CHECK(g(c).bits == L(gf(c)).bits);
  CHECK(kernels::gemm::add_bias(7, A, C, S, db.data(), dy.data(), s) != 0);  // unknown dtype code
}

TEMPLATE_TEST_CASE("gpusim precision: the conv helper kernels (bias add, bias gradient, shifted copy) on bf16 / f16",
                   "[gpusim][precision]", bf16, f16) {
  // kernels/conv.cu templated on the storage type (next to cuDNN's bf16 / f16 convolutions, which
  // the simulator cannot run): equal to the f32 kernels on the widened operands rounded once; the
  // shifted copy moves the bits and zero-fills.
  GPUSIM_REQUIRE_GPU();
  using L = TestType;
  const int code = std::is_same_v<L, bf16> ? 2 : 3;
  const index_t N = 2, C = 3, P = 4 * 5 * 6, n = N * C * P;
  auto lp = [](index_t m, float lo, float hi, float phase) { return wave<L, 1>({m}, lo, hi, phase, 0.1f); };
  void* s = gctx().stream().handle;
  const auto hy = lp(n, -3.0f, 3.0f, 0.77f), hb = lp(C, -1.0f, 1.0f, 2.1f);
  auto dy = hy.to(gpu());
  auto wy = widened_on_gpu(hy);
  const auto db = hb.to(gpu()), wb = widened_on_gpu(hb);
  REQUIRE(kernels::conv::bias_add(code, N, C, P, db.data(), dy.data(), s) == 0);
  REQUIRE(kernels::conv::bias_add(0, N, C, P, wb.data(), wy.data(), s) == 0);
  auto scratch = Tensor<double, 1>::empty({kernels::conv::bias_grad_scratch(C)}, gpu());
  auto gb = Tensor<L, 1>::empty({C}, gpu());
  auto gbf = Tensor<float, 1>::empty({C}, gpu());
  REQUIRE(kernels::conv::bias_grad(code, N, C, P, dy.data(), gb.data(), scratch.data(), s) == 0);
  const auto wy2 = widened_on_gpu(dy);
  REQUIRE(kernels::conv::bias_grad(0, N, C, P, wy2.data(), gbf.data(), scratch.data(), s) == 0);
  // Shifted copy of [N*C, 4, 5, 6] into [N*C, 6, 5, 8] at offset (-1, 0, -2): interior bits, zeros around.
  const index_t src_ext[3] = {4, 5, 6}, dst_ext[3] = {6, 5, 8}, off[3] = {-1, 0, -2};
  auto dst = Tensor<L, 1>::empty({N * C * 6 * 5 * 8}, gpu());
  REQUIRE(kernels::conv::shift_copy(code, N * C, src_ext, dst_ext, off, dy.data(), dst.data(), s) == 0);
  gctx().synchronize();
  const auto y = dy.to(Device::cpu()), yf = wy.to(Device::cpu());
  index_t bad = 0;
  for (index_t i = 0; i < n; ++i) bad += y(i).bits == L(yf(i)).bits ? 0 : 1;
  CHECK(bad == 0);
  const auto g = gb.to(Device::cpu()), gf = gbf.to(Device::cpu());
  for (index_t c = 0; c < C; ++c) CHECK(g(c).bits == L(gf(c)).bits);
  const auto d = dst.to(Device::cpu());
  index_t bad_copy = 0;
  for (index_t m = 0; m < N * C; ++m)
    for (index_t a = 0; a < 6; ++a)
      for (index_t b = 0; b < 5; ++b)
        for (index_t c = 0; c < 8; ++c) {
          const index_t i = a + off[0], j = b + off[1], k = c + off[2];
          const bool in = i >= 0 && i < 4 && j >= 0 && j < 5 && k >= 0 && k < 6;
          const std::uint16_t want = in ? y(((m * 4 + i) * 5 + j) * 6 + k).bits : std::uint16_t{0};
          bad_copy += d(((m * 6 + a) * 5 + b) * 8 + c).bits == want ? 0 : 1;
        }
  CHECK(bad_copy == 0);
}

TEMPLATE_TEST_CASE("gpusim precision: pool and resize kernels read and write bf16 / f16 storage on CUDA",
                   "[gpusim][precision]", bf16, f16) {
  // kernels/pool.cu and kernels/resize.cu templated on the storage type (the CUDA tables
  // takes_storage, as the CPU's), called through the exec fronts on device tensors: every result
  // equals the f32 route (the same kernels on the widened operands, rounded once) bit for bit,
  // max pooling's argmax exactly; against the CPU table (same sums in the same order) pooling is
  // bit for bit, resize within one ulp (nvcc may contract the double taps into FMAs).
  GPUSIM_REQUIRE_GPU();
  using L = TestType;
  auto ulps_from = [](const Tensor<L, 1>& cpu_r, const Tensor<L, 1>& got, int ulps) {
    const auto g = got.to(Device::cpu());
    index_t bad = 0;
    for (index_t i = 0; i < g.numel(); ++i) {
      const int d = std::abs(static_cast<int>(cpu_r.data()[i].bits) - static_cast<int>(g.data()[i].bits));
      const bool nans = std::isnan(static_cast<float>(cpu_r.data()[i])) && std::isnan(static_cast<float>(g.data()[i]));
      bad += (d <= ulps || nans) ? 0 : 1;
    }
    return bad;
  };
  for (bool include_pad : {true, false}) {
    INFO("pool, count_include_pad " << include_pad << ", dtype " << dtype_name(dtype_of<L>));
    exec::PoolGeometry g;
    g.planes = 3;
    g.in = {5, 7, 6};
    g.kernel = {2, 3, 2};
    g.stride = {2, 2, 1};  // overlapping windows in dims 1 and 2: the gradients add several outputs
    g.pad_lo = {0, 1, 1};
    g.count_include_pad = include_pad;
    for (int d = 0; d < 3; ++d) {
      const auto u = static_cast<std::size_t>(d);
      g.out[u] = (g.in[u] + 2 * g.pad_lo[u] - g.kernel[u]) / g.stride[u] + 1;
    }
    const index_t nin = g.planes * g.in[0] * g.in[1] * g.in[2], nout = g.planes * g.out[0] * g.out[1] * g.out[2];
    auto hx = wave<L, 1>({nin}, -3.0f, 3.0f, 0.71f, 0.3f);
    for (index_t i = 0; i < nin; i += 5) hx.data()[i] = L(1.0f);  // ties
    hx.data()[17] = L(std::numeric_limits<float>::quiet_NaN());    // NaN wins its windows
    const auto hg = wave<L, 1>({nout}, -1.0f, 1.0f, 0.37f, 0.9f);
    const auto dx = hx.to(gpu()), dg = hg.to(gpu());
    const auto wx = widened_on_gpu(hx), wg = widened_on_gpu(hg);
    auto y = Tensor<L, 1>::empty({nout}, gpu());
    auto yf = Tensor<float, 1>::empty({nout}, gpu());
    auto yc = Tensor<L, 1>::empty({nout});
    auto gx = Tensor<L, 1>::empty({nin}, gpu());
    auto gxf = Tensor<float, 1>::empty({nin}, gpu());
    auto gxc = Tensor<L, 1>::empty({nin});
    exec::avg_pool_forward(g, as_block(dx), as_block(y), gctx());
    exec::avg_pool_forward(g, as_block(wx), as_block(yf), gctx());
    exec::avg_pool_forward(g, as_block(hx), as_block(yc), hctx());
    gctx().synchronize();
    CHECK(shard::test::differing(y, yf) == 0);
    CHECK(ulps_from(yc, y, 0) == 0);
    exec::avg_pool_backward(g, as_block(dg), as_block(gx), gctx());
    exec::avg_pool_backward(g, as_block(wg), as_block(gxf), gctx());
    exec::avg_pool_backward(g, as_block(hg), as_block(gxc), hctx());
    gctx().synchronize();
    CHECK(shard::test::differing(gx, gxf) == 0);
    CHECK(ulps_from(gxc, gx, 0) == 0);
    auto idx = Tensor<std::int64_t, 1>::empty({nout}, gpu());
    auto idxf = Tensor<std::int64_t, 1>::empty({nout}, gpu());
    auto idxc = Tensor<std::int64_t, 1>::empty({nout});
    exec::max_pool_forward(g, as_block(dx), as_block(y), as_block(idx), gctx());
    exec::max_pool_forward(g, as_block(wx), as_block(yf), as_block(idxf), gctx());
    exec::max_pool_forward(g, as_block(hx), as_block(yc), as_block(idxc), hctx());
    gctx().synchronize();
    CHECK(shard::test::differing(y, yf) == 0);
    const auto ih = idx.to(Device::cpu()), ifh = idxf.to(Device::cpu());
    index_t idx_bad = 0;
    for (index_t o = 0; o < nout; ++o) idx_bad += (ih(o) == ifh(o) && ih(o) == idxc(o)) ? 0 : 1;
    CHECK(idx_bad == 0);
    exec::max_pool_backward(g, as_block(dg), as_block(idx), as_block(gx), gctx());
    exec::max_pool_backward(g, as_block(wg), as_block(idx), as_block(gxf), gctx());
    exec::max_pool_backward(g, as_block(hg), as_block(idxc), as_block(gxc), hctx());
    gctx().synchronize();
    CHECK(shard::test::differing(gx, gxf) == 0);
    CHECK(ulps_from(gxc, gx, 0) == 0);
  }
  for (ResizeMode mode : {ResizeMode::nearest, ResizeMode::linear}) {
    INFO("resize, mode " << (mode == ResizeMode::linear ? "linear" : "nearest") << ", dtype " << dtype_name(dtype_of<L>));
    exec::ResizeGeometry g;  // a block of a global grid: inputs [1, 8) of dim 1, outputs [4, 12)
    g.mode = mode;
    g.planes = 2;
    g.scale = {1, 2, 3};
    g.global_in = {3, 9, 5};
    g.in_lo = {0, 1, 0};
    g.in_len = {3, 7, 5};
    g.out_lo = {0, 4, 0};
    g.out_len = {3, 8, 15};
    const index_t nin = 2 * 3 * 7 * 5, nout = 2 * 3 * 8 * 15;
    const auto hx = wave<L, 1>({nin}, -3.0f, 3.0f, 0.53f, 0.1f), hg = wave<L, 1>({nout}, -1.0f, 1.0f, 0.23f, 0.6f);
    const auto dx = hx.to(gpu()), dg = hg.to(gpu());
    const auto wx = widened_on_gpu(hx), wg = widened_on_gpu(hg);
    auto y = Tensor<L, 1>::empty({nout}, gpu());
    auto yf = Tensor<float, 1>::empty({nout}, gpu());
    auto yc = Tensor<L, 1>::empty({nout});
    exec::resize_forward(g, as_block(dx), as_block(y), gctx());
    exec::resize_forward(g, as_block(wx), as_block(yf), gctx());
    exec::resize_forward(g, as_block(hx), as_block(yc), hctx());
    gctx().synchronize();
    CHECK(shard::test::differing(y, yf) == 0);
    CHECK(ulps_from(yc, y, 1) == 0);
    auto gx = Tensor<L, 1>::empty({nin}, gpu());
    auto gxf = Tensor<float, 1>::empty({nin}, gpu());
    auto gxc = Tensor<L, 1>::empty({nin});
    exec::resize_backward(g, as_block(dg), as_block(gx), gctx());
    exec::resize_backward(g, as_block(wg), as_block(gxf), gctx());
    exec::resize_backward(g, as_block(hg), as_block(gxc), hctx());
    gctx().synchronize();
    CHECK(shard::test::differing(gx, gxf) == 0);
    CHECK(ulps_from(gxc, gx, 1) == 0);
  }
}

TEMPLATE_TEST_CASE("gpusim precision: attention and neighbourhood attention on bf16 / f16 storage on CUDA",
                   "[gpusim][precision][attention]", bf16, f16) {
  // kernels/attention.cu and kernels/neighborhood.cu instantiated on the storage type (float
  // accumulation, float lse), through the exec fronts on device tensors. Oracle: the same kernels
  // in f32 on the widened operands (the working-copy route the CUDA fronts took for f16 before),
  // each result rounded once: within one unit in the last place of the storage type (bit for bit
  // unless the compiler contracts the two instantiations differently), lse to 1e-6.
  GPUSIM_REQUIRE_GPU();
  using L = TestType;
  auto lp = [](index_t n, float phase, float off) { return wave<L, 1>({n}, -2.0f, 2.0f, phase, off); };
  auto ulp_bad = [](const Tensor<L, 1>& got, const Tensor<float, 1>& f32) {
    const auto g = got.to(Device::cpu());
    const auto f = f32.to(Device::cpu());
    index_t bad = 0;
    for (index_t i = 0; i < g.numel(); ++i) {
      const int d = std::abs(static_cast<int>(g.data()[i].bits) - static_cast<int>(L(f.data()[i]).bits));
      bad += d <= 1 ? 0 : 1;
    }
    return bad;
  };
  auto lse_err = [](const Tensor<float, 1>& a, const Tensor<float, 1>& b) {
    const auto x = a.to(Device::cpu()), y = b.to(Device::cpu());
    double worst = 0;
    for (index_t i = 0; i < x.numel(); ++i)
      if (!(std::isinf(x.data()[i]) && x.data()[i] == y.data()[i]))
        worst = std::max(worst, std::abs(static_cast<double>(x.data()[i]) - y.data()[i]) /
                                    std::max(1.0, std::abs(static_cast<double>(y.data()[i]))));
    return worst;
  };
  auto view = [](const auto& t, std::vector<index_t> shape) {
    const Block b = as_block(t);
    return Block::view(b.dtype, b.device, b.data, shape.data(), static_cast<int>(shape.size()), nullptr, b.owner);
  };
  // ---- local attention, [B, H, N, D] blocks: partial tiles, Nq != Nk, D != Dv; causal with offsets.
  // ExecSettings::native_low_precision = false keeps bf16 / f16 off cuDNN's fused attention and the
  // tensor-core kernels (they round P and dS to the storage type: tests/gpusim/cuda_sim_attention.cpp
  // and tests/exec/cuda_attention.cpp bound them); the SIMT kernels in the storage type are within
  // one ulp of the f32 route.
  struct LowpOff {
    bool was = gctx().settings().native_low_precision;
    LowpOff() { gctx().settings().native_low_precision = false; }
    ~LowpOff() { gctx().settings().native_low_precision = was; }
  } lowp_off;
  for (bool causal : {false, true}) {
    INFO("attention, causal " << causal << ", dtype " << dtype_name(dtype_of<L>));
    exec::AttnGeom g{1, 2, 19, 23, 16, 8};
    exec::AttnMask m;
    m.scale = 0.3;
    m.causal = causal;
    m.q_pos0 = causal ? 4 : 0;
    const std::vector<index_t> sq{g.B, g.H, g.Nq, g.D}, sk{g.B, g.H, g.Nk, g.D}, sv{g.B, g.H, g.Nk, g.Dv},
        so{g.B, g.H, g.Nq, g.Dv}, sl{g.B, g.H, g.Nq};
    const index_t nq = g.B * g.H * g.Nq * g.D, nk = g.B * g.H * g.Nk * g.D, nv = g.B * g.H * g.Nk * g.Dv,
                  no = g.B * g.H * g.Nq * g.Dv, nl = g.B * g.H * g.Nq;
    const auto hq = lp(nq, 0.31f, 0.1f), hk = lp(nk, 0.47f, 0.7f), hv = lp(nv, 0.59f, 1.3f), hd = lp(no, 0.23f, 0.4f);
    const auto dq_ = hq.to(gpu()), dk_ = hk.to(gpu()), dv_ = hv.to(gpu()), dd_ = hd.to(gpu());
    const auto wq = widened_on_gpu(hq), wk = widened_on_gpu(hk), wv = widened_on_gpu(hv), wd = widened_on_gpu(hd);
    auto out = Tensor<L, 1>::empty({no}, gpu());
    auto outf = Tensor<float, 1>::empty({no}, gpu());
    auto lse = Tensor<float, 1>::empty({nl}, gpu());
    auto lsef = Tensor<float, 1>::empty({nl}, gpu());
    exec::attention_forward(g, m, view(dq_, sq), view(dk_, sk), view(dv_, sv), nullptr, view(out, so), view(lse, sl),
                            gctx());
    exec::attention_forward(g, m, view(wq, sq), view(wk, sk), view(wv, sv), nullptr, view(outf, so), view(lsef, sl),
                            gctx());
    gctx().synchronize();
    CHECK(ulp_bad(out, outf) == 0);
    CHECK(lse_err(lse, lsef) <= 1e-6);
    // Backward from the rounded out (as the tape saves it); dq, dk, dv start from values.
    const auto wo = widened_on_gpu(out);
    auto gq = lp(nq, 0.11f, 0.2f).to(gpu()), gk = lp(nk, 0.13f, 0.3f).to(gpu()), gv = lp(nv, 0.17f, 0.5f).to(gpu());
    auto fq = widened_on_gpu(gq), fk = widened_on_gpu(gk), fv = widened_on_gpu(gv);
    const Block bq = view(gq, sq), bk = view(gk, sk), bv = view(gv, sv), cq = view(fq, sq), ck = view(fk, sk),
                cv = view(fv, sv);
    exec::attention_backward(g, m, view(dq_, sq), view(dk_, sk), view(dv_, sv), nullptr, view(out, so), view(dd_, so),
                             view(lse, sl), &bq, &bk, &bv, gctx());
    exec::attention_backward(g, m, view(wq, sq), view(wk, sk), view(wv, sv), nullptr, view(wo, so), view(wd, so),
                             view(lse, sl), &cq, &ck, &cv, gctx());
    gctx().synchronize();
    CHECK(ulp_bad(gq, fq) == 0);
    CHECK(ulp_bad(gk, fk) == 0);
    CHECK(ulp_bad(gv, fv) == 0);
    // The lse merge of (out, lse) with a second partial result.
    const auto hb = lp(no, 0.71f, 0.9f);
    const auto ob = hb.to(gpu()), wb = widened_on_gpu(hb);
    auto lb = Tensor<float, 1>::empty({nl});
    for (index_t i = 0; i < nl; ++i) lb.data()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    const auto lbd = lb.to(gpu());
    auto lse2 = lse.to(Device::cpu()).to(gpu());
    auto outf2 = widened_on_gpu(out);
    exec::attention_merge(g, view(out, so), view(lse, sl), view(ob, so), view(lbd, sl), gctx());
    exec::attention_merge(g, view(outf2, so), view(lse2, sl), view(wb, so), view(lbd, sl), gctx());
    gctx().synchronize();
    CHECK(ulp_bad(out, outf2) == 0);
    CHECK(lse_err(lse, lse2) <= 1e-6);
  }
  // ---- neighbourhood attention, [B, S1, S2, H, D] blocks: a 3 x 3 window, periodic in one dim.
  {
    INFO("neighbourhood attention, dtype " << dtype_name(dtype_of<L>));
    exec::NbhdGeom g;
    g.B = 1;
    g.H = 2;
    g.D = g.Dv = 16;
    g.nq[1] = g.nk[1] = g.valid_hi[1] = 6;
    g.nq[2] = g.nk[2] = g.valid_hi[2] = 5;
    g.window[1] = g.window[2] = 3;
    g.wrap[2] = true;
    g.scale = 0.25;
    const std::vector<index_t> s{1, 6, 5, 2, 16}, sl{1, 6, 5, 2};
    const index_t n = 6 * 5 * 2 * 16, nl = 6 * 5 * 2;
    const auto hq = lp(n, 0.29f, 0.1f), hk = lp(n, 0.41f, 0.6f), hv = lp(n, 0.53f, 1.1f), hd = lp(n, 0.19f, 0.8f);
    const auto dq_ = hq.to(gpu()), dk_ = hk.to(gpu()), dv_ = hv.to(gpu()), dd_ = hd.to(gpu());
    const auto wq = widened_on_gpu(hq), wk = widened_on_gpu(hk), wv = widened_on_gpu(hv), wd = widened_on_gpu(hd);
    auto out = Tensor<L, 1>::empty({n}, gpu());
    auto outf = Tensor<float, 1>::empty({n}, gpu());
    auto lse = Tensor<float, 1>::empty({nl}, gpu());
    auto lsef = Tensor<float, 1>::empty({nl}, gpu());
    exec::nbhd_attention_forward(g, view(dq_, s), view(dk_, s), view(dv_, s), view(out, s), view(lse, sl), gctx());
    exec::nbhd_attention_forward(g, view(wq, s), view(wk, s), view(wv, s), view(outf, s), view(lsef, sl), gctx());
    gctx().synchronize();
    CHECK(ulp_bad(out, outf) == 0);
    CHECK(lse_err(lse, lsef) <= 1e-6);
    const auto wo = widened_on_gpu(out);
    auto gq = Tensor<L, 1>::empty({n}, gpu()), gk = Tensor<L, 1>::empty({n}, gpu()), gv = Tensor<L, 1>::empty({n}, gpu());
    auto fq = Tensor<float, 1>::empty({n}, gpu()), fk = Tensor<float, 1>::empty({n}, gpu()),
         fv = Tensor<float, 1>::empty({n}, gpu());
    const Block bq = view(gq, s), bk = view(gk, s), bv = view(gv, s), cq = view(fq, s), ck = view(fk, s),
                cv = view(fv, s);
    exec::nbhd_attention_backward(g, view(dq_, s), view(dk_, s), view(dv_, s), view(out, s), view(dd_, s),
                                  view(lse, sl), &bq, &bk, &bv, gctx());
    exec::nbhd_attention_backward(g, view(wq, s), view(wk, s), view(wv, s), view(wo, s), view(wd, s), view(lse, sl),
                                  &cq, &ck, &cv, gctx());
    gctx().synchronize();
    CHECK(ulp_bad(gq, fq) == 0);
    CHECK(ulp_bad(gk, fk) == 0);
    CHECK(ulp_bad(gv, fv) == 0);
  }
}

TEMPLATE_TEST_CASE("gpusim precision: sum_to on bf16 / f16 storage on CUDA", "[gpusim][precision]", bf16, f16) {
  // kernels/pointwise.cu's sum_to kernels templated on the storage type (a broadcast operand's
  // gradient): both the thread-per-position kernel (few reduced elements) and the block tree
  // (many) equal the f32 route bit for bit: double sums of the widened values, rounded once more.
  GPUSIM_REQUIRE_GPU();
  using L = TestType;
  const index_t rows = 40, n = rows * 3 * 16;
  const auto hg = wave<L, 1>({n}, -1.0f, 1.0f, 0.43f, 0.2f);
  const auto dg = hg.to(gpu());
  const auto wg = widened_on_gpu(hg);
  const index_t vshape[3] = {rows, 3, 16};
  struct Target {
    index_t numel;
    index_t strides[3];
  };
  // [1, 3, 1]: 640 reduced elements per position (block tree); [rows, 1, 16]: 3 (thread kernel).
  for (const Target& t : {Target{3, {0, 1, 0}}, Target{rows * 16, {16, 0, 1}}}) {
    INFO("destination of " << t.numel << " elements, dtype " << dtype_name(dtype_of<L>));
    auto d = Tensor<L, 1>::empty({t.numel}, gpu());
    auto dw = Tensor<float, 1>::empty({t.numel}, gpu());
    const Block bd = as_block(d), bw = as_block(dw);
    const Block g0 = as_block(dg), w0 = as_block(wg);
    const Block gv = Block::view(g0.dtype, g0.device, g0.data, vshape, 3, nullptr, g0.owner);
    const Block wv = Block::view(w0.dtype, w0.device, w0.data, vshape, 3, nullptr, w0.owner);
    exec::sum_to(gv, bd, Block::view(bd.dtype, bd.device, bd.data, vshape, 3, t.strides, bd.owner), gctx());
    exec::sum_to(wv, bw, Block::view(bw.dtype, bw.device, bw.data, vshape, 3, t.strides, bw.owner), gctx());
    gctx().synchronize();
    CHECK(shard::test::differing(d, dw) == 0);
  }
}

}  // namespace st_gpusim_cuda_sim_precision
