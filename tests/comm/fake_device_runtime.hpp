#pragma once
// FakeDeviceRuntime: a DeviceRuntime for DeviceKind::cuda that treats host memory as "device"
// memory and counts what the communicators ask of it (staging copies by direction, pinned
// allocations, stream synchronisations). Registering it lets the device paths of SelfComm and
// MpiComm (direct and staged) run on a machine without a GPU. FakeCudaScope registers it for a
// scope and restores whatever was registered before.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/device_runtime.hpp"

namespace shard::test {

/// Host-memory "device" runtime with counters.
struct FakeDeviceRuntime final : exec::DeviceRuntime {
  struct Counts {
    int h2d = 0, d2h = 0, d2d = 0, h2h = 0;  ///< copies by direction
    std::size_t h2d_bytes = 0, d2h_bytes = 0;
    int pinned_allocs = 0, pinned_frees = 0;
    int syncs = 0;  ///< stream synchronisations
    int captures = 0, ended = 0, launches = 0, destroyed = 0;  ///< graph calls (with `graphs` on)
  };
  /// Graph support for CapturedStep's orchestration tests: off by default (supports_graphs()
  /// false). On, a "capture" runs the captured work at once like every fake kernel (a real
  /// graph records it instead), launch_graph only counts, and `invalidate` makes end_capture
  /// fail the way an invalidated capture does.
  mutable bool graphs = false, invalidate = false;
  mutable bool capturing = false;
  mutable Counts n;
  /// The UUID device_uuid() reports (ranks that set the same one "share a GPU").
  mutable std::string uuid = "fake-gpu-0";
  void reset() const {
    n = Counts{};
    uuid = "fake-gpu-0";
    graphs = invalidate = capturing = false;
  }

  int device_count() const noexcept override { return 1; }
  void check_device(int device, const char* op) const override {
    SHARD_CHECK(device == 0, op, "fake runtime: device {} out of range", device);
  }
  void* allocate(std::size_t bytes, int) const override { return std::malloc(bytes ? bytes : 1); }
  void deallocate(void* p, int) const noexcept override { std::free(p); }
  void* allocate_pinned(std::size_t bytes) const override {
    ++n.pinned_allocs;
    return std::malloc(bytes ? bytes : 1);
  }
  void deallocate_pinned(void* p) const noexcept override {
    ++n.pinned_frees;
    std::free(p);
  }
  void copy(void* dst, Device dd, const void* src, Device sd, std::size_t bytes, Stream, bool) const override {
    if (dd.is_cuda() && sd.is_cpu()) ++n.h2d, n.h2d_bytes += bytes;
    else if (dd.is_cpu() && sd.is_cuda()) ++n.d2h, n.d2h_bytes += bytes;
    else if (dd.is_cuda()) ++n.d2d;
    else ++n.h2h;
    std::memmove(dst, src, bytes);
  }
  void memset(void* dst, int value, std::size_t bytes, int, Stream) const override { std::memset(dst, value, bytes); }
  Stream create_stream(int) const override { return {}; }
  void destroy_stream(Stream, int) const noexcept override {}
  void synchronize(Stream, int) const override { ++n.syncs; }
  void* create_event(int) const override { return nullptr; }
  void destroy_event(void*) const noexcept override {}
  void record_event(void*, Stream, int) const override {}
  void wait_event(Stream, void*, int) const override {}
  void synchronize_event(void*) const override {}
  bool query_event(void*) const override { return true; }
  void device_uuid(int, char out[64]) const override { std::snprintf(out, 64, "%s", uuid.c_str()); }

  bool supports_graphs() const noexcept override { return graphs; }
  void* begin_capture(Stream, int) const override {
    SHARD_CHECK(graphs && !capturing, "begin_capture", "fake runtime: graphs off or already capturing");
    ++n.captures;
    capturing = true;
    return new int(0);
  }
  void end_capture(void* g) const override {
    SHARD_CHECK(g && capturing, "end_capture", "fake runtime: no capture");
    capturing = false;
    ++n.ended;
    *static_cast<int*>(g) = 1;
    SHARD_CHECK(!invalidate, "end_capture", "fake runtime: the capture was invalidated");
  }
  void launch_graph(void* g) const override {
    SHARD_CHECK(g && *static_cast<int*>(g) == 1, "launch_graph", "fake runtime: not an instantiated graph");
    ++n.launches;
  }
  void destroy_graph(void* g) const noexcept override {
    capturing = false;
    ++n.destroyed;
    delete static_cast<int*>(g);
  }
  bool is_capturing(Stream, int) const override { return capturing; }
};

/// The process's fake runtime (static lifetime: pools that cached a pointer to it stay valid).
inline const FakeDeviceRuntime& fake_runtime() {
  static const FakeDeviceRuntime rt;
  return rt;
}

/// Registers fake_runtime() as the CUDA runtime for a scope, restoring the previous one after.
class FakeCudaScope {
 public:
  FakeCudaScope() : prev_(exec::find_family(DeviceKind::cuda, exec::KernelFamily::runtime)) {
    exec::register_family(DeviceKind::cuda, exec::KernelFamily::runtime, &fake_runtime());
    fake_runtime().reset();
  }
  ~FakeCudaScope() { exec::register_family(DeviceKind::cuda, exec::KernelFamily::runtime, prev_); }
  FakeCudaScope(const FakeCudaScope&) = delete;
  FakeCudaScope& operator=(const FakeCudaScope&) = delete;
  const FakeDeviceRuntime::Counts& counts() const { return fake_runtime().n; }

 private:
  const void* prev_;
};

}  // namespace shard::test
