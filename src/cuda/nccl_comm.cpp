// NcclComm (include/shardtensor/comm/nccl_comm.hpp): device-buffer communication on NCCL, host
// buffers through the base communicator it was made from; and its registration as the CUDA
// device-communicator factory (KernelFamily::comm) that make_device_comm() uses.
#include "shardtensor/comm/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/comm/payload_bytes.hpp"
#include "shardtensor/comm/device_comm_factory.hpp"
#include "shardtensor/runtime/device_runtime.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard {
namespace {

void nccl_check(ncclResult_t rc, const char* op, const char* call, ncclComm_t comm = nullptr) {
  if (rc == ncclSuccess) [[likely]]
    return;
  const char* last = ncclGetLastError(comm);
  SHARD_FAIL(op, "{} failed: {}{}{}", call, ncclGetErrorString(rc), last && *last ? ": " : "", last ? last : "");
}

// The NCCL type of a reduction on `dt` (false if NCCL has none).
bool nccl_type(DType dt, ncclDataType_t* t) {
  switch (dt) {
    case DType::f32: *t = ncclFloat32; return true;
    case DType::f64: *t = ncclFloat64; return true;
    case DType::f16: *t = ncclFloat16; return true;
    case DType::bf16: *t = ncclBfloat16; return true;
    case DType::i32: *t = ncclInt32; return true;
    case DType::i64: *t = ncclInt64; return true;
    case DType::u8: *t = ncclUint8; return true;
    default: return false;
  }
}

bool floating(DType dt) { return dt == DType::f32 || dt == DType::f64 || dt == DType::f16 || dt == DType::bf16; }

// NCCL type and op for a reduction; false when NCCL cannot do it (integer avg: the host path
// truncates the quotient, ncclAvg's integer rounding is not specified) so the caller delegates.
bool nccl_reduction(DType dt, ReduceOp op, ncclDataType_t* t, ncclRedOp_t* o) {
  if (!nccl_type(dt, t)) return false;
  switch (op) {
    case ReduceOp::sum: *o = ncclSum; return true;
    case ReduceOp::max: *o = ncclMax; return true;
    case ReduceOp::min: *o = ncclMin; return true;
    case ReduceOp::avg: *o = ncclAvg; return floating(dt);
  }
  return false;
}

std::size_t nbytes(index_t count, DType dt) { return static_cast<std::size_t>(count) * dtype_size(dt); }

cudaStream_t stream_of(const ExecContext& ctx) { return static_cast<cudaStream_t>(ctx.stream().handle); }

// Runs ncclGroupStart/ncclGroupEnd around a scope.
class Group {
 public:
  Group(const char* op, ncclComm_t c) : op_(op), c_(c) { nccl_check(ncclGroupStart(), op, "ncclGroupStart", c); }
  ~Group() noexcept(false) {
    if (std::uncaught_exceptions() == 0) nccl_check(ncclGroupEnd(), op_, "ncclGroupEnd", c_);
    else ncclGroupEnd();
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

 private:
  const char* op_;
  ncclComm_t c_;
};

/// A cudaEvent_t recorded after queued device work (disable-timing; destroyed with the object).
/// Requests on device memory are event-backed: test() is true only once the work has run on the
/// GPU, not merely been queued on its stream; wait() keeps the stream-ordered meaning (work queued
/// later on the same stream runs after it; the host waits with test() or a stream sync).
///
/// On a stream being captured into a graph (optim/captured_step.hpp) nothing is recorded: an
/// event recorded in a capture belongs to the replays and may not be queried. Such a request is
/// stream-ordered only (test() is true at once: the operation is part of the graph).
bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return st != cudaStreamCaptureStatusNone;
}

struct RecordedEvents {
  std::vector<cudaEvent_t> events;
  RecordedEvents() = default;
  RecordedEvents(const RecordedEvents&) = delete;
  RecordedEvents& operator=(const RecordedEvents&) = delete;
  ~RecordedEvents() {
    for (auto e : events) cudaEventDestroy(e);
  }
  void record(cudaStream_t s, const char* op) {
    if (capturing(s)) return;
    cudaEvent_t e = nullptr;
    cudaError_t rc = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (rc == cudaSuccess) {
      rc = cudaEventRecord(e, s);
      if (rc != cudaSuccess) cudaEventDestroy(e);
    }
    SHARD_CHECK(rc == cudaSuccess, op, "cannot record the completion event of a request: {}", cudaGetErrorString(rc));
    events.push_back(e);
  }
  /// True when every recorded event has completed; throws on a device error.
  bool done(const char* op) const {
    for (auto e : events) {
      const cudaError_t rc = cudaEventQuery(e);
      if (rc == cudaErrorNotReady) {
        cudaGetLastError();
        return false;
      }
      SHARD_CHECK(rc == cudaSuccess, op, "device error while testing a request: {}", cudaGetErrorString(rc));
    }
    return true;
  }
};

/// The request of a collective queued on a stream at once.
struct EventState final : Request::State {
  RecordedEvents ev;
  void wait() override {}  // stream-ordered (see RecordedEvents)
  bool test() override { return ev.done("NcclComm::test"); }
};

// isend/irecv operations queued until the first wait()/test() or the next call of the
// communicator, then launched as one group (so a rank's sends and receives cannot block each
// other on its stream).
struct P2PQueue {
  struct Op {
    bool send;
    void* buf;
    std::size_t bytes;
    int peer;
    cudaStream_t stream;
  };
  ncclComm_t comm = nullptr;
  std::vector<Op> ops;
  std::uint64_t queued = 0, launched = 0;  // tickets
  /// Completion events of launched groups, keyed by the last ticket of each group.
  std::vector<std::pair<std::uint64_t, std::shared_ptr<RecordedEvents>>> groups;

