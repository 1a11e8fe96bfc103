// Redistribution between placements: the planner (pure algebra over DistSpecs, cached) and the
// executor (box engine + one collective per communicating step). See redistribute.hpp.
#include "shardtensor/dist/redistribute.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>

#include "plan_cache.hpp"
#include "shardtensor/dist/consistency.hpp"
#include "shardtensor/exec/box.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::detail {

const char* redist_step_name(RedistStepKind k) noexcept {
  switch (k) {
    case RedistStepKind::local: return "local";
    case RedistStepKind::allgatherv: return "allgatherv";
    case RedistStepKind::alltoallv: return "alltoallv";
    case RedistStepKind::reduce_scatterv: return "reduce_scatterv";
    case RedistStepKind::allreduce: return "allreduce";
    case RedistStepKind::create_partial: return "create_partial";
  }
  return "?";
}

std::vector<RedistStepKind> RedistributePlan::kinds() const {
  std::vector<RedistStepKind> k;
  for (const auto& s : steps) k.push_back(s.kind);
  return k;
}

int RedistributePlan::collectives() const {
  int n = 0;
  for (const auto& s : steps) n += s.kind != RedistStepKind::local && s.kind != RedistStepKind::create_partial;
  return n;
}

namespace {

// ================================================================ planning (no data, no comms)

std::vector<index_t> contiguous_strides(const std::vector<index_t>& shape) {
  std::vector<index_t> st(shape.size());
  index_t acc = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    st[d] = acc;
    acc *= shape[d];
  }
  return st;
}

index_t offset_in(const std::vector<index_t>& strides, const std::vector<index_t>& lo) {
  index_t o = 0;
  for (std::size_t d = 0; d < lo.size(); ++d) o += lo[d] * strides[d];
  return o;
}

/// True if the box of extents `len` is one contiguous run of a contiguous block of `shape`.
bool is_contiguous_run(const std::vector<index_t>& shape, const std::vector<index_t>& len) {
  std::size_t d = 0;
  while (d < len.size() && len[d] == 1) ++d;
  for (std::size_t k = d + 1; k < len.size(); ++k)
    if (len[k] != shape[k]) return false;
  return true;
}

Box local_of(const Box& global_box, const Box& owner) {
  Box r = global_box;
  for (std::size_t d = 0; d < r.lo.size(); ++d) r.lo[d] -= owner.lo[d];
  return r;
}

Box empty_box(std::size_t rank) { return Box{std::vector<index_t>(rank, 0), std::vector<index_t>(rank, 0)}; }

struct PlanState {
  DistSpec spec;
  std::vector<index_t> shape;  // this rank's block under spec
};

// ---------------------------------------------------------------- step A
void plan_partials(PlanState& st, const DistSpec& dst, RedistributePlan& plan) {
  const auto& mesh = st.spec.mesh();
  for (int m = 0; m < mesh.ndim(); ++m) {
    const Placement cur = st.spec.placement(m), tgt = dst.placement(m);
    if (!cur.is_partial() || cur == tgt) continue;
    auto placements = st.spec.placements();
    RedistStep s;
    s.mesh_dims = {m};
    s.op = cur.op;
    s.in_shape = st.shape;
    // Reduce-scatter straight into Shard(d) when d is sharded by nobody else before and after.
    const bool rs = tgt.is_shard() && st.spec.sharding_mesh_dims(tgt.dim).empty() &&
                    dst.sharding_mesh_dims(tgt.dim) == std::vector<int>{m};
    if (rs) {
      placements[static_cast<std::size_t>(m)] = tgt;
      ShardSizes sizes = st.spec.sizes();
      sizes[static_cast<std::size_t>(tgt.dim)] = dst.layout(tgt.dim).sizes();
      DistSpec next(mesh, placements, st.spec.global_shape(), sizes);
      const int d = tgt.dim;
      const auto ud = static_cast<std::size_t>(d);
      const auto& lay = next.layout(d);
      s.kind = RedistStepKind::reduce_scatterv;
      s.tensor_dim = d;
      index_t off = 0;
      for (index_t p = 0; p < lay.parts(); ++p) {  // per-part slabs along d, packed contiguously
        Box b{std::vector<index_t>(st.shape.size(), 0), st.shape};
        b.lo[ud] = lay.offset(p);
        b.len[ud] = lay.size(p);
        s.send_boxes.push_back(b);
        s.send_counts.push_back(b.numel());
        s.send_displs.push_back(off);
        off += b.numel();
      }
      s.out_shape = st.shape;
      s.out_shape[ud] = lay.size(mesh.coord(m));
      st = PlanState{next, s.out_shape};
    } else {
      placements[static_cast<std::size_t>(m)] = Replicate();
      s.kind = RedistStepKind::allreduce;
      s.out_shape = st.shape;
      st.spec = DistSpec(mesh, placements, st.spec.global_shape(), st.spec.sizes());
    }
    plan.steps.push_back(std::move(s));
  }
}

