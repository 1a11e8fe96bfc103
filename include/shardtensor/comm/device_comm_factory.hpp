#pragma once
/// \file device_comm_factory.hpp
/// The device-communicator factory interface (public so that the NCCL backend in src/cuda
/// implements it without including comm's private headers; users need it only for a backend).
// DeviceCommFactory (KernelFamily::comm): how make_device_comm() gets a device communicator
// (NCCL) from the CUDA backend without the core library linking it. shardtensor::cuda registers
// one for DeviceKind::cuda (src/cuda/nccl_comm.cpp).
#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/runtime/registry.hpp"

namespace shard::exec {

struct DeviceCommFactory {
  static constexpr KernelFamily id = KernelFamily::comm;
  virtual ~DeviceCommFactory() = default;
  /// A device communicator over the ranks of `base` for `dev` (collective over `base`; the
  /// caller has checked that no two ranks share a GPU).
  virtual CommPtr make(CommPtr base, Device dev) const = 0;
  /// "nccl", ...
  virtual const char* name() const noexcept = 0;
};

}  // namespace shard::exec
