#include "shardtensor/comm/mpi_comm.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

#include "shardtensor/comm/payload_bytes.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/device_runtime.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard {
namespace {

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  SHARD_FAIL("mpi", "{} failed: {}", what, std::string(buf, static_cast<std::size_t>(len)));
}

int to_int(index_t n, const char* what) {
  SHARD_CHECK(n >= 0 && n <= INT_MAX, "mpi", "{}: count {} exceeds MPI's int range", what, n);
  return static_cast<int>(n);
}

std::vector<int> to_ints(std::span<const index_t> v, const char* what) {
  std::vector<int> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_int(v[i], what);
  return out;
}

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::c64: return MPI_C_FLOAT_COMPLEX;
    case DType::c128: return MPI_C_DOUBLE_COMPLEX;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op, DType dt) {
  SHARD_CHECK(dt != DType::bf16 && dt != DType::f16 && dt != DType::u8, "mpi", "reductions on {} are not supported",
              dt);
  SHARD_CHECK(!is_complex(dt) || op == ReduceOp::sum || op == ReduceOp::avg, "mpi",
              "{} reduction of {}: complex numbers have no order (sum and avg only)", reduce_op_name(op), dt);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

// Divides `count` elements in buf by `p` (the avg step after a sum).
void divide(void* buf, index_t count, DType dt, int p) {
  switch (dt) {
    case DType::f32: for (index_t i = 0; i < count; ++i) static_cast<float*>(buf)[i] /= static_cast<float>(p); break;
    case DType::f64: for (index_t i = 0; i < count; ++i) static_cast<double*>(buf)[i] /= p; break;
    case DType::i32: for (index_t i = 0; i < count; ++i) static_cast<std::int32_t*>(buf)[i] /= p; break;
    case DType::i64: for (index_t i = 0; i < count; ++i) static_cast<std::int64_t*>(buf)[i] /= p; break;
    case DType::c64:
      for (index_t i = 0; i < count; ++i) static_cast<std::complex<float>*>(buf)[i] /= static_cast<float>(p);
      break;
    case DType::c128: for (index_t i = 0; i < count; ++i) static_cast<std::complex<double>*>(buf)[i] /= p; break;
    default: SHARD_FAIL("mpi", "avg on {} is not supported", dt);
  }
}

// ------------------------------- collective watchdog -------------------------------

// What a watched wait needs to say who is stuck where (copied into requests, which may outlive
// the call that made them).
struct WatchInfo {
  double timeout = 0;  // seconds; 0 = unwatched (plain MPI_Wait)
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  std::string name;
};

[[noreturn]] void watchdog_abort(const WatchInfo& w, const char* op, double waited) {
  int world_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::fprintf(stderr,
               "shardtensor watchdog: rank %d of communicator '%s' (MPI, %d ranks; MPI_COMM_WORLD rank %d) has been "
               "blocked in %s for %.1f s, past the collective timeout of %g s (SHARDTENSOR_COMM_TIMEOUT / "
               "Communicator::set_timeout / ExecSettings::comm_timeout): another rank of the communicator has not "
               "entered it (stalled, deadlocked, or in a different call). Aborting the job.\n",
               w.rank, w.name.empty() ? "unnamed" : w.name.c_str(), w.size, world_rank, op, waited, w.timeout);
  std::fflush(stderr);
  MPI_Abort(w.comm != MPI_COMM_NULL ? w.comm : MPI_COMM_WORLD, 124);
  std::abort();  // MPI_Abort does not return; in case an implementation does
}

// Completes `n` requests: MPI_Waitall when unwatched; else MPI_Testall until done or the
// deadline (spinning for the first 200 us, then sleeping 50 us between tests). With `st` (n
// statuses), a request's own error (MPI_ERR_IN_STATUS) is left in its status for the caller.
void complete(MPI_Request* reqs, int n, const WatchInfo& w, const char* op, MPI_Status* st = MPI_STATUSES_IGNORE) {
  auto ck = [&](int rc) {
    if (rc != MPI_ERR_IN_STATUS || st == MPI_STATUSES_IGNORE) mpi_check(rc, op);
  };
  if (w.timeout <= 0) {
    ck(MPI_Waitall(n, reqs, st));
    return;
  }
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(w.timeout));
  for (long it = 0;; ++it) {
    int flag = 0;
    ck(MPI_Testall(n, reqs, &flag, st));
    if (flag) return;
    const auto now = clock::now();
    if (now >= deadline) watchdog_abort(w, op, std::chrono::duration<double>(now - start).count());
    if (now - start > std::chrono::microseconds(200)) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// A pinned staging buffer leased from an MpiComm's pool; goes back to the pool when destroyed.
class Lease {
 public:
  Lease() = default;
  Lease(std::shared_ptr<MpiComm::Staging> pool, void* p, std::size_t cap) : pool_(std::move(pool)), p_(p), cap_(cap) {}
  Lease(Lease&& o) noexcept : pool_(std::move(o.pool_)), p_(std::exchange(o.p_, nullptr)), cap_(o.cap_) {}
  Lease& operator=(Lease&&) = delete;
  Lease(const Lease&) = delete;
  ~Lease();
  char* get() const { return static_cast<char*>(p_); }

 private:
  std::shared_ptr<MpiComm::Staging> pool_;
  void* p_ = nullptr;
  std::size_t cap_ = 0;
};

// The receive-size check, folded into every point-to-point receive (issue 18 item 6: the cheap
// checks that stay on without the consistency mode). A peer that sent another number of elements
// than this rank expects means the ranks disagree on the exchange (another shape, shard sizes,
// halo width or padding on one of them). More than expected: MPI's MPI_ERR_TRUNCATE; fewer would
// complete silently, leaving stale data past the received part. Both become a shard::Error here
// (on the ranks that receive such a message: in a symmetric exchange, both ends of the link).
struct RecvExpect {
  int count = -1;  // < 0: not a receive (nothing to check)
  MPI_Datatype type = MPI_DATATYPE_NULL;
  int source = MPI_PROC_NULL;
  int tag = 0;
};

[[noreturn]] void receive_mismatch(const RecvExpect& e, const char* op, const std::string& got) {
  SHARD_FAIL(op,
             "rank {} sent {} where this rank expected {} elements (tag {}): the ranks disagree on this exchange "
             "(a different shape, shard sizes, halo width or padding on one of them; SHARDTENSOR_CHECK_COLLECTIVES=1 "
             "names the op and the argument that differs)",
             e.source, got, e.count, e.tag);
}

// `rc` is the completion call's return code, `st` the receive's status (MPI_ERROR preset to
// MPI_SUCCESS by the caller: MPI fills it only with MPI_ERR_IN_STATUS).
void check_received(int rc, const MPI_Status& st, const RecvExpect& e, const char* op) {
  if (e.count < 0 || e.source == MPI_PROC_NULL) {
    mpi_check(rc == MPI_ERR_IN_STATUS ? st.MPI_ERROR : rc, op);
    return;
  }
  const int err = rc == MPI_ERR_IN_STATUS ? st.MPI_ERROR : rc;
  if (err != MPI_SUCCESS) {
    int cls = MPI_SUCCESS;
    MPI_Error_class(err, &cls);
    if (cls == MPI_ERR_TRUNCATE) receive_mismatch(e, op, "more elements");
    mpi_check(err, op);
  }
  int got = 0;
  MPI_Get_count(&st, e.type, &got);
  if (got != e.count) receive_mismatch(e, op, got == MPI_UNDEFINED ? std::string("a partial element") : fmt::format("{} elements", got));
}

MPI_Status fresh_status() {
  MPI_Status st{};
  st.MPI_ERROR = MPI_SUCCESS;
  return st;
}

struct MpiRequestState : Request::State {
  MPI_Request req = MPI_REQUEST_NULL;
  WatchInfo watch;                     // timeout 0 = plain MPI_Wait
  const char* op = "MPI_Wait";
  RecvExpect recv;                     // a receive's expected size (count < 0: not a receive)
  bool send = false;                   // a point-to-point send
  std::function<void()> done;          // completion step (avg division, staged copy-back), may be empty
  std::vector<int> keep[4];            // int count arrays that must outlive the request
  std::vector<Lease> leases;           // staging buffers that must outlive the request
  ~MpiRequestState() override {
    // Abandoned while pending (an exception left the call that owned it): a receive is cancelled
    // so that MPI never writes into its freed buffer later; a send completes in the background.
    int fin = 0;
    MPI_Finalized(&fin);
    if (req == MPI_REQUEST_NULL || fin) return;
    if (recv.count >= 0) {
      MPI_Cancel(&req);
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    } else if (send) {
      MPI_Request_free(&req);
    }  // a pending collective may be neither freed nor cancelled (MPI): left as before
  }
  void wait() override {
    MPI_Status st = fresh_status();
    int rc = MPI_SUCCESS;
    if (watch.timeout > 0) {
      complete(&req, 1, watch, op, &st);
      rc = st.MPI_ERROR;
    } else {
      rc = MPI_Wait(&req, &st);
    }
    req = MPI_REQUEST_NULL;  // complete (or failed: then not to be touched again)
    check_received(rc, st, recv, op);
    if (done) done();
    leases.clear();
  }
  bool test() override {
    int flag = 0;
    MPI_Status st = fresh_status();
    const int rc = MPI_Test(&req, &flag, &st);
    if (rc != MPI_SUCCESS) req = MPI_REQUEST_NULL;
    if (rc != MPI_SUCCESS || flag) check_received(rc, st, recv, "MPI_Test");
    if (flag && done) done();
    if (flag) leases.clear();
    return flag != 0;
  }
};

bool g_we_initialised = false;
void finalize_at_exit() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

}  // namespace

// ------------------------------- staging pool -------------------------------

// Reusable pinned host buffers. A request keeps its leases (and through them the pool) alive.
struct MpiComm::Staging {
  explicit Staging(const exec::DeviceRuntime& r) : rt(&r) {}
  ~Staging() {
    for (auto& b : free_bufs) rt->deallocate_pinned(b.first);
  }
  const exec::DeviceRuntime* rt;
  std::mutex mu;
  std::vector<std::pair<void*, std::size_t>> free_bufs;  // (pointer, capacity)
  std::size_t total = 0;                                 // bytes allocated (free + leased)

  // The smallest free buffer of at least `bytes`; else a new one (power of two, >= 64 KiB),
  // replacing the largest free buffer that is too small.
  std::pair<void*, std::size_t> take(std::size_t bytes) {
    std::lock_guard lk(mu);
    std::size_t best = free_bufs.size();
    for (std::size_t i = 0; i < free_bufs.size(); ++i)
      if (free_bufs[i].second >= bytes && (best == free_bufs.size() || free_bufs[i].second < free_bufs[best].second))
        best = i;
    if (best < free_bufs.size()) {
      auto b = free_bufs[best];
      free_bufs.erase(free_bufs.begin() + static_cast<std::ptrdiff_t>(best));
      return b;
    }
    if (!free_bufs.empty()) {  // every free buffer is too small: drop the largest, grow
      auto it = std::max_element(free_bufs.begin(), free_bufs.end(),
                                 [](auto& a, auto& b) { return a.second < b.second; });
      rt->deallocate_pinned(it->first);
      total -= it->second;
      free_bufs.erase(it);
    }
    std::size_t cap = std::size_t{64} << 10;
    while (cap < bytes) cap *= 2;
    void* p = rt->allocate_pinned(cap);
    total += cap;
    return {p, cap};
  }
  void give_back(void* p, std::size_t cap) {
    std::lock_guard lk(mu);
    free_bufs.emplace_back(p, cap);
  }
};

namespace {

Lease::~Lease() {
  if (p_) pool_->give_back(p_, cap_);
}

Lease acquire(const std::shared_ptr<MpiComm::Staging>& pool, std::size_t bytes) {
  if (bytes == 0) return {};
  auto [p, cap] = pool->take(bytes);
  return Lease(pool, p, cap);
}

// One device call: the runtime, device and stream of its context.
struct DevCall {
  DevCall(const ExecContext& ctx, const char* op)
      : rt(&exec::kernels_for<exec::DeviceRuntime>(ctx.device(), op)), dev(ctx.device()), stream(ctx.stream()) {}
  const exec::DeviceRuntime* rt;
  Device dev;
  Stream stream;
  // Both copies return when done, so the staging buffer may be reused (or handed to MPI) at once.
  void to_host(void* h, const void* d, std::size_t bytes) const {
    if (bytes) rt->copy(h, Device::cpu(), d, dev, bytes, stream, true);
  }
  void to_dev(void* d, const void* h, std::size_t bytes) const {
    if (bytes) rt->copy(d, dev, h, Device::cpu(), bytes, stream, true);
  }
  // Work queued on the stream before the call must be complete before MPI reads device memory.
  void sync() const { rt->synchronize(stream, dev.index); }
};

std::size_t nbytes(index_t count, DType dt) { return static_cast<std::size_t>(count) * dtype_size(dt); }

// One past the last element that `counts`/`displs` address.
index_t extent(std::span<const index_t> counts, std::span<const index_t> displs) {
  index_t e = 0;
  for (std::size_t r = 0; r < counts.size(); ++r)
    if (counts[r] > 0) e = std::max(e, displs[r] + counts[r]);
  return e;
}

// Copies the received segments (and only them: the gaps of the device buffer keep their
// contents) from the host staging buffer to the device, merging adjacent segments.
void copy_back_segments(const DevCall& d, void* dev_base, const char* host_base, const std::vector<index_t>& counts,
                        const std::vector<index_t>& displs, DType dt) {
  std::vector<std::pair<index_t, index_t>> seg;
  for (std::size_t r = 0; r < counts.size(); ++r)
    if (counts[r] > 0) seg.emplace_back(displs[r], displs[r] + counts[r]);
  std::sort(seg.begin(), seg.end());
  const auto es = static_cast<index_t>(dtype_size(dt));
  for (std::size_t i = 0; i < seg.size();) {
    auto [a, b] = seg[i];
    std::size_t j = i + 1;
    for (; j < seg.size() && seg[j].first <= b; ++j) b = std::max(b, seg[j].second);
    d.to_dev(static_cast<char*>(dev_base) + a * es, host_base + a * es, static_cast<std::size_t>((b - a) * es));
    i = j;
  }
}

std::vector<index_t> to_vec(std::span<const index_t> s) { return {s.begin(), s.end()}; }

// The watchdog settings of one call on `c`: the context's comm_timeout if it sets one (>= 0), else
// the communicator's. The label is only built when the watchdog is on.
WatchInfo watch_of(const MpiComm& c, const ExecContext* ctx) {
  WatchInfo w;
  w.timeout = ctx && ctx->settings().comm_timeout >= 0 ? ctx->settings().comm_timeout : c.timeout();
  if (w.timeout > 0) {
    w.comm = c.native();
    w.rank = c.rank();
    w.size = c.size();
    w.name = c.name();
  }
  return w;
}

std::shared_ptr<MpiRequestState> make_state(const MpiComm& c, const ExecContext* ctx) {
  auto s = std::make_shared<MpiRequestState>();
  s->watch = watch_of(c, ctx);
  return s;
}

// MPI_Sendrecv as two non-blocking calls (for the watched path; MPI_Isendrecv is MPI-4).
int isendrecv(const void* sb, int sc, MPI_Datatype st, int dest, int stag, void* rb, int rc, MPI_Datatype rt, int src,
              int rtag, MPI_Comm comm, MPI_Request* r) {
  const int e = MPI_Irecv(rb, rc, rt, src, rtag, comm, &r[0]);
  return e != MPI_SUCCESS ? e : MPI_Isend(sb, sc, st, dest, stag, comm, &r[1]);
}

}  // namespace

// A blocking collective: the blocking MPI call itself when the watchdog is off (no overhead),
// else its non-blocking form (writing requests r_[0], r_[1]) completed under the watchdog.
#define SHARD_MPI_BLOCKING(ctx, name, blocking, nonblocking)              \
  do {                                                                     \
    const WatchInfo w_ = watch_of(*this, ctx);                             \
    if (w_.timeout > 0) {                                                  \
      MPI_Request r_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};            \
      mpi_check(nonblocking, name);                                        \
      complete(r_, 2, w_, name);                                           \
    } else {                                                               \
      mpi_check(blocking, name);                                           \
    }                                                                      \
  } while (0)

