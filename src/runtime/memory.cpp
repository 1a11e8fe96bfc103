#include "shardtensor/runtime/memory.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <sys/resource.h>
#include <typeinfo>
#include <vector>

#include "shardtensor/config.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/device_runtime.hpp"
#include "shardtensor/runtime/profiler.hpp"
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
// Cached bytes are not counted in current_bytes/peak_bytes (they are not in use). Blocks are
// mapped with mmap (page-rounded), never through malloc: glibc's free of an mmapped chunk raises
// its dynamic mmap threshold, which would change how the host program's allocations are served.
constexpr std::size_t page_round(std::size_t n) { return (n + 4095) / 4096 * 4096; }
std::atomic<std::uint64_t> g_large_allocs{0}, g_large_hits{0};
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
      detail::os_unmap(p, page_round(n));
      return;
    }
    std::vector<void*> evicted;
    std::vector<std::size_t> evicted_sizes;
    while (bytes_ + n > limit_) {
      auto& [sz, q] = lru_.front();
      auto range = by_size_.equal_range(sz);
      for (auto it = range.first; it != range.second; ++it)
        if (it->second == lru_.begin()) { by_size_.erase(it); break; }
      bytes_ -= sz;
      evicted.push_back(q);
      evicted_sizes.push_back(sz);
      lru_.pop_front();
    }
    lru_.emplace_back(n, p);
    by_size_.emplace(n, std::prev(lru_.end()));
    bytes_ += n;
    lk.unlock();
    for (std::size_t i = 0; i < evicted.size(); ++i) detail::os_unmap(evicted[i], page_round(evicted_sizes[i]));
  }
  /// Frees every cached block.
  void clear() {
    std::unique_lock<std::mutex> lk(mu_);
    Lru all;
    all.swap(lru_);
    by_size_.clear();
    bytes_ = 0;
    lk.unlock();
    for (auto& e : all) detail::os_unmap(e.second, page_round(e.first));
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
  // The bookkeeping nodes come from the small-block pool too (no malloc in allocate_bytes).
  using Entry = std::pair<std::size_t, void*>;
  using Lru = std::list<Entry, detail::SmallBlockAllocator<Entry>>;
  using BySize = std::multimap<std::size_t, Lru::iterator, std::less<std::size_t>,
                               detail::SmallBlockAllocator<std::pair<const std::size_t, Lru::iterator>>>;
  Lru lru_;  // parked blocks, least recently parked first
  BySize by_size_;
  std::size_t bytes_ = 0;
  std::size_t limit_ = std::size_t{1024} << 20;
};

/// The deleter of every block allocate_bytes hands out. It lives in the shared_ptr's control
/// block, so it also carries the storage's version counter: every view, reshape and Block that
/// shares the owner finds the same counter through std::get_deleter.
struct StorageDeleter {
  enum class Kind : unsigned char { host_large, host_small, device, user_token };
  Kind kind = Kind::host_small;
  int cls = 0;
  int index = 0;
  std::size_t bytes = 0;
  const exec::DeviceRuntime* rt = nullptr;
  const void* owner = nullptr;  ///< host_small: the allocating thread's pool tag
  Stream stream{};              ///< device: the stream it was allocated on (and is freed on)
  std::atomic<std::uint64_t> version{0};
  StorageDeleter(Kind k, int c, int i, std::size_t b, const exec::DeviceRuntime* r)
      : kind(k), cls(c), index(i), bytes(b), rt(r) {}
  StorageDeleter(const StorageDeleter& o)
      : kind(o.kind), cls(o.cls), index(o.index), bytes(o.bytes), rt(o.rt), owner(o.owner), stream(o.stream),
        version(o.version.load()) {}
  void operator()(void* q) const noexcept {
    switch (kind) {
      case Kind::host_large:
        counter(DeviceKind::cpu).sub(bytes);
        HostCache::get().give(q, bytes);
        break;
      case Kind::host_small:
        detail::SmallBlockPool::deallocate(q, cls, owner);
        counter(DeviceKind::cpu).sub(bytes);
        break;
      case Kind::device:
        rt->deallocate_on(q, index, stream);
        counter(DeviceKind::cuda).sub(bytes);
        break;
      case Kind::user_token:
        break;
    }
  }
};

