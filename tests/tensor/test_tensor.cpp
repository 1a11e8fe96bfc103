// Tensor<T, Rank>: construction, zero-copy views of user memory, narrow/slice views, contiguous
// copies, copy_from across strides, fill on strided views, reshape, allocation counters.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <numeric>
#include <shardtensor/shardtensor.hpp>

namespace st_tensor_test_tensor {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

namespace {
// Fills t with t(i, j, k) = 100 i + 10 j + k through the element accessor.
template <class T> void fill_iota3(const Tensor<T, 3>& t) {
  for (index_t i = 0; i < t.size(0); ++i)
    for (index_t j = 0; j < t.size(1); ++j)
      for (index_t k = 0; k < t.size(2); ++k) t(i, j, k) = static_cast<T>(100 * i + 10 * j + k);
}
}  // namespace

TEMPLATE_TEST_CASE("Tensor::empty / zeros / full", "[tensor]", float, double) {
  auto e = Tensor<TestType, 3>::empty({2, 3, 4});
  CHECK(e.shape() == Shape<3>{2, 3, 4});
  CHECK(e.strides() == Shape<3>{12, 4, 1});
  CHECK(e.numel() == 24);
  CHECK(e.is_contiguous());
  CHECK(e.owns_memory());
  CHECK(e.device() == Device::cpu());
  CHECK(reinterpret_cast<std::uintptr_t>(e.data()) % 64 == 0);

  auto z = Tensor<TestType, 2>::zeros({3, 5});
  for (index_t i = 0; i < 3; ++i)
    for (index_t j = 0; j < 5; ++j) CHECK(z(i, j) == TestType(0));
  auto f = Tensor<TestType, 1>::full({4}, TestType(2.5));
  for (index_t i = 0; i < 4; ++i) CHECK(f(i) == TestType(2.5));

  auto empty_dim = Tensor<TestType, 2>::zeros({0, 7});
  CHECK(empty_dim.numel() == 0);
  CHECK(empty_dim.clone().numel() == 0);
  empty_dim.fill(TestType(1));  // no-op, no crash

  auto scalar = Tensor<TestType, 0>::full({}, TestType(3));
  CHECK(scalar.numel() == 1);
  CHECK(scalar() == TestType(3));

  CHECK_THROWS_WITH((Tensor<TestType, 2>::empty({2, -1})),
                    ContainsSubstring("Tensor::empty") && ContainsSubstring("negative"));

  // Copies are shallow: they share storage.
  auto alias = f;
  alias(1) = TestType(-1);
  CHECK(f(1) == TestType(-1));
  CHECK(alias.data() == f.data());
}

TEST_CASE("Tensor::view is zero-copy over user memory", "[tensor][view]") {
  std::vector<double> user(12);
  std::iota(user.begin(), user.end(), 0.0);
  auto v = Tensor<double, 2>::view(user.data(), {3, 4});
  CHECK(v.data() == user.data());
  CHECK_FALSE(v.owns_memory());
  CHECK(v(1, 2) == 6.0);
  v(2, 3) = -5.0;  // writes through the view land in user memory
  CHECK(user[11] == -5.0);
  user[0] = 42.0;  // and user writes are seen by the view
  CHECK(v(0, 0) == 42.0);
  v.fill(1.0);
  CHECK(std::all_of(user.begin(), user.end(), [](double x) { return x == 1.0; }));

  // Strided view of the interior of a ghosted 5x6 array (one ghost cell on each side).
  std::vector<float> ghosted(5 * 6, 0.f);
  auto interior = Tensor<float, 2>::view(ghosted.data() + 6 + 1, {3, 4}, {6, 1});
  CHECK_FALSE(interior.is_contiguous());
  interior.fill(7.f);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 6; ++j) {
      const bool inside = i >= 1 && i <= 3 && j >= 1 && j <= 4;
      CHECK(ghosted[static_cast<std::size_t>(i * 6 + j)] == (inside ? 7.f : 0.f));
    }

  CHECK_THROWS_WITH((Tensor<float, 1>::view(nullptr, {3})), ContainsSubstring("Tensor::view"));
  CHECK_NOTHROW(Tensor<float, 1>::view(nullptr, {0}));
}