// ---------------------------------------------------------------- step B
void plan_move(PlanState& st, const DistSpec& tgt, RedistributePlan& plan) {
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

  const Box my_cur = st.spec.local_box(), my_tgt = tgt.local_box();
  const std::size_t R = my_tgt.len.size();
  RedistStep s;
  s.in_shape = st.shape;
  s.out_shape = my_tgt.len;
  // No communication when every rank's target box lies inside its current box.
  bool local_only = true;
  for (int r = 0; r < P && local_only; ++r) local_only = st.spec.box_of(r).contains(tgt.box_of(r));
  if (local_only) {
    s.kind = RedistStepKind::local;
    s.local_src = local_of(my_tgt, my_cur);
    s.local_dst = Box{std::vector<index_t>(R, 0), my_tgt.len};
    plan.steps.push_back(std::move(s));
    st = PlanState{tgt, my_tgt.len};
    return;
  }
  s.mesh_dims = changed;
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

  // One mesh dim m going Shard(d) -> Replicate with d sharded by m alone: one allgatherv.
  if (changed.size() == 1) {
    const int m = changed[0];
    const auto &a = st.spec.placement(m), &b = tgt.placement(m);
    if (a.is_shard() && b.is_replicate() && st.spec.sharding_mesh_dims(a.dim) == std::vector<int>{m}) {
      const int d = a.dim;
      const auto ud = static_cast<std::size_t>(d);
      const auto& lay = st.spec.layout(d);
      s.kind = RedistStepKind::allgatherv;
      s.tensor_dim = d;
      index_t slab = 1;  // elements per unit of dim d in the gathered block
      for (std::size_t k = 0; k < R; ++k)
        if (k != ud) slab *= my_tgt.len[k];
      bool outer_trivial = true;  // all dims before d have extent 1: parts land contiguously
      for (std::size_t k = 0; k < ud; ++k) outer_trivial = outer_trivial && my_tgt.len[k] == 1;
      s.recv_direct = outer_trivial;
      for (int g = 0; g < G; ++g) {
        s.recv_counts.push_back(lay.size(g) * slab);
        s.recv_displs.push_back(lay.offset(g) * slab);
        Box part{std::vector<index_t>(R, 0), my_tgt.len};
        part.lo[ud] = lay.offset(g);
        part.len[ud] = lay.size(g);
        s.recv_boxes.push_back(part);
      }
      plan.steps.push_back(std::move(s));
      st = PlanState{tgt, my_tgt.len};
      return;
    }
  }

  // General path: one alltoallv of box intersections over the group. For mesh dims in `changed`
  // where the source is replicated, the sender is the replica with the receiver's coordinate.
  s.kind = RedistStepKind::alltoallv;
  auto is_sender_for = [&](int sender_mesh, int receiver_mesh) {
    const auto cs = mesh.coords_of(sender_mesh), cr = mesh.coords_of(receiver_mesh);
    for (int m : changed)
      if (!st.spec.placement(m).is_shard() && cs[static_cast<std::size_t>(m)] != cr[static_cast<std::size_t>(m)])
        return false;
    return true;
  };
  const int me = mesh.rank();
  const auto Gs = static_cast<std::size_t>(G);
  s.send_boxes.assign(Gs, empty_box(R));
  s.recv_boxes.assign(Gs, empty_box(R));
  s.send_counts.assign(Gs, 0);
  s.recv_counts.assign(Gs, 0);
  for (std::size_t g = 0; g < Gs; ++g) {
    const int peer = group_to_mesh[g];
    if (is_sender_for(me, peer)) s.send_boxes[g] = local_of(Box::intersect(my_cur, tgt.box_of(peer)), my_cur);
    if (is_sender_for(peer, me)) s.recv_boxes[g] = local_of(Box::intersect(st.spec.box_of(peer), my_tgt), my_tgt);
    s.send_counts[g] = s.send_boxes[g].numel();
    s.recv_counts[g] = s.recv_boxes[g].numel();
    // This rank's own part moves with one local copy instead of through the send buffer and MPI:
    // its counts become 0, so it is neither packed nor sent (its send and receive boxes are equal).
    if (peer == me && s.send_counts[g] > 0) {
      s.has_self = true;
      s.local_src = s.send_boxes[g];
      s.local_dst = s.recv_boxes[g];
      s.send_counts[g] = s.recv_counts[g] = 0;
    }
  }
  // Send side: zero-copy when every outgoing box is a contiguous run of a contiguous input.
  const auto in_strides = contiguous_strides(st.shape);
  s.send_direct = true;
  for (std::size_t g = 0; g < Gs && s.send_direct; ++g)
    s.send_direct = s.send_counts[g] == 0 || is_contiguous_run(st.shape, s.send_boxes[g].len);
  s.send_displs.assign(Gs, 0);
  s.send_direct_displs.assign(Gs, 0);
  index_t off = 0;
  for (std::size_t g = 0; g < Gs; ++g) {
    s.send_displs[g] = off;
    off += s.send_counts[g];
    if (s.send_counts[g]) s.send_direct_displs[g] = offset_in(in_strides, s.send_boxes[g].lo);
  }
  // Receive side: straight into the output when every incoming box is a contiguous run of it.
  const auto out_strides = contiguous_strides(my_tgt.len);
  s.recv_direct = true;
  for (std::size_t g = 0; g < Gs && s.recv_direct; ++g)
    s.recv_direct = s.recv_counts[g] == 0 || is_contiguous_run(my_tgt.len, s.recv_boxes[g].len);
  s.recv_displs.assign(Gs, 0);
  off = 0;
  for (std::size_t g = 0; g < Gs; ++g) {
    if (s.recv_direct) {
      if (s.recv_counts[g]) s.recv_displs[g] = offset_in(out_strides, s.recv_boxes[g].lo);
    } else {
      s.recv_displs[g] = off;
      off += s.recv_counts[g];
    }
  }
  plan.steps.push_back(std::move(s));
  st = PlanState{tgt, my_tgt.len};
}

