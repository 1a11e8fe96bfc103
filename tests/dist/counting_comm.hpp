#pragma once
// CountingComm: a Communicator decorator that forwards every call to an inner communicator and
// counts the calls per operation name. Sub-communicators made by split() are wrapped too and
// share the counters, so a DeviceMesh built on a CountingComm counts the traffic of all its
// mesh-dim communicators. Lets tests prove that a step does no communication at all.
#include <map>
#include <memory>
#include <string>

#include <shardtensor/shardtensor.hpp>

namespace shard::test {

/// Communicator that counts calls per operation (shared with the communicators it splits off).
class CountingComm final : public Communicator {
 public:
  using Counts = std::map<std::string, int>;
  explicit CountingComm(CommPtr inner, std::shared_ptr<Counts> counts = std::make_shared<Counts>())
      : inner_(std::move(inner)), counts_(std::move(counts)) {}

  /// Calls so far, per operation name ("allreduce", "alltoallv", ...).
  const Counts& counts() const { return *counts_; }
  /// Total number of calls so far.
  int total() const {
    int n = 0;
    for (auto& [k, v] : *counts_) n += v;
    return n;
  }
  void reset() { counts_->clear(); }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return "counting:" + inner_->backend(); }
  void allreduce(const void* s, void* r, index_t n, DType dt, ReduceOp op, ExecContext* ctx = nullptr) override {
    bump("allreduce");
    inner_->allreduce(s, r, n, dt, op, ctx);
  }
  void broadcast(void* b, index_t n, DType dt, int root, ExecContext* ctx = nullptr) override {
    bump("broadcast");
    inner_->broadcast(b, n, dt, root, ctx);
  }
  void allgather(const void* s, index_t n, void* r, DType dt, ExecContext* ctx = nullptr) override {
    bump("allgather");
    inner_->allgather(s, n, r, dt, ctx);
  }
  void allgatherv(const void* s, index_t n, void* r, std::span<const index_t> c, std::span<const index_t> d,
                  DType dt, ExecContext* ctx = nullptr) override {
    bump("allgatherv");
    inner_->allgatherv(s, n, r, c, d, dt, ctx);
  }
  void reduce_scatterv(const void* s, void* r, std::span<const index_t> c, DType dt, ReduceOp op,
                       ExecContext* ctx = nullptr) override {
    bump("reduce_scatterv");
    inner_->reduce_scatterv(s, r, c, dt, op, ctx);
  }
  void alltoallv(const void* s, std::span<const index_t> sc, std::span<const index_t> sd, void* r,
                 std::span<const index_t> rc, std::span<const index_t> rd, DType dt,
                 ExecContext* ctx = nullptr) override {
    bump("alltoallv");
    inner_->alltoallv(s, sc, sd, r, rc, rd, dt, ctx);
  }
  void sendrecv(const void* s, index_t sn, int dest, void* r, index_t rn, int src, DType dt, int tag = 0,
                ExecContext* ctx = nullptr) override {
    bump("sendrecv");
    inner_->sendrecv(s, sn, dest, r, rn, src, dt, tag, ctx);
  }
  void barrier(ExecContext* ctx = nullptr) override {
    bump("barrier");
    inner_->barrier(ctx);
  }
  Request isend(const void* b, index_t n, DType dt, int dest, int tag = 0, ExecContext* ctx = nullptr) override {
    bump("isend");
    return inner_->isend(b, n, dt, dest, tag, ctx);
  }
  Request irecv(void* b, index_t n, DType dt, int src, int tag = 0, ExecContext* ctx = nullptr) override {
    bump("irecv");
    return inner_->irecv(b, n, dt, src, tag, ctx);
  }
  Request iallreduce(const void* s, void* r, index_t n, DType dt, ReduceOp op, ExecContext* ctx = nullptr) override {
    bump("iallreduce");
    return inner_->iallreduce(s, r, n, dt, op, ctx);
  }
  Request iallgatherv(const void* s, index_t n, void* r, std::span<const index_t> c, std::span<const index_t> d,
                      DType dt, ExecContext* ctx = nullptr) override {
    bump("iallgatherv");
    return inner_->iallgatherv(s, n, r, c, d, dt, ctx);
  }
  Request ialltoallv(const void* s, std::span<const index_t> sc, std::span<const index_t> sd, void* r,
                     std::span<const index_t> rc, std::span<const index_t> rd, DType dt,
                     ExecContext* ctx = nullptr) override {
    bump("ialltoallv");
    return inner_->ialltoallv(s, sc, sd, r, rc, rd, dt, ctx);
  }
  std::shared_ptr<Communicator> split(int color, int key) override {
    bump("split");
    auto sub = inner_->split(color, key);
    return sub ? std::make_shared<CountingComm>(sub, counts_) : nullptr;
  }

 private:
  void bump(const char* op) { ++(*counts_)[op]; }
  CommPtr inner_;
  std::shared_ptr<Counts> counts_;
};

}  // namespace shard::test
