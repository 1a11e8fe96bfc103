#pragma once
/// \file mpi_comm.hpp
/// MpiComm: Communicator over an MPI communicator (host buffers). Only available when
/// SHARDTENSOR_ENABLE_MPI is on.
#include <mpi.h>

#include "shardtensor/comm/communicator.hpp"

namespace shard {

/// Initialises MPI (MPI_THREAD_FUNNELED) unless it already is; if shardtensor initialised it,
/// MPI_Finalize runs at process exit. Returns true if this call initialised MPI.
bool mpi_init_if_needed(int* argc = nullptr, char*** argv = nullptr);

/// Communicator over a duplicate of a user's MPI communicator. MPI errors become shard::Error.
class MpiComm final : public Communicator {
 public:
  /// Duplicates `comm` (the user's communicator is never used directly, nor freed).
  explicit MpiComm(MPI_Comm comm);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  /// A duplicate of MPI_COMM_WORLD (initialises MPI if needed).
  static std::shared_ptr<MpiComm> world();
  /// The duplicated MPI communicator (owned by this object).
  MPI_Comm native() const { return comm_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  void allreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op) override;
  void broadcast(void* buf, index_t count, DType dt, int root) override;
  void allgather(const void* send, index_t count, void* recv, DType dt) override;
  void allgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                  std::span<const index_t> displs, DType dt) override;
  void reduce_scatterv(const void* send, void* recv, std::span<const index_t> counts, DType dt, ReduceOp op) override;
  void alltoallv(const void* send, std::span<const index_t> send_counts, std::span<const index_t> send_displs,
                 void* recv, std::span<const index_t> recv_counts, std::span<const index_t> recv_displs,
                 DType dt) override;
  void sendrecv(const void* send, index_t send_count, int dest, void* recv, index_t recv_count, int source, DType dt,
                int tag = 0) override;
  void barrier() override;
  Request isend(const void* buf, index_t count, DType dt, int dest, int tag = 0) override;
  Request irecv(void* buf, index_t count, DType dt, int source, int tag = 0) override;
  Request iallreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op) override;
  Request iallgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                      std::span<const index_t> displs, DType dt) override;
  Request ialltoallv(const void* send, std::span<const index_t> send_counts, std::span<const index_t> send_displs,
                     void* recv, std::span<const index_t> recv_counts, std::span<const index_t> recv_displs,
                     DType dt) override;
  std::shared_ptr<Communicator> split(int color, int key) override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace shard
