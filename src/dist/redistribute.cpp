// Redistribution between placements. Three steps (DESIGN.md §3):
//  A. resolve Partial mesh dims that the target does not keep: reduce-scatter-v straight into a
//     Shard when possible, else allreduce to Replicate;
//  B. move Shard/Replicate data: no communication when every rank's target box lies in its
//     current box (Replicate->Shard is a local slice); one allgatherv for a plain Shard->Replicate;
//     otherwise one alltoallv of box intersections over the mesh dims that change;
//  C. turn Replicate into the target's Partial (sum keeps the value on coordinate 0 only).
#include "shardtensor/dist/redistribute.hpp"

#include <cstring>
#include <numeric>

#include "shardtensor/tensor/memory.hpp"

namespace shard::detail {
namespace {

std::vector<index_t> contiguous(const std::vector<index_t>& shape) {
  std::vector<index_t> st(shape.size());
  index_t acc = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    st[static_cast<std::size_t>(d)] = acc;
    acc *= shape[static_cast<std::size_t>(d)];
  }
  return st;
}

index_t prod(const std::vector<index_t>& v) {
  return std::accumulate(v.begin(), v.end(), index_t{1}, std::multiplies<>());
}

// Element offset (in elements) of local index `lo` in block b.
index_t offset_of(const LocalBlock& b, const std::vector<index_t>& lo) {
  index_t o = 0;
  for (std::size_t d = 0; d < lo.size(); ++d) o += lo[d] * b.strides[d];
  return o;
}

// True if the box (lo, len) of contiguous block b is one contiguous run of memory.
bool box_is_contiguous_run(const LocalBlock& b, const std::vector<index_t>& len) {
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

void apply_replicate_to_partial(DType dt, LocalBlock& b, const DistSpec& spec, int m) {
  // sum: the value stays on coordinate 0 and the others hold zeros; avg/max/min keep the value.
  if (spec.placement(m).op != ReduceOp::sum || spec.mesh().coord(m) == 0) return;
  std::memset(b.data, 0, static_cast<std::size_t>(b.numel()) * dtype_size(dt));
}

}  // namespace

LocalBlock LocalBlock::allocate(DType dt, const std::vector<index_t>& shape) {
  LocalBlock b;
  b.storage = allocate_bytes(static_cast<std::size_t>(prod(shape)) * dtype_size(dt), Device::cpu());
  b.data = b.storage.get();
  b.shape = shape;
  b.strides = contiguous(shape);
  return b;
}

bool LocalBlock::is_contiguous() const {
  index_t acc = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    if (shape[static_cast<std::size_t>(d)] != 1 && strides[static_cast<std::size_t>(d)] != acc) return false;
    acc *= shape[static_cast<std::size_t>(d)];
  }
  return true;
}

index_t LocalBlock::numel() const { return prod(shape); }

void copy_box(DType dt, const LocalBlock& src, const std::vector<index_t>& src_lo, const LocalBlock& dst,
              const std::vector<index_t>& dst_lo, const std::vector<index_t>& len) {
  const index_t n = prod(len);
  if (n == 0) return;
  const auto es = static_cast<index_t>(dtype_size(dt));
  const auto R = len.size();
  const char* s = static_cast<const char*>(src.data) + offset_of(src, src_lo) * es;
  char* t = static_cast<char*>(dst.data) + offset_of(dst, dst_lo) * es;
  if (R == 0) { std::memcpy(t, s, static_cast<std::size_t>(es)); return; }
  const index_t inner = len[R - 1];
  const index_t outer = n / inner;
  const bool unit = src.strides[R - 1] == 1 && dst.strides[R - 1] == 1;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (index_t o = 0; o < outer; ++o) {
    index_t rem = o, os = 0, od = 0;
    for (int d = static_cast<int>(R) - 2; d >= 0; --d) {
      const index_t i = rem % len[static_cast<std::size_t>(d)];
      rem /= len[static_cast<std::size_t>(d)];
      os += i * src.strides[static_cast<std::size_t>(d)];
      od += i * dst.strides[static_cast<std::size_t>(d)];
    }
    if (unit) {
      std::memcpy(t + od * es, s + os * es, static_cast<std::size_t>(inner * es));
    } else {
      for (index_t i = 0; i < inner; ++i)
        std::memcpy(t + (od + i * dst.strides[R - 1]) * es, s + (os + i * src.strides[R - 1]) * es,
                    static_cast<std::size_t>(es));
    }
  }
}

