#pragma once
/// \file memory.hpp
/// Raw allocation on a Device, with per-process current/peak byte counters per device kind.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "shardtensor/core/device.hpp"

namespace shard {

/// Byte counters for one device kind in this process.
struct MemoryStats {
  std::size_t current_bytes = 0;  ///< bytes allocated by shardtensor and not yet freed
  std::size_t peak_bytes = 0;     ///< high-water mark of current_bytes since start / last reset
  std::size_t cached_bytes = 0;   ///< freed host blocks kept for reuse (see release_cached_memory)
};

/// Counters of shardtensor's host allocators since the start of the process. Host blocks never
/// come from malloc: they are mapped from the OS (mmap) and cached, so the host program's malloc
/// state is not disturbed and a steady-state step makes no OS mapping call (os_maps stays put).
struct HostAllocatorStats {
  std::uint64_t allocs = 0;            ///< small/medium block requests (< 1 MiB)
  std::uint64_t cache_hits = 0;        ///< ... served from a cached block
  std::uint64_t large_allocs = 0;      ///< large block requests (>= 1 MiB)
  std::uint64_t large_cache_hits = 0;  ///< ... served from the large-block cache
  std::uint64_t os_maps = 0;           ///< mmap calls for host blocks (slabs, medium and large blocks)
  std::uint64_t os_mapped_bytes = 0;   ///< bytes of those mappings
  std::uint64_t os_unmaps = 0;         ///< munmap calls (cache bounds, release_cached_memory)
  std::size_t pool_cached_bytes = 0;   ///< free small/medium blocks held in the pool's global lists
  std::size_t slab_bytes = 0;          ///< bytes of 1 MiB slabs carved into blocks of <= 32 KiB (kept)
};

/// Allocates `bytes` on `dev` (64-byte aligned on the host); freed when the last owner drops it.
/// Host blocks below 1 MiB come from a thread-safe caching pool with size classes (per-thread
/// fronts, global lists bounded by SHARDTENSOR_HOST_POOL_CACHE_MB, default 256); host blocks of
/// >= 1 MiB are recycled through a bounded cache (SHARDTENSOR_HOST_CACHE_MB, default 1024, 0
/// disables). Both map their memory with mmap, never through malloc. Every block carries a
/// version counter (see Tensor::version) in its owner's control block.
std::shared_ptr<void> allocate_bytes(std::size_t bytes, Device dev);

/// Counters of the host allocators.
HostAllocatorStats host_allocator_stats() noexcept;

namespace detail {
/// The version counter of the storage owned by `s` (memory from allocate_bytes or a stable user
/// view's token); null for memory shardtensor does not track.
std::atomic<std::uint64_t>* version_counter(const std::shared_ptr<void>& s) noexcept;
/// Adds one to the version of `s` (nothing for untracked or null storage).
inline void bump_version(const std::shared_ptr<void>& s) noexcept {
  if (s)
    if (auto* c = version_counter(s)) c->fetch_add(1, std::memory_order_relaxed);
}
/// A token owning nothing that gives user memory at `p` a version counter (declared stable views).
std::shared_ptr<void> user_memory_token(void* p);
/// True if `s` is such a token.
bool is_user_memory_token(const std::shared_ptr<void>& s) noexcept;
}  // namespace detail

/// shardtensor's allocation counters for `kind`.
MemoryStats memory_stats(DeviceKind kind = DeviceKind::cpu) noexcept;
/// Returns every cached host block to the system.
void release_cached_memory() noexcept;
/// Resets the peak counter of `kind` to the current value.
void reset_peak_memory(DeviceKind kind = DeviceKind::cpu) noexcept;
/// Peak resident set size of this process in bytes (from getrusage), 0 where unknown.
std::size_t process_peak_rss_bytes() noexcept;

/// Copies `bytes` between any two devices (both host, both device, or across).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes);

}  // namespace shard
