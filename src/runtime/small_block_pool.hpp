#pragma once
// Private: the caching allocator for small and medium host blocks (< 1 MiB) behind
// allocate_bytes.
//
// Why: a per-call buffer of ~160 KiB used to go through glibc's aligned malloc, i.e. mmap +
// munmap on every call (first-touch page faults each time), and glibc's free of an mmapped chunk
// raises its dynamic mmap threshold, changing how the host program's own allocations are served.
// This pool never calls malloc/free for blocks: it maps memory from the OS itself (mmap) and
// keeps freed blocks for reuse, so a steady-state training step makes no OS mapping call and the
// host's malloc state is untouched.
//
// Layout: size classes of 64 B .. 4 KiB in powers of two, then four classes per power of two up
// to 1 MiB (at most 25% rounding). Blocks of classes <= 32 KiB are carved from 1 MiB slabs (kept
// for the process lifetime); larger blocks are mapped one by one. Freed blocks go to a per-thread
// front (no lock; at most 64 blocks / 256 KiB per class) and overflow to a global per-class list
// (one mutex); a block freed on another thread than the one that allocated it goes to the global
// list (it would otherwise strand in that thread's front). Cached mapped-one-by-one blocks are bounded by SHARDTENSOR_HOST_POOL_CACHE_MB
// (default 256; beyond it they are unmapped). A thread's front is returned to the global lists
// when the thread exits. Statistics: see shard::host_allocator_stats().
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace shard::detail {

/// Small/medium host block pool (64-byte aligned blocks).
struct SmallBlockPool {
  /// Requests below this size are served by the pool.
  static constexpr std::size_t max_bytes = std::size_t{1} << 20;
  /// Number of size classes.
  static constexpr int num_classes = 39;
  /// The size class of a request of `bytes` (0 < bytes <= max_bytes).
  static constexpr int class_of(std::size_t bytes) noexcept {
    if (bytes <= 64) return 0;
    int e = 0;  // floor(log2(bytes - 1)) + 1 = ceil(log2(bytes))
    for (std::size_t v = bytes - 1; v; v >>= 1) ++e;
    if (bytes <= 4096) return e - 6;
    const int lo = e - 1;  // 2^lo < bytes <= 2^e
    const std::size_t step = std::size_t{1} << (lo - 2);
    const std::size_t q = (bytes - (std::size_t{1} << lo) + step - 1) / step;  // 1..4
    return 7 + (lo - 12) * 4 + static_cast<int>(q) - 1;
  }
  /// Bytes of a block of class `c`.
  static constexpr std::size_t class_bytes(int c) noexcept {
    if (c <= 6) return std::size_t{64} << c;
    const int lo = 12 + (c - 7) / 4;
    const std::size_t q = static_cast<std::size_t>((c - 7) % 4 + 1);
    return (std::size_t{1} << lo) + q * (std::size_t{1} << (lo - 2));
  }
  /// A block of at least `bytes` (0 < bytes < max_bytes) from size class `cls` (set here);
  /// null when the system is out of memory. `owner` (if given) receives the calling thread's tag.
  static void* allocate(std::size_t bytes, int& cls, const void** owner = nullptr);
  /// Returns a block of size class `cls` to the pool: to the calling thread's front when `owner`
  /// is null or the calling thread's tag, else (freed on another thread than the one that
  /// allocated it) to the global list, so blocks do not strand in one thread's front.
  static void deallocate(void* p, int cls, const void* owner = nullptr) noexcept;
  /// Moves the calling thread's parked blocks to the global lists and unmaps every cached
  /// one-by-one mapped block (slab memory stays mapped).
  static void release_thread_cache() noexcept;
};

/// Counters of the host allocators (the pool above and the >= 1 MiB block cache).
struct HostPoolCounters {
  std::uint64_t allocs = 0, hits = 0, os_maps = 0, os_mapped_bytes = 0, os_unmaps = 0;
  std::size_t cached_bytes = 0, slab_bytes = 0;
};
/// Snapshot of the pool's counters (cached_bytes: free blocks in the global lists).
HostPoolCounters small_pool_counters() noexcept;
/// Maps `bytes` (a multiple of the page size) from the OS, counted in the statistics; null on failure.
void* os_map(std::size_t bytes) noexcept;
/// Unmaps a mapping made by os_map.
void os_unmap(void* p, std::size_t bytes) noexcept;
/// Counters of os_map/os_unmap (every host mapping shardtensor makes).
void os_map_counters(std::uint64_t& maps, std::uint64_t& bytes, std::uint64_t& unmaps) noexcept;

/// Minimal allocator over the pool for shared_ptr control blocks (one small block each).
template <class T>
struct SmallBlockAllocator {
  using value_type = T;
  SmallBlockAllocator() = default;
  template <class U> SmallBlockAllocator(const SmallBlockAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    int cls = 0;
    void* p = SmallBlockPool::allocate(n * sizeof(T), cls);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept { SmallBlockPool::deallocate(p, SmallBlockPool::class_of(n * sizeof(T))); }
  template <class U> friend bool operator==(const SmallBlockAllocator&, const SmallBlockAllocator<U>&) noexcept {
    return true;
  }
};

}  // namespace shard::detail