  void flush() {
    if (ops.empty()) return;
    auto todo = std::move(ops);
    ops.clear();
    launched = queued;
    {
      Group g("NcclComm::wait", comm);
      for (const auto& o : todo) {
        if (o.send) nccl_check(ncclSend(o.buf, o.bytes, ncclUint8, o.peer, comm, o.stream), "isend", "ncclSend", comm);
        else nccl_check(ncclRecv(o.buf, o.bytes, ncclUint8, o.peer, comm, o.stream), "irecv", "ncclRecv", comm);
      }
    }
    auto ev = std::make_shared<RecordedEvents>();
    std::vector<cudaStream_t> streams;
    for (const auto& o : todo)
      if (std::find(streams.begin(), streams.end(), o.stream) == streams.end()) streams.push_back(o.stream);
    bool in_capture = false;
    for (auto s : streams) {
      in_capture = in_capture || capturing(s);
      ev->record(s, "NcclComm::wait");
    }
    // Forget groups that have completed (a later test() of theirs finds no group: done). Not
    // while capturing: an event query would invalidate the capture.
    if (!in_capture) std::erase_if(groups, [](const auto& g) { return g.second->done("NcclComm::wait"); });
    groups.emplace_back(launched, std::move(ev));
  }
  /// True when the group holding `ticket` has run on the GPU.
  bool done(std::uint64_t ticket) {
    for (const auto& g : groups)
      if (g.first >= ticket) return g.second->done("NcclComm::test");
    return true;  // its group completed and was forgotten (or it moved no bytes)
  }
};

struct P2PState final : Request::State {
  std::shared_ptr<P2PQueue> q;
  std::uint64_t ticket = 0;
  // wait(): the operation is launched and ordered on its stream (stream-ordered completion).
  // test(): true only once it has run on the GPU (it used to be true as soon as it was queued).
  void wait() override {
    if (q->launched < ticket) q->flush();
  }
  bool test() override {
    wait();
    return q->done(ticket);
  }
};

class NcclComm final : public Communicator {
 public:
  NcclComm(CommPtr base, ncclComm_t comm, Device dev)
      : base_(std::move(base)), comm_(comm), dev_(dev), q_(std::make_shared<P2PQueue>()) {
    q_->comm = comm_;
  }
  ~NcclComm() override {
    try {
      q_->flush();
    } catch (...) {
    }
    if (comm_) ncclCommDestroy(comm_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return base_->rank(); }
  int size() const override { return base_->size(); }
  std::string backend() const override { return "nccl"; }

  void allreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op, ExecContext* ctx) override {
    SHARD_PROFILE_COMM("allreduce", ctx, count * dtype_size(dt));
    ncclDataType_t t;
    ncclRedOp_t o;
    if (!device_call(ctx, "allreduce") || !nccl_reduction(dt, op, &t, &o))
      return base_->allreduce(send, recv, count, dt, op, ctx);
    nccl_check(ncclAllReduce(send, recv, static_cast<std::size_t>(count), t, o, comm_, stream_of(*ctx)), "allreduce",
               "ncclAllReduce", comm_);
  }

  void broadcast(void* buf, index_t count, DType dt, int root, ExecContext* ctx) override {
    SHARD_PROFILE_COMM("broadcast", ctx, count * dtype_size(dt));
    if (!device_call(ctx, "broadcast")) return base_->broadcast(buf, count, dt, root, ctx);
    SHARD_CHECK(root >= 0 && root < size(), "broadcast", "root {} out of range for {} ranks", root, size());
    nccl_check(ncclBroadcast(buf, buf, nbytes(count, dt), ncclUint8, root, comm_, stream_of(*ctx)), "broadcast",
               "ncclBroadcast", comm_);
  }

