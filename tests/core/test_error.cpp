// shard::Error and the check macros: messages name the op, carry the formatted details and the
// source location; shapes and device tags print with fmt.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <shardtensor/shardtensor.hpp>

namespace st_core_test_error {

using namespace shard;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;

namespace {
int checked_div(int a, int b) {
  SHARD_CHECK(b != 0, "checked_div", "division of {} by zero (shape {})", a, Shape<2>{3, 4});
  return a / b;
}
}  // namespace

TEST_CASE("SHARD_CHECK passes silently and fails with op, details and location", "[core][error]") {
  CHECK(checked_div(6, 3) == 2);
  CHECK_THROWS_AS(checked_div(1, 0), shard::Error);
  CHECK_THROWS_AS(checked_div(1, 0), std::runtime_error);  // Error is a runtime_error
  CHECK_THROWS_WITH(checked_div(1, 0), StartsWith("shardtensor: checked_div: division of 1 by zero (shape [3, 4])") &&
                                           ContainsSubstring("test_error.cpp:"));
  // Without MPI initialised no rank is printed.
  CHECK_THROWS_WITH(checked_div(1, 0), !ContainsSubstring("[rank"));
}

TEST_CASE("SHARD_FAIL always throws", "[core][error]") {
  CHECK_THROWS_WITH(SHARD_FAIL("myop", "code {}", 7), StartsWith("shardtensor: myop: code 7"));
}

TEST_CASE("shape helpers", "[core][shape]") {
  static_assert(numel(Shape<3>{2, 3, 4}) == 24);
  static_assert(numel(Shape<0>{}) == 1);
  static_assert(contiguous_strides(Shape<3>{2, 3, 4}) == Shape<3>{12, 4, 1});
  static_assert(ravel(Shape<3>{1, 2, 3}, Shape<3>{2, 3, 4}) == 23);
  static_assert(unravel(23, Shape<3>{2, 3, 4}) == Shape<3>{1, 2, 3});
  const Shape<3> s{3, 5, 2};
  for (index_t i = 0; i < numel(s); ++i) CHECK(ravel(unravel(i, s), s) == i);
  CHECK(fmt::format("{}", Shape<2>{9, 7}) == "[9, 7]");
}

TEST_CASE("device tags", "[core][device]") {
  static_assert(Device::cpu().is_cpu() && Device::cuda(1).is_cuda() && Device::cuda(1).index == 1);
  static_assert(tag::cpu::kind == DeviceKind::cpu && tag::cuda::kind == DeviceKind::cuda);
  CHECK(fmt::format("{}", Device::cpu()) == "cpu");
  CHECK(fmt::format("{}", Device::cuda(2)) == "cuda:2");
  CHECK(Device::cuda(0) == Device::cuda());
  CHECK_FALSE(Device::cuda(0) == Device::cuda(1));
  if (!cuda_compiled()) CHECK(cuda_device_count() == 0);
}

}  // namespace st_core_test_error
