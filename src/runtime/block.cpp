#include "shardtensor/runtime/block.hpp"

#include "shardtensor/runtime/memory.hpp"

namespace shard {

Block Block::allocate(DType dt, Device dev, const index_t* shape, int rank) {
  SHARD_CHECK(rank >= 0 && rank <= kMaxBlockRank, "Block::allocate", "rank {} outside 0..{}", rank, kMaxBlockRank);
  index_t n = 1;
  for (int d = 0; d < rank; ++d) {
    SHARD_CHECK(shape[d] >= 0, "Block::allocate", "negative extent {} in dim {}", shape[d], d);
    n *= shape[d];
  }
  SHARD_CHECK(numel_fits(std::vector<index_t>(shape, shape + rank), static_cast<index_t>(dtype_size(dt))),
              "Block::allocate", "shape {} of {} overflows a 64-bit byte count",
              std::vector<index_t>(shape, shape + rank), dt);
  auto mem = allocate_bytes(static_cast<std::size_t>(n) * dtype_size(dt), dev);
  void* p = mem.get();
  return view(dt, dev, p, shape, rank, nullptr, std::move(mem));
}

}  // namespace shard