  void allgather(const void* send, index_t count, void* recv, DType dt, ExecContext* ctx) override {
    SHARD_PROFILE_COMM("allgather", ctx, count * dtype_size(dt));
    if (!device_call(ctx, "allgather")) return base_->allgather(send, count, recv, dt, ctx);
    nccl_check(ncclAllGather(send, recv, nbytes(count, dt), ncclUint8, comm_, stream_of(*ctx)), "allgather",
               "ncclAllGather", comm_);
  }

  void allgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                  std::span<const index_t> displs, DType dt, ExecContext* ctx) override {
    SHARD_PROFILE_COMM("allgatherv", ctx, count * dtype_size(dt));
    if (!device_call(ctx, "allgatherv")) return base_->allgatherv(send, count, recv, counts, displs, dt, ctx);
    check_counts("allgatherv", counts, displs);
    SHARD_CHECK(counts[static_cast<std::size_t>(rank())] == count, "allgatherv",
                "send count {} differs from counts[{}] = {}", count, rank(), counts[static_cast<std::size_t>(rank())]);
    const auto s = stream_of(*ctx);
    bool packed = true;
    for (std::size_t r = 0; r < counts.size(); ++r)
      packed = packed && counts[r] == count && displs[r] == static_cast<index_t>(r) * count;
    if (packed) {
      nccl_check(ncclAllGather(send, recv, nbytes(count, dt), ncclUint8, comm_, s), "allgatherv", "ncclAllGather",
                 comm_);
      return;
    }
    Group g("allgatherv", comm_);
    for (int r = 0; r < size(); ++r) {
      const auto ur = static_cast<std::size_t>(r);
      if (count > 0) nccl_check(ncclSend(send, nbytes(count, dt), ncclUint8, r, comm_, s), "allgatherv", "ncclSend");
      if (counts[ur] > 0)
        nccl_check(ncclRecv(static_cast<char*>(recv) + nbytes(displs[ur], dt), nbytes(counts[ur], dt), ncclUint8, r,
                            comm_, s),
                   "allgatherv", "ncclRecv");
    }
  }

  void reduce_scatterv(const void* send, void* recv, std::span<const index_t> counts, DType dt, ReduceOp op,
                       ExecContext* ctx) override {
    SHARD_PROFILE_COMM("reduce_scatterv", ctx, ::shard::comm_detail::payload_bytes(counts, dtype_size(dt)));
    ncclDataType_t t;
    ncclRedOp_t o;
    if (!device_call(ctx, "reduce_scatterv") || !nccl_reduction(dt, op, &t, &o))
      return base_->reduce_scatterv(send, recv, counts, dt, op, ctx);
    SHARD_CHECK(counts.size() == static_cast<std::size_t>(size()), "reduce_scatterv", "need {} counts, got {}", size(),
                counts.size());
    const auto s = stream_of(*ctx);
    bool equal = true;
    for (index_t c : counts) equal = equal && c == counts[0];
    if (equal) {
      nccl_check(ncclReduceScatter(send, recv, static_cast<std::size_t>(counts[0]), t, o, comm_, s), "reduce_scatterv",
                 "ncclReduceScatter", comm_);
      return;
    }
    Group g("reduce_scatterv", comm_);  // one reduce per rank: block r of every send goes to rank r
    index_t off = 0;
    for (int r = 0; r < size(); ++r) {
      const index_t c = counts[static_cast<std::size_t>(r)];
      if (c > 0)
        nccl_check(ncclReduce(static_cast<const char*>(send) + nbytes(off, dt), recv, static_cast<std::size_t>(c), t, o,
                              r, comm_, s),
                   "reduce_scatterv", "ncclReduce");
      off += c;
    }
  }

