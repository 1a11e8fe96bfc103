// gpusim lane (and shardtensor_cuda_tests on a real GPU): the mixed-precision kernels on CUDA:
// exec::convert between f32, f64, bf16 and f16 (kernels/pointwise.cu, bit-level roundings of
// src/kernels_api/convert_ops.hpp) equals the CPU table bit for bit, including ties, f16
// subnormals, overflow and NaN; box_add on bf16 / f16 (kernels/box.cu) equals the CPU's; a bf16
// pointwise op matches the CPU's; the pointwise kernels templated on bf16 / f16 storage equal the
// CUDA f32 op rounded once; the norm kernels, the GEMM epilogues and the conv helper kernels on
// bf16 / f16 equal the f32 working-copy route.
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
#include "shardtensor/exec/norm.hpp"
#include "shardtensor/exec/pointwise.hpp"

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
    std::vector<double> sn(K), sf(K), sc(K);
    exec::norm_sums(g, as_block(dx), nullptr, sn.data(), gctx());
    exec::norm_sums(g, as_block(wx), nullptr, sf.data(), gctx());
    exec::norm_sums(g, as_block(hx), nullptr, sc.data(), hctx());
    CHECK(sn == sf);
    CHECK(rel_err(sn, sc) <= 1e-12);
    const double cnt = static_cast<double>(n) / static_cast<double>(K);
    std::vector<double> mean(K), invstd(K);
    for (std::size_t k = 0; k < K; ++k) mean[k] = sn[k] / cnt;
    exec::norm_sums(g, as_block(dx), mean.data(), sn.data(), gctx());
    exec::norm_sums(g, as_block(wx), mean.data(), sf.data(), gctx());
    CHECK(sn == sf);
    for (std::size_t k = 0; k < K; ++k) invstd[k] = 1.0 / std::sqrt(sn[k] / cnt + 1e-5);
    const Block bw = as_block(dw), bb = as_block(db), fw = as_block(ww), fb = as_block(wb);
    const Block cw = as_block(hw), cb = as_block(hb);
    auto y = Tensor<L, 1>::empty({n}, gpu());
    auto yf = Tensor<float, 1>::empty({n}, gpu());
    auto yc = Tensor<L, 1>::empty({n});
    exec::norm_apply(g, as_block(dx), &bw, &bb, mean.data(), invstd.data(), as_block(y), gctx());
    exec::norm_apply(g, as_block(wx), &fw, &fb, mean.data(), invstd.data(), as_block(yf), gctx());
    exec::norm_apply(g, as_block(hx), &cw, &cb, mean.data(), invstd.data(), as_block(yc), hctx());
    gctx().synchronize();
    CHECK(rounded_equal(y, yf) == 0);
    CHECK(within_ulp(yc, y) == 0);
    std::vector<double> sg(K), sgx(K), gw(C), gb(C), sgf(K), sgxf(K), gwf(C), gbf(C);
    exec::norm_backward_sums(g, as_block(dx), as_block(dg), &bw, mean.data(), invstd.data(), sg.data(), sgx.data(),
                             gw.data(), gb.data(), gctx());
    exec::norm_backward_sums(g, as_block(wx), as_block(wg), &fw, mean.data(), invstd.data(), sgf.data(), sgxf.data(),
                             gwf.data(), gbf.data(), gctx());
    CHECK(sg == sgf);
    CHECK(sgx == sgxf);
    CHECK(gw == gwf);
    CHECK(gb == gbf);
    auto gx = Tensor<L, 1>::empty({n}, gpu());
    auto gxf = Tensor<float, 1>::empty({n}, gpu());
    auto gxc = Tensor<L, 1>::empty({n});
    exec::norm_backward_dx(g, as_block(dx), as_block(dg), &bw, mean.data(), invstd.data(), sg.data(), sgx.data(),
                           1.0 / cnt, as_block(gx), gctx());
    exec::norm_backward_dx(g, as_block(wx), as_block(wg), &fw, mean.data(), invstd.data(), sg.data(), sgx.data(),
                           1.0 / cnt, as_block(gxf), gctx());
    exec::norm_backward_dx(g, as_block(hx), as_block(hg), &cw, mean.data(), invstd.data(), sg.data(), sgx.data(),
                           1.0 / cnt, as_block(gxc), hctx());
    gctx().synchronize();
    CHECK(rounded_equal(gx, gxf) == 0);
    CHECK(within_ulp(gxc, gx) == 0);
  }
  // load_f64 / store_f64 (running statistics, parameters): exact widening, double -> float -> L.
  std::vector<double> h64(C);
  exec::load_f64(as_block(dw), h64.data(), gctx());
  for (index_t c = 0; c < C; ++c) CHECK(h64[static_cast<std::size_t>(c)] == static_cast<double>(static_cast<float>(hw(c))));
  const double st[4] = {1.0 + 1.0 / 256 + 1e-12, -2.5, 3.0e-6, 0.0625};  // the first: a tie after double -> float
  auto sd = Tensor<L, 1>::empty({4}, gpu());
  exec::store_f64(st, as_block(sd), gctx());
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
