// The one CPU ISA detector (core/cpu_isa.hpp): parsing, the cap at the CPU's level, and that the
// level in effect is the one SHARDTENSOR_CPU_ISA asks for (the ISA lanes of ctest run this file
// under scalar and avx2, so a lane that did not take effect fails here).
#include <catch2/catch_test_macros.hpp>

#include <cstdlib>
#include <fstream>
#include <string>

#include "shardtensor/core/cpu_isa.hpp"
#include "shardtensor/core/error.hpp"

namespace st_core_test_cpu_isa {

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

TEST_CASE("cpu_bf16 parses the three units and refuses anything else", "[core][isa]") {
  CHECK(parse_cpu_bf16("widened") == CpuBf16::widened);
  CHECK(parse_cpu_bf16("avx512bf16") == CpuBf16::avx512_bf16);
  CHECK(parse_cpu_bf16("amx") == CpuBf16::amx);
  CHECK(std::string(to_string(CpuBf16::avx512_bf16)) == "avx512bf16");
  for (const char* bad : {"", "AMX", "avx512_bf16", "bf16", "none"}) {
    INFO(bad);
    try {
      parse_cpu_bf16(bad);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("SHARDTENSOR_CPU_BF16") != std::string::npos);
      CHECK(std::string(e.what()).find("widened, avx512bf16, amx") != std::string::npos);
    }
  }
}

TEST_CASE("cpu_bf16 is the requested unit capped at the CPU's, else the automatic choice", "[core][isa]") {
  const CpuBf16 hw = cpu_bf16_supported(), now = cpu_bf16();
  INFO("CPU " << cpu_model_name() << " supports " << to_string(hw) << ", in effect " << to_string(now));
  CHECK(now <= hw);
  if (cpu_isa() != CpuIsa::avx512) CHECK(hw == CpuBf16::widened);  // the bf16 units need the avx512 level
  CHECK((hw == CpuBf16::amx) == cpu_has_amx_bf16());
  const char* env = std::getenv("SHARDTENSOR_CPU_BF16");
  if (env != nullptr && *env != '\0' && std::string(env) != "auto") {
    const CpuBf16 want = parse_cpu_bf16(env);
    CHECK(now == (want < hw ? want : hw));
  } else if (hw == CpuBf16::avx512_bf16) {
    // vdpbf16ps on AMD (twice the f32 FMA flops on Zen 4), the widened kernels elsewhere
    std::ifstream info("/proc/cpuinfo");
    std::string line;
    bool amd = false;
    while (std::getline(info, line))
      if (line.rfind("vendor_id", 0) == 0) {
        amd = line.find("AuthenticAMD") != std::string::npos;
        break;
      }
    CHECK(now == (amd ? CpuBf16::avx512_bf16 : CpuBf16::widened));
  } else {
    CHECK(now == hw);
  }
}

}  // namespace st_core_test_cpu_isa
