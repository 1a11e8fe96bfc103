#pragma once
// Host Block helpers shared by the kernel-family tests (tests/exec/test_points.cpp,
// tests/exec/test_neighbors.cpp): a contiguous host block of given values, and a block's values.
#include <algorithm>
#include <vector>

#include <shardtensor/runtime/block.hpp>

namespace st_support {

/// A contiguous host block of shape s holding v (v.size() == the product of s).
template <class T>
shard::Block block_of(const std::vector<shard::index_t>& s, const std::vector<T>& v) {
  shard::Block b = shard::Block::allocate(shard::dtype_of<T>, shard::Device::cpu(), s);
  std::copy(v.begin(), v.end(), static_cast<T*>(b.data));
  return b;
}

/// The values of a contiguous host block.
template <class T>
std::vector<T> vec_of(const shard::Block& b) {
  const T* p = static_cast<const T*>(b.data);
  return std::vector<T>(p, p + b.numel());
}

}  // namespace st_support
