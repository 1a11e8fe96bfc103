#pragma once
/// \file communicator.hpp
/// Communicator: the one virtual interface of shardtensor. Backends: MpiComm (MPI; device
/// buffers go straight to a CUDA-aware MPI or are staged through pinned host memory), NcclComm
/// (comm/nccl_comm.hpp, shardtensor::cuda), SelfComm (one rank, no MPI). Buffers are type-erased
/// (pointer, count, DType); counts and displacements are in elements.
///
/// Every communication call takes a last `ExecContext* ctx` (default null):
///  - null, or a context on the CPU: the buffers are host memory (the historical semantics);
///  - a context on a CUDA device: the buffers are device memory of `ctx->device()` and the
///    operation is ordered on `ctx->stream()`: work queued on the stream before the call is seen
///    by it; a blocking call returns when its result is usable by work queued on that stream
///    afterwards; a request's wait() returns when the result is usable on that stream.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/context.hpp"
#include "shardtensor/comm/reduce_op.hpp"

namespace shard {

/// Handle of a non-blocking operation. wait() completes it (and runs any completion step,
/// such as the division of an avg-allreduce); a default-constructed Request is already complete.
class Request {
 public:
  struct State {
    virtual ~State() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;
  };
  Request() = default;
  explicit Request(std::shared_ptr<State> s) : state_(std::move(s)) {}
  /// Blocks until the operation completes. Idempotent.
  void wait() {
    if (state_) {
      auto s = std::move(state_);
      s->wait();
    }
  }
  /// True if complete (completes it if so).
  bool test() {
    if (!state_) return true;
    if (state_->test()) { state_.reset(); return true; }
    return false;
  }
  bool pending() const { return state_ != nullptr; }

 private:
  std::shared_ptr<State> state_;
};

/// Waits for every request in `reqs`.
inline void wait_all(std::span<Request> reqs) {
  for (auto& r : reqs) r.wait();
}

/// True when `ctx` says the buffers of a communication call are device memory.
inline bool on_device(const ExecContext* ctx) { return ctx != nullptr && !ctx->device().is_cpu(); }

/// Abstract communicator over a group of ranks. All collective calls must be made by every
/// rank of the group in the same order. Buffers are host memory unless the call's `ctx` is a
/// device context (see the file comment).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "mpi", "self", ...
  virtual std::string backend() const = 0;

