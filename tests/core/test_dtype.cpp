// dtypes: sizes, names, and the bf16 / f16 storage conversions.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <shardtensor/shardtensor.hpp>

namespace st_core_test_dtype {

using namespace shard;

static_assert(dtype_size(DType::f32) == 4 && dtype_size(DType::f64) == 8 && dtype_size(DType::bf16) == 2 &&
              dtype_size(DType::f16) == 2 && dtype_size(DType::i64) == 8 && dtype_size(DType::u8) == 1);
static_assert(dtype_of<float> == DType::f32 && dtype_of<const double> == DType::f64 && dtype_of<bf16> == DType::bf16);
static_assert(is_compute_type<float> && is_compute_type<double> && !is_compute_type<f16>);

namespace {
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Reference half -> float decode written from the IEEE definition.
double half_value(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const double sign = s ? -1.0 : 1.0;
  if (e == 0) return sign * std::ldexp(m, -24);
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(1024 + m, e - 25);
}
}  // namespace

TEST_CASE("dtype names print", "[core][dtype]") {
  CHECK(fmt::format("{}", DType::f32) == "f32");
  CHECK(fmt::format("{}", DType::bf16) == "bf16");
  CHECK(std::string(dtype_name(DType::i32)) == "i32");
}

TEST_CASE("f16: every finite half round-trips through float exactly", "[core][dtype][f16]") {
  int checked = 0;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    f16 h;
    h.bits = static_cast<std::uint16_t>(b);
    const float f = static_cast<float>(h);
    const double ref = half_value(h.bits);
    if (std::isnan(ref)) {
      CHECK(std::isnan(f));
      CHECK(std::isnan(static_cast<float>(f16(f))));
      continue;
    }
    if (static_cast<double>(f) != ref) FAIL(fmt::format("decode of {:#06x}: {} != {}", b, f, ref));
    if (f16(f).bits != h.bits) FAIL(fmt::format("round trip of {:#06x} gave {:#06x}", b, f16(f).bits));
    ++checked;
  }
  CHECK(checked == 0x10000 - 2 * 1023);  // all but the NaNs
}

TEST_CASE("f16: rounding to nearest even, overflow, subnormals", "[core][dtype][f16]") {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1).
  CHECK(f16(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even): rounds up.
  CHECK(f16(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3c02);
  // slightly above halfway rounds up
  CHECK(f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)).bits == 0x3c01);
  CHECK(f16(65504.0f).bits == 0x7bff);
  CHECK(f16(65519.0f).bits == 0x7bff);  // below the rounding boundary
  CHECK(f16(65520.0f).bits == 0x7c00);  // rounds to inf
  CHECK(f16(1e10f).bits == 0x7c00);
  CHECK(f16(-1e10f).bits == 0xfc00);
  CHECK(f16(INFINITY).bits == 0x7c00);
  CHECK(std::isnan(static_cast<float>(f16(NAN))));
  CHECK(f16(std::ldexp(1.0f, -24)).bits == 0x0001);  // smallest subnormal
  CHECK(f16(std::ldexp(1.0f, -26)).bits == 0x0000);  // underflows to 0
  CHECK(f16(-0.0f).bits == 0x8000);
  CHECK(f16(std::ldexp(1.0f, -14)).bits == 0x0400);  // smallest normal
  // Random floats: the result is the nearest half (error at most half an ulp).
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>(random_value(7, static_cast<std::uint64_t>(i), RandomInit::uniform(-7e4, 7e4)) *
                                       std::ldexp(1.0, -(i % 30)));
    const f16 h(x);
    const double back = half_value(h.bits);
    if (std::isinf(back)) {
      CHECK(std::abs(x) >= 65520.0f);
      continue;
    }
    f16 up, dn;
    up.bits = static_cast<std::uint16_t>(h.bits + 1);
    dn.bits = static_cast<std::uint16_t>(h.bits - 1);
    const double err = std::abs(back - x);
    if ((h.bits & 0x7fff) != 0x7bff) CHECK(err <= std::abs(half_value(up.bits) - x));
    if ((h.bits & 0x7fff) != 0) CHECK(err <= std::abs(half_value(dn.bits) - x));
  }
}

TEST_CASE("bf16: round trips and round-to-nearest-even", "[core][dtype][bf16]") {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    bf16 h;
    h.bits = static_cast<std::uint16_t>(b);
    const float f = static_cast<float>(h);
    CHECK((std::isnan(f) || bf16(f).bits == h.bits));
    std::uint32_t fb;
    std::memcpy(&fb, &f, 4);
    CHECK(fb == b << 16);  // bf16 -> float is exact: the top 16 bits
  }
  CHECK(static_cast<float>(bf16(1.0f)) == 1.0f);
  CHECK(static_cast<float>(bf16(-2.5f)) == -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1); 1 + 3*2^-8 rounds up to 1 + 2^-6.
  CHECK(bf16(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);
  CHECK(bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3f82);
  CHECK(bf16(from_bits(0x3f808001u)).bits == 0x3f81);  // just above halfway
  CHECK(std::isnan(static_cast<float>(bf16(NAN))));
  CHECK(std::isinf(static_cast<float>(bf16(INFINITY))));
  // Relative error of the conversion is at most half an ulp: 2^-8 (8 significant bits).
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>(random_value(3, static_cast<std::uint64_t>(i), RandomInit::normal(0, 1e3)));
    const float y = static_cast<float>(bf16(x));
    CHECK(std::abs(y - x) <= std::ldexp(std::abs(x), -8));
  }
}

}  // namespace st_core_test_dtype
