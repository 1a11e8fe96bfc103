// exec::DeviceRuntime on cudart, registered for DeviceKind::cuda when shardtensor::cuda is loaded.
//
// Device memory comes from a stream-ordered caching allocator: the device's default memory pool
// (cudaMallocAsync / cudaFreeAsync) with its release threshold raised so freed blocks stay
// cached instead of going back to the driver (cudaMalloc/cudaFree per tensor cost a device
// synchronisation each). Allocation and free are ordered on the legacy default stream, which
// waits for all prior work of every blocking stream on the device and is waited for by later
// work; streams made by create_stream() are blocking, so a block freed while a kernel on any of
// them still reads it is not handed out again before that kernel finishes. Set
// SHARDTENSOR_CUDA_CACHE=0 to use plain cudaMalloc/cudaFree instead (also used when the device
// has no memory-pool support).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <mutex>

#include "exec/device_runtime.hpp"
#include "shardtensor/core/error.hpp"

namespace shard::exec {
namespace {

constexpr int kMaxDevices = 64;

cudaStream_t as_stream(Stream s) { return static_cast<cudaStream_t>(s.handle); }

/// Throws shard::Error naming `op`, the call and the device when `e` is an error (and clears
/// the sticky-free error state so later calls are not poisoned).
void check(cudaError_t e, const char* op, const char* call, int device) {
  if (e == cudaSuccess) [[likely]]
    return;
  cudaGetLastError();
  SHARD_FAIL(op, "{} failed on cuda:{}: {} ({})", call, device, cudaGetErrorString(e), cudaGetErrorName(e));
}

/// Makes `device` current for the scope, restoring the previous one (only calls cudaSetDevice
/// when it differs).
class DeviceScope {
 public:
  DeviceScope(int device, const char* op) {
    check(cudaGetDevice(&prev_), op, "cudaGetDevice", device);
    if (prev_ != device) check(cudaSetDevice(device), op, "cudaSetDevice", device);
    else prev_ = -1;
  }
  ~DeviceScope() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
};

class CudaRuntime final : public DeviceRuntime {
 public:
  int device_count() const noexcept override {
    std::call_once(count_once_, [this] {
      int n = 0;
      const cudaError_t e = cudaGetDeviceCount(&n);
      if (e != cudaSuccess) {
        cudaGetLastError();
        n = 0;
        count_error_ = e;
      }
      count_ = n;
    });
    return count_;
  }

  void check_device(int device, const char* op) const override {
    const int n = device_count();
    if (n == 0) {
      SHARD_FAIL(op, "device cuda:{} requested but no CUDA device is visible ({}; CUDA_VISIBLE_DEVICES={})", device,
                 count_error_ == cudaSuccess ? "cudaGetDeviceCount returned 0" : cudaGetErrorString(count_error_),
                 visible_devices());
    }
    SHARD_CHECK(device >= 0 && device < n, op,
                "device index cuda:{} is beyond the {} visible GPU(s) (valid: cuda:0..cuda:{}; CUDA_VISIBLE_DEVICES={})",
                device, n, n - 1, visible_devices());
  }

  void* allocate(std::size_t bytes, int device) const override {
    check_device(device, "allocate");
    DeviceScope scope(device, "allocate");
    void* p = nullptr;
    cudaError_t e;
    if (use_pool(device)) {
      e = cudaMallocAsync(&p, bytes, cudaStreamLegacy);
      if (e == cudaErrorMemoryAllocation) {
        // Out of memory with blocks parked in the pool: return them and try once more.
        cudaGetLastError();
        cudaDeviceSynchronize();
        trim(device);
        e = cudaMallocAsync(&p, bytes, cudaStreamLegacy);
      }
    } else {
      e = cudaMalloc(&p, bytes);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      SHARD_FAIL("allocate", "cannot allocate {} bytes on cuda:{}: {} (device free {} of {} bytes)", bytes, device,
                 cudaGetErrorString(e), free_b, total_b);
    }
    return p;
  }

  void deallocate(void* p, int device) const noexcept override {
    if (!p) return;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) {  // runtime already torn down (process exit)
      cudaGetLastError();
      return;
    }
    if (prev != device) cudaSetDevice(device);
    const cudaError_t e = use_pool(device) ? cudaFreeAsync(p, cudaStreamLegacy) : cudaFree(p);
    if (e != cudaSuccess) cudaGetLastError();  // e.g. cudaErrorCudartUnloading at exit
    if (prev != device) cudaSetDevice(prev);
  }

