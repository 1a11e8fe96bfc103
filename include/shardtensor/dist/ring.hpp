#pragma once
/// \file ring.hpp
/// Split-phase ring shift (the communication of ring attention): every rank of a ring sends its
/// block to the next rank and receives the previous rank's block, with `start` / `finish` so the
/// caller computes while the messages fly. The ring runs along one mesh dim, or along the
/// flattened product of several mesh dims (row-major over them in ascending mesh-dim order, the
/// order of DeviceMesh::dims_comm); ranks that differ outside those dims belong to different rings.
///
/// Blocks may differ in size from rank to rank (uneven shards): each segment of a transfer names
/// its send count and its receive count (for a sharded tensor both follow from its DistSpec:
/// `ring_block_shape`; otherwise `RingShift::exchange_counts` trades them). Buffers live on any
/// device: the Communicator calls take the ExecContext of the data (a device context means device
/// memory, ordered on its stream).
///
/// The adjoint of a forward shift S (y_r = x_{r-1}) is the backward shift S^T (x_r = y_{r+1}):
/// start the same segments with `RingDirection::backward` and swapped counts;
/// <S x, y> = <x, S^T y> (tests/dist/mpi_ring.cpp).
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/dist/dist_tensor.hpp"
#include "shardtensor/mesh/device_mesh.hpp"

namespace shard {

/// Which way a shift moves the blocks: forward sends to ring index r+1 and receives from r-1;
/// backward (the adjoint) sends to r-1 and receives from r+1.
enum class RingDirection { forward, backward };

/// One buffer pair of a shift: `send_count` elements of `send` leave, `recv_count` elements arrive
/// in `recv` (which must not overlap `send`). Several segments of one transfer (e.g. K and V) move
/// as separate messages with their own tags.
struct RingSegment {
  const void* send = nullptr;
  index_t send_count = 0;
  void* recv = nullptr;
  index_t recv_count = 0;
};

/// The ring over the ranks of a mesh that differ only in a set of mesh dims.
class RingShift {
 public:
  /// An in-flight shift: finish() waits for every message (idempotent). The destructor finishes
  /// a transfer that is still pending (so buffers are never released under MPI's feet).
  class Transfer {
   public:
    Transfer() = default;
    Transfer(Transfer&&) noexcept = default;
    Transfer& operator=(Transfer&& o) noexcept {
      if (this != &o) {
        finish_quietly();
        reqs_ = std::move(o.reqs_);
      }
      return *this;
    }
    Transfer(const Transfer&) = delete;
    Transfer& operator=(const Transfer&) = delete;
    ~Transfer() { finish_quietly(); }
    /// Waits until every segment has been sent and received.
    void finish() {
      auto r = std::move(reqs_);
      reqs_.clear();
      wait_all(r);
    }
    bool pending() const { return !reqs_.empty(); }

   private:
    friend class RingShift;
    void finish_quietly() noexcept {
      try {
        finish();
      } catch (...) {
      }
    }
    std::vector<Request> reqs_;
  };

  RingShift() = default;
  /// The ring of this rank along mesh dims `dims` (distinct, any order; the ring order is
  /// row-major over them in ascending order). Collective over the mesh on the first use of a set
  /// of several dims (DeviceMesh::dims_comm). An empty `dims` is a one-rank ring.
  RingShift(const DeviceMesh& mesh, std::vector<int> dims);

  /// Number of ranks in the ring.
  int size() const { return size_; }
  /// This rank's position in the ring.
  int index() const { return index_; }
  /// Ring position `steps` after this one (negative: before), modulo size().
  int neighbor(int steps) const { return ((index_ + steps) % size_ + size_) % size_; }
  /// Mesh rank (DeviceMesh::rank) of ring position j: this rank's coordinates outside the ring
  /// dims, ring dims unravelled row-major from j.
  int mesh_rank_of(int j) const;
  /// The ring's mesh dims (ascending).
  const std::vector<int>& dims() const { return dims_; }
  /// The ring's communicator (null for a one-rank ring over no dims).
  const CommPtr& comm() const { return comm_; }

