// The one CPU ISA detector (core/cpu_isa.hpp).
#include "shardtensor/core/cpu_isa.hpp"

#include <cstdlib>
#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <fstream>

#include "shardtensor/core/error.hpp"

namespace shard {

CpuIsa cpu_isa_supported() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  static const CpuIsa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      return CpuIsa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::avx2;
    return CpuIsa::scalar;
  }();
  return isa;
#else
  return CpuIsa::scalar;
#endif
}

CpuIsa parse_cpu_isa(const std::string& name) {
  if (name == "scalar") return CpuIsa::scalar;
  if (name == "avx2") return CpuIsa::avx2;
  if (name == "avx512") return CpuIsa::avx512;
  SHARD_FAIL("cpu_isa", "SHARDTENSOR_CPU_ISA='{}' is not one of scalar, avx2, avx512", name);
}

bool cpu_isa_overridden() {
  const char* env = std::getenv("SHARDTENSOR_CPU_ISA");
  return env != nullptr && *env != '\0';
}

CpuIsa cpu_isa() {
  static const CpuIsa isa = [] {
    const CpuIsa hw = cpu_isa_supported();
    if (!cpu_isa_overridden()) return hw;
    const CpuIsa want = parse_cpu_isa(std::getenv("SHARDTENSOR_CPU_ISA"));
    return want < hw ? want : hw;
  }();
  return isa;
}

bool cpu_has_amx_bf16() {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__)
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // asm/prctl.h, the tile data state
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return has && cpu_isa() == CpuIsa::avx512;
#else
  return false;
#endif
}

const char* to_string(CpuIsa isa) noexcept {
  switch (isa) {
    case CpuIsa::scalar: return "scalar";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
  }
  return "?";
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) break;
      auto v = line.substr(colon + 1);
      const auto b = v.find_first_not_of(" \t");
      return b == std::string::npos ? std::string("unknown") : v.substr(b);
    }
  }
  return "unknown";
}

}  // namespace shard
