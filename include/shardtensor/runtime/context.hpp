#pragma once
/// \file context.hpp
/// Execution context: the device an op runs on, the stream its kernels and communication are
/// ordered on, a reusable workspace, and the per-context settings that replace process-global
/// knobs. Ops take a context explicitly or use the calling thread's current one for the device of
/// their operands (`current_context(dev)`).
#include <cstddef>
#include <memory>

#include "shardtensor/core/device.hpp"

namespace shard {

/// An opaque device stream (a `cudaStream_t` for CUDA; null = the device's default stream; always
/// null on the host, where work is synchronous).
struct Stream {
  void* handle = nullptr;
  friend constexpr bool operator==(const Stream&, const Stream&) = default;
};

/// Which halo transport conv-like stencil ops use (see dist/halo.hpp). `automatic` lets the
/// halo plan choose (thin faces when one dim needs ghosts, else the whole extended block).
enum class HaloTransport : unsigned char { automatic, thin, whole_block };

/// CPU conv kernel choice (nn/functional/conv_options.hpp, exec/conv.hpp): `automatic` takes the direct SIMD path (implicit GEMM
/// on a zero-padded input block per tile, AVX-512 or AVX2 micro-kernels) for every stride-1
/// gather and im2col + BLAS for the rest; `direct_avx2` forces the AVX2 micro-kernels even on an
/// AVX-512 CPU (tests, comparisons); `im2col_blas` always uses im2col + BLAS.
enum class ConvKernel : unsigned char { automatic, direct_avx2, im2col_blas };

/// How the CPU conv kernels use the cores: OpenMP over tiles with 1-thread BLAS (default, faster
/// on the reference machine), or a serial tile loop that lets BLAS thread (the direct path, which
/// does not call BLAS, then runs on one thread). Inside an OpenMP parallel region always serial.
enum class ConvThreading : unsigned char { tiles, blas };

/// The default of ExecSettings::check_collectives: true when the environment variable
/// SHARDTENSOR_CHECK_COLLECTIVES is set to anything but "" or "0" (read once per process).
bool collective_checks_default() noexcept;

/// Settings carried by a context. Defaults are the measured-best choices; tests and benchmarks
/// change them per context instead of through process-global switches.
struct ExecSettings {
  /// Use only deterministic algorithms (cuDNN conv: deterministic backward algorithms; no atomics).
  bool deterministic = false;
  /// Allow TF32 tensor-core math for fp32 GEMM/conv on CUDA (off: results comparable to CPU fp32).
  bool allow_tf32 = false;
  /// Overlap halo communication with interior compute in stencil ops.
  bool overlap_halo = true;
  /// Halo transport for stencil ops.
  HaloTransport halo_transport = HaloTransport::automatic;
  /// Bytes per slice of the sliced halo adjoint (bounds conv backward's extra memory).
  std::size_t halo_chunk_bytes = std::size_t{2} << 20;
  /// Working-set budget per thread of the CPU conv engine in bytes (4 KiB .. 32 MiB): the column
  /// buffer of one im2col tile, or the padded input block plus output tile of one direct tile.
  std::size_t conv_column_budget = std::size_t{1} << 20;
  /// CPU conv kernel choice.
  ConvKernel conv_kernel = ConvKernel::automatic;
  /// bf16 / f16 storage on the CPU takes the native paths where they exist: stride-1 bf16 conv on
  /// the CPU's bf16 unit (cpu_bf16(): AMX tiles or AVX-512 BF16; exact products summed in f32),
  /// and channel mixing (linear over the channel dim of a field) as a 1 x 1 conv that reads the
  /// storage dtype in place. Within bf16 / f16 rounding of the f32 result, not bit-identical to it.
  /// On CUDA, bf16 / f16 attention runs on cuDNN's fused attention or our tensor-core kernels,
  /// which round the probabilities and dS to the storage type as FlashAttention does.
  /// false: every bf16 / f16 op is f32 on the widened values, rounded once (bit-identical
  /// emulation; the stride-1 conv still widens tile by tile, which is bit-identical; CUDA
  /// attention takes its SIMT kernels in the storage type, within one ulp of the f32 route).
  bool native_low_precision = true;
  /// CPU conv threading policy.
  ConvThreading conv_threading = ConvThreading::tiles;
  /// Collective watchdog timeout in seconds for communication calls made with this context
  /// (see Communicator::timeout()): < 0 = the communicator's own setting (default; from
  /// SHARDTENSOR_COMM_TIMEOUT or set_timeout), 0 = off, > 0 = this many seconds.
  double comm_timeout = -1.0;
  /// Collective consistency checking (debug mode, dist/consistency.hpp): every library entry point
  /// that communicates first agrees a fingerprint of its call (op, dtype, shapes, placements, mesh,
  /// parameters, sequence number) over its communicator and throws shard::Error on every rank when
  /// the ranks disagree, instead of hanging. Default from SHARDTENSOR_CHECK_COLLECTIVES; must be
  /// the same on every rank. Off, it costs one branch per entry point.
  bool check_collectives = collective_checks_default();
};

/// Device + stream + workspace + settings. Not copyable (it owns its workspace); cheap to create.
class ExecContext {
 public:
  explicit ExecContext(Device dev = Device::cpu(), Stream stream = {}) : device_(dev), stream_(stream) {}
  ExecContext(const ExecContext&) = delete;
  ExecContext& operator=(const ExecContext&) = delete;
  ~ExecContext();

  Device device() const { return device_; }
  Stream stream() const { return stream_; }
  ExecSettings& settings() { return settings_; }
  const ExecSettings& settings() const { return settings_; }

  /// Scratch memory of at least `bytes` on the context's device. The same buffer is returned
  /// until a larger request replaces it, so a pointer is valid until the next workspace() call
  /// on this context; work using it must be ordered on this context's stream.
  void* workspace(std::size_t bytes);
  /// Bytes currently held as workspace.
  std::size_t workspace_bytes() const { return ws_bytes_; }
  /// Waits until all work queued on this context's stream has finished (no-op on the host).
  void synchronize() const;

 private:
  Device device_;
  Stream stream_;
  ExecSettings settings_{};
  std::shared_ptr<void> ws_;
  std::size_t ws_bytes_ = 0;
};

/// The calling thread's current context for `dev` (created on first use: default stream,
/// default settings). A ContextGuard replaces it for a scope.
ExecContext& current_context(Device dev = Device::cpu());

/// Makes `ctx` the calling thread's current context for `ctx.device()` until destroyed.
class ContextGuard {
 public:
  explicit ContextGuard(ExecContext& ctx);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  Device dev_;
  ExecContext* prev_;
};

}  // namespace shard
