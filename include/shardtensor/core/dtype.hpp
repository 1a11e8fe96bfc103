#pragma once
/// \file dtype.hpp
/// Element types: f32 and f64 for compute, bf16/f16 as storage types, c64/c128 (complex) for data
/// that moves through the box engine, redistribution, halo exchange and the communicators.
#include <complex>
#include <cstdint>
#include <cstring>
#include <fmt/format.h>
#include <type_traits>

#include "shardtensor/core/storage_bits.hpp"

namespace shard {

/// Element type tag used by the type-erased layers (communication, kernels).
enum class DType : std::uint8_t { f32, f64, bf16, f16, i32, i64, u8, c64, c128 };

/// Size of one element of `dt` in bytes.
constexpr std::size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::c64: return 8;
    case DType::c128: return 16;
  }
  return 0;
}

/// Name of a dtype ("f32", ...).
constexpr const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::c64: return "c64";
    case DType::c128: return "c128";
  }
  return "?";
}

/// bfloat16 storage type (round-to-nearest-even conversion from float: core/storage_bits.hpp).
struct bf16 {
  std::uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(cvt::bf16_bits(f)) {}
  explicit operator float() const { return cvt::bf16_to_f32(bits); }
  explicit operator double() const { return static_cast<double>(static_cast<float>(*this)); }
};

/// IEEE half storage type (conversion handles normals, subnormals, inf and NaN: core/storage_bits.hpp).
struct f16 {
  std::uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(cvt::f16_bits(f)) {}
  explicit operator float() const { return cvt::f16_to_f32(bits); }
  explicit operator double() const { return static_cast<double>(static_cast<float>(*this)); }
};

/// Arithmetic on the storage types goes through float and rounds once per operation (the generic
/// CPU loops of Tensor<bf16> / Tensor<f16>, halo accumulation); the heavy ops convert whole blocks
/// to f32 instead (exec/precision.hpp).
#define SHARD_LOWP_OPS(T)                                                                           \
  inline T operator+(T a, T b) { return T(static_cast<float>(a) + static_cast<float>(b)); }          \
  inline T operator-(T a, T b) { return T(static_cast<float>(a) - static_cast<float>(b)); }          \
  inline T operator*(T a, T b) { return T(static_cast<float>(a) * static_cast<float>(b)); }          \
  inline T operator/(T a, T b) { return T(static_cast<float>(a) / static_cast<float>(b)); }          \
  inline T operator-(T a) { return T(-static_cast<float>(a)); }                                      \
  inline T& operator+=(T& a, T b) { return a = a + b; }                                              \
  inline T& operator-=(T& a, T b) { return a = a - b; }                                              \
  inline T& operator*=(T& a, T b) { return a = a * b; }                                              \
  inline T& operator/=(T& a, T b) { return a = a / b; }                                              \
  inline bool operator==(T a, T b) { return static_cast<float>(a) == static_cast<float>(b); }        \
  inline bool operator!=(T a, T b) { return !(a == b); }                                             \
  inline bool operator<(T a, T b) { return static_cast<float>(a) < static_cast<float>(b); }          \
  inline bool operator>(T a, T b) { return static_cast<float>(a) > static_cast<float>(b); }          \
  inline bool operator<=(T a, T b) { return static_cast<float>(a) <= static_cast<float>(b); }        \
  inline bool operator>=(T a, T b) { return static_cast<float>(a) >= static_cast<float>(b); }
SHARD_LOWP_OPS(bf16)
SHARD_LOWP_OPS(f16)
#undef SHARD_LOWP_OPS

template <class T> struct dtype_traits;
template <> struct dtype_traits<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_traits<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_traits<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_traits<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_traits<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_traits<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_traits<std::uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_traits<std::complex<float>> { static constexpr DType value = DType::c64; };
template <> struct dtype_traits<std::complex<double>> { static constexpr DType value = DType::c128; };

/// True for the complex dtypes (c64, c128): no order, so no max/min reductions.
constexpr bool is_complex(DType dt) { return dt == DType::c64 || dt == DType::c128; }

/// DType of a C++ element type.
template <class T> inline constexpr DType dtype_of = dtype_traits<std::remove_cv_t<T>>::value;

/// True for the types the compute ops support (f32, f64).
template <class T> inline constexpr bool is_compute_type = std::is_same_v<T, float> || std::is_same_v<T, double>;
/// True for the types the mixed-precision ops accept: the compute types and the storage types
/// bf16 / f16 (computed in f32 with f32 accumulation; see exec/precision.hpp).
template <class T> inline constexpr bool is_float_type =
    is_compute_type<T> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;
/// The dtype a parameter of a Module<T> is held in: f32 masters for bf16 / f16 models, T otherwise.
template <class T> using master_t = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float, T>;
/// True for std::complex<float> and std::complex<double>.
template <class T> inline constexpr bool is_complex_type =
    std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>;

}  // namespace shard

template <> struct fmt::formatter<shard::DType> : fmt::formatter<fmt::string_view> {
  template <class Ctx> auto format(shard::DType d, Ctx& ctx) const {
    return fmt::formatter<fmt::string_view>::format(shard::dtype_name(d), ctx);
  }
};
