#include "shardtensor/comm/device_comm.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>

#include "shardtensor/comm/device_comm_factory.hpp"
#include "shardtensor/config.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/device_runtime.hpp"
#if SHARDTENSOR_HAS_MPI
#include "shardtensor/comm/mpi_comm.hpp"
#endif

namespace shard {
namespace {

// One rank's identity of its GPU: host name and GPU UUID, fixed size so it can be allgathered.
struct GpuKey {
  std::array<char, 192> host{};
  std::array<char, 64> uuid{};
};

std::string text(const char* p, std::size_t n) { return std::string(p, strnlen(p, n)); }

// "ranks 0, 2 share GPU <uuid> on host <h>; ranks 1, 3 share ..."
std::string describe(const std::vector<std::vector<int>>& groups, const std::vector<GpuKey>& keys) {
  std::string out;
  for (const auto& g : groups) {
    const auto& k = keys[static_cast<std::size_t>(g.front())];
    if (!out.empty()) out += "; ";
    out += fmt::format("ranks {} share GPU {} on host {}", fmt::join(g, ", "), text(k.uuid.data(), k.uuid.size()),
                       text(k.host.data(), k.host.size()));
  }
  return out;
}

std::vector<std::vector<int>> groups_of(const std::vector<GpuKey>& keys) {
  std::map<std::pair<std::string, std::string>, std::vector<int>> by;
  for (std::size_t r = 0; r < keys.size(); ++r)
    by[{text(keys[r].host.data(), keys[r].host.size()), text(keys[r].uuid.data(), keys[r].uuid.size())}].push_back(
        static_cast<int>(r));
  std::vector<std::vector<int>> out;
  for (auto& [k, ranks] : by)
    if (ranks.size() > 1) out.push_back(ranks);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<GpuKey> gather_keys(Communicator& comm, Device dev) {
  GpuKey mine;
  std::string err;
  try {
    const auto& rt = exec::kernels_for<exec::DeviceRuntime>(dev, "make_device_comm");
    rt.check_device(dev.index, "make_device_comm");
    rt.device_uuid(dev.index, mine.uuid.data());
    mine.uuid.back() = '\0';
    if (gethostname(mine.host.data(), mine.host.size() - 1) != 0) std::snprintf(mine.host.data(), 8, "unknown");
  } catch (const Error& e) {
    err = e.what();
  }
  comm.check_all(err.empty(), "make_device_comm", err);
  return comm.allgather_value(mine);
}

std::atomic<bool> g_logged{false};

}  // namespace

std::vector<std::vector<int>> ranks_sharing_gpu(Communicator& comm, Device dev) {
  SHARD_CHECK(dev.is_cuda(), "ranks_sharing_gpu", "device {} is not a GPU", dev);
  return groups_of(gather_keys(comm, dev));
}

CommPtr make_device_comm(CommPtr base, Device dev, bool allow_fallback) {
  SHARD_CHECK(base != nullptr, "make_device_comm", "null base communicator");
  if (dev.is_cpu()) return base;
  const auto keys = gather_keys(*base, dev);
  const auto groups = groups_of(keys);
  std::string why;
  if (!groups.empty()) {
    why = describe(groups, keys);
    SHARD_CHECK(allow_fallback, "make_device_comm",
                "{} ({}): NCCL refuses two ranks on one GPU and the fallback to the host communicator is "
                "disabled; give every rank its own GPU or allow the fallback",
                why, dev);
  } else {
    // Every rank runs the same program, but agree anyway so no rank enters NCCL's collective
    // initialisation alone.
    const int have = exec::find_family(dev.kind, exec::KernelFamily::comm) != nullptr ? 1 : 0;
    int all = have;
    base->allreduce(&have, &all, 1, DType::i32, ReduceOp::min);
    if (all) {
      const auto& f = exec::kernels_for<exec::DeviceCommFactory>(dev, "make_device_comm");
      return f.make(base, dev);
    }
    why = "no NCCL backend is linked into this program (link shardtensor::cuda, built with NCCL)";
    SHARD_CHECK(allow_fallback, "make_device_comm", "{} ({}) and the fallback to the host communicator is disabled",
                why, dev);
  }
  if (base->rank() == 0 && !g_logged.exchange(true)) {
    std::string how = "device buffers through its device path";
#if SHARDTENSOR_HAS_MPI
    if (auto* m = dynamic_cast<MpiComm*>(base.get()))
      how = m->passes_device_pointers() ? "device buffers go to the CUDA-aware MPI directly"
                                        : "device buffers are staged through pinned host memory";
#endif
    std::fprintf(stderr, "shardtensor: make_device_comm(%s): %s; using the %s communicator instead of NCCL (%s)\n",
                 fmt::format("{}", dev).c_str(), why.c_str(), base->backend().c_str(), how.c_str());
  }
  return base;
}

}  // namespace shard