  void alltoallv(const void* send, std::span<const index_t> sc, std::span<const index_t> sd, void* recv,
                 std::span<const index_t> rc, std::span<const index_t> rd, DType dt, ExecContext* ctx) override {
    SHARD_PROFILE_COMM("alltoallv", ctx, ::shard::comm_detail::payload_bytes(sc, dtype_size(dt)));
    if (!device_call(ctx, "alltoallv")) return base_->alltoallv(send, sc, sd, recv, rc, rd, dt, ctx);
    check_counts("alltoallv", sc, sd);
    check_counts("alltoallv", rc, rd);
    const auto s = stream_of(*ctx);
    Group g("alltoallv", comm_);
    for (int r = 0; r < size(); ++r) {
      const auto ur = static_cast<std::size_t>(r);
      if (sc[ur] > 0)
        nccl_check(ncclSend(static_cast<const char*>(send) + nbytes(sd[ur], dt), nbytes(sc[ur], dt), ncclUint8, r,
                            comm_, s),
                   "alltoallv", "ncclSend");
      if (rc[ur] > 0)
        nccl_check(
            ncclRecv(static_cast<char*>(recv) + nbytes(rd[ur], dt), nbytes(rc[ur], dt), ncclUint8, r, comm_, s),
            "alltoallv", "ncclRecv");
    }
  }

  void sendrecv(const void* send, index_t send_count, int dest, void* recv, index_t recv_count, int source, DType dt,
                int tag, ExecContext* ctx) override {
    SHARD_PROFILE_COMM("sendrecv", ctx, (dest >= 0 ? send_count : 0) * dtype_size(dt));
    if (!device_call(ctx, "sendrecv"))
      return base_->sendrecv(send, send_count, dest, recv, recv_count, source, dt, tag, ctx);
    SHARD_CHECK(dest < size() && source < size(), "sendrecv", "peer out of range (dest {}, source {}, size {})", dest,
                source, size());
    const auto s = stream_of(*ctx);
    Group g("sendrecv", comm_);
    if (dest >= 0 && send_count > 0)
      nccl_check(ncclSend(send, nbytes(send_count, dt), ncclUint8, dest, comm_, s), "sendrecv", "ncclSend");
    if (source >= 0 && recv_count > 0)
      nccl_check(ncclRecv(recv, nbytes(recv_count, dt), ncclUint8, source, comm_, s), "sendrecv", "ncclRecv");
  }

  void barrier(ExecContext* ctx) override {
    SHARD_PROFILE_COMM("barrier", ctx, 0);
    q_->flush();
    base_->barrier(on_device(ctx) ? ctx : nullptr);  // a device context: its stream drains first
  }

  Request isend(const void* buf, index_t count, DType dt, int dest, int tag, ExecContext* ctx) override {
    SHARD_PROFILE_COMM("isend", ctx, count * dtype_size(dt));
    if (!device_call(ctx, "isend", false)) return base_->isend(buf, count, dt, dest, tag, ctx);
    SHARD_CHECK(dest >= 0 && dest < size(), "isend", "dest {} out of range for {} ranks", dest, size());
    return queue(true, const_cast<void*>(buf), nbytes(count, dt), dest, *ctx);
  }

  Request irecv(void* buf, index_t count, DType dt, int source, int tag, ExecContext* ctx) override {
    SHARD_PROFILE_COMM("irecv", ctx, count * dtype_size(dt));
    if (!device_call(ctx, "irecv", false)) return base_->irecv(buf, count, dt, source, tag, ctx);
    SHARD_CHECK(source >= 0 && source < size(), "irecv", "source {} out of range for {} ranks", source, size());
    return queue(false, buf, nbytes(count, dt), source, *ctx);
  }

