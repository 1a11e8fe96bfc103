// Redistribution between placements. Three steps (DESIGN.md §3):
//  A. resolve Partial mesh dims that the target does not keep: reduce-scatter-v straight into a
//     Shard when possible, else allreduce to Replicate;
//  B. move Shard/Replicate data: no communication when every rank's target box lies in its
//     current box (Replicate->Shard is a local slice); one allgatherv for a plain Shard->Replicate;
//     otherwise one alltoallv of box intersections over the mesh dims that change;
//  C. turn Replicate into the target's Partial (sum keeps the value on coordinate 0 only).
#include "shardtensor/dist/redistribute.hpp"

#include <algorithm>
#include <numeric>

#include "shardtensor/exec/box.hpp"

namespace shard::detail {
namespace {

index_t prod(const std::vector<index_t>& v) {
  return std::accumulate(v.begin(), v.end(), index_t{1}, std::multiplies<>());
}

// Element offset (in elements) of local index `lo` in block b.
index_t offset_of(const Block& b, const std::vector<index_t>& lo) {
  index_t o = 0;
  for (std::size_t d = 0; d < lo.size(); ++d) o += lo[d] * b.strides[d];
  return o;
}

// True if the box (lo, len) of contiguous block b is one contiguous run of memory.
bool box_is_contiguous_run(const Block& b, const std::vector<index_t>& len) {
  if (!b.is_contiguous()) return false;
  // After the first dim with len > 1, every later dim must be full.
  std::size_t d = 0;
  while (d < len.size() && len[d] == 1) ++d;
  for (std::size_t k = d + 1; k < len.size(); ++k)
    if (len[k] != b.shape[k]) return false;
  return true;
}

Box local_of(const Box& global_box, const Box& owner) {
  Box r = global_box;
  for (std::size_t d = 0; d < r.lo.size(); ++d) r.lo[d] -= owner.lo[d];
  return r;
}

/// A contiguous block of `shape` at `data` (dtype and device of `like`), sharing like's owner.
Block contiguous_view(const Block& like, void* data, const std::vector<index_t>& shape) {
  return Block::view(like.dtype, like.device, data, shape.data(), static_cast<int>(shape.size()), nullptr, like.owner);
}

/// A fresh contiguous block of `shape` with the dtype and device of `like`.
Block allocate_like(const Block& like, const std::vector<index_t>& shape) {
  return Block::allocate(like.dtype, like.device, shape);
}

/// dst[dst_lo + box] = src[src_lo + box] (local coordinates).
void copy_box(const Block& src, const std::vector<index_t>& src_lo, const Block& dst, const std::vector<index_t>& dst_lo,
              const std::vector<index_t>& len) {
  exec::box_copy(exec::sub_box(dst, dst_lo, len), exec::sub_box(src, src_lo, len));
}

std::vector<index_t> zeros_like(const std::vector<index_t>& v) { return std::vector<index_t>(v.size(), 0); }

void apply_replicate_to_partial(const Block& b, const DistSpec& spec, int m) {
  // sum: the value stays on coordinate 0 and the others hold zeros; avg/max/min keep the value.
  if (spec.placement(m).op != ReduceOp::sum || spec.mesh().coord(m) == 0) return;
  exec::box_zero(b);
}

}  // namespace

namespace {

// ---------------------------------------------------------------- step A
struct State {
  DistSpec spec;
  Block block;
};

void resolve_partials(State& st, const DistSpec& dst, std::vector<std::string>* plan) {
  const auto& mesh = st.spec.mesh();
  for (int m = 0; m < mesh.ndim(); ++m) {
    const Placement cur = st.spec.placement(m), tgt = dst.placement(m);
    if (!cur.is_partial() || cur == tgt) continue;
    auto placements = st.spec.placements();
    // Reduce-scatter straight into Shard(d) when d is sharded by nobody else before and after.
    bool rs = tgt.is_shard() && st.spec.sharding_mesh_dims(tgt.dim).empty() &&
              dst.sharding_mesh_dims(tgt.dim) == std::vector<int>{m};
    if (rs) {
      placements[static_cast<std::size_t>(m)] = tgt;
      ShardSizes sizes = st.spec.sizes();
      sizes[static_cast<std::size_t>(tgt.dim)] = dst.layout(tgt.dim).sizes();
      DistSpec next(mesh, placements, st.spec.global_shape(), sizes);
      if (plan) { plan->push_back("reduce_scatterv"); st.spec = next; continue; }
      const int d = tgt.dim;
      const auto& lay = next.layout(d);
      const index_t P = lay.parts();
      // Pack per-part slabs along d so that each part's data is contiguous.
      const auto& in = st.block;
      std::vector<index_t> counts(static_cast<std::size_t>(P));
      index_t slab = 1;
      for (int k = 0; k < in.rank; ++k)
        if (k != d) slab *= in.shape[static_cast<std::size_t>(k)];
      for (index_t p = 0; p < P; ++p) counts[static_cast<std::size_t>(p)] = lay.size(p) * slab;
      Block send = allocate_like(in, {in.numel()});
      char* w = static_cast<char*>(send.data);
      const auto es = static_cast<index_t>(in.element_bytes());
      for (index_t p = 0; p < P; ++p) {
        std::vector<index_t> lo(static_cast<std::size_t>(in.rank), 0), len = in.shape_vec();
        lo[static_cast<std::size_t>(d)] = lay.offset(p);
        len[static_cast<std::size_t>(d)] = lay.size(p);
        copy_box(in, lo, contiguous_view(send, w, len), zeros_like(len), len);
        w += prod(len) * es;
      }
      auto out_shape = in.shape_vec();
      out_shape[static_cast<std::size_t>(d)] = lay.size(mesh.coord(m));
      Block out = allocate_like(in, out_shape);
      mesh.dim_comm(m)->reduce_scatterv(send.data, out.data, counts, in.dtype, cur.op);
      st = State{next, out};
    } else {
      placements[static_cast<std::size_t>(m)] = Replicate();
      DistSpec next(mesh, placements, st.spec.global_shape(), st.spec.sizes());
      if (plan) { plan->push_back("allreduce"); st.spec = next; continue; }
      Block out = allocate_like(st.block, st.block.shape_vec());
      exec::box_copy(out, st.block);
      mesh.dim_comm(m)->allreduce(out.data, out.data, out.numel(), out.dtype, cur.op);
      st = State{next, out};
    }
  }
}

// ---------------------------------------------------------------- step B
void move_data(State& st, const DistSpec& tgt, std::vector<std::string>* plan) {
  const auto& mesh = st.spec.mesh();
  const int P = mesh.size();
  // Mesh dims whose placement or layout changes.
  std::vector<int> changed;
  for (int m = 0; m < mesh.ndim(); ++m) {
    const auto &a = st.spec.placement(m), &b = tgt.placement(m);
    bool ch = !(a == b);
    if (!ch && a.is_shard()) ch = !(st.spec.layout(a.dim) == tgt.layout(a.dim));
    if (ch) changed.push_back(m);
  }
  // Also mesh dims sharding a tensor dim whose layout changed because another mesh dim joined it.
  for (int d = 0; d < st.spec.ndim(); ++d) {
    if (st.spec.layout(d) == tgt.layout(d) && st.spec.sharding_mesh_dims(d) == tgt.sharding_mesh_dims(d)) continue;
    for (int m : st.spec.sharding_mesh_dims(d)) changed.push_back(m);
    for (int m : tgt.sharding_mesh_dims(d)) changed.push_back(m);
  }
  std::sort(changed.begin(), changed.end());
  changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
  if (changed.empty()) return;

  // No communication when every rank's target box lies inside its current box.
  bool local_only = true;
  for (int r = 0; r < P && local_only; ++r) local_only = st.spec.box_of(r).contains(tgt.box_of(r));
  const Box my_cur = st.spec.local_box(), my_tgt = tgt.local_box();
  if (local_only) {
    if (plan) { plan->push_back("local"); st.spec = tgt; return; }
    Block out = allocate_like(st.block, my_tgt.len);
    copy_box(st.block, local_of(my_tgt, my_cur).lo, out, zeros_like(my_tgt.len), my_tgt.len);
    st = State{tgt, out};
    return;
  }

  // Group of the ranks that vary over `changed` (mesh.dims_comm is collective on first use, so the
  // plan-only mode below never creates it).
  int G = 1;
  for (int m : changed) G *= mesh.size(m);
  // Group rank g -> mesh rank (ranks varying over `changed`, row-major over them).
  std::vector<int> group_to_mesh(static_cast<std::size_t>(G));
  {
    auto coords = mesh.coords();
    for (int g = 0; g < G; ++g) {
      int rem = g;
      for (int k = static_cast<int>(changed.size()) - 1; k >= 0; --k) {
        const int m = changed[static_cast<std::size_t>(k)];
        coords[static_cast<std::size_t>(m)] = rem % mesh.size(m);
        rem /= mesh.size(m);
      }
      group_to_mesh[static_cast<std::size_t>(g)] = mesh.rank_of(coords);
    }
  }

  // Fast path: one mesh dim m going Shard(d) -> Replicate with d sharded by m alone: allgatherv.
  if (changed.size() == 1) {
    const int m = changed[0];
    const auto &a = st.spec.placement(m), &b = tgt.placement(m);
    if (a.is_shard() && b.is_replicate() && st.spec.sharding_mesh_dims(a.dim) == std::vector<int>{m}) {
      if (plan) { plan->push_back("allgatherv"); st.spec = tgt; return; }
      const auto comm = mesh.dims_comm(changed);
      const int d = a.dim;
      const auto& lay = st.spec.layout(d);
      index_t slab = 1;  // elements per unit of dim d in the gathered block
      for (int k = 0; k < tgt.ndim(); ++k)
        if (k != d) slab *= my_tgt.len[static_cast<std::size_t>(k)];
      std::vector<index_t> counts(static_cast<std::size_t>(G)), displs(static_cast<std::size_t>(G));
      for (int g = 0; g < G; ++g) {
        counts[static_cast<std::size_t>(g)] = lay.size(g) * slab;
        displs[static_cast<std::size_t>(g)] = lay.offset(g) * slab;
      }
      const DType dt = st.block.dtype;
      Block out = allocate_like(st.block, my_tgt.len);
      Block send = st.block;
      if (!send.is_contiguous()) {
        send = allocate_like(st.block, st.block.shape_vec());
        exec::box_copy(send, st.block);
      }
      bool outer_trivial = true;  // all dims before d have extent 1: blocks land contiguously
      for (int k = 0; k < d; ++k) outer_trivial = outer_trivial && my_tgt.len[static_cast<std::size_t>(k)] == 1;
      if (outer_trivial) {
        comm->allgatherv(send.data, send.numel(), out.data, counts, displs, dt);
      } else {
        Block tmp = allocate_like(out, {out.numel()});
        comm->allgatherv(send.data, send.numel(), tmp.data, counts, displs, dt);
        const auto es = static_cast<index_t>(out.element_bytes());
        for (int g = 0; g < G; ++g) {
          auto shape = my_tgt.len;
          shape[static_cast<std::size_t>(d)] = lay.size(g);
          const Block part =
              contiguous_view(tmp, static_cast<char*>(tmp.data) + displs[static_cast<std::size_t>(g)] * es, shape);
          std::vector<index_t> lo(shape.size(), 0);
          lo[static_cast<std::size_t>(d)] = lay.offset(g);
          copy_box(part, zeros_like(shape), out, lo, shape);
        }
      }
      st = State{tgt, out};
      return;
    }
  }

  // General path: one alltoallv of box intersections over the group. For mesh dims in `changed`
  // where the source is replicated, the sender is the replica with the receiver's coordinate.
  if (plan) { plan->push_back("alltoallv"); st.spec = tgt; return; }
  const auto comm = mesh.dims_comm(changed);
  auto is_sender_for = [&](int sender_mesh, int receiver_mesh) {
    const auto cs = mesh.coords_of(sender_mesh), cr = mesh.coords_of(receiver_mesh);
    for (int m : changed)
      if (!st.spec.placement(m).is_shard() && cs[static_cast<std::size_t>(m)] != cr[static_cast<std::size_t>(m)])
        return false;
    return true;
  };
  const int me = mesh.rank();
  std::vector<Box> send_boxes(static_cast<std::size_t>(G)), recv_boxes(static_cast<std::size_t>(G));
  std::vector<index_t> sc(static_cast<std::size_t>(G)), sd(static_cast<std::size_t>(G)),
      rc(static_cast<std::size_t>(G)), rd(static_cast<std::size_t>(G));
  for (int g = 0; g < G; ++g) {
    const int peer = group_to_mesh[static_cast<std::size_t>(g)];
    auto& sb = send_boxes[static_cast<std::size_t>(g)];
    auto& rb = recv_boxes[static_cast<std::size_t>(g)];
    sb = is_sender_for(me, peer) ? Box::intersect(my_cur, tgt.box_of(peer)) : Box{my_cur.lo, std::vector<index_t>(my_cur.lo.size(), 0)};
    rb = is_sender_for(peer, me) ? Box::intersect(st.spec.box_of(peer), my_tgt) : Box{my_tgt.lo, std::vector<index_t>(my_tgt.lo.size(), 0)};
    sc[static_cast<std::size_t>(g)] = sb.numel();
    rc[static_cast<std::size_t>(g)] = rb.numel();
  }
  const DType dt = st.block.dtype;
  Block out = allocate_like(st.block, my_tgt.len);
  const auto es = static_cast<index_t>(out.element_bytes());
  // This rank's own part moves with one local copy instead of through the send buffer and MPI:
  // its counts become 0, so it is neither packed nor sent (its send and receive boxes are equal).
  for (int g = 0; g < G; ++g) {
    const auto gi = static_cast<std::size_t>(g);
    if (group_to_mesh[gi] != me || sc[gi] == 0) continue;
    copy_box(st.block, local_of(send_boxes[gi], my_cur).lo, out, local_of(recv_boxes[gi], my_tgt).lo,
             send_boxes[gi].len);
    sc[gi] = rc[gi] = 0;
  }
  // Send side: zero-copy when every outgoing box is a contiguous run of the local block.
  bool send_direct = st.block.is_contiguous();
  for (int g = 0; g < G && send_direct; ++g)
    send_direct = sc[static_cast<std::size_t>(g)] == 0 ||
                  box_is_contiguous_run(st.block, send_boxes[static_cast<std::size_t>(g)].len);
  Block sendbuf;
  if (send_direct) {
    sendbuf = st.block;
    for (int g = 0; g < G; ++g)
      sd[static_cast<std::size_t>(g)] = sc[static_cast<std::size_t>(g)] ? offset_of(st.block, local_of(send_boxes[static_cast<std::size_t>(g)], my_cur).lo) : 0;
  } else {
    sendbuf = allocate_like(st.block, {std::accumulate(sc.begin(), sc.end(), index_t{0})});
    index_t off = 0;
    for (int g = 0; g < G; ++g) {
      const auto& b = send_boxes[static_cast<std::size_t>(g)];
      sd[static_cast<std::size_t>(g)] = off;
      if (sc[static_cast<std::size_t>(g)] == 0) continue;
      copy_box(st.block, local_of(b, my_cur).lo, contiguous_view(sendbuf, static_cast<char*>(sendbuf.data) + off * es, b.len),
               zeros_like(b.len), b.len);
      off += sc[static_cast<std::size_t>(g)];
    }
  }
  // Receive side: straight into the output when every incoming box is a contiguous run of it.
  bool recv_direct = true;
  for (int g = 0; g < G && recv_direct; ++g)
    recv_direct = rc[static_cast<std::size_t>(g)] == 0 || box_is_contiguous_run(out, recv_boxes[static_cast<std::size_t>(g)].len);
  if (recv_direct) {
    for (int g = 0; g < G; ++g)
      rd[static_cast<std::size_t>(g)] = rc[static_cast<std::size_t>(g)] ? offset_of(out, local_of(recv_boxes[static_cast<std::size_t>(g)], my_tgt).lo) : 0;
    comm->alltoallv(sendbuf.data, sc, sd, out.data, rc, rd, dt);
  } else {
    Block recvbuf = allocate_like(out, {std::accumulate(rc.begin(), rc.end(), index_t{0})});
    index_t off = 0;
    for (int g = 0; g < G; ++g) {
      rd[static_cast<std::size_t>(g)] = off;
      off += rc[static_cast<std::size_t>(g)];
    }
    comm->alltoallv(sendbuf.data, sc, sd, recvbuf.data, rc, rd, dt);
    for (int g = 0; g < G; ++g) {
      if (rc[static_cast<std::size_t>(g)] == 0) continue;
      const auto& b = recv_boxes[static_cast<std::size_t>(g)];
      const Block view =
          contiguous_view(recvbuf, static_cast<char*>(recvbuf.data) + rd[static_cast<std::size_t>(g)] * es, b.len);
      copy_box(view, zeros_like(b.len), out, local_of(b, my_tgt).lo, b.len);
    }
  }
  st = State{tgt, out};
}

Block run(const DistSpec& src, const Block& in, const DistSpec& dst,
               std::vector<std::string>* plan) {
  SHARD_CHECK(src.mesh() == dst.mesh(), "redistribute", "source and target live on different meshes");
  SHARD_CHECK(src.global_shape() == dst.global_shape(), "redistribute", "global shapes differ: {} vs {}",
              src.global_shape(), dst.global_shape());
  if (!plan) {
    SHARD_CHECK(in.shape_vec() == src.local_box().len, "redistribute", "local block shape {} != expected {} for {}",
                in.shape, src.local_box().len, src);
  }
  if (src == dst) {
    if (plan) plan->push_back("none");
    return in;
  }
  State st{src, in};
  resolve_partials(st, dst, plan);
  // Target with Partial dims that are not yet Partial treated as Replicate (step C adds them).
  auto mid = dst.placements();
  for (int m = 0; m < dst.mesh().ndim(); ++m)
    if (mid[static_cast<std::size_t>(m)].is_partial() && !(st.spec.placement(m) == mid[static_cast<std::size_t>(m)]))
      mid[static_cast<std::size_t>(m)] = Replicate();
  const DistSpec mid_spec(dst.mesh(), mid, dst.global_shape(), dst.sizes());
  move_data(st, mid_spec, plan);
  for (int m = 0; m < dst.mesh().ndim(); ++m) {
    if (!dst.placement(m).is_partial() || st.spec.placement(m) == dst.placement(m)) continue;
    if (plan) { plan->push_back("local"); continue; }
    if (st.block.owner.get() == in.owner.get() && st.block.data == in.data) {  // never write the input
      Block c = allocate_like(st.block, st.block.shape_vec());
      exec::box_copy(c, st.block);
      st.block = c;
    }
    apply_replicate_to_partial(st.block, dst, m);
  }
  if (plan && plan->empty()) plan->push_back("none");
  return st.block;
}

}  // namespace

Block redistribute(const DistSpec& src, const Block& in, const DistSpec& dst) {
  return run(src, in, dst, nullptr);
}

std::vector<std::string> redistribute_plan(const DistSpec& src, const DistSpec& dst) {
  std::vector<std::string> plan;
  Block none;
  run(src, none, dst, &plan);
  return plan;
}

}  // namespace shard::detail
