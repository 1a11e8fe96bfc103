#include "shardtensor/comm/communicator.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shardtensor/config.hpp"
#include "shardtensor/core/error.hpp"

#include <fmt/ranges.h>
#include "shardtensor/comm/payload_bytes.hpp"
#include "shardtensor/runtime/device_runtime.hpp"
#include "shardtensor/runtime/memory.hpp"
#include "shardtensor/runtime/profiler.hpp"
#if SHARDTENSOR_HAS_MPI
#include "shardtensor/comm/mpi_comm.hpp"
#endif

namespace shard {

void Communicator::reduce_scatter(const void* send, void* recv, index_t count, DType dt, ReduceOp op,
                                  ExecContext* ctx) {
  std::vector<index_t> counts(static_cast<std::size_t>(size()), count);
  reduce_scatterv(send, recv, counts, dt, op, ctx);
}

void Communicator::alltoall(const void* send, void* recv, index_t count, DType dt, ExecContext* ctx) {
  const auto p = static_cast<std::size_t>(size());
  std::vector<index_t> counts(p, count), displs(p);
  for (std::size_t i = 0; i < p; ++i) displs[i] = static_cast<index_t>(i) * count;
  alltoallv(send, counts, displs, recv, counts, displs, dt, ctx);
}

std::vector<std::vector<index_t>> Communicator::allgather_vectors(const std::vector<index_t>& v) {
  const auto lens = allgather_value<index_t>(static_cast<index_t>(v.size()));
  std::vector<index_t> displs(lens.size());
  index_t tot = 0;
  for (std::size_t i = 0; i < lens.size(); ++i) {
    displs[i] = tot;
    tot += lens[i];
  }
  std::vector<index_t> flat(static_cast<std::size_t>(tot));
  allgatherv(v.data(), static_cast<index_t>(v.size()), flat.data(), lens, displs, DType::i64);
  std::vector<std::vector<index_t>> out(lens.size());
  for (std::size_t i = 0; i < lens.size(); ++i)
    out[i].assign(flat.begin() + displs[i], flat.begin() + displs[i] + lens[i]);
  return out;
}

double Communicator::env_comm_timeout() {
  static const double t = [] {
    const char* e = std::getenv("SHARDTENSOR_COMM_TIMEOUT");
    if (!e || !*e) return 0.0;
    char* end = nullptr;
    const double v = std::strtod(e, &end);
    if (end == e || *end != '\0' || !(v >= 0) || v > 1e9) {
      std::fprintf(stderr, "shardtensor: ignoring SHARDTENSOR_COMM_TIMEOUT='%s' (expected seconds >= 0)\n", e);
      return 0.0;
    }
    return v;
  }();
  return t;
}

void Communicator::check_all(bool ok, const char* op, const std::string& message_if_not_ok) {
  const auto flags = allgather_value<int>(ok ? 1 : 0);
  int first_bad = -1;
  for (std::size_t i = 0; i < flags.size(); ++i)
    if (!flags[i]) { first_bad = static_cast<int>(i); break; }
  if (first_bad < 0) return;
  index_t len = rank() == first_bad ? static_cast<index_t>(message_if_not_ok.size()) : 0;
  broadcast(&len, 1, DType::i64, first_bad);
  std::string msg(static_cast<std::size_t>(len), '\0');
  if (rank() == first_bad) msg = message_if_not_ok;
  if (len > 0) broadcast(msg.data(), len, DType::u8, first_bad);
  SHARD_FAIL(op, "{} (detected on rank {} of {})", msg, first_bad, size());
}

void Communicator::check_all(bool ok, const char* op, const std::string& message_if_not_ok, std::uint64_t key,
                             const std::function<std::string()>& describe) {
  struct Vote {
    std::uint64_t ok;
    std::uint64_t key;
  };
  const auto votes = allgather_value(Vote{ok ? 1u : 0u, key});
  bool all_ok = true, same = true;
  for (const Vote& v : votes) {
    all_ok = all_ok && v.ok;
    same = same && v.key == votes[0].key;
  }
  if (!all_ok) {
    check_all(ok, op, message_if_not_ok);  // the plain check's message (the lowest failing rank's)
    return;                                // (not reached: it throws on every rank)
  }
  if (same) return;
  const auto groups = group_texts(describe ? describe() : std::string("(no description)"));
  std::string have;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& rs = groups[g].second;
    have += fmt::format("{}{} {{{}}} {} {}", g ? ", " : "", rs.size() == 1 ? "rank" : "ranks", fmt::join(rs, ","),
                        rs.size() == 1 ? "has" : "have", groups[g].first);
  }
  SHARD_FAIL(op, "ranks disagree on this call: {} (this is rank {} of {}; SHARDTENSOR_CHECK_COLLECTIVES=1 checks every "
             "communicating call this way)",
             groups.size() > 1 ? have : std::string("their arguments differ"), rank(), size());
}

