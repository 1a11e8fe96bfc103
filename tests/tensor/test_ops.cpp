// Local elementwise ops and reductions against straightforward loops, on contiguous and strided
// inputs, small and large (multithreaded) sizes.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <shardtensor/shardtensor.hpp>

namespace st_tensor_test_ops {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

namespace {
// A random (rows x cols) tensor, either contiguous or a strided window of a larger one.
template <class T> Tensor<T, 2> make(index_t rows, index_t cols, std::uint64_t seed, bool strided) {
  if (!strided) {
    auto t = Tensor<T, 2>::empty({rows, cols});
    t.fill_random(seed);
    return t;
  }
  auto big = Tensor<T, 2>::empty({rows + 3, cols + 5});
  big.fill_random(seed);
  return big.slice({2, 3}, {rows, cols});
}

template <class T, class F> void for_all(const Tensor<T, 2>& t, F&& f) {
  for (index_t i = 0; i < t.size(0); ++i)
    for (index_t j = 0; j < t.size(1); ++j) f(i, j);
}
}  // namespace

TEMPLATE_TEST_CASE("elementwise ops match loops", "[tensor][ops]", float, double) {
  using T = TestType;
  for (index_t rows : {index_t{3}, index_t{300}}) {  // 300 x 257 > OpenMP threshold
    const index_t cols = rows == 3 ? 7 : 257;
    for (int layout = 0; layout < 4; ++layout) {
      const bool sa = layout & 1, sb = layout & 2;
      INFO("rows " << rows << " strided a " << sa << " strided b " << sb);
      auto a = make<T>(rows, cols, 1, sa), b = make<T>(rows, cols, 2, sb);
      const auto a0 = a.clone(), b0 = b.clone();

      auto s = add(a, b), d = sub(a, b), m = mul(a, b);
      auto sq = map(a, [](T x) { return x * x; });
      bool ok = true;
      for_all(a, [&](index_t i, index_t j) {
        ok = ok && s(i, j) == a(i, j) + b(i, j) && d(i, j) == a(i, j) - b(i, j) && m(i, j) == a(i, j) * b(i, j) &&
             sq(i, j) == a(i, j) * a(i, j);
      });
      CHECK(ok);

      // axpy / scale in place (also on strided destinations)
      const T alpha = T(0.75);
      axpy(alpha, a, b);
      ok = true;
      for_all(b, [&](index_t i, index_t j) { ok = ok && b(i, j) == T(b0(i, j) + alpha * a0(i, j)); });
      CHECK(ok);
      scale(a, T(-2));
      ok = true;
      for_all(a, [&](index_t i, index_t j) { ok = ok && a(i, j) == T(a0(i, j) * T(-2)); });
      CHECK(ok);

      // zip_into with the output aliasing an input
      zip_into(a, a, b0, [](T x, T y) { return x - y; });
      ok = true;
      for_all(a, [&](index_t i, index_t j) { ok = ok && a(i, j) == T(T(a0(i, j) * T(-2)) - b0(i, j)); });
      CHECK(ok);

      // reductions, accumulated in double
      double rs = 0, rd = 0;
      for_all(a0, [&](index_t i, index_t j) {
        rs += static_cast<double>(a0(i, j));
        rd += static_cast<double>(a0(i, j)) * static_cast<double>(b0(i, j));
      });
      CHECK(std::abs(sum(a0) - rs) <= 1e-12 * (1 + std::abs(rs)) * static_cast<double>(a0.numel()));
      CHECK(std::abs(dot(a0, b0) - rd) <= 1e-12 * (1 + std::abs(rd)) * static_cast<double>(a0.numel()));
    }
  }
}

TEMPLATE_TEST_CASE("max_rel_diff is max|a-b| / max|b|", "[tensor][ops]", float, double) {
  using T = TestType;
  auto a = make<T>(5, 6, 3, false), b = make<T>(5, 6, 4, true);
  double num = 0, den = 0;
  for_all(a, [&](index_t i, index_t j) {
    num = std::max(num, std::abs(static_cast<double>(a(i, j)) - static_cast<double>(b(i, j))));
    den = std::max(den, std::abs(static_cast<double>(b(i, j))));
  });
  CHECK(max_rel_diff(a, b) == num / den);
  CHECK(max_rel_diff(a, a.clone()) == 0.0);
  auto z = Tensor<T, 2>::zeros({2, 2});
  CHECK(max_rel_diff(z, z) == 0.0);
  auto n = z.clone();
  n(1, 1) = T(NAN);
  CHECK(std::isinf(max_rel_diff(n, z)));
  CHECK(std::isinf(max_rel_diff(z, n)));
}

TEST_CASE("ops reject mismatched shapes with messages naming the op", "[tensor][ops][errors]") {
  auto a = Tensor<double, 2>::zeros({2, 3}), b = Tensor<double, 2>::zeros({3, 2});
  CHECK_THROWS_WITH(add(a, b), ContainsSubstring("add") && ContainsSubstring("[2, 3]") && ContainsSubstring("[3, 2]"));
  CHECK_THROWS_WITH(sub(a, b), ContainsSubstring("sub"));
  CHECK_THROWS_WITH(mul(a, b), ContainsSubstring("mul"));
  CHECK_THROWS_WITH(axpy(1.0, a, b), ContainsSubstring("axpy"));
  CHECK_THROWS_WITH(dot(a, b), ContainsSubstring("dot"));
  CHECK_THROWS_WITH(max_rel_diff(a, b), ContainsSubstring("max_rel_diff"));
  CHECK_THROWS_WITH(map_into(a, b, [](double x) { return x; }), ContainsSubstring("map"));
  CHECK_THROWS_WITH(zip_into(a, a, b, [](double x, double y) { return x + y; }), ContainsSubstring("zip"));
}

}  // namespace st_tensor_test_ops
