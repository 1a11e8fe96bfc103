#include "shardtensor/tensor/memory.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sys/resource.h>

#include "shardtensor/config.hpp"
#include "shardtensor/core/error.hpp"
#if SHARDTENSOR_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace shard {
namespace {
struct Counter {
  std::atomic<std::size_t> current{0}, peak{0};
  void add(std::size_t b) {
    const std::size_t now = current.fetch_add(b) + b;
    std::size_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {}
  }
  void sub(std::size_t b) { current.fetch_sub(b); }
};
Counter g_counters[2];
Counter& counter(DeviceKind k) { return g_counters[k == DeviceKind::cpu ? 0 : 1]; }

#if SHARDTENSOR_HAS_CUDA
void cuda_check(cudaError_t e, const char* what) {
  SHARD_CHECK(e == cudaSuccess, "cuda", "{} failed: {}", what, cudaGetErrorString(e));
}
#endif
}  // namespace

std::shared_ptr<void> allocate_bytes(std::size_t bytes, Device dev) {
  const std::size_t n = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  if (dev.is_cpu()) {
    void* p = std::aligned_alloc(64, n);
    SHARD_CHECK(p != nullptr, "allocate", "host allocation of {} bytes failed", n);
    counter(DeviceKind::cpu).add(n);
    return std::shared_ptr<void>(p, [n](void* q) {
      std::free(q);
      counter(DeviceKind::cpu).sub(n);
    });
  }
#if SHARDTENSOR_HAS_CUDA
  int prev = 0;
  cuda_check(cudaGetDevice(&prev), "cudaGetDevice");
  cuda_check(cudaSetDevice(dev.index), "cudaSetDevice");
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, n), "cudaMalloc");
  cudaSetDevice(prev);
  counter(DeviceKind::cuda).add(n);
  return std::shared_ptr<void>(p, [n](void* q) {
    cudaFree(q);
    counter(DeviceKind::cuda).sub(n);
  });
#else
  SHARD_FAIL("allocate", "device {} requested but shardtensor was built without CUDA", dev);
#endif
}

MemoryStats memory_stats(DeviceKind kind) noexcept {
  auto& c = counter(kind);
  return {c.current.load(), c.peak.load()};
}

void reset_peak_memory(DeviceKind kind) noexcept {
  auto& c = counter(kind);
  c.peak.store(c.current.load());
}

std::size_t process_peak_rss_bytes() noexcept {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<std::size_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if SHARDTENSOR_HAS_CUDA
  cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
#else
  SHARD_FAIL("copy_bytes", "copy {} -> {} needs CUDA, which this build lacks", src_dev, dst_dev);
#endif
}

bool cuda_compiled() noexcept { return SHARDTENSOR_HAS_CUDA != 0; }

int cuda_device_count() noexcept {
#if SHARDTENSOR_HAS_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

}  // namespace shard
