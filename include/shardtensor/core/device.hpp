#pragma once
/// \file device.hpp
/// Device tags (compile-time dispatch) and the runtime Device value carried by tensors.
#include <fmt/format.h>

namespace shard {

/// Where memory lives.
enum class DeviceKind : unsigned char { cpu, cuda };

/// A device: kind plus ordinal (the CUDA device index; 0 for CPU).
struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  constexpr bool is_cpu() const { return kind == DeviceKind::cpu; }
  constexpr bool is_cuda() const { return kind == DeviceKind::cuda; }
  friend constexpr bool operator==(const Device&, const Device&) = default;
  static constexpr Device cpu() { return {}; }
  static constexpr Device cuda(int i = 0) { return {DeviceKind::cuda, i}; }
};

namespace tag {
/// Compile-time tag for host code paths.
struct cpu { static constexpr DeviceKind kind = DeviceKind::cpu; };
/// Compile-time tag for CUDA code paths.
struct cuda { static constexpr DeviceKind kind = DeviceKind::cuda; };
}  // namespace tag

/// True when this build has CUDA support compiled in (see config.hpp).
bool cuda_compiled() noexcept;
/// Number of visible CUDA devices at run time (0 without a driver/GPU or without CUDA support).
int cuda_device_count() noexcept;

}  // namespace shard

template <> struct fmt::formatter<shard::Device> : fmt::formatter<fmt::string_view> {
  template <class Ctx> auto format(const shard::Device& d, Ctx& ctx) const {
    return d.is_cpu() ? fmt::format_to(ctx.out(), "cpu") : fmt::format_to(ctx.out(), "cuda:{}", d.index);
  }
};
