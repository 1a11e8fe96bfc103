#pragma once
// TrafficComm: a Communicator decorator that records, per operation, the number of calls and the
// largest number of bytes one call delivered to this rank (sub-communicators from split() share
// the record). Whole-model tests use it to show that no collective replicates a field: gather-
// type calls (allgather(v), broadcast) only move a few bytes of flags, and all-to-alls never
// deliver more than this rank's own block.
#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <string>

#include <shardtensor/shardtensor.hpp>

namespace shard::test {

/// Communicator that records calls and the largest per-call receive volume per operation.
class TrafficComm final : public Communicator {
 public:
  struct Stat {
    int calls = 0;
    std::size_t max_bytes = 0;  ///< largest delivery to this rank in one call
  };
  using Stats = std::map<std::string, Stat>;
  explicit TrafficComm(CommPtr inner, std::shared_ptr<Stats> s = std::make_shared<Stats>())
      : inner_(std::move(inner)), s_(std::move(s)) {}

  const Stats& stats() const { return *s_; }
  /// Calls of `op` so far.
  int calls(const std::string& op) const { return s_->count(op) ? s_->at(op).calls : 0; }
  /// Largest delivery of one `op` call so far (bytes).
  std::size_t max_bytes(const std::string& op) const { return s_->count(op) ? s_->at(op).max_bytes : 0; }
  void reset() { s_->clear(); }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return "traffic:" + inner_->backend(); }
  void allreduce(const void* s, void* r, index_t n, DType dt, ReduceOp op, ExecContext* ctx = nullptr) override {
    note("allreduce", n, dt);
    inner_->allreduce(s, r, n, dt, op, ctx);
  }
  void broadcast(void* b, index_t n, DType dt, int root, ExecContext* ctx = nullptr) override {
    note("broadcast", n, dt);
    inner_->broadcast(b, n, dt, root, ctx);
  }
  void allgather(const void* s, index_t n, void* r, DType dt, ExecContext* ctx = nullptr) override {
    note("allgather", n * size(), dt);
    inner_->allgather(s, n, r, dt, ctx);
  }
  void allgatherv(const void* s, index_t n, void* r, std::span<const index_t> c, std::span<const index_t> d,
                  DType dt, ExecContext* ctx = nullptr) override {
    note("allgatherv", sum(c), dt);
    inner_->allgatherv(s, n, r, c, d, dt, ctx);
  }
  void reduce_scatterv(const void* s, void* r, std::span<const index_t> c, DType dt, ReduceOp op,
                       ExecContext* ctx = nullptr) override {
    note("reduce_scatterv", c[static_cast<std::size_t>(rank())], dt);
    inner_->reduce_scatterv(s, r, c, dt, op, ctx);
  }
  void alltoallv(const void* s, std::span<const index_t> sc, std::span<const index_t> sd, void* r,
                 std::span<const index_t> rc, std::span<const index_t> rd, DType dt,
                 ExecContext* ctx = nullptr) override {
    note("alltoallv", sum(rc), dt);
    inner_->alltoallv(s, sc, sd, r, rc, rd, dt, ctx);
  }
  void sendrecv(const void* s, index_t sn, int dest, void* r, index_t rn, int src, DType dt, int tag = 0,
                ExecContext* ctx = nullptr) override {
    note("sendrecv", src >= 0 ? rn : 0, dt);
    inner_->sendrecv(s, sn, dest, r, rn, src, dt, tag, ctx);
  }
  void barrier(ExecContext* ctx = nullptr) override { inner_->barrier(ctx); }
  Request isend(const void* b, index_t n, DType dt, int dest, int tag = 0, ExecContext* ctx = nullptr) override {
    note("isend", 0, dt);
    return inner_->isend(b, n, dt, dest, tag, ctx);
  }
  Request irecv(void* b, index_t n, DType dt, int src, int tag = 0, ExecContext* ctx = nullptr) override {
    note("irecv", n, dt);
    return inner_->irecv(b, n, dt, src, tag, ctx);
  }
  Request iallreduce(const void* s, void* r, index_t n, DType dt, ReduceOp op, ExecContext* ctx = nullptr) override {
    note("allreduce", n, dt);
    return inner_->iallreduce(s, r, n, dt, op, ctx);
  }
  Request iallgatherv(const void* s, index_t n, void* r, std::span<const index_t> c, std::span<const index_t> d,
                      DType dt, ExecContext* ctx = nullptr) override {
    note("allgatherv", sum(c), dt);
    return inner_->iallgatherv(s, n, r, c, d, dt, ctx);
  }
  Request ialltoallv(const void* s, std::span<const index_t> sc, std::span<const index_t> sd, void* r,
                     std::span<const index_t> rc, std::span<const index_t> rd, DType dt,
                     ExecContext* ctx = nullptr) override {
    note("alltoallv", sum(rc), dt);
    return inner_->ialltoallv(s, sc, sd, r, rc, rd, dt, ctx);
  }
  std::shared_ptr<Communicator> split(int color, int key) override {
    auto sub = inner_->split(color, key);
    return sub ? std::make_shared<TrafficComm>(sub, s_) : nullptr;
  }

 private:
  static index_t sum(std::span<const index_t> c) { return std::accumulate(c.begin(), c.end(), index_t{0}); }
  void note(const char* op, index_t n, DType dt) {
    auto& st = (*s_)[op];
    ++st.calls;
    st.max_bytes = std::max(st.max_bytes, static_cast<std::size_t>(n) * dtype_size(dt));
  }
  CommPtr inner_;
  std::shared_ptr<Stats> s_;
};

}  // namespace shard::test
