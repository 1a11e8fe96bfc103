#pragma once
// Helpers of the MPI gpusim tests (tests/gpusim/mpi_cuda_sim_*.cpp): this rank's block of a
// DistTensor (any device) as doubles, and the largest difference relative to max(1, max |b|).
#include <algorithm>
#include <cmath>
#include <vector>

#include <shardtensor/shardtensor.hpp>

namespace st_gpusim_mpi_support {

/// This rank's local block, copied to the host, as doubles (bf16 / f16 through float, exact).
template <class T, int R>
std::vector<double> flat(const shard::DistTensor<T, R>& t) {
  const auto h = t.local().contiguous().to(shard::Device::cpu());
  std::vector<double> v(static_cast<std::size_t>(h.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(static_cast<float>(h.data()[i]));
  return v;
}

/// max |a - b| / max(1, max |b|); infinite for different sizes.
inline double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0, s = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(a[i] - b[i]));
    s = std::max(s, std::abs(b[i]));
  }
  return m / s;
}

}  // namespace st_gpusim_mpi_support
