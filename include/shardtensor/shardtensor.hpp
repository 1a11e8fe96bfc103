#pragma once
/// \file shardtensor.hpp
/// Umbrella header: everything a user of shardtensor needs.
#include "shardtensor/config.hpp"
#include "shardtensor/core/device.hpp"
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/tensor/memory.hpp"
#include "shardtensor/tensor/ops.hpp"
#include "shardtensor/tensor/tensor.hpp"
#include "shardtensor/mesh/placement.hpp"
#include "shardtensor/mesh/shard_layout.hpp"
#include "shardtensor/comm/communicator.hpp"
#if SHARDTENSOR_HAS_MPI
#include "shardtensor/comm/mpi_comm.hpp"
#endif
#include "shardtensor/mesh/device_mesh.hpp"
#include "shardtensor/dist/dist_spec.hpp"
#include "shardtensor/dist/dist_tensor.hpp"
#include "shardtensor/dist/halo.hpp"
#include "shardtensor/autograd/variable.hpp"
#include "shardtensor/autograd/comm_ops.hpp"
#include "shardtensor/nn/module.hpp"
#include "shardtensor/nn/parameter.hpp"
#include "shardtensor/optim/optimizer.hpp"
#include "shardtensor/nn/layers.hpp"
