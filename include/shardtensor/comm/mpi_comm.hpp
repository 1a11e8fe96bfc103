#pragma once
/// \file mpi_comm.hpp
/// MpiComm: Communicator over an MPI communicator. Only available when SHARDTENSOR_ENABLE_MPI is
/// on. Device buffers (a call with a CUDA ExecContext) are passed straight to MPI when the MPI is
/// CUDA-aware (see mpi_cuda_aware()), and otherwise staged through pinned host buffers that the
/// communicator keeps and grows on demand (through the CUDA backend's DeviceRuntime).
#include <mpi.h>

#include "shardtensor/comm/communicator.hpp"

namespace shard {

/// Initialises MPI (MPI_THREAD_FUNNELED) unless it already is; if shardtensor initialised it,
/// MPI_Finalize runs at process exit. Returns true if this call initialised MPI.
bool mpi_init_if_needed(int* argc = nullptr, char*** argv = nullptr);

/// Whether device pointers may be handed to MPI: the environment variable
/// SHARDTENSOR_MPI_CUDA_AWARE=1/0 decides if set; otherwise MPIX_Query_cuda_support() where
/// <mpi-ext.h> declares it (Open MPI); otherwise false. Evaluated once per process.
bool mpi_cuda_aware();

/// How an MpiComm moves device buffers: `automatic` = `direct` when mpi_cuda_aware(), else
/// `staged`; `direct` hands device pointers to MPI; `staged` copies through pinned host buffers.
enum class MpiDeviceTransport : unsigned char { automatic, direct, staged };

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
  void allreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op,
                 ExecContext* ctx = nullptr) override;
  void broadcast(void* buf, index_t count, DType dt, int root, ExecContext* ctx = nullptr) override;
  void allgather(const void* send, index_t count, void* recv, DType dt, ExecContext* ctx = nullptr) override;
  void allgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                  std::span<const index_t> displs, DType dt, ExecContext* ctx = nullptr) override;
  void reduce_scatterv(const void* send, void* recv, std::span<const index_t> counts, DType dt, ReduceOp op,
                       ExecContext* ctx = nullptr) override;
  void alltoallv(const void* send, std::span<const index_t> send_counts, std::span<const index_t> send_displs,
                 void* recv, std::span<const index_t> recv_counts, std::span<const index_t> recv_displs,
                 DType dt, ExecContext* ctx = nullptr) override;
  void sendrecv(const void* send, index_t send_count, int dest, void* recv, index_t recv_count, int source, DType dt,
                int tag = 0, ExecContext* ctx = nullptr) override;
  void barrier(ExecContext* ctx = nullptr) override;
  Request isend(const void* buf, index_t count, DType dt, int dest, int tag = 0, ExecContext* ctx = nullptr) override;
  Request irecv(void* buf, index_t count, DType dt, int source, int tag = 0, ExecContext* ctx = nullptr) override;
  Request iallreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op,
                     ExecContext* ctx = nullptr) override;
  Request iallgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                      std::span<const index_t> displs, DType dt, ExecContext* ctx = nullptr) override;
  Request ialltoallv(const void* send, std::span<const index_t> send_counts, std::span<const index_t> send_displs,
                     void* recv, std::span<const index_t> recv_counts, std::span<const index_t> recv_displs,
                     DType dt, ExecContext* ctx = nullptr) override;
  std::shared_ptr<Communicator> split(int color, int key) override;

  /// Chooses how device buffers move (default automatic); communicators made by split() inherit it.
  void set_device_transport(MpiDeviceTransport t) { transport_ = t; }
  MpiDeviceTransport device_transport() const { return transport_; }
  /// True when device buffers go to MPI directly (the resolved transport).
  bool passes_device_pointers() const;

  /// Pinned staging memory this communicator holds for device buffers (bytes; 0 until a device
  /// call needed staging).
  std::size_t staging_bytes() const;

  /// Pool of reusable pinned host buffers (defined in mpi_comm.cpp).
  struct Staging;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<Staging> staging_;  // created on the first staged call
  MpiDeviceTransport transport_ = MpiDeviceTransport::automatic;
};

}  // namespace shard