std::vector<std::pair<std::string, std::vector<int>>> Communicator::group_texts(const std::string& text) {
  const int P = size();
  const std::vector<index_t> lens = allgather_value(static_cast<index_t>(text.size()));
  std::vector<index_t> displs(static_cast<std::size_t>(P), 0);
  for (int r = 1; r < P; ++r)
    displs[static_cast<std::size_t>(r)] = displs[static_cast<std::size_t>(r) - 1] + lens[static_cast<std::size_t>(r) - 1];
  std::string texts(static_cast<std::size_t>(displs.back() + lens.back()), '\0');
  allgatherv(text.data(), static_cast<index_t>(text.size()), texts.data(), lens, displs, DType::u8);
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < P; ++r) {
    std::string v = texts.substr(static_cast<std::size_t>(displs[static_cast<std::size_t>(r)]),
                                 static_cast<std::size_t>(lens[static_cast<std::size_t>(r)]));
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
    if (it == groups.end()) groups.emplace_back(std::move(v), std::vector<int>{r});
    else it->second.push_back(r);
  }
  return groups;
}

// ------------------------------- SelfComm -------------------------------

namespace {
// Copies `count` elements; on a device context, a device-to-device copy ordered on its stream.
void copy_elems(void* dst, const void* src, index_t count, DType dt, ExecContext* ctx) {
  if (dst == src || count <= 0) return;
  const auto bytes = static_cast<std::size_t>(count) * dtype_size(dt);
  if (!on_device(ctx)) {
    std::memmove(dst, src, bytes);
    return;
  }
  exec::cuda_runtime("SelfComm").copy(dst, ctx->device(), src, ctx->device(), bytes, ctx->stream(), false);
}
}  // namespace

