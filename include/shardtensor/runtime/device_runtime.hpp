#pragma once
/// \file device_runtime.hpp
/// The device runtime interface of the runtime layer (public: comm's device staging and the CUDA
/// backend use it; users need it only to plug in a backend).
// DeviceRuntime: the services of a device runtime the core library calls through the registry
// (KernelFamily::runtime). shardtensor::cuda implements it with cudart; the core never includes
// a CUDA header. All calls take the device index explicitly and set it themselves.
#include <cstddef>

#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/context.hpp"
#include "shardtensor/runtime/registry.hpp"

namespace shard::exec {

struct DeviceRuntime {
  static constexpr KernelFamily id = KernelFamily::runtime;
  virtual ~DeviceRuntime() = default;

  /// Number of visible devices (0 without a driver or GPU; never throws).
  virtual int device_count() const noexcept = 0;
  /// Throws shard::Error naming `op` unless 0 <= device < device_count().
  virtual void check_device(int device, const char* op) const = 0;

  /// Device memory (throws shard::Error on failure, naming the bytes and the device), ordered on
  /// the device's default stream.
  virtual void* allocate(std::size_t bytes, int device) const = 0;
  virtual void deallocate(void* p, int device) const noexcept = 0;
  /// Stream-ordered device memory: the block is used on `stream` (allocate_on) and was last used
  /// on `stream` (deallocate_on; work of other streams on it must be ordered before that stream's
  /// later work by the caller, e.g. with an event). A caching runtime hands a freed block out again
  /// at once only to the stream it was freed on, and to other streams once that stream's work
  /// queued before the free has completed. The default ignores the stream.
  virtual void* allocate_on(std::size_t bytes, int device, Stream stream) const {
    (void)stream;
    return allocate(bytes, device);
  }
  virtual void deallocate_on(void* p, int device, Stream stream) const noexcept {
    (void)stream;
    deallocate(p, device);
  }
  /// Page-locked host memory for staging.
  virtual void* allocate_pinned(std::size_t bytes) const = 0;
  virtual void deallocate_pinned(void* p) const noexcept = 0;

  /// Copies `bytes` between any two of host / device memory, ordered on `stream` of `device`
  /// (the device side's index). Returns after the copy completes when either side is pageable
  /// host memory or `sync` is set.
  virtual void copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes, Stream stream,
                    bool sync) const = 0;
  /// Sets `bytes` bytes at `dst` to `value` on `stream`.
  virtual void memset(void* dst, int value, std::size_t bytes, int device, Stream stream) const = 0;

  virtual Stream create_stream(int device) const = 0;
  virtual void destroy_stream(Stream s, int device) const noexcept = 0;
  virtual void synchronize(Stream s, int device) const = 0;

  /// Events: an opaque handle recorded on a stream, waited on by the host or by another stream.
  virtual void* create_event(int device) const = 0;
  virtual void destroy_event(void* ev) const noexcept = 0;
  virtual void record_event(void* ev, Stream s, int device) const = 0;
  virtual void wait_event(Stream s, void* ev, int device) const = 0;  ///< stream waits for ev
  virtual void synchronize_event(void* ev) const = 0;                ///< host waits for ev
  virtual bool query_event(void* ev) const = 0;                      ///< true when complete

  /// Timing events for the profiler (runtime/profiler.hpp): an event that records a timestamp, or
  /// null when the runtime cannot time (the default). Destroyed with destroy_event.
  virtual void* create_timing_event(int device) const {
    (void)device;
    return nullptr;
  }
  /// Records a timing event on `s`; false (nothing recorded) while `s` is being captured into a
  /// graph, where a timestamp would belong to the replays.
  virtual bool record_timing_event(void* ev, Stream s, int device) const {
    record_event(ev, s, device);
    return true;
  }
  /// Milliseconds between two completed timing events (negative when unknown).
  virtual float elapsed_ms(void* start, void* stop) const {
    (void)start;
    (void)stop;
    return -1.0f;
  }

  /// Graph capture (optim/captured_step.hpp). Whether the runtime can capture the work queued
  /// on a stream into a graph and replay it (false: the default; CapturedStep then runs eagerly).
  virtual bool supports_graphs() const noexcept { return false; }
  /// Starts capturing the work the calling thread queues on `s` (a stream of create_stream, never
  /// the default stream) into a new graph and returns its handle. Until destroy_graph, device
  /// memory allocated on `s` comes from a private pool of the graph, and blocks freed on `s`
  /// during the capture join that pool: the graph's replays write the same addresses, so none of
  /// them goes back to the shared cache before the graph is destroyed. Work on `s` is recorded,
  /// not run; a host synchronisation, an event query or a default-stream operation inside the
  /// capture fails (shard::Error) and the caller must destroy_graph the handle.
  virtual void* begin_capture(Stream s, int device) const {
    (void)s;
    (void)device;
    SHARD_FAIL("begin_capture", "this device runtime cannot capture graphs");
  }
  /// Ends the capture of `g` and instantiates the graph (throws shard::Error when the capture
  /// was invalidated, naming why; the handle must still be destroyed).
  virtual void end_capture(void* g) const {
    (void)g;
    SHARD_FAIL("end_capture", "this device runtime cannot capture graphs");
  }
  /// Queues one replay of the instantiated graph `g` on the stream it was captured on.
  virtual void launch_graph(void* g) const {
    (void)g;
    SHARD_FAIL("launch_graph", "this device runtime cannot capture graphs");
  }
  /// Waits for the graph's replays, then frees it and returns its pool to the shared cache
  /// (blocks still held by tensors return to it when those are freed). Also ends a capture left
  /// unfinished by an error.
  virtual void destroy_graph(void* g) const noexcept { (void)g; }
  /// Whether `s` is being captured into a graph now.
  virtual bool is_capturing(Stream s, int device) const {
    (void)s;
    (void)device;
    return false;
  }

  /// A stable identifier of the physical GPU behind `device` (its UUID as text), used to detect
  /// ranks that share a GPU (NCCL refuses them).
  virtual void device_uuid(int device, char out[64]) const = 0;

  /// Bytes the runtime's device allocator keeps cached for reuse (freed by shardtensor, not yet
  /// returned to the driver), summed over devices.
  virtual std::size_t cached_bytes() const noexcept { return 0; }
  /// Returns cached device memory to the driver (see release_cached_memory()).
  virtual void release_cached() const noexcept {}
};

/// The stream of the calling thread's current context for `dev` when one has been made current
/// or created (current_context / ContextGuard), else the default stream; never creates a context
/// and never throws (src/runtime/context.cpp). Device memory is allocated and freed on it.
Stream current_stream_if_any(Device dev) noexcept;

/// The CUDA runtime when shardtensor::cuda is linked; throws naming `op` otherwise.
inline const DeviceRuntime& cuda_runtime(const char* op) {
  return kernels_for<DeviceRuntime>(Device::cuda(0), op);
}

}  // namespace shard::exec