  /// Starts a shift of `segments` (dtype `dt`) in direction `dir`; `ctx` is the data's
  /// ExecContext (null or CPU: host memory). `tag` (0..63) separates shifts in flight at once on
  /// one ring. A one-rank ring moves nothing: each segment's send must equal its receive count
  /// and the data is copied on `ctx`'s device.
  Transfer start(std::span<const RingSegment> segments, DType dt, RingDirection dir = RingDirection::forward,
                 ExecContext* ctx = nullptr, int tag = 0) const;

  /// The element count each rank will receive when every rank sends `send_count` (blocking, one
  /// sendrecv): for blocks whose sizes no spec tells.
  index_t exchange_counts(index_t send_count, RingDirection dir = RingDirection::forward) const;

 private:
  DeviceMesh mesh_;
  std::vector<int> dims_;
  CommPtr comm_;
  int size_ = 1, index_ = 0;
};

/// Local shape, on the rank at ring position j of `ring`, of a tensor laid out by `spec` (the shape
/// of the block a shift delivers from there).
template <int R>
Shape<R> ring_block_shape(const DistSpec& spec, const RingShift& ring, int j) {
  const Box& b = spec.box_of(ring.mesh_rank_of(j));
  Shape<R> s{};
  for (int d = 0; d < R; ++d) s[static_cast<std::size_t>(d)] = b.len[static_cast<std::size_t>(d)];
  return s;
}

/// A typed in-flight shift of one tensor block; finish() returns the received block.
template <class T, int R>
class RingTensorShift {
 public:
  RingTensorShift() = default;
  RingTensorShift(RingShift::Transfer tr, Tensor<T, R> send, Tensor<T, R> recv)
      : tr_(std::move(tr)), send_(std::move(send)), recv_(std::move(recv)) {}
  /// Waits and returns the received block (contiguous).
  Tensor<T, R> finish() {
    tr_.finish();
    send_ = Tensor<T, R>();
    return recv_;
  }

 private:
  RingShift::Transfer tr_;
  Tensor<T, R> send_;  // kept alive until the send completed
  Tensor<T, R> recv_;
};

/// Starts shifting `block` (any strides; copied if not contiguous) around `ring`; the block that
/// arrives has shape `recv_shape` (from the sender's spec: ring_block_shape of neighbor(-1) for a
/// forward shift, neighbor(+1) for a backward one).
template <class T, int R>
RingTensorShift<T, R> ring_shift_start(const RingShift& ring, const Tensor<T, R>& block,
                                       const std::type_identity_t<Shape<R>>& recv_shape,
                                       RingDirection dir = RingDirection::forward, int tag = 0) {
  Tensor<T, R> send = block.contiguous();
  Tensor<T, R> recv = Tensor<T, R>::empty(recv_shape, block.device());
  const RingSegment seg{send.data(), send.numel(), recv.data(), recv.numel()};
  ExecContext& ctx = current_context(block.device());
  auto tr = ring.start(std::span<const RingSegment>(&seg, 1), dtype_of<T>, dir, &ctx, tag);
  return RingTensorShift<T, R>(std::move(tr), std::move(send), std::move(recv));
}

/// One whole shift of a sharded tensor's local block along mesh dims `dims`: returns the local
/// block of the previous ring rank (forward) or of the next one (backward, the adjoint).
template <class T, int R>
Tensor<T, R> ring_shift(const DistTensor<T, R>& x, const std::vector<int>& dims,
                        RingDirection dir = RingDirection::forward) {
  RingShift ring(x.mesh(), dims);
  const int from = ring.neighbor(dir == RingDirection::forward ? -1 : 1);
  return ring_shift_start(ring, x.local(), ring_block_shape<R>(x.spec(), ring, from), dir).finish();
}

}  // namespace shard
