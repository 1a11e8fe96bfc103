// Per-thread free lists of small host blocks (see small_block_pool.hpp).
#include "small_block_pool.hpp"

#include <cstdlib>

namespace shard::detail {
namespace {

constexpr int num_classes = 15;  // 64 B << 0 .. 64 B << 14 = 1 MiB (requests are < 1 MiB)
constexpr std::size_t class_bytes(int c) { return std::size_t{64} << c; }
constexpr std::size_t bin_cap_bytes = std::size_t{256} << 10;
constexpr std::size_t bin_cap(int c) {
  const std::size_t by_bytes = bin_cap_bytes / class_bytes(c);
  return by_bytes < 1 ? 1 : (by_bytes > 64 ? 64 : by_bytes);
}

struct ThreadBins {
  void* head[num_classes];
  std::size_t count[num_classes];
};
void drain(ThreadBins& b) noexcept {
  for (int c = 0; c < num_classes; ++c) {
    while (b.head[c]) {
      void* p = b.head[c];
      b.head[c] = *static_cast<void**>(p);
      std::free(p);
    }
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

void* SmallBlockPool::allocate(std::size_t bytes, int& cls) {
  int c = 0;
  while (class_bytes(c) < bytes) ++c;
  cls = c;
  if (ThreadBins* b = bins(); b && b->head[c]) {
    void* p = b->head[c];
    b->head[c] = *static_cast<void**>(p);
    --b->count[c];
    return p;
  }
  return std::aligned_alloc(64, class_bytes(c));
}

void SmallBlockPool::deallocate(void* p, int cls) noexcept {
  ThreadBins* b = bins();
  if (!b || b->count[cls] >= bin_cap(cls)) {
    std::free(p);
    return;
  }
  *static_cast<void**>(p) = b->head[cls];
  b->head[cls] = p;
  ++b->count[cls];
}

void SmallBlockPool::release_thread_cache() noexcept {
  if (ThreadBins* b = bins()) drain(*b);
}

}  // namespace shard::detail
