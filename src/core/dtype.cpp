#include "shardtensor/core/dtype.hpp"

#include <cmath>

namespace shard {

f16::f16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) { bits = static_cast<std::uint16_t>(sign | 0x7e00u); return; }   // NaN
  if (absx >= 0x477ff000u) { bits = static_cast<std::uint16_t>(sign | 0x7c00u); return; }  // overflow -> inf
  if (absx < 0x38800000u) {  // subnormal half (or zero)
    const float a = std::fabs(f) * 16777216.0f;  // 2^24
    bits = static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(a)));
    return;
  }
  std::uint32_t m = absx + 0xc8000fffu + ((absx >> 13) & 1u);  // rebias exponent, round to nearest even
  bits = static_cast<std::uint16_t>(sign | (m >> 13));
}

f16::operator float() const {
  const std::uint32_t sign = (bits & 0x8000u) << 16;
  const std::uint32_t exp = (bits >> 10) & 0x1fu, man = bits & 0x3ffu;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(man), -24);
    if (sign) out = -out;
    return out;
  }
  std::uint32_t u;
  if (exp == 31) u = sign | 0x7f800000u | (man << 13);
  else u = sign | ((exp + 112u) << 23) | (man << 13);
  std::memcpy(&out, &u, 4);
  return out;
}

}  // namespace shard
