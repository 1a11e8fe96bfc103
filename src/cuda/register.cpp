// The link anchor of shardtensor::cuda. CMake consumers of shardtensor::cuda link with
// --no-as-needed (INTERFACE link option of the target), so libshardtensor_cuda.so is always
// recorded as needed, loaded at start-up, and the static registrars in src/cuda/*.cpp register
// the CUDA device runtime and kernel families with the core's registry (include/shardtensor/runtime/registry.hpp).
// A program linked by hand with --as-needed can keep the library by referencing this symbol
// (e.g. calling it once); it reports whether the backend registered its device runtime.
#include "shardtensor/runtime/registry.hpp"

extern "C" {
/// 1 when the CUDA backend's device runtime is registered (always, once this library is loaded).
int shardtensor_cuda_link_anchor() {
  return shard::exec::find_family(shard::DeviceKind::cuda, shard::exec::KernelFamily::runtime) != nullptr ? 1 : 0;
}
}