std::shared_ptr<RedistributePlan> build_plan(const DistSpec& src, const DistSpec& dst) {
  auto plan = std::make_shared<RedistributePlan>();
  plan->in_shape = src.local_box().len;
  plan->out_shape = dst.local_box().len;
  if (src == dst) return plan;
  PlanState st{src, plan->in_shape};
  plan_partials(st, dst, *plan);
  // Target with Partial dims that are not yet Partial treated as Replicate (step C adds them).
  auto mid = dst.placements();
  for (int m = 0; m < dst.mesh().ndim(); ++m)
    if (mid[static_cast<std::size_t>(m)].is_partial() && !(st.spec.placement(m) == mid[static_cast<std::size_t>(m)]))
      mid[static_cast<std::size_t>(m)] = Replicate();
  const DistSpec mid_spec(dst.mesh(), mid, dst.global_shape(), dst.sizes());
  plan_move(st, mid_spec, *plan);
  for (int m = 0; m < dst.mesh().ndim(); ++m) {
    if (!dst.placement(m).is_partial() || st.spec.placement(m) == dst.placement(m)) continue;
    RedistStep s;
    s.kind = RedistStepKind::create_partial;
    s.mesh_dims = {m};
    s.op = dst.placement(m).op;
    s.in_shape = s.out_shape = st.shape;
    // sum: the value stays on coordinate 0 and the others hold zeros; avg/max/min keep the value.
    s.zero = s.op == ReduceOp::sum && dst.mesh().coord(m) != 0;
    plan->steps.push_back(std::move(s));
  }
  return plan;
}

