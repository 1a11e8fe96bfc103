// isa_lane LEVEL PROGRAM [ARGS...]: runs PROGRAM with SHARDTENSOR_CPU_ISA=LEVEL, so ctest can run
// the kernel-family tests once per ISA level (scalar, avx2, avx512) on one machine. When the CPU
// does not support LEVEL the lane would only repeat a lower one, and when LEVEL is the CPU's best
// level the default test runs already use it: then it prints why and exits 77, which ctest
// reports as "Skipped" (SKIP_RETURN_CODE), not as passed.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "shardtensor/core/cpu_isa.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: isa_lane scalar|avx2|avx512 PROGRAM [ARGS...]\n");
    return 2;
  }
  shard::CpuIsa want{};
  try {
    want = shard::parse_cpu_isa(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  const shard::CpuIsa have = shard::cpu_isa_supported();
  const std::string cpu = shard::cpu_model_name();
  if (want > have) {
    std::printf("isa_lane: skipped: the %s lane needs a CPU with %s; this one (%s) supports %s\n", argv[1], argv[1],
                cpu.c_str(), shard::to_string(have));
    return 77;
  }
  if (want == have && std::getenv("SHARDTENSOR_ISA_LANE_FORCE") == nullptr) {
    std::printf("isa_lane: skipped: %s is this CPU's (%s) best level, which the default test runs use\n", argv[1],
                cpu.c_str());
    return 77;
  }
  std::printf("isa_lane: SHARDTENSOR_CPU_ISA=%s on %s (supports %s)\n", argv[1], cpu.c_str(), shard::to_string(have));
  std::fflush(stdout);
  setenv("SHARDTENSOR_CPU_ISA", argv[1], 1);
  execvp(argv[2], argv + 2);
  std::perror("isa_lane: exec");
  return 127;
}
