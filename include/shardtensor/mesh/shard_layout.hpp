#pragma once
/// \file shard_layout.hpp
/// ShardLayout: how one global extent is split into contiguous blocks over `parts` ranks.
/// The balanced rule lives here and nowhere else.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <vector>

#include "shardtensor/core/error.hpp"
#include "shardtensor/core/shape.hpp"

namespace shard {

/// Balanced block rule: extent n over p parts gives the first n % p parts n/p + 1 elements and
/// the rest n/p (9 over 4 -> 3,2,2,2).
constexpr index_t balanced_size(index_t n, index_t p, index_t i) { return n / p + (i < n % p ? 1 : 0); }
/// Offset of part i under the balanced rule.
constexpr index_t balanced_offset(index_t n, index_t p, index_t i) {
  return i * (n / p) + (i < n % p ? i : n % p);
}

/// Split of one extent into `parts()` contiguous blocks, balanced or with explicit sizes.
class ShardLayout {
 public:
  ShardLayout() = default;
  /// Balanced layout of n over p parts.
  static ShardLayout balanced(index_t n, index_t p) {
    SHARD_CHECK(n >= 0 && p >= 1, "ShardLayout::balanced", "need n >= 0 and p >= 1 (got n={}, p={})", n, p);
    std::vector<index_t> s(static_cast<std::size_t>(p));
    for (index_t i = 0; i < p; ++i) s[i] = balanced_size(n, p, i);
    return ShardLayout(std::move(s));
  }
  /// Layout with explicit per-part sizes (a simulation's own decomposition); empty parts allowed.
  static ShardLayout from_sizes(std::vector<index_t> sizes, index_t expected_extent = -1) {
    SHARD_CHECK(!sizes.empty(), "ShardLayout::from_sizes", "no parts given");
    index_t tot = 0;
    for (auto s : sizes) {
      SHARD_CHECK(s >= 0, "ShardLayout::from_sizes", "negative part size in {}", sizes);
      tot += s;
    }
    SHARD_CHECK(expected_extent < 0 || tot == expected_extent, "ShardLayout::from_sizes",
                "part sizes {} sum to {} but the global extent is {}", sizes, tot, expected_extent);
    return ShardLayout(std::move(sizes));
  }

  index_t extent() const { return offsets_.empty() ? 0 : offsets_.back(); }
  index_t parts() const { return static_cast<index_t>(sizes_.size()); }
  index_t size(index_t part) const { return sizes_[static_cast<std::size_t>(part)]; }
  index_t offset(index_t part) const { return offsets_[static_cast<std::size_t>(part)]; }
  const std::vector<index_t>& sizes() const { return sizes_; }
  /// True if the sizes equal the balanced rule's.
  bool is_balanced() const { return *this == balanced(extent(), parts()); }
  /// Part owning global index g (the first non-empty part whose block contains g).
  index_t owner(index_t g) const {
    SHARD_CHECK(g >= 0 && g < extent(), "ShardLayout::owner", "index {} outside [0, {})", g, extent());
    index_t lo = 0, hi = parts() - 1;
    while (lo < hi) {  // first part with offset+size > g
      index_t mid = (lo + hi) / 2;
      if (offset(mid) + size(mid) > g) hi = mid; else lo = mid + 1;
    }
    return lo;
  }
  /// Local index of global index g within its owner's block.
  index_t to_local(index_t g) const { return g - offset(owner(g)); }
  /// Global index of local index l in part `part`.
  index_t to_global(index_t part, index_t l) const { return offset(part) + l; }
  friend bool operator==(const ShardLayout& a, const ShardLayout& b) { return a.sizes_ == b.sizes_; }

 private:
  explicit ShardLayout(std::vector<index_t> s) : sizes_(std::move(s)), offsets_(sizes_.size() + 1, 0) {
    for (std::size_t i = 0; i < sizes_.size(); ++i) offsets_[i + 1] = offsets_[i] + sizes_[i];
  }
  std::vector<index_t> sizes_;
  std::vector<index_t> offsets_;  // parts()+1 entries; back() is the extent
};

}  // namespace shard

template <> struct fmt::formatter<shard::ShardLayout> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx> auto format(const shard::ShardLayout& l, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "ShardLayout(extent={}, sizes={})", l.extent(), l.sizes());
  }
};