namespace {

// ---------------------------------------------------------------- step A
struct State {
  DistSpec spec;
  LocalBlock block;
};

void resolve_partials(DType dt, State& st, const DistSpec& dst, std::vector<std::string>* plan) {
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
      for (std::size_t k = 0; k < in.shape.size(); ++k)
        if (static_cast<int>(k) != d) slab *= in.shape[k];
      for (index_t p = 0; p < P; ++p) counts[static_cast<std::size_t>(p)] = lay.size(p) * slab;
      LocalBlock send = LocalBlock::allocate(dt, {in.numel()});
      char* w = static_cast<char*>(send.data);
      const auto es = static_cast<index_t>(dtype_size(dt));
      for (index_t p = 0; p < P; ++p) {
        std::vector<index_t> lo(in.shape.size(), 0), len = in.shape;
        lo[static_cast<std::size_t>(d)] = lay.offset(p);
        len[static_cast<std::size_t>(d)] = lay.size(p);
        LocalBlock dstv;
        dstv.data = w;
        dstv.shape = len;
        dstv.strides = contiguous(len);
        copy_box(dt, in, lo, dstv, std::vector<index_t>(len.size(), 0), len);
        w += prod(len) * es;
      }
      auto out_shape = in.shape;
      out_shape[static_cast<std::size_t>(d)] = lay.size(mesh.coord(m));
      LocalBlock out = LocalBlock::allocate(dt, out_shape);
      mesh.dim_comm(m)->reduce_scatterv(send.data, out.data, counts, dt, cur.op);
      st = State{next, out};
    } else {
      placements[static_cast<std::size_t>(m)] = Replicate();
      DistSpec next(mesh, placements, st.spec.global_shape(), st.spec.sizes());
      if (plan) { plan->push_back("allreduce"); st.spec = next; continue; }
      LocalBlock out = LocalBlock::allocate(dt, st.block.shape);
      copy_box(dt, st.block, std::vector<index_t>(out.shape.size(), 0), out, std::vector<index_t>(out.shape.size(), 0),
               out.shape);
      mesh.dim_comm(m)->allreduce(out.data, out.data, out.numel(), dt, cur.op);
      st = State{next, out};
    }
  }
}

