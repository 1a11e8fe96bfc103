// The host-only part of the CUDA conv table's algorithm choice (src/cuda/conv_algo_select.hpp,
// used by src/cuda/conv_cuda.cpp), on the CPU: the trial workspace a search asks for (free device
// memory + the caching allocator's cached bytes, less a margin, within the user cap), the halving
// after a failed allocation, the cap's parsing, and the choice among timed candidates (fastest
// that succeeded, fits the workspace actually given, deterministic when asked).
#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

// Not an installed header and not under the test binary's include path: reached relative to
// this file (plain C++, no CUDA headers).
#include "../../src/cuda/conv_algo_select.hpp"

namespace st_exec_test_conv_algo_select {

namespace cs = shard::exec::conv_select;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;
cs::Candidate cand(int algo, float ms, std::size_t ws, bool ok = true, bool det = true) {
  return {algo, 0, ws, ms, ok, det};
}
}  // namespace

TEST_CASE("conv algo select: the user cap SHARDTENSOR_CUDNN_WORKSPACE_MIB", "[conv][cuda_logic]") {
  std::string err;
  CHECK_FALSE(cs::parse_workspace_cap_mib(nullptr, &err).has_value());
  CHECK(err.empty());
  CHECK_FALSE(cs::parse_workspace_cap_mib("", &err).has_value());
  CHECK(err.empty());
  CHECK(cs::parse_workspace_cap_mib("0", &err) == std::optional<std::size_t>(0));
  CHECK(cs::parse_workspace_cap_mib("1024", &err) == std::optional<std::size_t>(GiB));
  CHECK(err.empty());
  for (const char* bad : {"-1", "1e3", "12 ", "abc", "0x10", "99999999999999"}) {
    err.clear();
    CHECK_FALSE(cs::parse_workspace_cap_mib(bad, &err).has_value());
    CHECK(err.find("SHARDTENSOR_CUDNN_WORKSPACE_MIB") != std::string::npos);
  }
}

TEST_CASE("conv algo select: the trial workspace is what the allocator can give, within the cap", "[conv][cuda_logic]") {
  // 40 GiB free on the device and 8 GiB cached by the allocator: 48 GiB available, 1/16 kept back.
  const std::size_t avail = 48 * GiB;
  CHECK(cs::search_limit(40 * GiB, 8 * GiB, std::nullopt) == avail - avail / 16);
  // cached blocks count: without them the request would be smaller
  CHECK(cs::search_limit(40 * GiB, 0, std::nullopt) < cs::search_limit(40 * GiB, 8 * GiB, std::nullopt));
  // the cap bounds it; a cap above what is available does not raise it
  CHECK(cs::search_limit(40 * GiB, 8 * GiB, 1 * GiB) == 1 * GiB);
  CHECK(cs::search_limit(40 * GiB, 8 * GiB, 100 * GiB) == avail - avail / 16);
  CHECK(cs::search_limit(40 * GiB, 8 * GiB, 0) == 0);
  // small memory: the 64 MiB floor of the margin, and nothing when that is all there is
  CHECK(cs::search_limit(100 * MiB, 0, std::nullopt) == 36 * MiB);
  CHECK(cs::search_limit(32 * MiB, 16 * MiB, std::nullopt) == 0);
  // the request: the largest workspace an algorithm asks for within the limit
  CHECK(cs::trial_request({0, 64 * MiB, 6 * GiB, 512 * MiB}, 8 * GiB) == 6 * GiB);
  CHECK(cs::trial_request({0, 64 * MiB, 6 * GiB, 512 * MiB}, 1 * GiB) == 512 * MiB);
  CHECK(cs::trial_request({0, 64 * MiB}, 0) == 0);
  CHECK(cs::trial_request({}, 8 * GiB) == 0);
  // a failed allocation halves the request down to 1 MiB, then asks for none
  CHECK(cs::next_request(8 * GiB) == 4 * GiB);
  CHECK(cs::next_request(2 * MiB) == 1 * MiB);
  CHECK(cs::next_request(1 * MiB) == 0);
  std::size_t want = 3 * GiB + 5;
  int tries = 0;
  while (want > 0 && tries < 100) {
    want = cs::next_request(want);
    ++tries;
  }
  CHECK(want == 0);
  CHECK(tries <= 13);
}

TEST_CASE("conv algo select: the fastest candidate that fits and is allowed", "[conv][cuda_logic]") {
  const std::vector<cs::Candidate> found = {
      cand(0, 5.0f, 0),                        // implicit GEMM: slow, no workspace
      cand(1, 1.0f, 6 * GiB),                  // FFT: fastest, big workspace
      cand(2, 2.0f, 512 * MiB, true, false),   // non-deterministic
      cand(3, 3.0f, 256 * MiB),                // deterministic, modest workspace
      cand(4, 0.5f, 64 * MiB, false),          // failed (status not success): never chosen
  };
  // all the memory the allocator can give: the fastest successful one
  auto c = cs::pick_fastest(found, false, 8 * GiB);
  REQUIRE(c);
  CHECK(c->algo == 1);
  // a cap below its workspace: the fastest that fits
  c = cs::pick_fastest(found, false, 1 * GiB);
  REQUIRE(c);
  CHECK(c->algo == 2);
  // deterministic only
  c = cs::pick_fastest(found, true, 1 * GiB);
  REQUIRE(c);
  CHECK(c->algo == 3);
  // no workspace at all
  c = cs::pick_fastest(found, true, 0);
  REQUIRE(c);
  CHECK(c->algo == 0);
  // nothing qualifies
  CHECK_FALSE(cs::pick_fastest({cand(7, 1.0f, 1 * GiB)}, false, 0).has_value());
  CHECK_FALSE(cs::pick_fastest({cand(7, 1.0f, 0, false)}, false, GiB).has_value());
  CHECK_FALSE(cs::pick_fastest({}, false, GiB).has_value());
  // order does not matter (cuDNN sorts by time, but a candidate list need not be sorted); ties
  // go to the smaller workspace, then to the earlier candidate
  c = cs::pick_fastest({cand(5, 2.0f, 100 * MiB), cand(6, 2.0f, 10 * MiB), cand(8, 3.0f, 0)}, false, GiB);
  REQUIRE(c);
  CHECK(c->algo == 6);
  c = cs::pick_fastest({cand(5, 2.0f, 10 * MiB), cand(6, 2.0f, 10 * MiB)}, false, GiB);
  REQUIRE(c);
  CHECK(c->algo == 5);
}

}  // namespace st_exec_test_conv_algo_select
