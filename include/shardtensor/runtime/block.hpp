#pragma once
/// \file block.hpp
/// Block: the type-erased, device-aware strided array every layer below the typed fronts works
/// on (dtype, device, pointer, shape, strides in elements, owner). Fixed-capacity shape storage
/// (rank <= 8), so making and slicing blocks never allocates.
#include <array>
#include <memory>
#include <vector>

#include "shardtensor/core/device.hpp"
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/shape.hpp"

namespace shard {

/// Largest tensor rank a Block (and Tensor) supports.
inline constexpr int kMaxBlockRank = 8;

/// A strided box of elements on one device. Copies are shallow (they share `owner`).
struct Block {
  using Extents = std::array<index_t, kMaxBlockRank>;

  DType dtype = DType::f32;
  Device device{};
  void* data = nullptr;
  int rank = 0;
  Extents shape{};    ///< extents; entries >= rank are unused (kept 1)
  Extents strides{};  ///< element strides; entries >= rank are unused
  std::shared_ptr<void> owner;  ///< keeps the memory alive (null for views of user memory)

  /// Contiguous block of `shape` freshly allocated on `dev` (uninitialised).
  static Block allocate(DType dt, Device dev, const index_t* shape, int rank);
  static Block allocate(DType dt, Device dev, const std::vector<index_t>& shape) {
    return allocate(dt, dev, shape.data(), static_cast<int>(shape.size()));
  }
  /// Non-owning view of `data` with the given shape and strides (contiguous when strides is null).
  static Block view(DType dt, Device dev, void* data, const index_t* shape, int rank, const index_t* strides = nullptr,
                    std::shared_ptr<void> owner = nullptr) {
    SHARD_CHECK(rank >= 0 && rank <= kMaxBlockRank, "Block::view", "rank {} outside 0..{}", rank, kMaxBlockRank);
    Block b;
    b.dtype = dt;
    b.device = dev;
    b.data = data;
    b.rank = rank;
    b.shape.fill(1);
    b.strides.fill(0);
    index_t acc = 1;
    for (int d = rank - 1; d >= 0; --d) {
      b.shape[static_cast<std::size_t>(d)] = shape[d];
      b.strides[static_cast<std::size_t>(d)] = strides ? strides[d] : acc;
      acc *= shape[d];
    }
    b.owner = std::move(owner);
    return b;
  }

  index_t numel() const {
    index_t n = 1;
    for (int d = 0; d < rank; ++d) n *= shape[static_cast<std::size_t>(d)];
    return n;
  }
  std::size_t element_bytes() const { return dtype_size(dtype); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * element_bytes(); }
  /// Row-major without gaps (size-1 dims may have any stride).
  bool is_contiguous() const {
    index_t acc = 1;
    for (int d = rank - 1; d >= 0; --d) {
      const auto e = shape[static_cast<std::size_t>(d)];
      if (e != 1 && strides[static_cast<std::size_t>(d)] != acc) return false;
      acc *= e;
    }
    return true;
  }
  /// Shape as a vector (for messages and the vector-based spec algebra).
  std::vector<index_t> shape_vec() const { return {shape.begin(), shape.begin() + rank}; }
  std::vector<index_t> strides_vec() const { return {strides.begin(), strides.begin() + rank}; }
  /// Pointer to the element at local multi-index `idx` (rank entries).
  void* at(const index_t* idx) const {
    index_t off = 0;
    for (int d = 0; d < rank; ++d) off += idx[d] * strides[static_cast<std::size_t>(d)];
    return static_cast<char*>(data) + off * static_cast<index_t>(element_bytes());
  }
  /// View of the box [lo, lo + len) (local coordinates); shares the owner.
  Block slice(const index_t* lo, const index_t* len) const {
    Block b = *this;
    bool empty = false;
    for (int d = 0; d < rank; ++d) {
      SHARD_CHECK(lo[d] >= 0 && len[d] >= 0 && lo[d] + len[d] <= shape[static_cast<std::size_t>(d)], "Block::slice",
                  "box [{}, {}) outside dim {} of extent {}", lo[d], lo[d] + len[d], d, shape[static_cast<std::size_t>(d)]);
      b.shape[static_cast<std::size_t>(d)] = len[d];
      empty = empty || len[d] == 0;
    }
    if (!empty) b.data = at(lo);
    return b;
  }
  Block slice(const std::vector<index_t>& lo, const std::vector<index_t>& len) const { return slice(lo.data(), len.data()); }
};

}  // namespace shard
