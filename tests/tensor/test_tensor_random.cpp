// Deterministic random init: a function of (seed, global index) only, so the same global tensor
// results whether it is filled whole or box by box at any offsets.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <shardtensor/shardtensor.hpp>

namespace st_tensor_test_tensor_random {

using namespace shard;

TEMPLATE_TEST_CASE("fill_random: whole tensor == tensor assembled from boxes at offsets", "[tensor][random]", float,
                   double) {
  const Shape<3> g{7, 9, 5};
  for (RandomInit init : {RandomInit::uniform(-1, 1), RandomInit::normal(0.5, 2.0)}) {
    auto whole = Tensor<TestType, 3>::empty(g);
    whole.fill_random(1234, init);
    // Tile with uneven boxes (balanced over 3 x 4 x 2 parts, plus explicit uneven sizes incl. empty ones).
    const std::vector<ShardLayout> lays = {ShardLayout::balanced(7, 3), ShardLayout::from_sizes({0, 4, 0, 5}),
                                           ShardLayout::balanced(5, 2)};
    auto assembled = Tensor<TestType, 3>::full(g, TestType(-99));
    for (index_t a = 0; a < lays[0].parts(); ++a)
      for (index_t b = 0; b < lays[1].parts(); ++b)
        for (index_t c = 0; c < lays[2].parts(); ++c) {
          const Shape<3> lo{lays[0].offset(a), lays[1].offset(b), lays[2].offset(c)};
          const Shape<3> len{lays[0].size(a), lays[1].size(b), lays[2].size(c)};
          auto box = Tensor<TestType, 3>::empty(len);  // a separate local block
          box.fill_random(1234, lo, g, init);
          assembled.slice(lo, len).copy_from(box);
        }
    CHECK(max_rel_diff(assembled, whole) == 0.0);
    // Filling a strided view in place gives the same values too.
    auto inplace = Tensor<TestType, 3>::zeros(g);
    inplace.slice({2, 3, 1}, {4, 5, 3}).fill_random(1234, {2, 3, 1}, g, init);
    for (index_t i = 2; i < 6; ++i)
      for (index_t j = 3; j < 8; ++j)
        for (index_t k = 1; k < 4; ++k) CHECK(inplace(i, j, k) == whole(i, j, k));
    CHECK(inplace(0, 0, 0) == TestType(0));
  }
}

TEST_CASE("fill_random: element value is random_value(seed, global linear index)", "[tensor][random]") {
  auto t = Tensor<double, 2>::empty({6, 4});
  t.fill_random(99);
  for (index_t i = 0; i < 6; ++i)
    for (index_t j = 0; j < 4; ++j)
      CHECK(t(i, j) == random_value(99, static_cast<std::uint64_t>(i * 4 + j), RandomInit{}));
  // float is the rounded double value
  auto f = Tensor<float, 2>::empty({6, 4});
  f.fill_random(99);
  CHECK(f(5, 3) == static_cast<float>(t(5, 3)));
}

TEST_CASE("fill_random: seeds differ, same seed repeats, large fills run multithreaded", "[tensor][random]") {
  const index_t n = 1 << 18;  // above the OpenMP threshold
  auto a = Tensor<double, 1>::empty({n}), b = Tensor<double, 1>::empty({n}), c = Tensor<double, 1>::empty({n});
  a.fill_random(5, RandomInit::uniform(2.0, 3.0));
  b.fill_random(5, RandomInit::uniform(2.0, 3.0));
  c.fill_random(6, RandomInit::uniform(2.0, 3.0));
  CHECK(max_rel_diff(a, b) == 0.0);
  index_t same = 0;
  double lo = 1e300, hi = -1e300;
  for (index_t i = 0; i < n; ++i) {
    same += a(i) == c(i);
    lo = std::min(lo, a(i));
    hi = std::max(hi, a(i));
  }
  CHECK(same == 0);
  CHECK(lo >= 2.0);
  CHECK(hi < 3.0);
  const double mean = sum(a) / static_cast<double>(n);
  CHECK(std::abs(mean - 2.5) < 0.005);  // 1/sqrt(12 n) ~ 6e-4

  auto g = Tensor<double, 1>::empty({n});
  g.fill_random(11, RandomInit::normal(1.0, 3.0));
  const double m = sum(g) / static_cast<double>(n);
  auto centred = map(g, [m](double x) { return (x - m) * (x - m); });
  const double sd = std::sqrt(sum(centred) / static_cast<double>(n));
  CHECK(std::abs(m - 1.0) < 0.05);   // 3/sqrt(n) ~ 6e-3
  CHECK(std::abs(sd - 3.0) < 0.05);
  for (index_t i = 0; i < n; ++i)
    if (!std::isfinite(g(i))) FAIL("non-finite normal sample at " << i);
}

}  // namespace st_tensor_test_tensor_random
