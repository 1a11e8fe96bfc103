#include "shardtensor/comm/mpi_comm.hpp"

#include <climits>
#include <cstdlib>
#include <vector>

#include "shardtensor/core/error.hpp"

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

struct MpiRequestState : Request::State {
  MPI_Request req = MPI_REQUEST_NULL;
  std::function<void()> done;          // completion step (avg division), may be empty
  std::vector<int> keep[4];            // int count arrays that must outlive the request
  void wait() override {
    mpi_check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
    if (done) done();
  }
  bool test() override {
    int flag = 0;
    mpi_check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag && done) done();
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
  mpi_check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
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
  return std::make_shared<MpiComm>(MPI_COMM_WORLD);
}

void MpiComm::allreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op) {
  const void* s = send == recv ? MPI_IN_PLACE : send;
  mpi_check(MPI_Allreduce(s, recv, to_int(count, "allreduce"), mpi_type(dt), mpi_op(op, dt), comm_), "MPI_Allreduce");
  if (op == ReduceOp::avg) divide(recv, count, dt, size_);
}

void MpiComm::broadcast(void* buf, index_t count, DType dt, int root) {
  SHARD_CHECK(root >= 0 && root < size_, "broadcast", "root {} out of range for {} ranks", root, size_);
  mpi_check(MPI_Bcast(buf, to_int(count, "broadcast"), mpi_type(dt), root, comm_), "MPI_Bcast");
}

void MpiComm::allgather(const void* send, index_t count, void* recv, DType dt) {
  const int c = to_int(count, "allgather");
  mpi_check(MPI_Allgather(send, c, mpi_type(dt), recv, c, mpi_type(dt), comm_), "MPI_Allgather");
}

void MpiComm::allgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                         std::span<const index_t> displs, DType dt) {
  SHARD_CHECK(counts.size() == static_cast<std::size_t>(size_) && displs.size() == counts.size(), "allgatherv",
              "need {} counts and displacements, got {} and {}", size_, counts.size(), displs.size());
  auto c = to_ints(counts, "allgatherv"), d = to_ints(displs, "allgatherv");
  mpi_check(MPI_Allgatherv(send, to_int(count, "allgatherv"), mpi_type(dt), recv, c.data(), d.data(), mpi_type(dt),
                           comm_),
            "MPI_Allgatherv");
}

void MpiComm::reduce_scatterv(const void* send, void* recv, std::span<const index_t> counts, DType dt, ReduceOp op) {
  SHARD_CHECK(counts.size() == static_cast<std::size_t>(size_), "reduce_scatterv", "need {} counts, got {}", size_,
              counts.size());
  auto c = to_ints(counts, "reduce_scatterv");
  mpi_check(MPI_Reduce_scatter(send, recv, c.data(), mpi_type(dt), mpi_op(op, dt), comm_), "MPI_Reduce_scatter");
  if (op == ReduceOp::avg) divide(recv, counts[static_cast<std::size_t>(rank_)], dt, size_);
}

void MpiComm::alltoallv(const void* send, std::span<const index_t> sc, std::span<const index_t> sd, void* recv,
                        std::span<const index_t> rc, std::span<const index_t> rd, DType dt) {
  const auto p = static_cast<std::size_t>(size_);
  SHARD_CHECK(sc.size() == p && sd.size() == p && rc.size() == p && rd.size() == p, "alltoallv",
              "need {} counts/displacements per side", p);
  auto a = to_ints(sc, "alltoallv"), b = to_ints(sd, "alltoallv"), c = to_ints(rc, "alltoallv"),
       d = to_ints(rd, "alltoallv");
  mpi_check(MPI_Alltoallv(send, a.data(), b.data(), mpi_type(dt), recv, c.data(), d.data(), mpi_type(dt), comm_),
            "MPI_Alltoallv");
}

