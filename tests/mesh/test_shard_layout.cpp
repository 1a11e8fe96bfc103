// ShardLayout: the one balanced rule, explicit sizes (incl. empty parts), offsets and the
// global <-> local index mapping.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <shardtensor/shardtensor.hpp>

namespace st_mesh_test_shard_layout {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

// The rule is constexpr: these hold at compile time.
static_assert(balanced_size(9, 4, 0) == 3 && balanced_size(9, 4, 1) == 2 && balanced_size(9, 4, 3) == 2);
static_assert(balanced_offset(9, 4, 0) == 0 && balanced_offset(9, 4, 1) == 3 && balanced_offset(9, 4, 2) == 5 &&
              balanced_offset(9, 4, 3) == 7 && balanced_offset(9, 4, 4) == 9);
static_assert(balanced_size(2, 4, 1) == 1 && balanced_size(2, 4, 2) == 0);
static_assert(balanced_offset(0, 3, 2) == 0);

TEST_CASE("balanced rule: 9 over 4 is 3,2,2,2 with offsets 0,3,5,7", "[mesh][layout]") {
  const auto l = ShardLayout::balanced(9, 4);
  CHECK(l.sizes() == std::vector<index_t>{3, 2, 2, 2});
  CHECK(l.offset(0) == 0);
  CHECK(l.offset(1) == 3);
  CHECK(l.offset(2) == 5);
  CHECK(l.offset(3) == 7);
  CHECK(l.extent() == 9);
  CHECK(l.parts() == 4);
  CHECK(l.is_balanced());
}

TEST_CASE("balanced rule agrees with the constexpr helpers for many (n, p)", "[mesh][layout]") {
  for (index_t n = 0; n <= 23; ++n) {
    for (index_t p = 1; p <= 7; ++p) {
      const auto l = ShardLayout::balanced(n, p);
      index_t tot = 0, max_s = 0, min_s = n;
      for (index_t i = 0; i < p; ++i) {
        CHECK(l.size(i) == balanced_size(n, p, i));
        CHECK(l.offset(i) == balanced_offset(n, p, i));
        CHECK(l.offset(i) == tot);  // contiguous blocks in part order
        tot += l.size(i);
        max_s = std::max(max_s, l.size(i));
        min_s = std::min(min_s, l.size(i));
        if (i > 0) CHECK(l.size(i) <= l.size(i - 1));  // larger parts come first
      }
      CHECK(tot == n);
      CHECK(max_s - min_s <= 1);
    }
  }
}

TEST_CASE("owner / to_local / to_global round trip", "[mesh][layout]") {
  const std::vector<ShardLayout> layouts = {
      ShardLayout::balanced(9, 4), ShardLayout::balanced(7, 3), ShardLayout::balanced(2, 5),
      ShardLayout::from_sizes({0, 4, 0, 0, 3, 2}), ShardLayout::from_sizes({5}), ShardLayout::from_sizes({1, 0, 1})};
  for (const auto& l : layouts) {
    INFO(fmt::format("{}", l));
    for (index_t g = 0; g < l.extent(); ++g) {
      const index_t p = l.owner(g), loc = l.to_local(g);
      CHECK(l.size(p) > 0);  // empty parts own nothing
      CHECK(loc >= 0);
      CHECK(loc < l.size(p));
      CHECK(l.to_global(p, loc) == g);
    }
    for (index_t p = 0; p < l.parts(); ++p)
      for (index_t loc = 0; loc < l.size(p); ++loc) {
        const index_t g = l.to_global(p, loc);
        CHECK(l.owner(g) == p);
        CHECK(l.to_local(g) == loc);
      }
  }
}

TEST_CASE("from_sizes: explicit uneven sizes incl. empty parts", "[mesh][layout]") {
  const auto l = ShardLayout::from_sizes({4, 0, 5}, 9);
  CHECK(l.extent() == 9);
  CHECK(l.parts() == 3);
  CHECK(l.offset(1) == 4);
  CHECK(l.size(1) == 0);
  CHECK(l.offset(2) == 4);
  CHECK_FALSE(l.is_balanced());
  CHECK(l.owner(3) == 0);
  CHECK(l.owner(4) == 2);
  CHECK(l == ShardLayout::from_sizes({4, 0, 5}));
  CHECK_FALSE(l == ShardLayout::from_sizes({4, 5, 0}));
  CHECK(ShardLayout::from_sizes({3, 2, 2, 2}, 9) == ShardLayout::balanced(9, 4));
  CHECK(ShardLayout::from_sizes({3, 2, 2, 2}).is_balanced());
  CHECK(ShardLayout::from_sizes({0, 0}, 0).extent() == 0);
}

TEST_CASE("from_sizes / balanced / owner reject bad input with a message naming the op", "[mesh][layout][errors]") {
  CHECK_THROWS_WITH(ShardLayout::from_sizes({4, 0, 4}, 9),
                    ContainsSubstring("ShardLayout::from_sizes") && ContainsSubstring("sum to 8") &&
                        ContainsSubstring("9"));
  CHECK_THROWS_WITH(ShardLayout::from_sizes({}), ContainsSubstring("ShardLayout::from_sizes"));
  CHECK_THROWS_WITH(ShardLayout::from_sizes({3, -1, 7}), ContainsSubstring("negative"));
  CHECK_THROWS_AS(ShardLayout::balanced(5, 0), shard::Error);
  CHECK_THROWS_AS(ShardLayout::balanced(-1, 2), shard::Error);
  CHECK_THROWS_WITH(ShardLayout::balanced(5, 2).owner(5), ContainsSubstring("ShardLayout::owner"));
  CHECK_THROWS_WITH(ShardLayout::balanced(5, 2).owner(-1), ContainsSubstring("ShardLayout::owner"));
}

TEST_CASE("ShardLayout prints with fmt", "[mesh][layout]") {
  CHECK(fmt::format("{}", ShardLayout::balanced(9, 4)) == "ShardLayout(extent=9, sizes=[3, 2, 2, 2])");
}

}  // namespace st_mesh_test_shard_layout
