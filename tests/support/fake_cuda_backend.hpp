#pragma once
// FakeCudaBackend: makes DeviceKind::cuda usable on a machine without a GPU, for tests of the
// device paths (dist/, comm, whole models). It registers, for the scope of the object:
//   * the FakeDeviceRuntime (tests/comm/fake_device_runtime.hpp) as the CUDA runtime: "device"
//     memory is host memory, copies are counted by direction;
//   * for DeviceKind::cuda, the CPU tables of the kernel families box, tensor, pointwise, reduce,
//     norm, pool, resize, conv, gemm and optim, so every op on a Device::cuda(0) tensor runs the
//     CPU kernels on that (host) memory.
// The destructor restores whatever was registered before (a real CUDA backend, if linked).
// Usage:
//   shard::test::FakeCudaBackend fake;
//   auto x = ...to(Device::cuda(0));  ... fake.counts().d2h ...
#include <array>

#include "../comm/fake_device_runtime.hpp"
#include "exec/registry.hpp"

namespace shard::test {

/// Registers the fake CUDA runtime and the CPU kernel tables for DeviceKind::cuda for a scope.
class FakeCudaBackend {
 public:
  /// The kernel families that get their CPU table registered for DeviceKind::cuda.
  static constexpr std::array<exec::KernelFamily, 10> kFamilies = {
      exec::KernelFamily::box,    exec::KernelFamily::tensor, exec::KernelFamily::pointwise,
      exec::KernelFamily::reduce, exec::KernelFamily::norm,   exec::KernelFamily::pool,
      exec::KernelFamily::resize, exec::KernelFamily::conv,   exec::KernelFamily::gemm,
      exec::KernelFamily::optim};

  FakeCudaBackend() {
    for (std::size_t i = 0; i < kFamilies.size(); ++i) {
      prev_[i] = exec::find_family(DeviceKind::cuda, kFamilies[i]);
      exec::register_family(DeviceKind::cuda, kFamilies[i], exec::find_family(DeviceKind::cpu, kFamilies[i]));
    }
  }
  ~FakeCudaBackend() {
    for (std::size_t i = 0; i < kFamilies.size(); ++i) exec::register_family(DeviceKind::cuda, kFamilies[i], prev_[i]);
  }
  FakeCudaBackend(const FakeCudaBackend&) = delete;
  FakeCudaBackend& operator=(const FakeCudaBackend&) = delete;

  /// Copy/sync counters of the fake runtime (reset when the backend was registered).
  const FakeDeviceRuntime::Counts& counts() const { return runtime_.counts(); }
  /// Resets the counters (e.g. after setting up inputs, before the operation under test).
  void reset_counts() const { fake_runtime().n = FakeDeviceRuntime::Counts{}; }

 private:
  FakeCudaScope runtime_;  // registered first, restored last
  std::array<const void*, kFamilies.size()> prev_{};
};

}  // namespace shard::test