namespace {

}  // namespace

bool mpi_cuda_aware() {
  static const bool aware = [] {
    if (const char* e = std::getenv("SHARDTENSOR_MPI_CUDA_AWARE"); e && *e) return std::strcmp(e, "0") != 0;
#if defined(MPIX_CUDA_AWARE_SUPPORT)
    return MPIX_Query_cuda_support() == 1;
#else
    return false;
#endif
  }();
  return aware;
}

bool mpi_init_if_needed(int* argc, char*** argv) {
  int init = 0;
  MPI_Initialized(&init);
  if (init) return false;
  int provided = 0;
  mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  g_we_initialised = true;
  std::atexit(finalize_at_exit);
  return true;
}

MpiComm::MpiComm(MPI_Comm comm) {
  int init = 0;
  MPI_Initialized(&init);
  SHARD_CHECK(init, "MpiComm", "MPI is not initialised (call shard::mpi_init_if_needed or MPI_Init first)");
  SHARD_CHECK(comm != MPI_COMM_NULL, "MpiComm", "MPI_COMM_NULL given");
  if (timeout() > 0) {  // watched: MPI_Comm_idup, completed under the watchdog
    MPI_Request r = MPI_REQUEST_NULL;
    mpi_check(MPI_Comm_idup(comm, &comm_, &r), "MPI_Comm_idup");
    WatchInfo w;
    w.timeout = timeout();
    w.comm = comm;
    MPI_Comm_rank(comm, &w.rank);
    MPI_Comm_size(comm, &w.size);
    w.name = "the user's communicator (MpiComm constructor)";
    complete(&r, 1, w, "MPI_Comm_idup");
  } else {
    mpi_check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  }
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiComm::~MpiComm() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::shared_ptr<MpiComm> MpiComm::world() {
  mpi_init_if_needed();
  auto c = std::make_shared<MpiComm>(MPI_COMM_WORLD);
  c->set_name("world");
  return c;
}

bool MpiComm::passes_device_pointers() const {
  return transport_ == MpiDeviceTransport::direct ||
         (transport_ == MpiDeviceTransport::automatic && mpi_cuda_aware());
}

std::size_t MpiComm::staging_bytes() const {
  if (!staging_) return 0;
  std::lock_guard lk(staging_->mu);
  return staging_->total;
}

// Device calls below: `direct` = pointers straight to MPI after the stream's queued work is done;
// otherwise copy in to pinned staging, run the host MPI call on it, copy the result out. The avg
// reductions always stage (the division runs on the host buffer).
#define SHARD_STAGING_POOL(d)                                                           \
  if (!staging_) staging_ = std::make_shared<Staging>(*(d).rt);                          \
  const auto& pool = staging_

void MpiComm::allreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op, ExecContext* ctx) {
  SHARD_PROFILE_COMM("allreduce", ctx, count * dtype_size(dt));
  const int n = to_int(count, "allreduce");
  const MPI_Op mop = mpi_op(op, dt);
  if (size_ == 1 && on_device(ctx)) {
    // One rank: the result is the input (avg divides by 1). No host staging and no wait for the
    // stream: a 1-rank device step through MPI stays asynchronous (the parameter gradients' sums).
    const DevCall d(*ctx, "allreduce");
    if (send != recv && count > 0) d.rt->copy(recv, d.dev, send, d.dev, nbytes(count, dt), d.stream, false);
    return;
  }
  if (!on_device(ctx) || (passes_device_pointers() && op != ReduceOp::avg)) {
    if (on_device(ctx)) DevCall(*ctx, "allreduce").sync();
    const void* s = send == recv ? MPI_IN_PLACE : send;
    SHARD_MPI_BLOCKING(ctx, "MPI_Allreduce", (MPI_Allreduce(s, recv, n, mpi_type(dt), mop, comm_)),
                       (MPI_Iallreduce(s, recv, n, mpi_type(dt), mop, comm_, r_)));
    if (op == ReduceOp::avg) divide(recv, count, dt, size_);
    return;
  }
  const DevCall d(*ctx, "allreduce");
  SHARD_STAGING_POOL(d);
  const auto bytes = nbytes(count, dt);
  auto buf = acquire(pool, bytes);
  d.to_host(buf.get(), send, bytes);
  SHARD_MPI_BLOCKING(ctx, "MPI_Allreduce", (MPI_Allreduce(MPI_IN_PLACE, buf.get(), n, mpi_type(dt), mop, comm_)),
                     (MPI_Iallreduce(MPI_IN_PLACE, buf.get(), n, mpi_type(dt), mop, comm_, r_)));
  if (op == ReduceOp::avg) divide(buf.get(), count, dt, size_);
  d.to_dev(recv, buf.get(), bytes);
}

