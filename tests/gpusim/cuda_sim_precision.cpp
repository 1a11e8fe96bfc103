// gpusim lane (and shardtensor_cuda_tests on a real GPU): the mixed-precision kernels on CUDA:
// exec::convert between f32, f64, bf16 and f16 (kernels/pointwise.cu, bit-level roundings of
// src/kernels_api/convert_ops.hpp) equals the CPU table bit for bit, including ties, f16
// subnormals, overflow and NaN; box_add on bf16 / f16 (kernels/box.cu) equals the CPU's; a bf16
// pointwise op through the f32 working copies (exec/precision.hpp) matches the CPU's.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "exec/box_kernels.hpp"
#include "gpusim_support.hpp"
#include "shardtensor/exec/pointwise.hpp"

using namespace gpusim;

namespace {

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
