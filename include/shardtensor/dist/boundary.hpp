#pragma once
/// \file boundary.hpp
/// Boundary: how ghost cells beyond the global domain edge are filled along one tensor dim
/// (shared by the halo exchange, dist/halo.hpp, and a user's declared ghost layers,
/// dist/ghosts.hpp).
#include <cstdint>

#include <fmt/format.h>

namespace shard {

/// How ghost cells beyond the global domain edge are filled along one tensor dim.
enum class Boundary : std::uint8_t {
  zero,       ///< zeros (a convolution's zero padding)
  periodic,   ///< wrap around: index -1 is n-1 (PyTorch 'circular')
  reflect,    ///< mirror without repeating the edge: index -1 is 1 (PyTorch 'reflect')
  replicate,  ///< repeat the edge value: index -1 is 0 (PyTorch 'replicate')
};

/// Name of a boundary mode ("zero", ...).
constexpr const char* boundary_name(Boundary b) {
  switch (b) {
    case Boundary::zero: return "zero";
    case Boundary::periodic: return "periodic";
    case Boundary::reflect: return "reflect";
    case Boundary::replicate: return "replicate";
  }
  return "?";
}

}  // namespace shard

template <> struct fmt::formatter<shard::Boundary> : fmt::formatter<fmt::string_view> {
  template <class Ctx> auto format(shard::Boundary b, Ctx& ctx) const {
    return fmt::formatter<fmt::string_view>::format(shard::boundary_name(b), ctx);
  }
};