void MpiComm::broadcast(void* buf, index_t count, DType dt, int root, ExecContext* ctx) {
  SHARD_PROFILE_COMM("broadcast", ctx, count * dtype_size(dt));
  SHARD_CHECK(root >= 0 && root < size_, "broadcast", "root {} out of range for {} ranks", root, size_);
  const int n = to_int(count, "broadcast");
  if (size_ == 1 && on_device(ctx)) return;  // one rank: the buffer already holds the root's data
  if (!on_device(ctx) || passes_device_pointers()) {
    if (on_device(ctx)) DevCall(*ctx, "broadcast").sync();
    SHARD_MPI_BLOCKING(ctx, "MPI_Bcast", (MPI_Bcast(buf, n, mpi_type(dt), root, comm_)),
                       (MPI_Ibcast(buf, n, mpi_type(dt), root, comm_, r_)));
    return;
  }
  const DevCall d(*ctx, "broadcast");
  SHARD_STAGING_POOL(d);
  const auto bytes = nbytes(count, dt);
  auto h = acquire(pool, bytes);
  if (rank_ == root) d.to_host(h.get(), buf, bytes);
  SHARD_MPI_BLOCKING(ctx, "MPI_Bcast", (MPI_Bcast(h.get(), n, mpi_type(dt), root, comm_)),
                     (MPI_Ibcast(h.get(), n, mpi_type(dt), root, comm_, r_)));
  if (rank_ != root) d.to_dev(buf, h.get(), bytes);
}

