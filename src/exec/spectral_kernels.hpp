#pragma once
// The spectral kernel family's interface (private): src/exec/spectral_cpu.cpp (DeviceKind::cpu)
// and src/cuda/spectral_cuda.cpp. The front has checked dtypes, shapes, devices; blocks are
// contiguous; `real` is the precision (f32 for c64, f64 for c128).
#include "shardtensor/exec/spectral.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct SpectralKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::spectral;
  virtual ~SpectralKernels() = default;
  virtual void forward(DType real, const SpectralGeometry& g, const void* x, const void* w, void* y,
                       ExecContext& ctx) const = 0;
  /// gx / gw may be null (not wanted).
  virtual void backward(DType real, const SpectralGeometry& g, const void* x, const void* w, const void* gy, void* gx,
                        void* gw, ExecContext& ctx) const = 0;
};

}  // namespace shard::exec