TEMPLATE_TEST_CASE("narrow and slice are views; out-of-range errors name the op", "[tensor][view]", float, double) {
  auto t = Tensor<TestType, 3>::empty({4, 5, 6});
  fill_iota3(t);
  auto n = t.narrow(1, 2, 3);
  CHECK(n.shape() == Shape<3>{4, 3, 6});
  CHECK(n.strides() == t.strides());
  CHECK_FALSE(n.is_contiguous());
  CHECK(n.storage() == t.storage());
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 0; j < 3; ++j)
      for (index_t k = 0; k < 6; ++k) CHECK(n(i, j, k) == t(i, j + 2, k));
  n(0, 0, 0) = TestType(-1);
  CHECK(t(0, 2, 0) == TestType(-1));

  auto s = t.slice({1, 1, 2}, {2, 3, 4});
  CHECK(s.shape() == Shape<3>{2, 3, 4});
  for (index_t i = 0; i < 2; ++i)
    for (index_t j = 0; j < 3; ++j)
      for (index_t k = 0; k < 4; ++k) CHECK(s(i, j, k) == t(i + 1, j + 1, k + 2));
  // A slice of a slice composes.
  auto ss = s.slice({1, 0, 1}, {1, 2, 2});
  CHECK(ss(0, 1, 1) == t(2, 2, 4));
  // Narrowing the outermost dim keeps contiguity.
  CHECK(t.narrow(0, 1, 2).is_contiguous());
  CHECK(t.narrow(2, 6, 0).numel() == 0);

  CHECK_THROWS_WITH(t.narrow(3, 0, 1), ContainsSubstring("Tensor::narrow") && ContainsSubstring("dim 3"));
  CHECK_THROWS_WITH(t.narrow(1, 3, 3), ContainsSubstring("Tensor::narrow") && ContainsSubstring("out of bounds"));
  CHECK_THROWS_WITH(t.narrow(1, -1, 2), ContainsSubstring("Tensor::narrow"));
  CHECK_THROWS_WITH(t.slice({0, 0, 0}, {5, 1, 1}), ContainsSubstring("Tensor::narrow"));
}

TEMPLATE_TEST_CASE("contiguous, clone and to() are deep where they must be", "[tensor]", float, double) {
  auto t = Tensor<TestType, 3>::empty({3, 4, 5});
  fill_iota3(t);
  CHECK(t.contiguous().data() == t.data());  // already contiguous: no copy
  auto c = t.clone();
  CHECK(c.data() != t.data());
  c(0, 0, 0) = TestType(-7);
  CHECK(t(0, 0, 0) == TestType(0));

  auto v = t.slice({1, 1, 1}, {2, 2, 3});
  auto vc = v.contiguous();
  CHECK(vc.is_contiguous());
  CHECK(vc.data() != v.data());
  CHECK(vc.strides() == Shape<3>{6, 3, 1});
  for (index_t i = 0; i < 2; ++i)
    for (index_t j = 0; j < 2; ++j)
      for (index_t k = 0; k < 3; ++k) CHECK(vc(i, j, k) == v(i, j, k));
  auto h = t.to(Device::cpu());
  CHECK(h.data() != t.data());
  CHECK(h(2, 3, 4) == t(2, 3, 4));
}

