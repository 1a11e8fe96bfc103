#pragma once
/// \file shape.hpp
/// Index type, Shape<Rank>, and small shape helpers.
#include <array>
#include <cstdint>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace shard {

/// Signed index type for extents, offsets and strides.
using index_t = std::int64_t;

/// Extents of a Rank-dimensional tensor (row-major: last dim fastest).
template <int Rank> using Shape = std::array<index_t, Rank>;

/// Product of the extents.
template <std::size_t R> constexpr index_t numel(const std::array<index_t, R>& s) {
  index_t n = 1;
  for (auto e : s) n *= e;
  return n;
}

/// True when the product of the (non-negative) extents in `s`, times `elem_bytes`, fits in
/// index_t: a shape whose element count or byte size overflows int64 must be refused before
/// anything is sized from it (its wrapped-around numel would allocate and index garbage).
template <class Extents> constexpr bool numel_fits(const Extents& s, index_t elem_bytes = 1) {
  for (auto e : s)
    if (e == 0) return true;
  index_t n = elem_bytes;
  for (auto e : s)
    if (e < 0 || __builtin_mul_overflow(n, static_cast<index_t>(e), &n)) return false;
  return true;
}

/// Row-major (C) strides for `s`.
template <std::size_t R> constexpr std::array<index_t, R> contiguous_strides(const std::array<index_t, R>& s) {
  std::array<index_t, R> st{};
  index_t acc = 1;
  for (int d = static_cast<int>(R) - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= s[d];
  }
  return st;
}

/// Row-major multi-index of linear index `lin` in shape `s`.
template <std::size_t R> constexpr std::array<index_t, R> unravel(index_t lin, const std::array<index_t, R>& s) {
  std::array<index_t, R> idx{};
  for (int d = static_cast<int>(R) - 1; d >= 0; --d) {
    idx[d] = s[d] ? lin % s[d] : 0;
    lin = s[d] ? lin / s[d] : 0;
  }
  return idx;
}

/// Row-major linear index of multi-index `idx` in shape `s`.
template <std::size_t R> constexpr index_t ravel(const std::array<index_t, R>& idx, const std::array<index_t, R>& s) {
  index_t lin = 0;
  for (std::size_t d = 0; d < R; ++d) lin = lin * s[d] + idx[d];
  return lin;
}

}  // namespace shard
