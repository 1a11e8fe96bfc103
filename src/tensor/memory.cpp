#include "shardtensor/tensor/memory.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <sys/resource.h>
#include <vector>

#include "exec/device_runtime.hpp"
#include "shardtensor/config.hpp"
#include "shardtensor/core/error.hpp"
#include "small_block_pool.hpp"

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

// Host block cache. A fresh multi-MiB block costs one page fault per 4 KiB page on first touch
// (measured: ~3x a memcpy of the same bytes), and redistribute and the ops allocate same-sized
// results step after step. So host blocks of >= 1 MiB are parked here when their last owner drops
// them and handed out again for a request of the same size (up to 1/8 larger). Bounded by
// SHARDTENSOR_HOST_CACHE_MB (default 1024; 0 disables); least recently parked blocks go first.
// Cached bytes are not counted in current_bytes/peak_bytes (they are not in use).
class HostCache {
 public:
  static constexpr std::size_t min_bytes = std::size_t{1} << 20;
  /// Never destroyed: deleters of tensors that outlive main() may still return blocks.
  static HostCache& get() {
    static HostCache* c = new HostCache;
    return *c;
  }
  /// A cached block of at least n bytes (its size in `got`), or null.
  void* take(std::size_t n, std::size_t& got) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_size_.lower_bound(n);
    if (it == by_size_.end() || it->first > n + n / 8) return nullptr;
    got = it->first;
    void* p = it->second->second;
    lru_.erase(it->second);
    by_size_.erase(it);
    bytes_ -= got;
    return p;
  }
  /// Parks block p of n bytes (evicting older blocks to stay within the limit), or frees it.
  void give(void* p, std::size_t n) {
    std::unique_lock<std::mutex> lk(mu_);
    if (n > limit_) {
      lk.unlock();
      std::free(p);
      return;
    }
    std::vector<void*> evicted;
    while (bytes_ + n > limit_) {
      auto& [sz, q] = lru_.front();
      auto range = by_size_.equal_range(sz);
      for (auto it = range.first; it != range.second; ++it)
        if (it->second == lru_.begin()) { by_size_.erase(it); break; }
      bytes_ -= sz;
      evicted.push_back(q);
      lru_.pop_front();
    }
    lru_.emplace_back(n, p);
    by_size_.emplace(n, std::prev(lru_.end()));
    bytes_ += n;
    lk.unlock();
    for (void* q : evicted) std::free(q);
  }
  /// Frees every cached block.
  void clear() {
    std::unique_lock<std::mutex> lk(mu_);
    std::list<std::pair<std::size_t, void*>> all;
    all.swap(lru_);
    by_size_.clear();
    bytes_ = 0;
    lk.unlock();
    for (auto& e : all) std::free(e.second);
  }
  std::size_t bytes() {
    std::lock_guard<std::mutex> lk(mu_);
    return bytes_;
  }

 private:
  HostCache() {
    if (const char* e = std::getenv("SHARDTENSOR_HOST_CACHE_MB")) limit_ = std::strtoull(e, nullptr, 10) << 20;
  }
  std::mutex mu_;
  std::list<std::pair<std::size_t, void*>> lru_;  // parked blocks, least recently parked first
  std::multimap<std::size_t, std::list<std::pair<std::size_t, void*>>::iterator> by_size_;
  std::size_t bytes_ = 0;
  std::size_t limit_ = std::size_t{1024} << 20;
};

/// The runtime of `dev`'s backend (throws naming `op` and the device when it is not linked or
/// this build has no CUDA), after checking the device index against the visible devices.
const exec::DeviceRuntime& runtime_for(Device dev, const char* op) {
  const auto& rt = exec::kernels_for<exec::DeviceRuntime>(dev, op);
  rt.check_device(dev.index, op);
  return rt;
}
}  // namespace

std::shared_ptr<void> allocate_bytes(std::size_t bytes, Device dev) {
  const std::size_t n = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  if (dev.is_cpu()) {
    if (n >= HostCache::min_bytes) {
      std::size_t got = 0;
      void* p = HostCache::get().take(n, got);
      if (!p) {
        p = std::aligned_alloc(64, n);
        got = n;
      }
      SHARD_CHECK(p != nullptr, "allocate", "host allocation of {} bytes failed", n);
      counter(DeviceKind::cpu).add(got);
      return std::shared_ptr<void>(p, [got](void* q) {
        counter(DeviceKind::cpu).sub(got);
        HostCache::get().give(q, got);
      });
    }
    // Small blocks: per-thread free lists, control block from the same pool (small_block_pool.hpp).
    int cls = 0;
    void* p = detail::SmallBlockPool::allocate(n, cls);
    SHARD_CHECK(p != nullptr, "allocate", "host allocation of {} bytes failed", n);
    counter(DeviceKind::cpu).add(n);
    return std::shared_ptr<void>(
        p,
        [n, cls](void* q) {
          detail::SmallBlockPool::deallocate(q, cls);
          counter(DeviceKind::cpu).sub(n);
        },
        detail::SmallBlockAllocator<void>{});
  }
  // Device memory: the backend's runtime (shardtensor::cuda caches freed blocks in a
  // stream-ordered pool, see src/cuda/runtime_cuda.cpp); counted here by the bytes handed out.
  const auto& rt = runtime_for(dev, "allocate");
  void* p = rt.allocate(n, dev.index);
  auto& c = counter(dev.kind);
  c.add(n);
  return std::shared_ptr<void>(p, [&rt, &c, n, index = dev.index](void* q) {
    rt.deallocate(q, index);
    c.sub(n);
  });
}

MemoryStats memory_stats(DeviceKind kind) noexcept {
  auto& c = counter(kind);
  std::size_t cached = 0;
  if (kind == DeviceKind::cpu) {
    cached = HostCache::get().bytes();
  } else if (const void* t = exec::find_family(kind, exec::KernelFamily::runtime)) {
    cached = static_cast<const exec::DeviceRuntime*>(t)->cached_bytes();
  }
  return {c.current.load(), c.peak.load(), cached};
}

void release_cached_memory() noexcept {
  HostCache::get().clear();
  detail::SmallBlockPool::release_thread_cache();
  if (const void* t = exec::find_family(DeviceKind::cuda, exec::KernelFamily::runtime))
    static_cast<const exec::DeviceRuntime*>(t)->release_cached();
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
  // At least one side is a device: the copy is ordered on the device's current stream and
  // complete when this returns (copy_bytes is synchronous).
  const Device side = dst_dev.is_cpu() ? src_dev : dst_dev;
  const auto& rt = runtime_for(side, "copy_bytes");
  if (!dst_dev.is_cpu() && !src_dev.is_cpu() && dst_dev.index != src_dev.index) rt.check_device(src_dev.index, "copy_bytes");
  rt.copy(dst, dst_dev, src, src_dev, bytes, current_context(side).stream(), /*sync=*/true);
}

bool cuda_compiled() noexcept { return SHARDTENSOR_HAS_CUDA != 0; }

int cuda_device_count() noexcept {
  const void* t = exec::find_family(DeviceKind::cuda, exec::KernelFamily::runtime);
  return t ? static_cast<const exec::DeviceRuntime*>(t)->device_count() : 0;
}

}  // namespace shard
