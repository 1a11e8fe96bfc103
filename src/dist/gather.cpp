// Gather to one root / scatter from one root (dist/gather.hpp). Point-to-point, one box at a
// time, so the root holds the global tensor plus one staging box and every other rank at most
// its own block and one packed copy of it. Device blocks are staged through the host
// (O(local) on senders; the root's result is copied to the device once at the end).
#include "shardtensor/dist/gather.hpp"

#include <algorithm>

#include "shardtensor/dist/redistribute.hpp"
#include "shardtensor/dist/consistency.hpp"
#include "shardtensor/exec/box.hpp"

namespace shard::detail {

namespace {
constexpr int kGatherTag = 7301;
constexpr int kScatterTag = 7302;

/// A contiguous host copy of `b` (b itself when it already is one).
Block host_contiguous(const Block& b) {
  if (b.device.is_cpu() && b.is_contiguous()) return b;
  Block out = Block::allocate(b.dtype, Device::cpu(), b.shape.data(), b.rank);
  exec::box_copy(out, b);
  return out;
}
}  // namespace

DistSpec without_partials(const DistSpec& spec) {
  if (!spec.has_partial()) return spec;
  std::vector<Placement> ps = spec.placements();
  for (auto& p : ps)
    if (p.is_partial()) p = Replicate();
  return spec.with_placements(std::move(ps), spec.sizes());
}

bool is_box_writer(const DistSpec& spec, int mesh_rank) {
  const auto c = spec.mesh().coords_of(mesh_rank);
  for (int m = 0; m < spec.mesh().ndim(); ++m)
    if (!spec.placement(m).is_shard() && c[static_cast<std::size_t>(m)] != 0) return false;
  return true;
}

Block gather_to(const DistSpec& spec, const Block& local, int root) {
  if (checking_collectives(local.device)) [[unlikely]]
    CollectiveFingerprint("gather_to").dtype(local.dtype).spec(spec).field("root", root).agree(spec.mesh());
  const auto& comm = spec.mesh().comm();
  const int P = comm->size(), me = comm->rank();
  SHARD_CHECK(root >= 0 && root < P, "gather_to", "root {} out of range for a mesh of {} ranks", root, P);
  SHARD_CHECK(local.shape_vec() == spec.local_box().len, "gather_to", "local block of shape {} does not match {} ({} expected)",
              local.shape_vec(), spec, spec.local_box().len);
  // Partials first: reduce to Replicate (an allreduce over the partial mesh dims, O(local)).
  const DistSpec np = without_partials(spec);
  Block mine = spec.has_partial() ? redistribute(spec, host_contiguous(local), np) : local;
  const DType dt = local.dtype;
  if (me != root) {
    if (is_box_writer(np, me) && mine.numel() > 0) {
      const Block packed = host_contiguous(mine);
      comm->isend(packed.data, packed.numel(), dt, root, kGatherTag).wait();
    }
    return Block{};
  }
  const std::vector<index_t>& gshape = np.global_shape();
  Block full = Block::allocate(dt, Device::cpu(), gshape);
  // Boxes that are one contiguous run of the result (row bands) are received in place; the
  // others through a staging buffer of the largest such box.
  index_t biggest = 0;
  for (int r = 0; r < P; ++r)
    if (r != root && is_box_writer(np, r) && !exec::sub_box(full, np.box_of(r).lo, np.box_of(r).len).is_contiguous())
      biggest = std::max(biggest, np.box_of(r).numel());
  Block staging = biggest > 0 ? Block::allocate(dt, Device::cpu(), {biggest}) : Block{};
  for (int r = 0; r < P; ++r) {
    if (!is_box_writer(np, r)) continue;
    const Box& b = np.box_of(r);
    if (b.numel() == 0) continue;
    const Block dst = exec::sub_box(full, b.lo, b.len);
    if (r == root) {
      exec::box_copy(dst, mine);
      continue;
    }
    if (dst.is_contiguous()) {
      comm->irecv(dst.data, b.numel(), dt, r, kGatherTag).wait();
      continue;
    }
    comm->irecv(staging.data, b.numel(), dt, r, kGatherTag).wait();
    exec::box_copy(dst, Block::view(dt, Device::cpu(), staging.data, b.len.data(), static_cast<int>(b.len.size())));
  }
  if (local.device.is_cpu()) return full;
  Block out = Block::allocate(dt, local.device, gshape);
  exec::box_copy(out, full);
  return out;
}

Block scatter_from(const DistSpec& spec, const Block& full, int root, DType dt, Device dev) {
  const auto& comm = spec.mesh().comm();
  const int P = comm->size(), me = comm->rank();
  SHARD_CHECK(root >= 0 && root < P, "scatter_from", "root {} out of range for a mesh of {} ranks", root, P);
  std::string err;
  if (me == root && (full.dtype != dt || full.shape_vec() != spec.global_shape()))
    err = fmt::format("root's tensor is {} of shape {}, the target is {} of global shape {}", full.dtype,
                      full.shape_vec(), dt, spec.global_shape());
  comm->check_all(err.empty(), "scatter_from", err);
  const DistSpec np = without_partials(spec);
  const Box& mybox = np.local_box();
  Block mine = Block::allocate(dt, Device::cpu(), mybox.len);
  if (me == root) {
    // Host boxes that are one contiguous run of `full` are sent in place, the others staged.
    auto in_place = [&](int r) {
      const Box& b = np.box_of(r);
      return full.device.is_cpu() && exec::sub_box(full, b.lo, b.len).is_contiguous();
    };
    index_t biggest = 0;
    for (int r = 0; r < P; ++r)
      if (r != root && !in_place(r)) biggest = std::max(biggest, np.box_of(r).numel());
    Block staging = biggest > 0 ? Block::allocate(dt, Device::cpu(), {biggest}) : Block{};
    for (int r = 0; r < P; ++r) {
      const Box& b = np.box_of(r);
      if (b.numel() == 0) continue;
      const Block src = exec::sub_box(full, b.lo, b.len);
      if (r == root) {
        exec::box_copy(mine, src);
        continue;
      }
      if (in_place(r)) {
        comm->isend(src.data, b.numel(), dt, r, kScatterTag).wait();
        continue;
      }
      exec::box_copy(Block::view(dt, Device::cpu(), staging.data, b.len.data(), static_cast<int>(b.len.size())), src);
      comm->isend(staging.data, b.numel(), dt, r, kScatterTag).wait();
    }
  } else if (mine.numel() > 0) {
    comm->irecv(mine.data, mine.numel(), dt, root, kScatterTag).wait();
  }
  if (spec.has_partial()) mine = redistribute(np, mine, spec);
  if (dev.is_cpu()) return mine;
  Block out = Block::allocate(dt, dev, mine.shape.data(), mine.rank);
  exec::box_copy(out, mine);
  return out;
}

}  // namespace shard::detail
