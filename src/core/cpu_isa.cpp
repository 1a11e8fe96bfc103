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

CpuBf16 cpu_bf16_supported() {
  if (cpu_has_amx_bf16()) return CpuBf16::amx;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__)
  static const bool dot = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
    return ((a >> 5) & 1u) != 0;  // CPUID.(7,1):EAX[5] AVX512_BF16
  }();
  if (dot && cpu_isa() == CpuIsa::avx512) return CpuBf16::avx512_bf16;
#endif
  return CpuBf16::widened;
}

namespace {
bool cpu_is_amd() {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
#else
  return false;
#endif
}
}  // namespace

CpuBf16 cpu_bf16() {
  static const CpuBf16 unit = [] {
    const CpuBf16 hw = cpu_bf16_supported();
    const char* env = std::getenv("SHARDTENSOR_CPU_BF16");
    if (env == nullptr || *env == '\0' || std::string(env) == "auto") {
      if (hw == CpuBf16::avx512_bf16 && !cpu_is_amd()) return CpuBf16::widened;
      return hw;
    }
    const CpuBf16 want = parse_cpu_bf16(env);
    return want < hw ? want : hw;
  }();
  return unit;
}

CpuBf16 parse_cpu_bf16(const std::string& name) {
  if (name == "widened") return CpuBf16::widened;
  if (name == "avx512bf16") return CpuBf16::avx512_bf16;
  if (name == "amx") return CpuBf16::amx;
  SHARD_FAIL("cpu_bf16", "SHARDTENSOR_CPU_BF16='{}' is not one of auto, widened, avx512bf16, amx", name);
}

const char* to_string(CpuBf16 unit) noexcept {
  switch (unit) {
    case CpuBf16::widened: return "widened";
    case CpuBf16::avx512_bf16: return "avx512bf16";
    case CpuBf16::amx: return "amx";
  }
  return "?";
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