  /// recv = reduce(send) over all ranks; send == recv means in place.
  virtual void allreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op,
                         ExecContext* ctx = nullptr) = 0;
  virtual void broadcast(void* buf, index_t count, DType dt, int root, ExecContext* ctx = nullptr) = 0;
  /// recv gets every rank's `count` elements in rank order.
  virtual void allgather(const void* send, index_t count, void* recv, DType dt, ExecContext* ctx = nullptr) = 0;
  /// recv gets rank r's counts[r] elements at displs[r].
  virtual void allgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                          std::span<const index_t> displs, DType dt, ExecContext* ctx = nullptr) = 0;
  /// send holds size() consecutive blocks of counts[r] elements; rank r receives reduce(block r).
  virtual void reduce_scatterv(const void* send, void* recv, std::span<const index_t> counts, DType dt,
                               ReduceOp op, ExecContext* ctx = nullptr) = 0;
  virtual void alltoallv(const void* send, std::span<const index_t> send_counts, std::span<const index_t> send_displs,
                         void* recv, std::span<const index_t> recv_counts, std::span<const index_t> recv_displs,
                         DType dt, ExecContext* ctx = nullptr) = 0;
  /// Sends to `dest` and receives from `source` at once (either may be -1 for none).
  virtual void sendrecv(const void* send, index_t send_count, int dest, void* recv, index_t recv_count, int source,
                        DType dt, int tag = 0, ExecContext* ctx = nullptr) = 0;
  virtual void barrier(ExecContext* ctx = nullptr) = 0;

  virtual Request isend(const void* buf, index_t count, DType dt, int dest, int tag = 0,
                        ExecContext* ctx = nullptr) = 0;
  virtual Request irecv(void* buf, index_t count, DType dt, int source, int tag = 0, ExecContext* ctx = nullptr) = 0;
  virtual Request iallreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op,
                             ExecContext* ctx = nullptr) = 0;
  virtual Request iallgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                              std::span<const index_t> displs, DType dt, ExecContext* ctx = nullptr) = 0;
  virtual Request ialltoallv(const void* send, std::span<const index_t> send_counts,
                             std::span<const index_t> send_displs, void* recv, std::span<const index_t> recv_counts,
                             std::span<const index_t> recv_displs, DType dt, ExecContext* ctx = nullptr) = 0;

  /// New communicator of the ranks with the same `color`, ordered by `key` (collective). Its
  /// watchdog timeout follows this communicator's (also when set later, e.g. on a mesh's
  /// communicator after the mesh made its sub-communicators) until set on the new one itself;
  /// the name is not inherited.
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;

  // ---- identity and collective watchdog ----
  /// A label for messages (DeviceMesh names its sub-communicators "mesh [2, 2] dims [0]");
  /// empty by default.
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  /// Collective watchdog timeout in seconds; 0 = off (the default). When on, a rank blocked in
  /// one of this communicator's collectives, or in a wait() on one of its requests, for longer
  /// than this aborts the whole job (MPI_Abort) with a message on stderr that names the
  /// operation, the communicator (name(), size) and the rank, instead of waiting forever. The
  /// initial value comes from the environment variable SHARDTENSOR_COMM_TIMEOUT (seconds, read
  /// once per process; unset, empty or 0 = off); a call's ExecContext can override it
  /// (ExecSettings::comm_timeout). Backends without blocking waits (SelfComm) ignore it. Off, it
  /// costs nothing: the MPI backend then calls the blocking MPI functions as before.
  /// A communicator made by split() follows its parent's setting until set_timeout is called on
  /// it (then its own value wins, for it and for communicators split from it).
  double timeout() const {
    for (const TimeoutState* s = timeout_.get(); s != nullptr; s = s->parent.get()) {
      const double v = s->own.load(std::memory_order_relaxed);
      if (v >= 0) return v;
    }
    return env_comm_timeout();
  }
  void set_timeout(double seconds) { timeout_->own.store(seconds > 0 ? seconds : 0.0, std::memory_order_relaxed); }

  /// Sequence number of the next checked call on this communicator (collective consistency
  /// checking, dist/consistency.hpp): how many checked calls this rank made here before.
  std::uint64_t next_checked_call() noexcept { return checked_calls_.fetch_add(1, std::memory_order_relaxed); }

  // ---- conveniences built on the primitives (non-virtual) ----
  /// reduce_scatterv with equal counts.
  void reduce_scatter(const void* send, void* recv, index_t count, DType dt, ReduceOp op,
                      ExecContext* ctx = nullptr);
  /// alltoallv with equal counts.
  void alltoall(const void* send, void* recv, index_t count, DType dt, ExecContext* ctx = nullptr);

  /// Typed in-place allreduce (host buffer).
  template <class T> void allreduce_inplace(T* buf, index_t count, ReduceOp op) {
    allreduce(buf, buf, count, dtype_of<T>, op);
  }
  /// Every rank's value of `v`, in rank order (host).
  template <class T> std::vector<T> allgather_value(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    std::vector<T> out(static_cast<std::size_t>(size()));
    allgather(&v, static_cast<index_t>(sizeof(T)), out.data(), byte_dtype());
    return out;
  }
  /// Every rank's vector `v` (sizes may differ), in rank order.
  std::vector<std::vector<index_t>> allgather_vectors(const std::vector<index_t>& v);

  /// Collective precondition check: every rank passes its own `ok`; if any rank's is false,
  /// every rank throws shard::Error carrying the message of the lowest failing rank. Never hangs.
  void check_all(bool ok, const char* op, const std::string& message_if_not_ok);
  /// check_all that also agrees `key`, a hash of the arguments every rank must pass alike: a cheap
  /// check folded into the same allgather (16 bytes per rank instead of 4), on whether or not
  /// collective consistency checking is (issue 18 item 6). If every `ok` holds but the keys
  /// differ, every rank throws shard::Error naming which ranks passed what: each rank's
  /// `describe()`, gathered only then.
  void check_all(bool ok, const char* op, const std::string& message_if_not_ok, std::uint64_t key,
                 const std::function<std::string()>& describe);
  /// Every rank's `text`, grouped by value in order of first appearance: (text, ranks holding it).
  /// Collective (one allgather of lengths, one allgatherv).
  std::vector<std::pair<std::string, std::vector<int>>> group_texts(const std::string& text);

 protected:
  /// DType used to move raw bytes.
  static constexpr DType byte_dtype() { return DType::u8; }
  /// For split(): this (new) communicator's timeout follows `parent`'s until set on this one.
  void follow_timeout_of(const Communicator& parent) { timeout_->parent = parent.timeout_; }

 private:
  /// The watchdog setting: own value (< 0 = not set here) and the parent's state it follows.
  /// Shared pointers, so a split child keeps following after the parent object is gone.
  struct TimeoutState {
    std::atomic<double> own{-1.0};
    std::shared_ptr<const TimeoutState> parent;
  };
  std::string name_;
  std::atomic<std::uint64_t> checked_calls_{0};
  std::shared_ptr<TimeoutState> timeout_ = std::make_shared<TimeoutState>();
  static double env_comm_timeout();
};

/// Shared handle to a communicator.
using CommPtr = std::shared_ptr<Communicator>;

/// The one-rank communicator: every collective is a local copy. Needs no MPI.
class SelfComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "self"; }
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

 private:
  struct Pending;  // self send/recv matching
  /// A message sent to self, not yet received: host bytes, or (device buffers) a device copy
  /// queued on the sender's stream, so nothing synchronises (a captured step may send to self).
  struct SelfMessage {
    int tag;
    std::vector<char> host;
    std::shared_ptr<void> device;
    std::size_t bytes;
    Device where = Device::cpu();  // of `device`
    Stream stream{};               // the sender's stream (its copy into `device` is queued there)
  };
  std::vector<SelfMessage> mailbox_;
};

/// Default communicator: a duplicate of MPI_COMM_WORLD when MPI is enabled (initialising MPI if
/// nobody has), else a SelfComm.
CommPtr default_comm();

}  // namespace shard
