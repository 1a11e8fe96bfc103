// The one CPU ISA detector (core/cpu_isa.hpp): parsing, the cap at the CPU's level, and that the
// level in effect is the one SHARDTENSOR_CPU_ISA asks for (the ISA lanes of ctest run this file
// under scalar and avx2, so a lane that did not take effect fails here).
#include <catch2/catch_test_macros.hpp>

#include <cstdlib>
#include <string>

#include "shardtensor/core/cpu_isa.hpp"
#include "shardtensor/core/error.hpp"

using namespace shard;

TEST_CASE("cpu_isa parses the three levels and refuses anything else", "[core][isa]") {
  CHECK(parse_cpu_isa("scalar") == CpuIsa::scalar);
  CHECK(parse_cpu_isa("avx2") == CpuIsa::avx2);
  CHECK(parse_cpu_isa("avx512") == CpuIsa::avx512);
  CHECK(std::string(to_string(CpuIsa::avx2)) == "avx2");
  CHECK(fmt::format("{}", CpuIsa::avx512) == "avx512");
  for (const char* bad : {"", "AVX2", "sse4", "avx512f", "avx-512"}) {
    INFO(bad);
    try {
      parse_cpu_isa(bad);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("SHARDTENSOR_CPU_ISA") != std::string::npos);
      CHECK(std::string(e.what()).find("scalar, avx2, avx512") != std::string::npos);
    }
  }
}

TEST_CASE("cpu_isa is the requested level capped at the CPU's", "[core][isa]") {
  const CpuIsa hw = cpu_isa_supported();
  const CpuIsa now = cpu_isa();
  INFO("CPU " << cpu_model_name() << " supports " << to_string(hw) << ", in effect " << to_string(now));
  CHECK(now <= hw);
  const char* env = std::getenv("SHARDTENSOR_CPU_ISA");
  if (env != nullptr && *env != '\0') {
    const CpuIsa want = parse_cpu_isa(env);
    CHECK(cpu_isa_overridden());
    CHECK(now == (want < hw ? want : hw));
  } else {
    CHECK_FALSE(cpu_isa_overridden());
    CHECK(now == hw);
  }
  CHECK(!cpu_model_name().empty());
}