  void* allocate_pinned(std::size_t bytes) const override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
      SHARD_FAIL("allocate_pinned", "cannot allocate {} bytes of pinned host memory: {}", bytes, cudaGetErrorString(e));
    }
    return p;
  }
  void deallocate_pinned(void* p) const noexcept override {
    if (p && cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
  }

  void copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes, Stream stream,
            bool sync) const override {
    if (bytes == 0) return;
    const int device = dst_dev.is_cuda() ? dst_dev.index : src_dev.index;
    DeviceScope scope(device, "copy");
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)), "copy", "cudaMemcpyAsync", device);
    // Pageable host memory: the caller may reuse or read it as soon as we return.
    if (sync || (dst_dev.is_cpu() && !is_pinned(dst)) || (src_dev.is_cpu() && !is_pinned(src)))
      check(cudaStreamSynchronize(as_stream(stream)), "copy", "cudaStreamSynchronize", device);
  }

  void memset(void* dst, int value, std::size_t bytes, int device, Stream stream) const override {
    if (bytes == 0) return;
    DeviceScope scope(device, "memset");
    check(cudaMemsetAsync(dst, value, bytes, as_stream(stream)), "memset", "cudaMemsetAsync", device);
  }

  Stream create_stream(int device) const override {
    check_device(device, "create_stream");
    DeviceScope scope(device, "create_stream");
    cudaStream_t s = nullptr;
    // Blocking (synchronises with the legacy default stream): the allocator relies on it.
    check(cudaStreamCreateWithFlags(&s, cudaStreamDefault), "create_stream", "cudaStreamCreate", device);
    return Stream{s};
  }
  void destroy_stream(Stream s, int device) const noexcept override {
    if (!s.handle) return;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (prev != device) cudaSetDevice(device);
    if (cudaStreamDestroy(as_stream(s)) != cudaSuccess) cudaGetLastError();
    if (prev != device) cudaSetDevice(prev);
  }
  void synchronize(Stream s, int device) const override {
    DeviceScope scope(device, "synchronize");
    check(cudaStreamSynchronize(as_stream(s)), "synchronize", "cudaStreamSynchronize", device);
  }

  void* create_event(int device) const override {
    check_device(device, "create_event");
    DeviceScope scope(device, "create_event");
    cudaEvent_t ev = nullptr;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "create_event", "cudaEventCreate", device);
    return ev;
  }
  void destroy_event(void* ev) const noexcept override {
    if (ev && cudaEventDestroy(static_cast<cudaEvent_t>(ev)) != cudaSuccess) cudaGetLastError();
  }
  void record_event(void* ev, Stream s, int device) const override {
    DeviceScope scope(device, "record_event");
    check(cudaEventRecord(static_cast<cudaEvent_t>(ev), as_stream(s)), "record_event", "cudaEventRecord", device);
  }
  void wait_event(Stream s, void* ev, int device) const override {
    DeviceScope scope(device, "wait_event");
    check(cudaStreamWaitEvent(as_stream(s), static_cast<cudaEvent_t>(ev), 0), "wait_event", "cudaStreamWaitEvent",
          device);
  }
  void synchronize_event(void* ev) const override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(ev)), "synchronize_event", "cudaEventSynchronize", -1);
  }
  bool query_event(void* ev) const override {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(ev));
    if (e == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    check(e, "query_event", "cudaEventQuery", -1);
    return true;
  }

  void device_uuid(int device, char out[64]) const override {
    check_device(device, "device_uuid");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "device_uuid", "cudaGetDeviceProperties", device);
    const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
    std::snprintf(out, 64, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
                  u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  }

  std::size_t cached_bytes() const noexcept override {
    std::size_t total = 0;
    const int n = device_count();
    for (int d = 0; d < n && d < kMaxDevices; ++d) {
      if (pool_state_[d].load(std::memory_order_acquire) != kPoolOn) continue;
      cudaMemPool_t pool = nullptr;
      std::uint64_t reserved = 0, used = 0;
      if (cudaDeviceGetDefaultMemPool(&pool, d) != cudaSuccess ||
          cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess ||
          cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess) {
        cudaGetLastError();
        continue;
      }
      total += static_cast<std::size_t>(reserved > used ? reserved - used : 0);
    }
    return total;
  }

  void release_cached() const noexcept override {
    const int n = device_count();
    for (int d = 0; d < n && d < kMaxDevices; ++d) {
      if (pool_state_[d].load(std::memory_order_acquire) != kPoolOn) continue;
      int prev = -1;
      if (cudaGetDevice(&prev) != cudaSuccess) {
        cudaGetLastError();
        return;
      }
      cudaSetDevice(d);
      cudaStreamSynchronize(cudaStreamLegacy);  // pending frees complete before the trim
      trim(d);
      cudaSetDevice(prev);
    }
  }

 private:
  static constexpr int kPoolUnknown = 0, kPoolOn = 1, kPoolOff = 2;

  static const char* visible_devices() {
    const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
    return v ? v : "(unset)";
  }
  static bool is_pinned(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeHost;
  }
  static void trim(int device) {
    cudaMemPool_t pool = nullptr;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
    cudaGetLastError();
  }

  /// Whether `device` (current) allocates from its caching pool; decided once per device.
  bool use_pool(int device) const noexcept {
    if (device < 0 || device >= kMaxDevices) return false;
    auto& st = pool_state_[device];
    int s = st.load(std::memory_order_acquire);
    if (s != kPoolUnknown) return s == kPoolOn;
    std::lock_guard<std::mutex> lk(pool_mu_);
    s = st.load(std::memory_order_relaxed);
    if (s == kPoolUnknown) {
      s = kPoolOff;
      const char* env = std::getenv("SHARDTENSOR_CUDA_CACHE");
      int supported = 0;
      cudaMemPool_t pool = nullptr;
      if (!(env && std::strcmp(env, "0") == 0) &&
          cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) == cudaSuccess && supported &&
          cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
        std::uint64_t keep = UINT64_MAX;  // never release freed blocks on synchronisation
        if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) == cudaSuccess) s = kPoolOn;
      }
      cudaGetLastError();
      st.store(s, std::memory_order_release);
    }
    return s == kPoolOn;
  }

  mutable std::once_flag count_once_;
  mutable int count_ = 0;
  mutable cudaError_t count_error_ = cudaSuccess;
  mutable std::mutex pool_mu_;
  mutable std::atomic<int> pool_state_[kMaxDevices] = {};
};

// Never destroyed: deleters of device tensors that outlive main() still call it.
const CudaRuntime& runtime() {
  static const CudaRuntime* rt = new CudaRuntime;
  return *rt;
}
[[maybe_unused]] const bool registered = (register_family(DeviceKind::cuda, KernelFamily::runtime, &runtime()), true);

}  // namespace
}  // namespace shard::exec
