// Split-phase ring shift (include/shardtensor/dist/ring.hpp): one isend/irecv pair per segment on
// the communicator of the ring's mesh dims, with tags of its own (they never match halo messages).
#include "shardtensor/dist/ring.hpp"

#include <algorithm>

#include "shardtensor/core/error.hpp"
#include "shardtensor/dist/consistency.hpp"
#include "shardtensor/exec/box.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard {

namespace {
constexpr int kRingTagBase = 0x5A00;  // + 64 * direction + tag * 8 + segment (segments < 8)
constexpr int kMaxSegments = 8;
}  // namespace

RingShift::RingShift(const DeviceMesh& mesh, std::vector<int> dims) : mesh_(mesh), dims_(std::move(dims)) {
  std::sort(dims_.begin(), dims_.end());
  SHARD_CHECK(std::adjacent_find(dims_.begin(), dims_.end()) == dims_.end(), "RingShift",
              "mesh dims {} repeat a dim", dims_);
  for (int m : dims_)
    SHARD_CHECK(m >= 0 && m < mesh.ndim(), "RingShift", "mesh dim {} out of range for a {}-D mesh", m, mesh.ndim());
  size_ = 1;
  index_ = 0;
  for (int m : dims_) {
    size_ *= mesh.size(m);
    index_ = index_ * mesh.size(m) + mesh.coord(m);
  }
  if (!dims_.empty()) comm_ = dims_.size() == 1 ? mesh.dim_comm(dims_[0]) : mesh.dims_comm(dims_);
}

int RingShift::mesh_rank_of(int j) const {
  SHARD_CHECK(j >= 0 && j < size_, "RingShift::mesh_rank_of", "ring position {} out of range for {} ranks", j, size_);
  std::vector<int> c = mesh_.coords();
  for (auto it = dims_.rbegin(); it != dims_.rend(); ++it) {
    c[static_cast<std::size_t>(*it)] = j % mesh_.size(*it);
    j /= mesh_.size(*it);
  }
  return mesh_.rank_of(c);
}

RingShift::Transfer RingShift::start(std::span<const RingSegment> segments, DType dt, RingDirection dir,
                                     ExecContext* ctx, int tag) const {
  SHARD_CHECK(tag >= 0 && tag < 8, "RingShift::start", "tag {} out of range [0, 8)", tag);
  SHARD_CHECK(static_cast<int>(segments.size()) <= kMaxSegments, "RingShift::start", "{} segments (at most {})",
              segments.size(), kMaxSegments);
  SHARD_PROFILE_SCOPE("ring", "ring_shift", "start", ctx);
  Transfer tr;
  if (size_ == 1) {  // nothing moves: the block comes back to itself
    for (const auto& s : segments) {
      SHARD_CHECK(s.send_count == s.recv_count, "RingShift::start",
                  "one-rank ring: a segment sends {} elements but expects {}", s.send_count, s.recv_count);
      if (s.send_count == 0) continue;
      const Device dev = ctx ? ctx->device() : Device::cpu();
      const index_t n = s.send_count;
      Block src = Block::view(dt, dev, const_cast<void*>(s.send), &n, 1);
      Block dst = Block::view(dt, dev, s.recv, &n, 1);
      exec::box_copy(dst, src, ctx ? *ctx : current_context(dev));
    }
    return tr;
  }
  // Checked over the ring; the sequence number counts on the mesh's communicator, so a ring that
  // made one shift more than another ring of the mesh shows at the mesh's next checked call.
  if (detail::checking_collectives(ctx ? ctx->device() : Device::cpu())) [[unlikely]]
    detail::CollectiveFingerprint("ring shift").dtype(dt).mesh(mesh_).field("ring dims", dims_)
        .text("direction", dir == RingDirection::forward ? "forward" : "backward").field("tag", tag)
        .field("segments", segments.size()).agree(*comm_, mesh_.comm().get());
  const int to = neighbor(dir == RingDirection::forward ? 1 : -1);
  const int from = neighbor(dir == RingDirection::forward ? -1 : 1);
  const int base = kRingTagBase + (dir == RingDirection::forward ? 0 : 64) + tag * kMaxSegments;
  tr.reqs_.reserve(2 * segments.size());
  for (std::size_t i = 0; i < segments.size(); ++i)
    tr.reqs_.push_back(comm_->irecv(segments[i].recv, segments[i].recv_count, dt, from, base + static_cast<int>(i), ctx));
  for (std::size_t i = 0; i < segments.size(); ++i)
    tr.reqs_.push_back(
        comm_->isend(segments[i].send, segments[i].send_count, dt, to, base + static_cast<int>(i), ctx));
  return tr;
}

index_t RingShift::exchange_counts(index_t send_count, RingDirection dir) const {
  if (size_ == 1) return send_count;
  const int to = neighbor(dir == RingDirection::forward ? 1 : -1);
  const int from = neighbor(dir == RingDirection::forward ? -1 : 1);
  index_t got = 0;
  comm_->sendrecv(&send_count, 1, to, &got, 1, from, DType::i64, kRingTagBase + 128);
  return got;
}

}  // namespace shard