  // Collectives are queued on the stream at once: wait() is stream-ordered, test() is true once
  // the collective has run on the GPU (an event recorded after it).
  Request iallreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op, ExecContext* ctx) override {
    SHARD_PROFILE_COMM("iallreduce", ctx, count * dtype_size(dt));
    if (!on_device(ctx)) return base_->iallreduce(send, recv, count, dt, op, ctx);
    allreduce(send, recv, count, dt, op, ctx);
    return event_request(*ctx);
  }
  Request iallgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                      std::span<const index_t> displs, DType dt, ExecContext* ctx) override {
    SHARD_PROFILE_COMM("iallgatherv", ctx, count * dtype_size(dt));
    if (!on_device(ctx)) return base_->iallgatherv(send, count, recv, counts, displs, dt, ctx);
    allgatherv(send, count, recv, counts, displs, dt, ctx);
    return event_request(*ctx);
  }
  Request ialltoallv(const void* send, std::span<const index_t> sc, std::span<const index_t> sd, void* recv,
                     std::span<const index_t> rc, std::span<const index_t> rd, DType dt, ExecContext* ctx) override {
    SHARD_PROFILE_COMM("ialltoallv", ctx, ::shard::comm_detail::payload_bytes(sc, dtype_size(dt)));
    if (!on_device(ctx)) return base_->ialltoallv(send, sc, sd, recv, rc, rd, dt, ctx);
    alltoallv(send, sc, sd, recv, rc, rd, dt, ctx);
    return event_request(*ctx);
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    q_->flush();
    auto sub_base = base_->split(color, key);
    ncclComm_t sub = nullptr;
    nccl_check(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr), "NcclComm::split",
               "ncclCommSplit", comm_);
    if (!sub_base) {
      if (sub) ncclCommDestroy(sub);
      return nullptr;
    }
    SHARD_CHECK(sub != nullptr, "NcclComm::split", "ncclCommSplit gave no communicator for color {}", color);
    auto out = std::make_shared<NcclComm>(std::move(sub_base), sub, dev_);
    out->follow_timeout_of(*this);
    return out;
  }

 private:
  // True for a device call (buffers on this communicator's GPU); launches queued isend/irecv
  // first unless `flush` is false (isend/irecv themselves queue behind them).
  bool device_call(ExecContext* ctx, const char* op, bool flush = true) {
    if (!on_device(ctx)) return false;
    SHARD_CHECK(ctx->device() == dev_, op, "buffers on {} but this NCCL communicator is on {}", ctx->device(), dev_);
    if (flush) q_->flush();
    return true;
  }
  void check_counts(const char* op, std::span<const index_t> c, std::span<const index_t> d) const {
    SHARD_CHECK(c.size() == static_cast<std::size_t>(size()) && d.size() == c.size(), op,
                "need {} counts and displacements, got {} and {}", size(), c.size(), d.size());
  }
  static Request event_request(const ExecContext& ctx) {
    auto st = std::make_shared<EventState>();
    st->ev.record(stream_of(ctx), "NcclComm::request");
    return Request(st);
  }
  Request queue(bool send, void* buf, std::size_t bytes, int peer, const ExecContext& ctx) {
    auto st = std::make_shared<P2PState>();
    st->q = q_;
    st->ticket = ++q_->queued;
    if (bytes > 0) q_->ops.push_back({send, buf, bytes, peer, stream_of(ctx)});
    return Request(st);
  }

  CommPtr base_;
  ncclComm_t comm_ = nullptr;
  Device dev_;
  std::shared_ptr<P2PQueue> q_;
};

// make_device_comm()'s route to NCCL.
struct NcclFactory final : exec::DeviceCommFactory {
  CommPtr make(CommPtr base, Device dev) const override { return make_nccl_comm(std::move(base), dev); }
  const char* name() const noexcept override { return "nccl"; }
};
const NcclFactory g_factory;
[[maybe_unused]] const bool g_registered =
    (exec::register_family(DeviceKind::cuda, exec::KernelFamily::comm, &g_factory), true);

}  // namespace

CommPtr make_nccl_comm(CommPtr base, Device dev) {
  SHARD_CHECK(base != nullptr, "make_nccl_comm", "null base communicator");
  SHARD_CHECK(dev.is_cuda(), "make_nccl_comm", "device {} is not a GPU", dev);
  std::string err;
  try {
    exec::kernels_for<exec::DeviceRuntime>(dev, "make_nccl_comm").check_device(dev.index, "make_nccl_comm");
  } catch (const Error& e) {
    err = e.what();
  }
  base->check_all(err.empty(), "make_nccl_comm", err);

  // Rank 0 makes the id and broadcasts it (with its result, so a failure reaches every rank).
  struct Boot {
    int rc = ncclSuccess;
    ncclUniqueId id{};
  } boot;
  if (base->rank() == 0) boot.rc = ncclGetUniqueId(&boot.id);
  base->broadcast(&boot, static_cast<index_t>(sizeof boot), DType::u8, 0);
  SHARD_CHECK(boot.rc == ncclSuccess, "make_nccl_comm", "ncclGetUniqueId failed on rank 0: {}",
              ncclGetErrorString(static_cast<ncclResult_t>(boot.rc)));

  ncclComm_t comm = nullptr;
  cudaError_t ce = cudaSetDevice(dev.index);
  ncclResult_t rc = ce == cudaSuccess ? ncclCommInitRank(&comm, base->size(), boot.id, base->rank()) : ncclSuccess;
  const bool ok = ce == cudaSuccess && rc == ncclSuccess;
  try {
    base->check_all(ok, "make_nccl_comm",
                    ce != cudaSuccess
                        ? fmt::format("cudaSetDevice({}) failed: {}", dev.index, cudaGetErrorString(ce))
                        : fmt::format("ncclCommInitRank on {} failed: {} ({})", dev, ncclGetErrorString(rc),
                                      ncclGetLastError(nullptr)));
  } catch (...) {
    if (comm) ncclCommAbort(comm);
    throw;
  }
  return std::make_shared<NcclComm>(std::move(base), comm, dev);
}

}  // namespace shard
