#pragma once
/// \file storage_bits.hpp
/// The one bf16 / f16 <-> f32 conversion of the project, as bit operations: shard::bf16 /
/// shard::f16 (core/dtype.hpp), the CPU kernel tables (src/exec/storage_cpu.hpp, the conv engine)
/// and the CUDA kernels (kernels/*.cu, through the kernel firewall's kernels_api/convert_ops.hpp)
/// all call these, so every device rounds identically, and the GPU simulator, which has no bf16
/// conversion instructions, runs them too. Round to nearest even (f16 subnormals included); NaN
/// stays NaN, quiet, with its sign; overflow gives inf (f16). Plain C++17 with no other project
/// include, so that the kernels (compiled by nvcc in C++17 against the firewall) can take it.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SHARD_CVT_HD __host__ __device__ __forceinline__
#else
#define SHARD_CVT_HD inline
#endif

namespace shard::cvt {

SHARD_CVT_HD std::uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint32_t>(__float_as_uint(f));
#else
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
SHARD_CVT_HD float f32_from_bits(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

/// float -> bfloat16 bits, round to nearest even.
SHARD_CVT_HD std::uint16_t bf16_bits(float f) {
  std::uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | 0x7fc0u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
SHARD_CVT_HD float bf16_to_f32(std::uint16_t b) { return f32_from_bits(static_cast<std::uint32_t>(b) << 16); }

/// float -> IEEE half bits, round to nearest even (subnormals included), overflow to inf.
SHARD_CVT_HD std::uint16_t f16_bits(float f) {
  const std::uint32_t x = f32_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow (and inf) -> inf
  if (absx < 0x38800000u) {  // a subnormal half or zero: the value in units of 2^-24, rounded to even
    const std::uint32_t e = absx >> 23;                        // biased f32 exponent (< 113)
    if (e < 101) return static_cast<std::uint16_t>(sign);     // below half of the smallest subnormal
    const std::uint32_t m = (absx & 0x7fffffu) | 0x800000u;   // 24-bit significand
    const std::uint32_t shift = 126u - e;                      // value / 2^-24 = m >> shift (shift 14..25)
    std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  const std::uint32_t m = absx + 0xc8000fffu + ((absx >> 13) & 1u);  // rebias the exponent, round to even
  return static_cast<std::uint16_t>(sign | (m >> 13));
}
SHARD_CVT_HD float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  const std::uint32_t u = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112u) << 23) | (man << 13));
  return f32_from_bits(u);
}

}  // namespace shard::cvt