void MpiComm::allgather(const void* send, index_t count, void* recv, DType dt, ExecContext* ctx) {
  SHARD_PROFILE_COMM("allgather", ctx, count * dtype_size(dt));
  const int c = to_int(count, "allgather");
  if (!on_device(ctx) || passes_device_pointers()) {
    if (on_device(ctx)) DevCall(*ctx, "allgather").sync();
    SHARD_MPI_BLOCKING(ctx, "MPI_Allgather", (MPI_Allgather(send, c, mpi_type(dt), recv, c, mpi_type(dt), comm_)),
                       (MPI_Iallgather(send, c, mpi_type(dt), recv, c, mpi_type(dt), comm_, r_)));
    return;
  }
  const DevCall d(*ctx, "allgather");
  SHARD_STAGING_POOL(d);
  const auto bytes = nbytes(count, dt);
  auto hs = acquire(pool, bytes);
  auto hr = acquire(pool, bytes * static_cast<std::size_t>(size_));
  d.to_host(hs.get(), send, bytes);
  SHARD_MPI_BLOCKING(ctx, "MPI_Allgather", (MPI_Allgather(hs.get(), c, mpi_type(dt), hr.get(), c, mpi_type(dt), comm_)),
                     (MPI_Iallgather(hs.get(), c, mpi_type(dt), hr.get(), c, mpi_type(dt), comm_, r_)));
  d.to_dev(recv, hr.get(), bytes * static_cast<std::size_t>(size_));
}

