#include "shardtensor/runtime/registry.hpp"

#include <array>
#include <atomic>

#include "shardtensor/config.hpp"
#include "shardtensor/core/error.hpp"

namespace shard::exec {
namespace {
constexpr int kFamilies = static_cast<int>(KernelFamily::count_);
// [device kind][family]; written at load time (static registrars), read everywhere after.
std::array<std::array<std::atomic<const void*>, kFamilies>, 2> g_tables{};

const char* family_name(KernelFamily f) {
  switch (f) {
    case KernelFamily::runtime: return "runtime";
    case KernelFamily::box: return "box";
    case KernelFamily::pointwise: return "pointwise";
    case KernelFamily::reduce: return "reduce";
    case KernelFamily::norm: return "norm";
    case KernelFamily::pool: return "pool";
    case KernelFamily::resize: return "resize";
    case KernelFamily::conv: return "conv";
    case KernelFamily::gemm: return "gemm";
    case KernelFamily::optim: return "optim";
    case KernelFamily::comm: return "comm";
    case KernelFamily::attention: return "attention";
    case KernelFamily::fft: return "fft";
    case KernelFamily::tensor: return "tensor";
    case KernelFamily::nbhd_attention: return "nbhd_attention";
    case KernelFamily::spectral: return "spectral";
    case KernelFamily::neighbors: return "neighbors";
    case KernelFamily::rows: return "rows";
    case KernelFamily::points: return "points";
    case KernelFamily::count_: break;
  }
  return "?";
}
std::size_t slot(DeviceKind k) { return k == DeviceKind::cpu ? 0 : 1; }
}  // namespace

void register_family(DeviceKind kind, KernelFamily family, const void* table) noexcept {
  g_tables[slot(kind)][static_cast<std::size_t>(family)].store(table, std::memory_order_release);
}

const void* find_family(DeviceKind kind, KernelFamily family) noexcept {
  return g_tables[slot(kind)][static_cast<std::size_t>(family)].load(std::memory_order_acquire);
}

const void* require_family(Device dev, KernelFamily family, const char* op) {
  if (const void* t = find_family(dev.kind, family)) return t;
  if (dev.is_cuda()) {
    SHARD_CHECK(SHARDTENSOR_HAS_CUDA, op, "tensor on {} but shardtensor was built without CUDA (SHARDTENSOR_ENABLE_CUDA=OFF)",
                dev);
    SHARD_FAIL(op,
               "tensor on {} but the CUDA backend is not linked into this program: link shardtensor::cuda "
               "(kernel family '{}')",
               dev, family_name(family));
  }
  SHARD_FAIL(op, "no {} implementation of kernel family '{}' is registered", dev, family_name(family));
}

}  // namespace shard::exec