void MpiComm::sendrecv(const void* send, index_t send_count, int dest, void* recv, index_t recv_count, int source,
                       DType dt, int tag) {
  SHARD_CHECK(dest < size_ && source < size_, "sendrecv", "peer out of range (dest {}, source {}, size {})", dest,
              source, size_);
  mpi_check(MPI_Sendrecv(send, to_int(send_count, "sendrecv"), mpi_type(dt), dest < 0 ? MPI_PROC_NULL : dest, tag,
                         recv, to_int(recv_count, "sendrecv"), mpi_type(dt), source < 0 ? MPI_PROC_NULL : source, tag,
                         comm_, MPI_STATUS_IGNORE),
            "MPI_Sendrecv");
}

void MpiComm::barrier() { mpi_check(MPI_Barrier(comm_), "MPI_Barrier"); }

Request MpiComm::isend(const void* buf, index_t count, DType dt, int dest, int tag) {
  SHARD_CHECK(dest >= 0 && dest < size_, "isend", "dest {} out of range for {} ranks", dest, size_);
  auto s = std::make_shared<MpiRequestState>();
  mpi_check(MPI_Isend(buf, to_int(count, "isend"), mpi_type(dt), dest, tag, comm_, &s->req), "MPI_Isend");
  return Request(s);
}

Request MpiComm::irecv(void* buf, index_t count, DType dt, int source, int tag) {
  SHARD_CHECK(source >= 0 && source < size_, "irecv", "source {} out of range for {} ranks", source, size_);
  auto s = std::make_shared<MpiRequestState>();
  mpi_check(MPI_Irecv(buf, to_int(count, "irecv"), mpi_type(dt), source, tag, comm_, &s->req), "MPI_Irecv");
  return Request(s);
}

Request MpiComm::iallreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op) {
  auto s = std::make_shared<MpiRequestState>();
  const void* sb = send == recv ? MPI_IN_PLACE : send;
  mpi_check(MPI_Iallreduce(sb, recv, to_int(count, "iallreduce"), mpi_type(dt), mpi_op(op, dt), comm_, &s->req),
            "MPI_Iallreduce");
  if (op == ReduceOp::avg) {
    const int p = size_;
    s->done = [recv, count, dt, p] { divide(recv, count, dt, p); };
  }
  return Request(s);
}

Request MpiComm::iallgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                             std::span<const index_t> displs, DType dt) {
  SHARD_CHECK(counts.size() == static_cast<std::size_t>(size_) && displs.size() == counts.size(), "iallgatherv",
              "need {} counts and displacements", size_);
  auto s = std::make_shared<MpiRequestState>();
  s->keep[0] = to_ints(counts, "iallgatherv");
  s->keep[1] = to_ints(displs, "iallgatherv");
  mpi_check(MPI_Iallgatherv(send, to_int(count, "iallgatherv"), mpi_type(dt), recv, s->keep[0].data(),
                            s->keep[1].data(), mpi_type(dt), comm_, &s->req),
            "MPI_Iallgatherv");
  return Request(s);
}

Request MpiComm::ialltoallv(const void* send, std::span<const index_t> sc, std::span<const index_t> sd, void* recv,
                            std::span<const index_t> rc, std::span<const index_t> rd, DType dt) {
  const auto p = static_cast<std::size_t>(size_);
  SHARD_CHECK(sc.size() == p && sd.size() == p && rc.size() == p && rd.size() == p, "ialltoallv",
              "need {} counts/displacements per side", p);
  auto s = std::make_shared<MpiRequestState>();
  s->keep[0] = to_ints(sc, "ialltoallv");
  s->keep[1] = to_ints(sd, "ialltoallv");
  s->keep[2] = to_ints(rc, "ialltoallv");
  s->keep[3] = to_ints(rd, "ialltoallv");
  mpi_check(MPI_Ialltoallv(send, s->keep[0].data(), s->keep[1].data(), mpi_type(dt), recv, s->keep[2].data(),
                           s->keep[3].data(), mpi_type(dt), comm_, &s->req),
            "MPI_Ialltoallv");
  return Request(s);
}

std::shared_ptr<Communicator> MpiComm::split(int color, int key) {
  MPI_Comm nc = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &nc), "MPI_Comm_split");
  if (nc == MPI_COMM_NULL) return nullptr;
  auto out = std::make_shared<MpiComm>(nc);  // duplicates nc
  MPI_Comm_free(&nc);
  return out;
}

}  // namespace shard
