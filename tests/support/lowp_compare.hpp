#pragma once
// Oracles of the bf16 / f16 tests that compare a storage-type result with the f32 working-copy
// route (widen every operand, run the f32 op, round the result once): the widening, and the count
// of elements that differ from the rounded f32 result. Tensors on any device (copied to the host
// for the comparison).
#include <cmath>

#include "shardtensor/shardtensor.hpp"

namespace shard::test {

/// x (bf16 / f16) widened exactly to f32, on the host.
template <class L, int R>
Tensor<float, R> widened(const Tensor<L, R>& x) {
  const auto h = x.to(Device::cpu());
  auto y = Tensor<float, R>::empty(h.shape(), Device::cpu());
  for (index_t i = 0; i < h.numel(); ++i) y.data()[i] = static_cast<float>(h.data()[i]);
  return y;
}

/// The elements where got != L(want) bit for bit (where want is NaN: where got is not NaN).
template <class L, int R>
index_t differing(const Tensor<L, R>& got, const Tensor<float, R>& want) {
  const auto g = got.to(Device::cpu());
  const auto w = want.to(Device::cpu());
  index_t bad = 0;
  for (index_t i = 0; i < g.numel(); ++i) {
    const float v = w.data()[i];
    if (std::isnan(v)) bad += std::isnan(static_cast<float>(g.data()[i])) ? 0 : 1;
    else bad += g.data()[i].bits == L(v).bits ? 0 : 1;
  }
  return bad;
}

}  // namespace shard::test