void MpiComm::allgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                         std::span<const index_t> displs, DType dt, ExecContext* ctx) {
  SHARD_PROFILE_COMM("allgatherv", ctx, count * dtype_size(dt));
  SHARD_CHECK(counts.size() == static_cast<std::size_t>(size_) && displs.size() == counts.size(), "allgatherv",
              "need {} counts and displacements, got {} and {}", size_, counts.size(), displs.size());
  auto c = to_ints(counts, "allgatherv"), dsp = to_ints(displs, "allgatherv");
  const int n = to_int(count, "allgatherv");
  if (!on_device(ctx) || passes_device_pointers()) {
    if (on_device(ctx)) DevCall(*ctx, "allgatherv").sync();
    SHARD_MPI_BLOCKING(ctx, "MPI_Allgatherv",
                       (MPI_Allgatherv(send, n, mpi_type(dt), recv, c.data(), dsp.data(), mpi_type(dt), comm_)),
                       (MPI_Iallgatherv(send, n, mpi_type(dt), recv, c.data(), dsp.data(), mpi_type(dt), comm_, r_)));
    return;
  }
  const DevCall d(*ctx, "allgatherv");
  SHARD_STAGING_POOL(d);
  auto hs = acquire(pool, nbytes(count, dt));
  auto hr = acquire(pool, nbytes(extent(counts, displs), dt));
  d.to_host(hs.get(), send, nbytes(count, dt));
  SHARD_MPI_BLOCKING(
      ctx, "MPI_Allgatherv",
      (MPI_Allgatherv(hs.get(), n, mpi_type(dt), hr.get(), c.data(), dsp.data(), mpi_type(dt), comm_)),
      (MPI_Iallgatherv(hs.get(), n, mpi_type(dt), hr.get(), c.data(), dsp.data(), mpi_type(dt), comm_, r_)));
  copy_back_segments(d, recv, hr.get(), to_vec(counts), to_vec(displs), dt);
}

