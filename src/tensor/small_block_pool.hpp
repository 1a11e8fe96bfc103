#pragma once
// Private: per-thread free lists of small host blocks (< 1 MiB) behind allocate_bytes.
// A tiny tensor used to cost an aligned malloc (glibc's memalign path, which skips its fast
// per-thread cache) plus a free, and a second malloc for the shared_ptr control block. Blocks are
// kept in power-of-two size classes (64 B .. 1 MiB); each thread parks a bounded number per
// class (at most 64 blocks and 256 KiB per class, one block in the two largest; at most ~5 MiB per
// thread) and hands them out
// again without locking. A block may be freed on another thread than the one that allocated it (it
// then joins that thread's lists). Parked blocks are not counted in memory_stats (neither in use
// nor "cached": cached_bytes reports the large-block cache only); release_cached_memory() returns
// the calling thread's parked blocks, and a thread's blocks are returned when it exits.
#include <cstddef>
#include <memory>
#include <new>

namespace shard::detail {

/// Small-block pool front (host memory, 64-byte aligned).
struct SmallBlockPool {
  /// Requests below this size are served by the pool.
  static constexpr std::size_t max_bytes = std::size_t{1} << 20;
  /// A block of at least `bytes` (0 < bytes < max_bytes) from size class `cls` (set here);
  /// null when the system is out of memory.
  static void* allocate(std::size_t bytes, int& cls);
  /// Returns a block of size class `cls` (parked on this thread, or freed).
  static void deallocate(void* p, int cls) noexcept;
  /// Frees every block parked on the calling thread.
  static void release_thread_cache() noexcept;
};

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
  void deallocate(T* p, std::size_t n) noexcept { SmallBlockPool::deallocate(p, class_of(n * sizeof(T))); }
  static int class_of(std::size_t bytes) noexcept {
    int c = 0;
    while ((std::size_t{64} << c) < bytes) ++c;
    return c;
  }
  template <class U> friend bool operator==(const SmallBlockAllocator&, const SmallBlockAllocator<U>&) noexcept {
    return true;
  }
};

}  // namespace shard::detail
