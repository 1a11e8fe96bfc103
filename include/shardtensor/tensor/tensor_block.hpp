#pragma once
/// \file tensor_block.hpp
/// Conversions between the typed Tensor<T, R> and the type-erased Block (no copies).
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/tensor/tensor.hpp"

namespace shard {

/// A Block viewing `t` (same memory, shape, strides, device; shares its owner).
template <class T, int R>
Block as_block(const Tensor<T, R>& t) {
  return Block::view(dtype_of<T>, t.device(), const_cast<std::remove_const_t<T>*>(t.data()), t.shape().data(), R,
                     t.strides().data(), t.storage());
}

/// A Tensor viewing `b` (dtype and rank must match; shares its owner).
template <class T, int R>
Tensor<T, R> tensor_of(const Block& b) {
  SHARD_CHECK(b.dtype == dtype_of<T> && b.rank == R, "tensor_of", "block of {} rank {} viewed as {} rank {}", b.dtype,
              b.rank, dtype_of<T>, R);
  Shape<R> shape{}, strides{};
  for (int d = 0; d < R; ++d) {
    shape[static_cast<std::size_t>(d)] = b.shape[static_cast<std::size_t>(d)];
    strides[static_cast<std::size_t>(d)] = b.strides[static_cast<std::size_t>(d)];
  }
  return Tensor<T, R>::adopt(b.owner, static_cast<T*>(b.data), shape, strides, b.device);
}

}  // namespace shard
