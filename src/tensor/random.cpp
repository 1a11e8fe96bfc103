#include <cmath>

#include "shardtensor/tensor/tensor.hpp"

namespace shard {
namespace {
constexpr std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform in (0, 1) with 53 random bits.
double unit(std::uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
}  // namespace

double random_value(std::uint64_t seed, std::uint64_t idx, RandomInit init) noexcept {
  const std::uint64_t k = splitmix64(seed * 0xd1b54a32d192ed03ull + 0x8cb92ba72f3d8dd7ull);
  const std::uint64_t h1 = splitmix64(k ^ splitmix64(2 * idx));
  if (init.kind == RandomInit::Kind::uniform) return init.a + (init.b - init.a) * unit(h1);
  const std::uint64_t h2 = splitmix64(k ^ splitmix64(2 * idx + 1));
  const double r = std::sqrt(-2.0 * std::log(unit(h1)));
  return init.a + init.b * r * std::cos(6.283185307179586 * unit(h2));
}

}  // namespace shard
