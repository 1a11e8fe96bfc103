#pragma once
/// \file registry.hpp
/// The device-backend registry of the runtime layer. Public (namespace shard::exec) because the
/// layers above it (exec's families, comm's device-communicator factory) and the CUDA backend all
/// register or look up tables through it; users need it only to plug in a backend of their own.
//
// Every kernel family has one interface (an abstract struct with a static `id`), a CPU
// implementation compiled into libshardtensor, and a CUDA implementation compiled into
// shardtensor::cuda, which registers its tables when it is linked (static registrar objects in
// src/cuda/*.cpp; programs that link shardtensor::cuda link it --no-as-needed, so it is always
// loaded, see src/cuda/register.cpp). The core
// library never links cudart: a CPU-only program that consumes a CUDA-enabled install needs
// neither the toolkit nor libcudart.
//
// Dispatch: `kernels_for<PointwiseKernels>(x.device, "add")` returns the table for the device's
// kind, or throws shard::Error naming the op and the device when no backend for it is linked.
#include "shardtensor/core/device.hpp"

namespace shard::exec {

/// The kernel families (and the device runtime) a backend provides, one table each.
enum class KernelFamily : int {
  runtime,    ///< DeviceRuntime: memory, copies, streams, events, pinned host memory
  box,        ///< strided-box copy/add/fill/zero
  pointwise,  ///< pointwise arithmetic and activations (forward and backward)
  reduce,     ///< reductions and losses
  norm,       ///< norm statistics, apply, backward
  pool,       ///< pooling forward/backward
  resize,     ///< upsampling forward/backward
  conv,       ///< convolution forward, backward-data, backward-filter (incl. transposed)
  gemm,       ///< GEMM
  optim,      ///< optimizer updates
  comm,       ///< device communicator factory (NCCL)
  attention,  ///< local attention forward / backward / lse merge
  fft,        ///< local FFTs (CPU: FFTW3; CUDA: cuFFT)
  tensor,     ///< TensorDeviceKernels: Tensor's own device entry points (strided copy, fill, axpby, mul, sum)
  nbhd_attention,  ///< neighbourhood (windowed) attention forward/backward
  spectral,   ///< per-mode channel mixing of a spectrum (the FNO multiply)
  neighbors,  ///< local kNN / radius point search and neighbour-list merge
  rows,       ///< gather rows by index / scatter-add rows (sparse exchanges, neighbour gathers)
  points,     ///< point-cloud per-entry maths on neighbour lists, point <-> grid scatter / interpolation
  count_
};

/// Registers `table` (an object of the family's interface type, with static lifetime) for
/// `kind`. Called by backends at load time; a later registration replaces an earlier one.
void register_family(DeviceKind kind, KernelFamily family, const void* table) noexcept;

/// The registered table, or null.
const void* find_family(DeviceKind kind, KernelFamily family) noexcept;

/// The registered table; throws shard::Error naming `op` and `dev` when none is registered.
const void* require_family(Device dev, KernelFamily family, const char* op);

/// Typed lookup: `kernels_for<BoxKernels>(dev, "copy")`.
template <class Family>
const Family& kernels_for(Device dev, const char* op) {
  return *static_cast<const Family*>(require_family(dev, Family::id, op));
}

/// One way for every family to register its CPU table and keep it linked in a static link
/// (`<family>` is the KernelFamily enumerator, e.g. conv, pool, nbhd_attention):
///  - src/exec/<family>_cpu.cpp, in namespace shard::exec, after the table object:
///      SHARD_CPU_TABLE(<family>, table);
///    registers `table` for DeviceKind::cpu at load time and defines `<family>_cpu_anchor`;
///  - src/exec/<family>.cpp (the front), in namespace shard::exec:
///      SHARD_KEEP_CPU_TABLE(<family>);
///    an external definition whose initialiser references the anchor, so wherever the front is
///    linked the CPU file (and its registration) is linked too.
#define SHARD_CPU_TABLE(family, table)       \
  extern const int family##_cpu_anchor;      \
  const int family##_cpu_anchor =            \
      (::shard::exec::register_family(::shard::DeviceKind::cpu, ::shard::exec::KernelFamily::family, &(table)), 1)
#define SHARD_KEEP_CPU_TABLE(family)         \
  extern const int family##_cpu_anchor;      \
  extern const int* const family##_cpu_keep; \
  const int* const family##_cpu_keep = &family##_cpu_anchor

/// True when a backend for `kind` registered its runtime (CPU: always).
inline bool backend_available(DeviceKind kind) noexcept {
  return kind == DeviceKind::cpu || find_family(kind, KernelFamily::runtime) != nullptr;
}

}  // namespace shard::exec
