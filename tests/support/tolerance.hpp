#pragma once
// Mixed absolute/relative comparison for every test that compares computed values with a
// reference: |got - ref| <= rel * max|ref| + abs, elementwise maximum over the tensor.
//
// A purely relative check (max|got - ref| / max|ref|) fails wherever the exact reference is zero
// (a window-1 attention's dq and dk, a gradient that cancels exactly) because rounding noise of
// one ISA path then has relative error 1. The absolute floor is derived from the dtype and the
// length of the reduction that produced the values: `abs = 8 * eps(T) * sqrt(n) * magnitude`,
// where `magnitude` bounds the size of one term of the reduction (e.g. |q| |k| for an attention
// score). Usage:
//
//   CHECK(diff_of(got, ref) <= mixed_tol<T>(1e-10, n, magnitude));
//
// On failure Catch2 prints both sides: the largest difference, the largest reference magnitude and
// the tolerance.
#include <catch2/catch_tostring.hpp>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "shardtensor/core/shape.hpp"
#include "shardtensor/tensor/tensor.hpp"

namespace shard::test {

/// The result of comparing got with ref: the largest |got - ref| and the largest |ref|;
/// `bad` when shapes differ or a NaN appears on one side only.
struct Diff {
  double max_abs = 0;
  double max_ref = 0;
  bool bad = false;
  /// max|got - ref| / max|ref| (the old purely relative measure; for reports).
  double rel() const { return bad ? INFINITY : max_abs / std::max(max_ref, 1e-300); }
};

/// Mixed tolerance: |got - ref| <= rel * max|ref| + abs.
struct Tol {
  double rel = 0;
  double abs = 0;
};

/// Tolerance for values of type T that come from reductions of `reduction_len` terms of size up
/// to `magnitude`: relative `rel`, absolute floor 8 eps(T) sqrt(n) magnitude.
template <class T>
Tol mixed_tol(double rel, index_t reduction_len, double magnitude = 1.0) {
  using R = std::conditional_t<std::is_floating_point_v<T>, T, double>;
  const double eps = static_cast<double>(std::numeric_limits<R>::epsilon());
  const double n = static_cast<double>(std::max<index_t>(reduction_len, 1));
  return {rel, 8.0 * eps * std::sqrt(n) * magnitude};
}

/// The comparison rule of a dtype: a relative tolerance and the dtype's machine epsilon. `at`
/// makes the Tol of one tensor of `len` values within a result whose largest value is
/// `magnitude` (the oracle harnesses: a gradient that is exactly zero, e.g. dq of a window-1
/// attention, is then compared against the rounding noise its siblings' size allows).
struct DTol {
  double rel = 0;
  double eps = 0;
  Tol at(std::size_t len, double magnitude) const {
    return {rel, 8.0 * eps * std::sqrt(static_cast<double>(std::max<std::size_t>(len, 1))) * magnitude};
  }
};

template <class T>
DTol dtol(double rel) {
  return {rel, static_cast<double>(std::numeric_limits<std::conditional_t<std::is_floating_point_v<T>, T, double>>::epsilon())};
}

/// The rule of a relative tolerance given alone: below 1e-7 it can only be an fp64 comparison.
inline DTol dtol_of_rel(double rel) {
  return rel < 1e-7 ? dtol<double>(rel) : dtol<float>(rel);
}

inline bool operator<=(const Diff& d, const Tol& t) { return !d.bad && d.max_abs <= t.rel * d.max_ref + t.abs; }

inline void accumulate(Diff& d, double x, double y) {
  if (std::isnan(x) != std::isnan(y)) {
    d.bad = true;
    return;
  }
  if (std::isnan(x)) return;
  d.max_abs = std::max(d.max_abs, std::abs(x - y));
  d.max_ref = std::max(d.max_ref, std::abs(y));
}

/// Compares two vectors of values.
template <class A, class B>
Diff diff_of(const std::vector<A>& got, const std::vector<B>& ref) {
  Diff d;
  if (got.size() != ref.size()) {
    d.bad = true;
    return d;
  }
  for (std::size_t i = 0; i < got.size(); ++i) accumulate(d, static_cast<double>(got[i]), static_cast<double>(ref[i]));
  return d;
}

/// Compares two tensors of the same shape (any strides, any devices: copied to the host).
template <class A, class B, int R>
Diff diff_of(const Tensor<A, R>& got, const Tensor<B, R>& ref) {
  Diff d;
  if (got.shape() != ref.shape()) {
    d.bad = true;
    return d;
  }
  const auto a = got.to(Device::cpu()).contiguous(), b = ref.to(Device::cpu()).contiguous();
  for (index_t i = 0; i < a.numel(); ++i)
    accumulate(d, static_cast<double>(a.data()[i]), static_cast<double>(b.data()[i]));
  return d;
}

}  // namespace shard::test

template <>
struct Catch::StringMaker<shard::test::Diff> {
  static std::string convert(const shard::test::Diff& d) {
    if (d.bad) return "{shape mismatch or one-sided NaN}";
    return fmt::format("{{max|got-ref|={:.3e}, max|ref|={:.3e}, rel={:.3e}}}", d.max_abs, d.max_ref, d.rel());
  }
};

template <>
struct Catch::StringMaker<shard::test::Tol> {
  static std::string convert(const shard::test::Tol& t) {
    return fmt::format("{{rel={:.1e} * max|ref| + abs={:.3e}}}", t.rel, t.abs);
  }
};
