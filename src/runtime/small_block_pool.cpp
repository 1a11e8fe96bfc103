// The caching allocator for small and medium host blocks (see small_block_pool.hpp).
#include "small_block_pool.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "shardtensor/runtime/profiler.hpp"

namespace shard::detail {
namespace {

constexpr int num_classes = SmallBlockPool::num_classes;
constexpr std::size_t class_bytes(int c) { return SmallBlockPool::class_bytes(c); }
constexpr std::size_t slab_bytes = std::size_t{1} << 20;
constexpr std::size_t max_slab_class_bytes = std::size_t{32} << 10;  // larger classes: one mapping per block
constexpr bool from_slab(int c) { return class_bytes(c) <= max_slab_class_bytes; }
constexpr std::size_t front_cap_bytes = std::size_t{256} << 10;
constexpr std::size_t front_cap(int c) {
  const std::size_t by_bytes = front_cap_bytes / class_bytes(c);
  return by_bytes < 1 ? 1 : (by_bytes > 64 ? 64 : by_bytes);
}

std::atomic<std::uint64_t> g_maps{0}, g_map_bytes{0}, g_unmaps{0};
std::atomic<std::uint64_t> g_allocs{0}, g_hits{0};
std::atomic<std::size_t> g_cached{0}, g_slab{0};

void push(void*& head, void* p) noexcept {
  *static_cast<void**>(p) = head;
  head = p;
}
void* pop(void*& head) noexcept {
  void* p = head;
  head = *static_cast<void**>(p);
  return p;
}

// Global per-class free lists. Never destroyed (blocks may be returned after main()).
struct alignas(64) GlobalClass {
  std::mutex mu;
  void* head = nullptr;
  std::size_t count = 0;
  char* cursor = nullptr;  // slab classes: the uncarved rest of the current slab
  char* end = nullptr;
};
struct Global {
  GlobalClass cls[num_classes];
  std::size_t limit = std::size_t{256} << 20;  // cached bytes of one-by-one mapped blocks
  std::atomic<std::size_t> mapped_cached{0};
  Global() {
    if (const char* e = std::getenv("SHARDTENSOR_HOST_POOL_CACHE_MB")) limit = std::strtoull(e, nullptr, 10) << 20;
  }
};
Global& global() {
  static Global* g = new Global;
  return *g;
}

/// A block of class c from the global list, a slab, or the OS.
void* global_take(int c) noexcept {
  auto& g = global();
  auto& gc = g.cls[c];
  const std::size_t sz = class_bytes(c);
  {
    std::lock_guard<std::mutex> lk(gc.mu);
    if (gc.head) {
      --gc.count;
      g_cached.fetch_sub(sz, std::memory_order_relaxed);
      if (!from_slab(c)) g.mapped_cached.fetch_sub(sz, std::memory_order_relaxed);
      g_hits.fetch_add(1, std::memory_order_relaxed);
      return pop(gc.head);
    }
    if (from_slab(c)) {
      if (gc.cursor == nullptr || gc.cursor + sz > gc.end) {
        void* s = os_map(slab_bytes);
        if (!s) return nullptr;
        g_slab.fetch_add(slab_bytes, std::memory_order_relaxed);
        gc.cursor = static_cast<char*>(s);
        gc.end = gc.cursor + slab_bytes;
      }
      void* p = gc.cursor;
      gc.cursor += sz;
      return p;
    }
  }
  return os_map(sz);
}

/// Returns a block of class c to the global list (or to the OS beyond the bound).
void global_give(int c, void* p) noexcept {
  auto& g = global();
  auto& gc = g.cls[c];
  const std::size_t sz = class_bytes(c);
  if (!from_slab(c)) {
    if (g.mapped_cached.fetch_add(sz, std::memory_order_relaxed) + sz > g.limit) {
      g.mapped_cached.fetch_sub(sz, std::memory_order_relaxed);
      os_unmap(p, sz);
      return;
    }
  }
  std::lock_guard<std::mutex> lk(gc.mu);
  push(gc.head, p);
  ++gc.count;
  g_cached.fetch_add(sz, std::memory_order_relaxed);
}

struct ThreadBins {
  void* head[num_classes];
  std::size_t count[num_classes];
};
void drain(ThreadBins& b) noexcept {
  for (int c = 0; c < num_classes; ++c) {
    while (b.head[c]) global_give(c, pop(b.head[c]));
    b.count[c] = 0;
  }
}

// The bins are trivial (zero-initialised, no TLS init call on access); a separate object, touched
// once per thread, returns the parked blocks at thread exit and stops further parking.
thread_local ThreadBins t_bins{};
// 0: no block parked yet on this thread, 1: live, 2: thread exiting (no more parking).
thread_local unsigned char t_state = 0;
struct ThreadDrain {
  ~ThreadDrain() {
    drain(t_bins);
    t_state = 2;
  }
};
thread_local ThreadDrain t_drain;

ThreadBins* bins() noexcept {
  if (t_state == 1) [[likely]] return &t_bins;
  if (t_state == 2) return nullptr;
  [[maybe_unused]] ThreadDrain* d = &t_drain;  // constructs it (registers its destructor)
  t_state = 1;
  return &t_bins;
}

}  // namespace

namespace {
constinit profile::Site g_prof_os_map{"alloc", "cpu", "os_map"};  // the profiler's row of every mmap
}  // namespace

void* os_map(std::size_t bytes) noexcept {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  profile::count_alloc(g_prof_os_map, bytes);
  g_maps.fetch_add(1, std::memory_order_relaxed);
  g_map_bytes.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

void os_unmap(void* p, std::size_t bytes) noexcept {
  ::munmap(p, bytes);
  g_unmaps.fetch_add(1, std::memory_order_relaxed);
}

void os_map_counters(std::uint64_t& maps, std::uint64_t& bytes, std::uint64_t& unmaps) noexcept {
  maps = g_maps.load(std::memory_order_relaxed);
  bytes = g_map_bytes.load(std::memory_order_relaxed);
  unmaps = g_unmaps.load(std::memory_order_relaxed);
}

HostPoolCounters small_pool_counters() noexcept {
  HostPoolCounters s;
  s.allocs = g_allocs.load(std::memory_order_relaxed);
  s.hits = g_hits.load(std::memory_order_relaxed);
  os_map_counters(s.os_maps, s.os_mapped_bytes, s.os_unmaps);
  s.cached_bytes = g_cached.load(std::memory_order_relaxed);
  s.slab_bytes = g_slab.load(std::memory_order_relaxed);
  return s;
}

void* SmallBlockPool::allocate(std::size_t bytes, int& cls, const void** owner) {
  const int c = class_of(bytes);
  cls = c;
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  ThreadBins* b = bins();
  if (owner) *owner = b;
  if (b && b->head[c]) {
    --b->count[c];
    g_hits.fetch_add(1, std::memory_order_relaxed);
    return pop(b->head[c]);
  }
  return global_take(c);
}

void SmallBlockPool::deallocate(void* p, int cls, const void* owner) noexcept {
  ThreadBins* b = bins();
  if (!b || (owner && owner != b) || b->count[cls] >= front_cap(cls)) {
    global_give(cls, p);
    return;
  }
  push(b->head[cls], p);
  ++b->count[cls];
}

void SmallBlockPool::release_thread_cache() noexcept {
  if (ThreadBins* b = bins()) drain(*b);
  auto& g = global();
  for (int c = 0; c < num_classes; ++c) {
    if (from_slab(c)) continue;
    auto& gc = g.cls[c];
    void* list = nullptr;
    {
      std::lock_guard<std::mutex> lk(gc.mu);
      list = gc.head;
      gc.head = nullptr;
      g_cached.fetch_sub(gc.count * class_bytes(c), std::memory_order_relaxed);
      g.mapped_cached.fetch_sub(gc.count * class_bytes(c), std::memory_order_relaxed);
      gc.count = 0;
    }
    while (list) os_unmap(pop(list), class_bytes(c));
  }
}

}  // namespace shard::detail
