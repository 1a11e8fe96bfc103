#pragma once
// The optim kernel family's interface (private): src/exec/optim_cpu.cpp (DeviceKind::cpu) and
// src/cuda/optim_cuda.cpp (DeviceKind::cuda). Pointers are contiguous, n elements, one device.
#include "shardtensor/exec/optim.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct OptimKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::optim;
  virtual ~OptimKernels() = default;
  /// buf may be null (momentum 0).
  virtual void sgd(DType dt, index_t n, void* w, const void* g, void* buf, const SgdParams& p,
                   ExecContext& ctx) const = 0;
  virtual void adam(DType dt, index_t n, void* w, const void* g, double* m, double* v, const AdamParams& p,
                    ExecContext& ctx) const = 0;
};


/// Defined in src/cuda/optim_cuda.cpp (shardtensor::cuda) next to the static registrar of the CUDA
/// table: the CUDA library's registration unit calls it so a static link keeps that file.
void cuda_link_optim() noexcept;

}  // namespace shard::exec
