// NVTX ranges for the profiler's scopes (include/shardtensor/runtime/profiler.hpp), installed when
// shardtensor::cuda is loaded. NVTX3 is header-only (the toolkit's nvtx3/nvToolsExt.h; it needs
// dlopen, never libcuda or libcudart), so this file is the only place that includes it and a
// build without CUDA has no NVTX at all.
//
// Every profiled scope (op family/pass, collective, halo exchange, redistribute, ring shift,
// optimiser step, backward walk) pushes a range in the domain "shardtensor" with the message
// "name/pass" ("conv/forward", "allreduce", "halo/adjoint", ...), registered once per site as an
// NVTX string handle. Ranges are pushed while the profiler collects (SHARDTENSOR_PROFILE=1 or a
// shard::Profiler) or when an NVTX tool is attached (Nsight Systems / Compute set
// NVTX_INJECTION64_PATH); SHARDTENSOR_NVTX=1 forces them on, =0 off. Otherwise a scope never
// reaches NVTX (docs/performance.md, "Profiling").
#include <nvtx3/nvToolsExt.h>

#include <cstdlib>
#include <cstring>

#include "shardtensor/runtime/profiler.hpp"

namespace shard::cuda_glue {
namespace {

nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("shardtensor");
  return d;
}

void* name(const char* message) { return nvtxDomainRegisterStringA(domain(), message); }

void push(void* handle) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = static_cast<nvtxStringHandle_t>(handle);
  nvtxDomainRangePushEx(domain(), &a);
}

void pop() { nvtxDomainRangePop(domain()); }

bool tool_attached() {
  if (const char* f = std::getenv("SHARDTENSOR_NVTX"); f && *f) return std::strcmp(f, "0") != 0;
  const char* inj = std::getenv("NVTX_INJECTION64_PATH");
  return inj && *inj;
}

struct Install {
  Install() {
    const char* f = std::getenv("SHARDTENSOR_NVTX");
    if (f && std::strcmp(f, "0") == 0) return;  // no ranges at all
    profile::set_range_hooks(profile::RangeHooks{&name, &push, &pop}, tool_attached());
  }
} install;

}  // namespace
}  // namespace shard::cuda_glue
