// The storage-precision boundary (exec::convert, src/kernels_api/convert_ops.hpp): two independent
// implementations of the roundings agree (shard::bf16 / shard::f16 of core/dtype.hpp, which the
// CPU table uses, and the bit-level cvt:: functions, which the CUDA kernels use), every bf16 and
// f16 value survives the round trip through f32, and the front refuses what it cannot do.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels_api/convert_ops.hpp"
#include "shardtensor/shardtensor.hpp"
#include "shardtensor/exec/pointwise.hpp"

namespace st_exec_test_precision_convert {

using namespace shard;

namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// Floats that stress the roundings: ties (low bits exactly half), the f16 subnormal and
/// overflow boundaries, signed zeros, infinities, NaNs, and random bit patterns.
std::vector<float> probe_floats() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, 65536.0f, 1e30f, -1e30f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                          5.9604644775390625e-8f, 2.98023223876953125e-8f, 2.98023224e-8f, 8.940697e-8f,
                          6.103515625e-5f, 6.1e-5f, 3.0517578125e-5f};
  for (std::uint32_t e = 90; e < 150; ++e)  // every exponent near the f16 range, with tie patterns
    for (std::uint32_t m : {0x000000u, 0x001000u, 0x002000u, 0x003000u, 0x008000u, 0x018000u, 0x7fffffu, 0x7fe000u,
                            0x400000u, 0x401000u, 0x000001u}) {
      v.push_back(float_of((e << 23) | m));
      v.push_back(-float_of((e << 23) | m));
    }
  std::mt19937 rng(7);
  for (int i = 0; i < 400000; ++i) v.push_back(float_of(static_cast<std::uint32_t>(rng())));
  return v;
}

}  // namespace

TEST_CASE("precision: the two bf16 / f16 roundings agree bit for bit", "[precision][convert]") {
  const auto v = probe_floats();
  std::size_t checked = 0;
  for (float f : v) {
    const bf16 b(f);
    const f16 h(f);
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(b)));
      CHECK(std::isnan(cvt::bf16_to_f32(cvt::bf16_bits(f))));
      CHECK(std::isnan(static_cast<float>(h)));
      CHECK(std::isnan(cvt::f16_to_f32(cvt::f16_bits(f))));
      continue;
    }
    INFO("f = " << f << " bits " << std::hex << bits_of(f));
    REQUIRE(b.bits == cvt::bf16_bits(f));
    REQUIRE(h.bits == cvt::f16_bits(f));
    REQUIRE(bits_of(static_cast<float>(h)) == bits_of(cvt::f16_to_f32(h.bits)));
    ++checked;
  }
  CHECK(checked > 390000);  // the random patterns include about 0.4 % NaNs
}

TEST_CASE("precision: every bf16 and f16 value round-trips through f32 exactly", "[precision][convert]") {
  for (std::uint32_t u = 0; u < 65536; ++u) {
    const auto h = static_cast<std::uint16_t>(u);
    const float fb = cvt::bf16_to_f32(h), fh = cvt::f16_to_f32(h);
    if (!std::isnan(fb)) REQUIRE(cvt::bf16_bits(fb) == h);
    if (!std::isnan(fh)) REQUIRE(cvt::f16_bits(fh) == h);
  }
  // Correctly rounded: the nearest representable value, ties to even (spot checks by hand).
  CHECK(cvt::bf16_bits(1.0f + 1.0f / 256) == 0x3f80);          // tie between 1 and 1+2^-7: even (1)
  CHECK(cvt::bf16_bits(1.0f + 3.0f / 256) == 0x3f82);          // tie between 1+2^-7 and 1+2^-6: even
  CHECK(cvt::f16_bits(1.0f + 1.0f / 2048) == 0x3c00);          // f16 tie: even (1)
  CHECK(cvt::f16_bits(65520.0f) == 0x7c00);                    // halfway past the largest f16: inf
  CHECK(cvt::f16_bits(65519.0f) == 0x7bff);                    // just below: the largest finite f16
  CHECK(cvt::f16_bits(2.98023223876953125e-8f) == 0x0000);     // half the smallest subnormal: even (0)
  CHECK(cvt::f16_bits(8.940696716308594e-8f) == 0x0002);       // 1.5 subnormal units: even (2)
}

TEST_CASE("precision: exec::convert over every dtype pair on the CPU", "[precision][convert]") {
  auto& ctx = current_context(Device::cpu());
  const auto v = probe_floats();
  const index_t n = static_cast<index_t>(v.size());
  auto src = Tensor<float, 1>::empty({n}, Device::cpu());
  for (index_t i = 0; i < n; ++i) src(i) = v[static_cast<std::size_t>(i)];
  auto b = Tensor<bf16, 1>::empty({n}, Device::cpu());
  auto h = Tensor<f16, 1>::empty({n}, Device::cpu());
  auto d = Tensor<double, 1>::empty({n}, Device::cpu());
  exec::convert(as_block(src), as_block(b), ctx);
  exec::convert(as_block(src), as_block(h), ctx);
  exec::convert(as_block(h), as_block(d), ctx);
  auto back = Tensor<float, 1>::empty({n}, Device::cpu());
  exec::convert(as_block(b), as_block(back), ctx);
  for (index_t i = 0; i < n; ++i) {
    const float f = v[static_cast<std::size_t>(i)];
    if (std::isnan(f)) continue;
    REQUIRE(b(i).bits == cvt::bf16_bits(f));
    REQUIRE(h(i).bits == cvt::f16_bits(f));
    REQUIRE(bits_of(back(i)) == bits_of(cvt::bf16_to_f32(cvt::bf16_bits(f))));
    REQUIRE(d(i) == static_cast<double>(cvt::f16_to_f32(cvt::f16_bits(f))));
  }
  // f64 -> bf16 goes through f32 (documented double rounding).
  auto dd = Tensor<double, 1>::empty({2}, Device::cpu());
  dd(0) = 1.0 + 1.0 / 256 + 1e-12;  // just above a bf16 tie; f32 rounds it onto the tie
  dd(1) = -3.25;
  auto db = Tensor<bf16, 1>::empty({2}, Device::cpu());
  exec::convert(as_block(dd), as_block(db), ctx);
  CHECK(db(0).bits == 0x3f80);
  CHECK(static_cast<float>(db(1)) == -3.25f);
  // Bad input: integer dtypes and mismatched counts are refused with the op's name.
  auto ints = Tensor<std::int32_t, 1>::empty({n}, Device::cpu());
  CHECK_THROWS_WITH(exec::convert(as_block(ints), as_block(src), ctx),
                    Catch::Matchers::ContainsSubstring("convert") && Catch::Matchers::ContainsSubstring("i32"));
  auto small = Tensor<float, 1>::empty({3}, Device::cpu());
  CHECK_THROWS_WITH(exec::convert(as_block(b), as_block(small), ctx),
                    Catch::Matchers::ContainsSubstring("element count"));
}

}  // namespace st_exec_test_precision_convert
