#pragma once
/// \file hash.hpp
/// 64-bit FNV-1a, the library's one byte hash: collective call keys and fingerprints
/// (dist/consistency.hpp), the checksum trailer of Module::save files and the checkpoint manifest
/// check, and the per-name parameter seeds (nn::seed_for). Fast and stable across platforms and
/// builds (file checksums and seeds depend on it); not cryptographic.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shard::detail {

inline constexpr std::uint64_t kFnv1aOffset = 0xcbf29ce484222325ull;  ///< the offset basis
inline constexpr std::uint64_t kFnv1aPrime = 0x100000001b3ull;

/// FNV-1a of the n bytes at p, continuing from state h (kFnv1aOffset starts a hash).
inline std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = kFnv1aOffset) noexcept {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= kFnv1aPrime;
  }
  return h;
}
/// FNV-1a of the characters of s, continuing from state h.
inline std::uint64_t fnv1a(std::string_view s, std::uint64_t h = kFnv1aOffset) noexcept {
  return fnv1a(s.data(), s.size(), h);
}

}  // namespace shard::detail
