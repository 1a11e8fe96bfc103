#pragma once
// CPU tables that read and write the bf16 / f16 storage dtypes in place (a family's
// native_storage): the element conversions they share, and a dtype switch over the four float
// storage types. Every bf16 / f16 value widens exactly; a result rounds double -> float ->
// storage, the two roundings of the f32 working-copy route (exec/precision.hpp), so a kernel
// that computes in double on the widened values gives bit for bit what that route gives.
#include <type_traits>

#include "shardtensor/core/storage_bits.hpp"
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"

namespace shard::exec::storage {

/// True for the bf16 / f16 storage types.
template <class T>
inline constexpr bool is_narrow_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

/// The type a kernel accumulates a T result in where the f32 route accumulates in T: float for
/// bf16 / f16 (the f32 route's working type), T itself otherwise.
template <class T>
using work_t = std::conditional_t<is_narrow_v<T>, float, T>;

/// T -> float (exact for bf16 / f16; bf16 / f16 through the inline bit conversions of
/// core/storage_bits.hpp, the ones shard::bf16 / shard::f16 call).
template <class T>
inline float to_float(const T& v) {
  if constexpr (std::is_same_v<T, bf16>) return cvt::bf16_to_f32(v.bits);
  else if constexpr (std::is_same_v<T, f16>) return cvt::f16_to_f32(v.bits);
  else return static_cast<float>(v);
}
/// T -> double (exact for every storage type).
template <class T>
inline double to_double(const T& v) {
  if constexpr (is_narrow_v<T>) return static_cast<double>(to_float(v));
  else return static_cast<double>(v);
}
/// T -> its work_t (exact).
template <class T>
inline work_t<T> to_work(const T& v) {
  if constexpr (is_narrow_v<T>) return to_float(v);
  else return v;
}
/// float -> T, rounded once to nearest even (bf16 / f16), a plain cast otherwise.
template <class T>
inline T from_float(float v) {
  if constexpr (is_narrow_v<T>) {
    T r;
    r.bits = std::is_same_v<T, bf16> ? cvt::bf16_bits(v) : cvt::f16_bits(v);
    return r;
  } else {
    return static_cast<T>(v);
  }
}
/// double -> T; bf16 / f16 through float (the f32 route's two roundings, bit for bit).
template <class T>
inline T from_double(double v) {
  if constexpr (is_narrow_v<T>) return from_float<T>(static_cast<float>(v));
  else return static_cast<T>(v);
}

}  // namespace shard::exec::storage

/// Runs CALL with `T` bound to the element type of float storage dtype `dt` (f32, f64, bf16,
/// f16); any other dtype is a shard::Error naming `op`.
#define SHARD_STORAGE_DISPATCH(op, dt, CALL)                                        \
  switch (dt) {                                                                     \
    case ::shard::DType::f32: { using T = float; CALL; break; }                     \
    case ::shard::DType::f64: { using T = double; CALL; break; }                    \
    case ::shard::DType::bf16: { using T = ::shard::bf16; CALL; break; }            \
    case ::shard::DType::f16: { using T = ::shard::f16; CALL; break; }              \
    default: SHARD_FAIL(op, "unsupported dtype {} (f32, f64, bf16, f16)", dt);      \
  }