TEMPLATE_TEST_CASE("copy_from between non-contiguous tensors", "[tensor]", float, double) {
  auto src = Tensor<TestType, 3>::empty({5, 6, 7});
  fill_iota3(src);
  auto dst = Tensor<TestType, 3>::zeros({4, 8, 9});
  // strided -> strided (different strides on both sides)
  auto sv = src.slice({1, 0, 2}, {3, 4, 5});
  auto dv = dst.slice({0, 3, 1}, {3, 4, 5});
  dv.copy_from(sv);
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 0; j < 8; ++j)
      for (index_t k = 0; k < 9; ++k) {
        const bool in = i < 3 && j >= 3 && j < 7 && k >= 1 && k < 6;
        const TestType want = in ? src(i + 1, j - 3, k - 1 + 2) : TestType(0);
        CHECK(dst(i, j, k) == want);
      }
  // Non-unit innermost stride (every other column) in both directions.
  std::vector<TestType> buf(20, TestType(0));
  auto every_other = Tensor<TestType, 2>::view(buf.data(), {2, 5}, {10, 2});
  every_other.copy_from(src.slice({0, 0, 0}, {1, 2, 5}).contiguous().template reshape<2>({2, 5}));
  for (index_t j = 0; j < 2; ++j)
    for (index_t k = 0; k < 5; ++k) {
      CHECK(buf[static_cast<std::size_t>(10 * j + 2 * k)] == src(0, j, k));
      CHECK(buf[static_cast<std::size_t>(10 * j + 2 * k + 1)] == TestType(0));
    }
  auto back = Tensor<TestType, 2>::zeros({2, 5});
  back.copy_from(every_other);
  for (index_t j = 0; j < 2; ++j)
    for (index_t k = 0; k < 5; ++k) CHECK(back(j, k) == src(0, j, k));

  CHECK_THROWS_WITH(dst.copy_from(Tensor<TestType, 3>::zeros({4, 8, 8})),
                    ContainsSubstring("Tensor::copy_from") && ContainsSubstring("[4, 8, 8]"));
}

TEMPLATE_TEST_CASE("fill on strided views touches only the view", "[tensor]", float, double) {
  auto t = Tensor<TestType, 3>::zeros({4, 5, 6});
  t.narrow(2, 1, 3).narrow(0, 2, 2).fill(TestType(3));
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 0; j < 5; ++j)
      for (index_t k = 0; k < 6; ++k) {
        const bool in = i >= 2 && k >= 1 && k < 4;
        CHECK(t(i, j, k) == (in ? TestType(3) : TestType(0)));
      }
  // A view with a non-unit innermost stride.
  std::vector<TestType> buf(12, TestType(0));
  Tensor<TestType, 1>::view(buf.data() + 1, {4}, {3}).fill(TestType(9));
  for (std::size_t i = 0; i < buf.size(); ++i) CHECK(buf[i] == (i % 3 == 1 && i < 11 ? TestType(9) : TestType(0)));
}

TEST_CASE("reshape is a view of contiguous tensors", "[tensor]") {
  auto t = Tensor<double, 3>::empty({2, 3, 4});
  fill_iota3(t);
  auto r = t.reshape<2>({6, 4});
  CHECK(r.data() == t.data());
  CHECK(r.storage() == t.storage());
  CHECK(r(4, 3) == t(1, 1, 3));
  auto flat = t.reshape<1>({24});
  flat(23) = -1;
  CHECK(t(1, 2, 3) == -1);
  CHECK_THROWS_WITH(t.reshape<2>({5, 5}), ContainsSubstring("Tensor::reshape") && ContainsSubstring("[5, 5]"));
  CHECK_THROWS_WITH(t.narrow(1, 0, 2).reshape<1>({16}),
                    ContainsSubstring("Tensor::reshape") && ContainsSubstring("not contiguous"));
  // The reshaped view keeps the memory alive after the original goes away.
  Tensor<float, 1> keep;
  {
    auto tmp = Tensor<float, 2>::full({2, 2}, 5.f);
    keep = tmp.reshape<1>({4});
  }
  CHECK(keep(3) == 5.f);
}

TEST_CASE("allocation counters track owning tensors", "[tensor][memory]") {
  const auto before = memory_stats();
  {
    auto t = Tensor<double, 1>::empty({1000});  // 8000 bytes, rounded up to 64
    const auto during = memory_stats();
    CHECK(during.current_bytes == before.current_bytes + 8000);
    CHECK(during.peak_bytes >= during.current_bytes);
    auto v = Tensor<double, 1>::view(t.data(), {1000});  // views allocate nothing
    CHECK(memory_stats().current_bytes == during.current_bytes);
  }
  CHECK(memory_stats().current_bytes == before.current_bytes);
  reset_peak_memory();
  CHECK(memory_stats().peak_bytes == memory_stats().current_bytes);
  { auto big = Tensor<float, 1>::empty({1 << 16}); }
  CHECK(memory_stats().peak_bytes >= memory_stats().current_bytes + (std::size_t{1} << 18));
  CHECK(process_peak_rss_bytes() > 0);
  CHECK(memory_stats(DeviceKind::cuda).current_bytes == 0);
}

}  // namespace st_tensor_test_tensor
