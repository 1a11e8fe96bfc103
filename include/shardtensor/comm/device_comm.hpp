#pragma once
/// \file device_comm.hpp
/// Choosing the communicator for device buffers. NCCL refuses two ranks on one GPU ("Duplicate
/// GPU detected"), so make_device_comm() first finds the ranks that share a GPU (same host and
/// same GPU UUID) and, if there are any, keeps the host communicator (MpiComm moves device
/// buffers CUDA-aware or staged through pinned host memory) instead of making an NcclComm.
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"

namespace shard {

/// Groups (each of >= 2 ranks of `comm`, ascending) of ranks whose `dev` is the same physical
/// GPU on the same host; empty when every rank has a GPU of its own. Collective over `comm`;
/// throws shard::Error on every rank if any rank cannot query its device.
std::vector<std::vector<int>> ranks_sharing_gpu(Communicator& comm, Device dev);

/// The communicator for buffers on `dev` over the ranks of `base` (collective over `base`):
///  - `dev` on the CPU: `base`;
///  - every rank on its own GPU and the NCCL backend linked (shardtensor::cuda): an NcclComm
///    made from `base` (host-buffer calls delegate to `base`);
///  - ranks sharing a GPU, or no NCCL backend linked: `base` itself (the fallback; the first
///    time, rank 0 logs to stderr which ranks share which GPU), or, with `allow_fallback` false,
///    shard::Error on every rank naming the ranks that share each GPU.
CommPtr make_device_comm(CommPtr base, Device dev, bool allow_fallback = true);

}  // namespace shard