void SelfComm::allreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op, ExecContext* ctx) {
  SHARD_PROFILE_COMM("allreduce", ctx, count * dtype_size(dt));
  SHARD_CHECK(!is_complex(dt) || op == ReduceOp::sum || op == ReduceOp::avg, "SelfComm::allreduce",
              "{} reduction of {}: complex numbers have no order (sum and avg only)", reduce_op_name(op), dt);
  copy_elems(recv, send, count, dt, ctx);
}
void SelfComm::broadcast(void*, index_t count, DType dt, int root, ExecContext* ctx) {
  SHARD_PROFILE_COMM("broadcast", ctx, count * dtype_size(dt));
  SHARD_CHECK(root == 0, "SelfComm::broadcast", "root {} out of range for 1 rank", root);
}
void SelfComm::allgather(const void* send, index_t count, void* recv, DType dt, ExecContext* ctx) {
  SHARD_PROFILE_COMM("allgather", ctx, count * dtype_size(dt));
  copy_elems(recv, send, count, dt, ctx);
}
void SelfComm::allgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                          std::span<const index_t> displs, DType dt, ExecContext* ctx) {
  SHARD_PROFILE_COMM("allgatherv", ctx, count * dtype_size(dt));
  SHARD_CHECK(counts.size() == 1 && displs.size() == 1 && counts[0] == count, "SelfComm::allgatherv",
              "counts do not match send count {}", count);
  copy_elems(static_cast<char*>(recv) + displs[0] * static_cast<index_t>(dtype_size(dt)), send, count, dt, ctx);
}
void SelfComm::reduce_scatterv(const void* send, void* recv, std::span<const index_t> counts, DType dt, ReduceOp op,
                               ExecContext* ctx) {
  SHARD_PROFILE_COMM("reduce_scatterv", ctx, ::shard::comm_detail::payload_bytes(counts, dtype_size(dt)));
  SHARD_CHECK(!is_complex(dt) || op == ReduceOp::sum || op == ReduceOp::avg, "SelfComm::reduce_scatterv",
              "{} reduction of {}: complex numbers have no order (sum and avg only)", reduce_op_name(op), dt);
  SHARD_CHECK(counts.size() == 1, "SelfComm::reduce_scatterv", "expected 1 count, got {}", counts.size());
  copy_elems(recv, send, counts[0], dt, ctx);
}
void SelfComm::alltoallv(const void* send, std::span<const index_t> sc, std::span<const index_t> sd, void* recv,
                         std::span<const index_t> rc, std::span<const index_t> rd, DType dt, ExecContext* ctx) {
  SHARD_PROFILE_COMM("alltoallv", ctx, ::shard::comm_detail::payload_bytes(sc, dtype_size(dt)));
  SHARD_CHECK(sc.size() == 1 && sd.size() == 1 && rc.size() == 1 && rd.size() == 1 && sc[0] == rc[0],
              "SelfComm::alltoallv", "send/recv counts differ");
  const auto es = static_cast<index_t>(dtype_size(dt));
  copy_elems(static_cast<char*>(recv) + rd[0] * es, static_cast<const char*>(send) + sd[0] * es, sc[0], dt, ctx);
}
void SelfComm::sendrecv(const void* send, index_t send_count, int dest, void* recv, index_t recv_count, int source,
                        DType dt, int, ExecContext* ctx) {
  SHARD_PROFILE_COMM("sendrecv", ctx, (dest >= 0 ? send_count : 0) * dtype_size(dt));
  SHARD_CHECK(dest <= 0 && source <= 0, "SelfComm::sendrecv", "peer out of range (dest {}, source {})", dest, source);
  if (dest == 0 && source == 0) {
    SHARD_CHECK(send_count == recv_count, "SelfComm::sendrecv", "count {} != {}", send_count, recv_count);
    copy_elems(recv, send, send_count, dt, ctx);
  }
}
void SelfComm::barrier(ExecContext* ctx) { SHARD_PROFILE_COMM("barrier", ctx, 0); }
Request SelfComm::isend(const void* buf, index_t count, DType dt, int dest, int tag, ExecContext* ctx) {
  SHARD_PROFILE_COMM("isend", ctx, count * dtype_size(dt));
  SHARD_CHECK(dest == 0, "SelfComm::isend", "dest {} out of range", dest);
  const auto bytes = static_cast<std::size_t>(count) * dtype_size(dt);
  SelfMessage msg{tag, {}, nullptr, bytes, Device::cpu(), Stream{}};
  if (on_device(ctx) && bytes > 0) {
    // A device copy ordered on the sender's stream (the receiver copies out on its own stream,
    // which for a one-rank communicator is the same context's).
    ContextGuard on(*ctx);
    msg.device = allocate_bytes(bytes, ctx->device());
    msg.where = ctx->device();
    msg.stream = ctx->stream();
    exec::cuda_runtime("SelfComm::isend").copy(msg.device.get(), ctx->device(), buf, ctx->device(), bytes,
                                               ctx->stream(), false);
  } else if (bytes > 0) {
    msg.host.resize(bytes);
    std::memcpy(msg.host.data(), buf, bytes);
  }
  mailbox_.push_back(std::move(msg));
  return {};
}
Request SelfComm::irecv(void* buf, index_t count, DType dt, int source, int tag, ExecContext* ctx) {
  SHARD_PROFILE_COMM("irecv", ctx, count * dtype_size(dt));
  SHARD_CHECK(source == 0, "SelfComm::irecv", "source {} out of range", source);
  struct St : Request::State {
    SelfComm* c; void* buf; std::size_t bytes; int tag;
    bool dev = false; Device device; Stream stream;
    bool test() override {
      for (auto it = c->mailbox_.begin(); it != c->mailbox_.end(); ++it) {
        if (it->tag == tag) {
          SHARD_CHECK(it->bytes == bytes, "SelfComm::irecv", "message of {} bytes, expected {}", it->bytes, bytes);
          if (bytes > 0) {
            if (it->device && dev) {
              const auto& rt = exec::cuda_runtime("SelfComm::irecv");
              // The sender's copy is ordered on its stream: another stream waits for it first.
              if (it->stream != stream) rt.synchronize(it->stream, it->where.index);
              rt.copy(buf, device, it->device.get(), it->where, bytes, stream, false);
            } else if (it->device) {  // sent from device memory, received into host memory
              exec::cuda_runtime("SelfComm::irecv").copy(buf, Device::cpu(), it->device.get(), it->where, bytes,
                                                         it->stream, true);
            } else if (dev) {  // from pageable host memory: synchronous
              exec::cuda_runtime("SelfComm::irecv").copy(buf, device, it->host.data(), Device::cpu(), bytes, stream,
                                                         true);
            } else {
              std::memcpy(buf, it->host.data(), bytes);
            }
          }
          c->mailbox_.erase(it);
          return true;
        }
      }
      return false;
    }
    void wait() override {
      SHARD_CHECK(test(), "SelfComm::irecv", "no matching send with tag {} (would deadlock)", tag);
    }
  };
  auto s = std::make_shared<St>();
  s->c = this; s->buf = buf; s->bytes = static_cast<std::size_t>(count) * dtype_size(dt); s->tag = tag;
  if (on_device(ctx)) { s->dev = true; s->device = ctx->device(); s->stream = ctx->stream(); }
  return Request(s);
}
Request SelfComm::iallreduce(const void* send, void* recv, index_t count, DType dt, ReduceOp op, ExecContext* ctx) {
  SHARD_PROFILE_COMM("iallreduce", ctx, count * dtype_size(dt));
  allreduce(send, recv, count, dt, op, ctx);
  return {};
}
Request SelfComm::iallgatherv(const void* send, index_t count, void* recv, std::span<const index_t> counts,
                              std::span<const index_t> displs, DType dt, ExecContext* ctx) {
  SHARD_PROFILE_COMM("iallgatherv", ctx, count * dtype_size(dt));
  allgatherv(send, count, recv, counts, displs, dt, ctx);
  return {};
}
Request SelfComm::ialltoallv(const void* send, std::span<const index_t> sc, std::span<const index_t> sd, void* recv,
                             std::span<const index_t> rc, std::span<const index_t> rd, DType dt, ExecContext* ctx) {
  SHARD_PROFILE_COMM("ialltoallv", ctx, ::shard::comm_detail::payload_bytes(sc, dtype_size(dt)));
  alltoallv(send, sc, sd, recv, rc, rd, dt, ctx);
  return {};
}
std::shared_ptr<Communicator> SelfComm::split(int color, int) {
  if (color < 0) return nullptr;
  auto out = std::make_shared<SelfComm>();
  out->follow_timeout_of(*this);
  return out;
}

CommPtr default_comm() {
#if SHARDTENSOR_HAS_MPI
  return MpiComm::world();
#else
  return std::make_shared<SelfComm>();
#endif
}

}  // namespace shard