// ---------------------------------------------------------------- step B
void move_data(DType dt, State& st, const DistSpec& tgt, std::vector<std::string>* plan) {
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
    LocalBlock out = LocalBlock::allocate(dt, my_tgt.len);
    copy_box(dt, st.block, local_of(my_tgt, my_cur).lo, out, std::vector<index_t>(my_tgt.len.size(), 0), my_tgt.len);
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
      LocalBlock out = LocalBlock::allocate(dt, my_tgt.len);
      LocalBlock send = st.block;
      if (!send.is_contiguous()) {
        send = LocalBlock::allocate(dt, st.block.shape);
        copy_box(dt, st.block, std::vector<index_t>(send.shape.size(), 0), send,
                 std::vector<index_t>(send.shape.size(), 0), send.shape);
      }
      bool outer_trivial = true;  // all dims before d have extent 1: blocks land contiguously
      for (int k = 0; k < d; ++k) outer_trivial = outer_trivial && my_tgt.len[static_cast<std::size_t>(k)] == 1;
      if (outer_trivial) {
        comm->allgatherv(send.data, send.numel(), out.data, counts, displs, dt);
      } else {
        LocalBlock tmp = LocalBlock::allocate(dt, {out.numel()});
        comm->allgatherv(send.data, send.numel(), tmp.data, counts, displs, dt);
        const auto es = static_cast<index_t>(dtype_size(dt));
        for (int g = 0; g < G; ++g) {
          LocalBlock part;
          part.data = static_cast<char*>(tmp.data) + displs[static_cast<std::size_t>(g)] * es;
          part.shape = my_tgt.len;
          part.shape[static_cast<std::size_t>(d)] = lay.size(g);
          part.strides = contiguous(part.shape);
          std::vector<index_t> lo(part.shape.size(), 0);
          lo[static_cast<std::size_t>(d)] = lay.offset(g);
          copy_box(dt, part, std::vector<index_t>(part.shape.size(), 0), out, lo, part.shape);
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
  LocalBlock out = LocalBlock::allocate(dt, my_tgt.len);
  const auto es = static_cast<index_t>(dtype_size(dt));
  // This rank's own part moves with one local copy instead of through the send buffer and MPI:
  // its counts become 0, so it is neither packed nor sent (its send and receive boxes are equal).
  for (int g = 0; g < G; ++g) {
    const auto gi = static_cast<std::size_t>(g);
    if (group_to_mesh[gi] != me || sc[gi] == 0) continue;
    copy_box(dt, st.block, local_of(send_boxes[gi], my_cur).lo, out, local_of(recv_boxes[gi], my_tgt).lo,
             send_boxes[gi].len);
    sc[gi] = rc[gi] = 0;
  }
  // Send side: zero-copy when every outgoing box is a contiguous run of the local block.
  bool send_direct = st.block.is_contiguous();
  for (int g = 0; g < G && send_direct; ++g)
    send_direct = sc[static_cast<std::size_t>(g)] == 0 ||
                  box_is_contiguous_run(st.block, send_boxes[static_cast<std::size_t>(g)].len);
  LocalBlock sendbuf;
  if (send_direct) {
    sendbuf = st.block;
    for (int g = 0; g < G; ++g)
      sd[static_cast<std::size_t>(g)] = sc[static_cast<std::size_t>(g)] ? offset_of(st.block, local_of(send_boxes[static_cast<std::size_t>(g)], my_cur).lo) : 0;
  } else {
    sendbuf = LocalBlock::allocate(dt, {std::accumulate(sc.begin(), sc.end(), index_t{0})});
    index_t off = 0;
    for (int g = 0; g < G; ++g) {
      const auto& b = send_boxes[static_cast<std::size_t>(g)];
      sd[static_cast<std::size_t>(g)] = off;
      if (sc[static_cast<std::size_t>(g)] == 0) continue;
      LocalBlock view;
      view.data = static_cast<char*>(sendbuf.data) + off * es;
      view.shape = b.len;
      view.strides = contiguous(b.len);
      copy_box(dt, st.block, local_of(b, my_cur).lo, view, std::vector<index_t>(b.len.size(), 0), b.len);
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
    LocalBlock recvbuf = LocalBlock::allocate(dt, {std::accumulate(rc.begin(), rc.end(), index_t{0})});
    index_t off = 0;
    for (int g = 0; g < G; ++g) {
      rd[static_cast<std::size_t>(g)] = off;
      off += rc[static_cast<std::size_t>(g)];
    }
    comm->alltoallv(sendbuf.data, sc, sd, recvbuf.data, rc, rd, dt);
    for (int g = 0; g < G; ++g) {
      if (rc[static_cast<std::size_t>(g)] == 0) continue;
      const auto& b = recv_boxes[static_cast<std::size_t>(g)];
      LocalBlock view;
      view.data = static_cast<char*>(recvbuf.data) + rd[static_cast<std::size_t>(g)] * es;
      view.shape = b.len;
      view.strides = contiguous(b.len);
      copy_box(dt, view, std::vector<index_t>(b.len.size(), 0), out, local_of(b, my_tgt).lo, b.len);
    }
  }
  st = State{tgt, out};
}

LocalBlock run(DType dt, const DistSpec& src, const LocalBlock& in, const DistSpec& dst,
               std::vector<std::string>* plan) {
  SHARD_CHECK(src.mesh() == dst.mesh(), "redistribute", "source and target live on different meshes");
  SHARD_CHECK(src.global_shape() == dst.global_shape(), "redistribute", "global shapes differ: {} vs {}",
              src.global_shape(), dst.global_shape());
  if (!plan) {
    SHARD_CHECK(in.shape == src.local_box().len, "redistribute", "local block shape {} != expected {} for {}",
                in.shape, src.local_box().len, src);
  }
  if (src == dst) {
    if (plan) plan->push_back("none");
    return in;
  }
  State st{src, in};
  resolve_partials(dt, st, dst, plan);
  // Target with Partial dims that are not yet Partial treated as Replicate (step C adds them).
  auto mid = dst.placements();
  for (int m = 0; m < dst.mesh().ndim(); ++m)
    if (mid[static_cast<std::size_t>(m)].is_partial() && !(st.spec.placement(m) == mid[static_cast<std::size_t>(m)]))
      mid[static_cast<std::size_t>(m)] = Replicate();
  const DistSpec mid_spec(dst.mesh(), mid, dst.global_shape(), dst.sizes());
  move_data(dt, st, mid_spec, plan);
  for (int m = 0; m < dst.mesh().ndim(); ++m) {
    if (!dst.placement(m).is_partial() || st.spec.placement(m) == dst.placement(m)) continue;
    if (plan) { plan->push_back("local"); continue; }
    if (st.block.storage.get() == in.storage.get() && st.block.data == in.data) {  // never write the input
      LocalBlock c = LocalBlock::allocate(dt, st.block.shape);
      copy_box(dt, st.block, std::vector<index_t>(c.shape.size(), 0), c, std::vector<index_t>(c.shape.size(), 0),
               c.shape);
      st.block = c;
    }
    apply_replicate_to_partial(dt, st.block, dst, m);
  }
  if (plan && plan->empty()) plan->push_back("none");
  return st.block;
}

}  // namespace

LocalBlock redistribute(DType dt, const DistSpec& src, const LocalBlock& in, const DistSpec& dst) {
  return run(dt, src, in, dst, nullptr);
}

std::vector<std::string> redistribute_plan(const DistSpec& src, const DistSpec& dst) {
  std::vector<std::string> plan;
  LocalBlock none;
  run(DType::f32, src, none, dst, &plan);
  return plan;
}

}  // namespace shard::detail