void MpiComm::reduce_scatterv(const void* send, void* recv, std::span<const index_t> counts, DType dt, ReduceOp op,
                              ExecContext* ctx) {
  SHARD_PROFILE_COMM("reduce_scatterv", ctx, ::shard::comm_detail::payload_bytes(counts, dtype_size(dt)));
  SHARD_CHECK(counts.size() == static_cast<std::size_t>(size_), "reduce_scatterv", "need {} counts, got {}", size_,
              counts.size());
  auto c = to_ints(counts, "reduce_scatterv");
  const MPI_Op mop = mpi_op(op, dt);
  const index_t mine = counts[static_cast<std::size_t>(rank_)];
  if (!on_device(ctx) || (passes_device_pointers() && op != ReduceOp::avg)) {
    if (on_device(ctx)) DevCall(*ctx, "reduce_scatterv").sync();
    SHARD_MPI_BLOCKING(ctx, "MPI_Reduce_scatter", (MPI_Reduce_scatter(send, recv, c.data(), mpi_type(dt), mop, comm_)),
                       (MPI_Ireduce_scatter(send, recv, c.data(), mpi_type(dt), mop, comm_, r_)));
    if (op == ReduceOp::avg) divide(recv, mine, dt, size_);
    return;
  }
  const DevCall d(*ctx, "reduce_scatterv");
  SHARD_STAGING_POOL(d);
  index_t total = 0;
  for (index_t k : counts) total += k;
  auto hs = acquire(pool, nbytes(total, dt));
  auto hr = acquire(pool, nbytes(mine, dt));
  d.to_host(hs.get(), send, nbytes(total, dt));
  SHARD_MPI_BLOCKING(ctx, "MPI_Reduce_scatter",
                     (MPI_Reduce_scatter(hs.get(), hr.get(), c.data(), mpi_type(dt), mop, comm_)),
                     (MPI_Ireduce_scatter(hs.get(), hr.get(), c.data(), mpi_type(dt), mop, comm_, r_)));
  if (op == ReduceOp::avg) divide(hr.get(), mine, dt, size_);
  d.to_dev(recv, hr.get(), nbytes(mine, dt));
}

void MpiComm::alltoallv(const void* send, std::span<const index_t> sc, std::span<const index_t> sd, void* recv,
                        std::span<const index_t> rc, std::span<const index_t> rd, DType dt, ExecContext* ctx) {
  SHARD_PROFILE_COMM("alltoallv", ctx, ::shard::comm_detail::payload_bytes(sc, dtype_size(dt)));
  const auto p = static_cast<std::size_t>(size_);
  SHARD_CHECK(sc.size() == p && sd.size() == p && rc.size() == p && rd.size() == p, "alltoallv",
              "need {} counts/displacements per side", p);
  auto a = to_ints(sc, "alltoallv"), b = to_ints(sd, "alltoallv"), c = to_ints(rc, "alltoallv"),
       e = to_ints(rd, "alltoallv");
  if (!on_device(ctx) || passes_device_pointers()) {
    if (on_device(ctx)) DevCall(*ctx, "alltoallv").sync();
    SHARD_MPI_BLOCKING(
        ctx, "MPI_Alltoallv",
        (MPI_Alltoallv(send, a.data(), b.data(), mpi_type(dt), recv, c.data(), e.data(), mpi_type(dt), comm_)),
        (MPI_Ialltoallv(send, a.data(), b.data(), mpi_type(dt), recv, c.data(), e.data(), mpi_type(dt), comm_, r_)));
    return;
  }
  const DevCall d(*ctx, "alltoallv");
  SHARD_STAGING_POOL(d);
  const auto send_bytes = nbytes(extent(sc, sd), dt);
  auto hs = acquire(pool, send_bytes);
  auto hr = acquire(pool, nbytes(extent(rc, rd), dt));
  d.to_host(hs.get(), send, send_bytes);
  SHARD_MPI_BLOCKING(
      ctx, "MPI_Alltoallv",
      (MPI_Alltoallv(hs.get(), a.data(), b.data(), mpi_type(dt), hr.get(), c.data(), e.data(), mpi_type(dt), comm_)),
      (MPI_Ialltoallv(hs.get(), a.data(), b.data(), mpi_type(dt), hr.get(), c.data(), e.data(), mpi_type(dt), comm_,
                      r_)));
  copy_back_segments(d, recv, hr.get(), to_vec(rc), to_vec(rd), dt);
}