// ---------------------------------------------------------------- the cache

PlanCache<RedistributePlan>& redist_plan_cache() {
  static auto* c = new PlanCache<RedistributePlan>(1024);  // never destroyed: usable during static destruction
  return *c;
}

// ================================================================ execution

Block allocate_like(const Block& like, const std::vector<index_t>& shape) {
  return Block::allocate(like.dtype, like.device, shape);
}

/// A contiguous block of `shape` at element offset `offset` of contiguous block `buf`.
Block part_of(const Block& buf, index_t offset, const std::vector<index_t>& shape) {
  return Block::view(buf.dtype, buf.device, static_cast<char*>(buf.data) + offset * static_cast<index_t>(buf.element_bytes()),
                     shape.data(), static_cast<int>(shape.size()), nullptr, buf.owner);
}

Block sub(const Block& b, const Box& box) { return exec::sub_box(b, box.lo, box.len); }

CommPtr comm_of(const DeviceMesh& mesh, const std::vector<int>& dims) {
  return dims.size() == 1 ? mesh.dim_comm(dims[0]) : mesh.dims_comm(dims);
}

/// Runs one step on the block's own device: buffers are allocated there, packed and unpacked by
/// the box engine on `ectx`, and the communicator gets `ctx` (null for host blocks, whose calls
/// then run exactly as before; the device's context otherwise: stream-ordered device buffers).
Block run_step(const RedistStep& s, const DeviceMesh& mesh, const Block& in, const Block& original, ExecContext& ectx,
               ExecContext* ctx) {
  const DType dt = in.dtype;
  switch (s.kind) {
    case RedistStepKind::local: {
      Block out = allocate_like(in, s.out_shape);
      exec::box_copy(out, sub(in, s.local_src), ectx);
      return out;
    }
    case RedistStepKind::create_partial: {
      if (!s.zero) {
        if (in.data != original.data || in.owner != original.owner) return in;
        Block out = allocate_like(in, s.out_shape);  // never write (or alias) the input
        exec::box_copy(out, in, ectx);
        return out;
      }
      Block out = in.data != original.data || in.owner != original.owner ? in : allocate_like(in, s.out_shape);
      exec::box_zero(out, ectx);
      return out;
    }
    case RedistStepKind::allreduce: {
      Block out = allocate_like(in, s.out_shape);
      exec::box_copy(out, in, ectx);
      comm_of(mesh, s.mesh_dims)->allreduce(out.data, out.data, out.numel(), dt, s.op, ctx);
      return out;
    }
    case RedistStepKind::reduce_scatterv: {
      Block send = allocate_like(in, {in.numel()});
      for (std::size_t p = 0; p < s.send_boxes.size(); ++p)
        exec::box_copy(part_of(send, s.send_displs[p], s.send_boxes[p].len), sub(in, s.send_boxes[p]), ectx);
      Block out = allocate_like(in, s.out_shape);
      comm_of(mesh, s.mesh_dims)->reduce_scatterv(send.data, out.data, s.send_counts, dt, s.op, ctx);
      return out;
    }
    case RedistStepKind::allgatherv: {
      Block send = in;
      if (!in.is_contiguous()) {
        send = allocate_like(in, s.in_shape);
        exec::box_copy(send, in, ectx);
      }
      Block out = allocate_like(in, s.out_shape);
      const auto comm = comm_of(mesh, s.mesh_dims);
      if (s.recv_direct) {
        comm->allgatherv(send.data, send.numel(), out.data, s.recv_counts, s.recv_displs, dt, ctx);
      } else {
        Block tmp = allocate_like(in, {out.numel()});
        comm->allgatherv(send.data, send.numel(), tmp.data, s.recv_counts, s.recv_displs, dt, ctx);
        for (std::size_t g = 0; g < s.recv_boxes.size(); ++g)
          exec::box_copy(sub(out, s.recv_boxes[g]), part_of(tmp, s.recv_displs[g], s.recv_boxes[g].len), ectx);
      }
      return out;
    }
    case RedistStepKind::alltoallv: {
      const auto comm = comm_of(mesh, s.mesh_dims);
      Block out = allocate_like(in, s.out_shape);
      if (s.has_self) exec::box_copy(sub(out, s.local_dst), sub(in, s.local_src), ectx);
      const bool direct = s.send_direct && in.is_contiguous();
      Block sendbuf = in;
      if (!direct) {
        sendbuf = allocate_like(in, {std::accumulate(s.send_counts.begin(), s.send_counts.end(), index_t{0})});
        for (std::size_t g = 0; g < s.send_boxes.size(); ++g)
          if (s.send_counts[g])
            exec::box_copy(part_of(sendbuf, s.send_displs[g], s.send_boxes[g].len), sub(in, s.send_boxes[g]), ectx);
      }
      const auto& sd = direct ? s.send_direct_displs : s.send_displs;
      if (s.recv_direct) {
        comm->alltoallv(sendbuf.data, s.send_counts, sd, out.data, s.recv_counts, s.recv_displs, dt, ctx);
      } else {
        Block recvbuf = allocate_like(in, {std::accumulate(s.recv_counts.begin(), s.recv_counts.end(), index_t{0})});
        comm->alltoallv(sendbuf.data, s.send_counts, sd, recvbuf.data, s.recv_counts, s.recv_displs, dt, ctx);
        for (std::size_t g = 0; g < s.recv_boxes.size(); ++g)
          if (s.recv_counts[g])
            exec::box_copy(sub(out, s.recv_boxes[g]), part_of(recvbuf, s.recv_displs[g], s.recv_boxes[g].len), ectx);
      }
      return out;
    }
  }
  return in;
}

}  // namespace

