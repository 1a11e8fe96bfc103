#pragma once
/// \file nccl_comm.hpp
/// NcclComm: a Communicator whose device-buffer calls run on NCCL (defined in shardtensor::cuda;
/// link it to use these). Most programs call make_device_comm() (comm/device_comm.hpp), which
/// falls back to the host communicator where ranks share a GPU; make_nccl_comm() is the direct
/// factory.
///
/// Semantics (see communicator.hpp): a call with a context on the communicator's device runs on
/// that context's stream (blocking calls return once the work is queued; the result is usable by
/// later work on the stream); calls with host buffers (null or CPU context) delegate to the base
/// communicator. Collectives: allreduce (sum, avg via ncclAvg, max, min), broadcast, allgather,
/// allgatherv (ncclAllGather when every count is equal and the blocks packed, else grouped
/// ncclSend/ncclRecv), reduce_scatterv (ncclReduceScatter when counts are equal, else one
/// grouped ncclReduce per rank), alltoallv (grouped ncclSend/ncclRecv), sendrecv (one group).
/// isend/irecv are queued and launched together as one ncclSend/ncclRecv group at the first
/// wait()/test() of any of them or at the next call of the communicator (NCCL has no tags:
/// messages between two ranks match in order). Operations NCCL cannot do (avg of integers, a
/// dtype it has no reduction for) run through the base communicator on the device buffers.
/// split() uses ncclCommSplit, so DeviceMesh's per-dim communicators are NCCL too.
#include "shardtensor/comm/communicator.hpp"

namespace shard {

/// An NcclComm over the ranks of `base` on GPU `dev` (collective over `base`: rank 0 makes the
/// ncclUniqueId and broadcasts it over `base`). NCCL refuses two ranks on one GPU: check with
/// ranks_sharing_gpu() first, or use make_device_comm(). Throws shard::Error on every rank when
/// the id cannot be made or the initialisation fails on any rank.
CommPtr make_nccl_comm(CommPtr base, Device dev);

}  // namespace shard