void MpiComm::sendrecv(const void* send, index_t send_count, int dest, void* recv, index_t recv_count, int source,
                       DType dt, int tag, ExecContext* ctx) {
  SHARD_PROFILE_COMM("sendrecv", ctx, (dest >= 0 ? send_count : 0) * dtype_size(dt));
  SHARD_CHECK(dest < size_ && source < size_, "sendrecv", "peer out of range (dest {}, source {}, size {})", dest,
              source, size_);
  const int ns = to_int(send_count, "sendrecv"), nr = to_int(recv_count, "sendrecv");
  const int to = dest < 0 ? MPI_PROC_NULL : dest, from = source < 0 ? MPI_PROC_NULL : source;
  // MPI_Sendrecv, or under the watchdog its two non-blocking halves; then the receive-size check.
  auto exchange = [&](const void* sb, int sn, void* rb, int rn) {
    const WatchInfo w = watch_of(*this, ctx);
    MPI_Status st = fresh_status();
    int rc = MPI_SUCCESS;
    if (w.timeout > 0) {
      MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
      MPI_Status sts[2] = {fresh_status(), fresh_status()};
      mpi_check(isendrecv(sb, sn, mpi_type(dt), to, tag, rb, rn, mpi_type(dt), from, tag, comm_, r), "MPI_Sendrecv");
      complete(r, 2, w, "MPI_Sendrecv", sts);
      mpi_check(sts[1].MPI_ERROR, "MPI_Sendrecv");
      st = sts[0];
      rc = st.MPI_ERROR;
    } else {
      rc = MPI_Sendrecv(sb, sn, mpi_type(dt), to, tag, rb, rn, mpi_type(dt), from, tag, comm_, &st);
      if (rc == MPI_ERR_IN_STATUS) rc = st.MPI_ERROR;
    }
    check_received(rc, st, RecvExpect{rn, mpi_type(dt), from, tag}, "MPI_Sendrecv");
  };
  if (!on_device(ctx) || passes_device_pointers()) {
    if (on_device(ctx)) DevCall(*ctx, "sendrecv").sync();
    exchange(send, ns, recv, nr);
    return;
  }
  const DevCall d(*ctx, "sendrecv");
  SHARD_STAGING_POOL(d);
  auto hs = acquire(pool, dest >= 0 ? nbytes(send_count, dt) : 0);
  auto hr = acquire(pool, source >= 0 ? nbytes(recv_count, dt) : 0);
  if (dest >= 0) d.to_host(hs.get(), send, nbytes(send_count, dt));
  // No staging buffer for a missing peer: MPI still rejects a null buffer with a nonzero count.
  const int sn = dest >= 0 ? ns : 0, rn = source >= 0 ? nr : 0;
  exchange(hs.get(), sn, hr.get(), rn);
  if (source >= 0) d.to_dev(recv, hr.get(), nbytes(recv_count, dt));
}

void MpiComm::barrier(ExecContext* ctx) {
  SHARD_PROFILE_COMM("barrier", ctx, 0);
  if (on_device(ctx)) DevCall(*ctx, "barrier").sync();
  SHARD_MPI_BLOCKING(ctx, "MPI_Barrier", (MPI_Barrier(comm_)), (MPI_Ibarrier(comm_, r_)));
}

Request MpiComm::isend(const void* buf, index_t count, DType dt, int dest, int tag, ExecContext* ctx) {
  SHARD_PROFILE_COMM("isend", ctx, count * dtype_size(dt));
  SHARD_CHECK(dest >= 0 && dest < size_, "isend", "dest {} out of range for {} ranks", dest, size_);
  const int n = to_int(count, "isend");
  auto s = make_state(*this, ctx);
  if (on_device(ctx)) {
    const DevCall d(*ctx, "isend");
    if (passes_device_pointers()) {
      d.sync();
    } else {
      SHARD_STAGING_POOL(d);
      s->leases.push_back(acquire(pool, nbytes(count, dt)));
      d.to_host(s->leases.back().get(), buf, nbytes(count, dt));
      buf = s->leases.back().get();
    }
  }
  s->op = "wait() on MPI_Isend";
  s->send = true;
  mpi_check(MPI_Isend(buf, n, mpi_type(dt), dest, tag, comm_, &s->req), "MPI_Isend");
  return Request(s);
}

Request MpiComm::irecv(void* buf, index_t count, DType dt, int source, int tag, ExecContext* ctx) {
  SHARD_PROFILE_COMM("irecv", ctx, count * dtype_size(dt));
  SHARD_CHECK(source >= 0 && source < size_, "irecv", "source {} out of range for {} ranks", source, size_);
  const int n = to_int(count, "irecv");
  auto s = make_state(*this, ctx);
  void* target = buf;
  if (on_device(ctx)) {
    const DevCall d(*ctx, "irecv");
    if (passes_device_pointers()) {
      d.sync();  // the buffer may still be read by work queued before the call
    } else {
      SHARD_STAGING_POOL(d);
      s->leases.push_back(acquire(pool, nbytes(count, dt)));
      target = s->leases.back().get();
      const auto bytes = nbytes(count, dt);
      s->done = [d, buf, target, bytes] { d.to_dev(buf, target, bytes); };
    }
  }
  s->op = "wait() on MPI_Irecv";
  s->recv = RecvExpect{n, mpi_type(dt), source, tag};
  mpi_check(MPI_Irecv(target, n, mpi_type(dt), source, tag, comm_, &s->req), "MPI_Irecv");
  return Request(s);
}

