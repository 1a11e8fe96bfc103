#pragma once
/// \file memory.hpp
/// Raw allocation on a Device, with per-process current/peak byte counters per device kind.
#include <cstddef>
#include <memory>

#include "shardtensor/core/device.hpp"

namespace shard {

/// Byte counters for one device kind in this process.
struct MemoryStats {
  std::size_t current_bytes = 0;  ///< bytes allocated by shardtensor and not yet freed
  std::size_t peak_bytes = 0;     ///< high-water mark of current_bytes since start / last reset
  std::size_t cached_bytes = 0;   ///< freed host blocks kept for reuse (see release_cached_memory)
};

/// Allocates `bytes` on `dev` (64-byte aligned on the host); freed when the last owner drops it.
/// Host blocks of >= 1 MiB are recycled through a bounded cache (SHARDTENSOR_HOST_CACHE_MB,
/// default 1024, 0 disables) to avoid first-touch page faults on every new large tensor.
std::shared_ptr<void> allocate_bytes(std::size_t bytes, Device dev);

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