std::shared_ptr<const RedistributePlan> redistribute_plan(const DistSpec& src, const DistSpec& dst) {
  SHARD_CHECK(src.mesh() == dst.mesh(), "redistribute", "source and target live on different meshes: {}",
              mesh_mismatch(src.mesh(), dst.mesh()));
  SHARD_CHECK(src.global_shape() == dst.global_shape(), "redistribute", "global shapes differ: {} vs {}",
              src.global_shape(), dst.global_shape());
  std::vector<index_t> key = mesh_key(src.mesh());
  append_spec_key(key, src);
  append_spec_key(key, dst);
  return redist_plan_cache().get(std::move(key), src.mesh(), [&] { return build_plan(src, dst); });
}

std::size_t redistribute_plan_cache_size() noexcept { return redist_plan_cache().size(); }

Block execute_redistribute(const RedistributePlan& plan, const DeviceMesh& mesh, const Block& in) {
  SHARD_CHECK(in.shape_vec() == plan.in_shape, "redistribute", "local block shape {} != expected {} of the plan",
              in.shape_vec(), plan.in_shape);
  for (const auto& s : plan.steps)
    SHARD_CHECK(!is_complex(in.dtype) ||
                    !((s.kind == RedistStepKind::allreduce || s.kind == RedistStepKind::reduce_scatterv) &&
                      (s.op == ReduceOp::max || s.op == ReduceOp::min)),
                "redistribute", "Partial({}) of a {} tensor: complex numbers have no order (use sum or avg)",
                reduce_op_name(s.op), in.dtype);
  if (plan.steps.empty()) return in;
  ExecContext& ectx = current_context(in.device);
  ExecContext* ctx = in.device.is_cpu() ? nullptr : &ectx;
  SHARD_PROFILE_SCOPE("redistribute", "redistribute", "", &ectx);
  Block cur = in;
  for (const auto& s : plan.steps) cur = run_step(s, mesh, cur, in, ectx, ctx);
  return cur;
}

Block redistribute(const DistSpec& src, const Block& in, const DistSpec& dst, bool check) {
  if (check && checking_collectives(in.device)) [[unlikely]]
    CollectiveFingerprint("redistribute").dtype(in.dtype).spec(src).spec(dst, "target ").agree(src.mesh());
  const auto plan = redistribute_plan(src, dst);
  SHARD_CHECK(in.shape_vec() == plan->in_shape, "redistribute", "local block shape {} != expected {} for {}",
              in.shape_vec(), plan->in_shape, src);
  return execute_redistribute(*plan, src.mesh(), in);
}

}  // namespace shard::detail