/// The runtime of `dev`'s backend (throws naming `op` and the device when it is not linked or
/// this build has no CUDA), after checking the device index against the visible devices.
// The profiler's allocator rows: every request that reached allocate_bytes, by device kind.
constinit profile::Site g_prof_host_request{"alloc", "cpu", "request"};
constinit profile::Site g_prof_device_request{"alloc", "cuda", "request"};

const exec::DeviceRuntime& runtime_for(Device dev, const char* op) {
  const auto& rt = exec::kernels_for<exec::DeviceRuntime>(dev, op);
  rt.check_device(dev.index, op);
  return rt;
}
}  // namespace

std::shared_ptr<void> allocate_bytes(std::size_t bytes, Device dev) {
  const std::size_t n = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  profile::count_alloc(dev.is_cpu() ? g_prof_host_request : g_prof_device_request, n);
  if (dev.is_cpu()) {
    if (n >= HostCache::min_bytes) {
      std::size_t got = 0;
      g_large_allocs.fetch_add(1, std::memory_order_relaxed);
      void* p = HostCache::get().take(n, got);
      if (p) {
        g_large_hits.fetch_add(1, std::memory_order_relaxed);
      } else {
        p = detail::os_map(page_round(n));
        got = n;
      }
      SHARD_CHECK(p != nullptr, "allocate", "host allocation of {} bytes failed", n);
      counter(DeviceKind::cpu).add(got);
      // (If the control block cannot be allocated, shared_ptr calls the deleter: nothing leaks.)
      return std::shared_ptr<void>(p, StorageDeleter(StorageDeleter::Kind::host_large, 0, 0, got, nullptr),
                                   detail::SmallBlockAllocator<void>{});
    }
    // Small blocks: per-thread free lists, control block from the same pool (small_block_pool.hpp).
    int cls = 0;
    const void* owner = nullptr;
    void* p = detail::SmallBlockPool::allocate(n, cls, &owner);
    SHARD_CHECK(p != nullptr, "allocate", "host allocation of {} bytes failed", n);
    counter(DeviceKind::cpu).add(n);
    StorageDeleter d(StorageDeleter::Kind::host_small, cls, 0, n, nullptr);
    d.owner = owner;
    return std::shared_ptr<void>(p, std::move(d), detail::SmallBlockAllocator<void>{});
  }
  // Device memory: the backend's runtime, stream-ordered on the stream of the thread's current
  // context for `dev` (shardtensor::cuda caches freed blocks per stream, see
  // src/cuda/runtime_cuda.cpp). The block is freed on the same stream: a tensor's work is queued
  // on the context it was made in, or ordered before that stream's later work by the caller.
  // Counted here by the bytes handed out.
  const auto& rt = runtime_for(dev, "allocate");
  const Stream stream = exec::current_stream_if_any(dev);
  void* p = rt.allocate_on(n, dev.index, stream);
  counter(dev.kind).add(n);
  StorageDeleter d(StorageDeleter::Kind::device, 0, dev.index, n, &rt);
  d.stream = stream;
  return std::shared_ptr<void>(p, std::move(d), detail::SmallBlockAllocator<void>{});
}

HostAllocatorStats host_allocator_stats() noexcept {
  const auto c = detail::small_pool_counters();
  HostAllocatorStats s;
  s.allocs = c.allocs;
  s.cache_hits = c.hits;
  s.large_allocs = g_large_allocs.load(std::memory_order_relaxed);
  s.large_cache_hits = g_large_hits.load(std::memory_order_relaxed);
  s.os_maps = c.os_maps;
  s.os_mapped_bytes = c.os_mapped_bytes;
  s.os_unmaps = c.os_unmaps;
  s.pool_cached_bytes = c.cached_bytes;
  s.slab_bytes = c.slab_bytes;
  return s;
}

namespace detail {
std::atomic<std::uint64_t>* version_counter(const std::shared_ptr<void>& s) noexcept {
  auto* d = std::get_deleter<StorageDeleter>(s);
  return d ? &d->version : nullptr;
}
std::shared_ptr<void> user_memory_token(void* p) {
  return std::shared_ptr<void>(p, StorageDeleter(StorageDeleter::Kind::user_token, 0, 0, 0, nullptr),
                               SmallBlockAllocator<void>{});
}
bool is_user_memory_token(const std::shared_ptr<void>& s) noexcept {
  auto* d = std::get_deleter<StorageDeleter>(s);
  return d && d->kind == StorageDeleter::Kind::user_token;
}
}  // namespace detail

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
