// The host block cache behind allocate_bytes (src/runtime/memory.cpp): large freed blocks are
// reused for requests of the same size, never while still owned, and are not counted as in use.
#include <catch2/catch_test_macros.hpp>

#include <cstdlib>
#include <shardtensor/shardtensor.hpp>

namespace st_tensor_test_host_cache {

using namespace shard;

TEST_CASE("large host blocks are recycled through the cache", "[tensor][memory]") {
  if (const char* e = std::getenv("SHARDTENSOR_HOST_CACHE_MB"); e && std::atoll(e) < 16)
    SKIP("host block cache limited by SHARDTENSOR_HOST_CACHE_MB=" << e);
  release_cached_memory();
  REQUIRE(memory_stats().cached_bytes == 0);
  const Shape<1> big{1 << 20};  // 4 MiB of floats: above the 1 MiB caching threshold
  const std::size_t bytes = std::size_t{4} << 20;
  const auto base = memory_stats().current_bytes;
  float* first = nullptr;
  {
    auto t = Tensor<float, 1>::full(big, 3.f);
    first = t.data();
    CHECK(memory_stats().current_bytes == base + bytes);
  }
  // Freed: no longer in use, parked in the cache.
  CHECK(memory_stats().current_bytes == base);
  CHECK(memory_stats().cached_bytes == bytes);
  {
    // The same size takes the parked block (no new pages); a second live tensor gets another one.
    auto a = Tensor<float, 1>::zeros(big);
    auto b = Tensor<float, 1>::full(big, 2.f);
    CHECK(a.data() == first);
    CHECK(b.data() != a.data());
    CHECK(memory_stats().cached_bytes == 0);
    CHECK(memory_stats().current_bytes == base + 2 * bytes);
    CHECK(a(12345) == 0.f);  // fill semantics are unaffected by reuse
    CHECK(b(12345) == 2.f);
  }
  CHECK(memory_stats().cached_bytes == 2 * bytes);
  // A much smaller large request does not take a much bigger block.
  {
    auto c = Tensor<float, 1>::empty({1 << 19});
    CHECK(c.data() != first);
  }
  release_cached_memory();
  CHECK(memory_stats().cached_bytes == 0);
  CHECK(memory_stats().current_bytes == base);
}

TEST_CASE("small host blocks bypass the cache", "[tensor][memory]") {
  release_cached_memory();
  { auto t = Tensor<double, 2>::zeros({64, 64}); }  // 32 KiB
  CHECK(memory_stats().cached_bytes == 0);
}

}  // namespace st_tensor_test_host_cache
