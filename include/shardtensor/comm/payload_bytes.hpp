#pragma once
/// \file payload_bytes.hpp
/// Payload bytes of a v-collective (namespace comm_detail; public so that NcclComm in src/cuda
/// shares it).
// Payload bytes of a v-collective for the profiler's comm rows (SHARD_PROFILE_COMM in the
// Communicator backends: SelfComm, MpiComm, NcclComm).
#include <cstddef>
#include <cstdint>

namespace shard::comm_detail {

/// The sum of `counts` (elements) times `elem_bytes`.
template <class Counts>
std::uint64_t payload_bytes(const Counts& counts, std::size_t elem_bytes) noexcept {
  std::uint64_t n = 0;
  for (auto c : counts) n += static_cast<std::uint64_t>(c);
  return n * elem_bytes;
}

}  // namespace shard::comm_detail