Request MpiComm::iallreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op, ExecContext* ctx) {
  SHARD_PROFILE_COMM("iallreduce", ctx, count * dtype_size(dt));
  const int n = to_int(count, "iallreduce");
  const MPI_Op mop = mpi_op(op, dt);
  auto s = make_state(*this, ctx);
  const int p = size_;
  s->op = "wait() on MPI_Iallreduce";
  if (on_device(ctx) && !(passes_device_pointers() && op != ReduceOp::avg)) {
    const DevCall d(*ctx, "iallreduce");
    SHARD_STAGING_POOL(d);
    const auto bytes = nbytes(count, dt);
    s->leases.push_back(acquire(pool, bytes));
    char* h = s->leases.back().get();
    d.to_host(h, send, bytes);
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, h, n, mpi_type(dt), mop, comm_, &s->req), "MPI_Iallreduce");
    s->done = [d, h, recv, count, bytes, dt, p, op] {
      if (op == ReduceOp::avg) divide(h, count, dt, p);
      d.to_dev(recv, h, bytes);
    };
    return Request(s);
  }
  if (on_device(ctx)) DevCall(*ctx, "iallreduce").sync();
  const void* sb = send == recv ? MPI_IN_PLACE : send;
  mpi_check(MPI_Iallreduce(sb, recv, n, mpi_type(dt), mop, comm_, &s->req), "MPI_Iallreduce");
  if (op == ReduceOp::avg) s->done = [recv, count, dt, p] { divide(recv, count, dt, p); };
  return Request(s);
}

Request MpiComm::iallgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                             std::span<const index_t> displs, DType dt, ExecContext* ctx) {
  SHARD_PROFILE_COMM("iallgatherv", ctx, count * dtype_size(dt));
  SHARD_CHECK(counts.size() == static_cast<std::size_t>(size_) && displs.size() == counts.size(), "iallgatherv",
              "need {} counts and displacements", size_);
  auto s = make_state(*this, ctx);
  s->op = "wait() on MPI_Iallgatherv";
  s->keep[0] = to_ints(counts, "iallgatherv");
  s->keep[1] = to_ints(displs, "iallgatherv");
  const int n = to_int(count, "iallgatherv");
  if (on_device(ctx)) {
    const DevCall d(*ctx, "iallgatherv");
    if (passes_device_pointers()) {
      d.sync();
    } else {
      SHARD_STAGING_POOL(d);
      s->leases.push_back(acquire(pool, nbytes(count, dt)));
      s->leases.push_back(acquire(pool, nbytes(extent(counts, displs), dt)));
      d.to_host(s->leases[0].get(), send, nbytes(count, dt));
      send = s->leases[0].get();
      const char* h = s->leases[1].get();
      s->done = [d, recv, h, c = to_vec(counts), o = to_vec(displs), dt] { copy_back_segments(d, recv, h, c, o, dt); };
      recv = s->leases[1].get();
    }
  }
  mpi_check(MPI_Iallgatherv(send, n, mpi_type(dt), recv, s->keep[0].data(), s->keep[1].data(), mpi_type(dt), comm_,
                            &s->req),
            "MPI_Iallgatherv");
  return Request(s);
}

Request MpiComm::ialltoallv(const void* send, std::span<const index_t> sc, std::span<const index_t> sd, void* recv,
                            std::span<const index_t> rc, std::span<const index_t> rd, DType dt, ExecContext* ctx) {
  SHARD_PROFILE_COMM("ialltoallv", ctx, ::shard::comm_detail::payload_bytes(sc, dtype_size(dt)));
  const auto p = static_cast<std::size_t>(size_);
  SHARD_CHECK(sc.size() == p && sd.size() == p && rc.size() == p && rd.size() == p, "ialltoallv",
              "need {} counts/displacements per side", p);
  auto s = make_state(*this, ctx);
  s->op = "wait() on MPI_Ialltoallv";
  s->keep[0] = to_ints(sc, "ialltoallv");
  s->keep[1] = to_ints(sd, "ialltoallv");
  s->keep[2] = to_ints(rc, "ialltoallv");
  s->keep[3] = to_ints(rd, "ialltoallv");
  if (on_device(ctx)) {
    const DevCall d(*ctx, "ialltoallv");
    if (passes_device_pointers()) {
      d.sync();
    } else {
      SHARD_STAGING_POOL(d);
      const auto send_bytes = nbytes(extent(sc, sd), dt);
      s->leases.push_back(acquire(pool, send_bytes));
      s->leases.push_back(acquire(pool, nbytes(extent(rc, rd), dt)));
      d.to_host(s->leases[0].get(), send, send_bytes);
      send = s->leases[0].get();
      const char* h = s->leases[1].get();
      s->done = [d, recv, h, c = to_vec(rc), o = to_vec(rd), dt] { copy_back_segments(d, recv, h, c, o, dt); };
      recv = s->leases[1].get();
    }
  }
  mpi_check(MPI_Ialltoallv(send, s->keep[0].data(), s->keep[1].data(), mpi_type(dt), recv, s->keep[2].data(),
                           s->keep[3].data(), mpi_type(dt), comm_, &s->req),
            "MPI_Ialltoallv");
  return Request(s);
}

#undef SHARD_STAGING_POOL
#undef SHARD_MPI_BLOCKING

std::shared_ptr<Communicator> MpiComm::split(int color, int key) {
  // MPI_Comm_split has no non-blocking form: with the watchdog on, a watched barrier first makes
  // sure every rank has arrived.
  if (timeout() > 0) barrier();
  MPI_Comm nc = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &nc), "MPI_Comm_split");
  if (nc == MPI_COMM_NULL) return nullptr;
  auto out = std::make_shared<MpiComm>(nc);  // duplicates nc
  MPI_Comm_free(&nc);
  out->transport_ = transport_;
  out->follow_timeout_of(*this);
  return out;
}

}  // namespace shard
