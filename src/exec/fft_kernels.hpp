#pragma once
// The fft kernel family's interface (private): src/exec/fft_cpu.cpp (DeviceKind::cpu, FFTW3) and
// src/cuda/fft_cuda.cpp (DeviceKind::cuda, cuFFT).
// The front has checked the geometry, dtypes, shapes and device; blocks are contiguous.
#include "shardtensor/exec/fft.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct FftKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::fft;
  virtual ~FftKernels() = default;
  /// `real` is the precision (f32 or f64); in/out as the front documents (out unscaled when
  /// g.scale == 1, else multiplied by it).
  virtual void fft(DType real, const FftGeometry& g, const void* in, void* out, ExecContext& ctx) const = 0;
};

}  // namespace shard::exec
