// Halo exchange and its adjoint: the type-erased core behind dist/halo.hpp. The plan (who sends
// which slabs to whom) is in halo_plan.cpp; this file moves the data: strided pack/unpack through
// the box engine (exec/box.hpp) and the split-phase transfer (post a stage's isend/irecv,
// complete it, next stage).
#include <algorithm>

#include "halo_plan.hpp"
#include "shardtensor/dist/consistency.hpp"
#include "shardtensor/exec/box.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard {

using namespace detail;

namespace {

using Run = HaloRun;
using Stage = HaloStage;

}  // namespace

// ---------------------------------------------------------------- the transfer
// The profiler's rows: a transfer's start (pack, post the first stage) and its finish (wait,
// the remaining stages, unpack), forward and adjoint; the collectives inside are comm rows.
namespace {
constinit profile::Site g_prof_forward_start{"halo", "halo", "forward_start"};
constinit profile::Site g_prof_forward_finish{"halo", "halo", "forward_finish"};
constinit profile::Site g_prof_adjoint_start{"halo", "halo", "adjoint_start"};
constinit profile::Site g_prof_adjoint_finish{"halo", "halo", "adjoint_finish"};
}  // namespace

struct HaloTransfer::Impl {
  DType dt{};
  Direction dir{};
  std::size_t es = 0;
  std::vector<index_t> lo, len, ext;
  Block buf, result;
  std::shared_ptr<const HaloPlan> plan;
  std::vector<CommPtr> comms;  // per stage of the plan (null: local padding)
  Block staging;               // from the plan's pool: every message of one stage
  std::size_t next = 0;        // first stage (in execution order) not yet posted
  bool inflight = false, done = false;
  int tag = 0;
  std::vector<Request> reqs;
  std::vector<char*> recv_at;  // per receiving peer of the posted stage: its staging region
  // The transfer owns its execution context: the device, stream and settings of the calling
  // thread's current context at construction, kept by value, so finish() is safe after that
  // context's ContextGuard scope ended or on another thread.
  std::unique_ptr<ExecContext> own_ctx;
  ExecContext* ectx = nullptr;  // own_ctx (box engine)
  ExecContext* ctx = nullptr;   // passed to the communicator: null for host blocks, else *ectx

  bool fwd() const { return dir == Direction::forward; }
  std::size_t count() const { return plan->stages.size(); }
  /// Plan index of the i-th executed stage (the adjoint runs them in reverse).
  std::size_t stage_index(std::size_t i) const { return fwd() ? i : count() - 1 - i; }

  /// The slab box of run r of stage st in the buffer: at the ghost positions or (src=true) at the
  /// source positions (walked backwards along d for a reflected run: a negative stride).
  Block box(const Stage& st, const Run& r, bool src) const {
    const auto ud = static_cast<std::size_t>(st.d);
    auto start = st.region_lo;
    start[ud] = src ? lo[ud] + r.src : r.ghost;
    auto l = st.region_len;
    l[ud] = src && r.step < 0 ? 1 : r.len;  // a reflected run: slice its first cell, then walk back
    Block b = exec::sub_box(buf, start, l);
    b.shape[ud] = r.len;
    if (src) b.strides[ud] *= r.step;
    return b;
  }
  /// Copies (or adds) between the slabs of `runs` in the buffer and a contiguous staging region.
  void stage_io(const Stage& st, const std::vector<Run>& runs, bool src_side, char* region, bool to_staging,
                bool add) {
    for (const auto& r : runs) {
      const Block b = box(st, r, src_side);
      const Block s = Block::view(dt, buf.device, region, b.shape.data(), b.rank);
      if (to_staging) exec::box_copy(s, b, *ectx);
      else if (add) exec::box_add(b, s, *ectx);
      else exec::box_copy(b, s, *ectx);
      region += b.numel() * static_cast<index_t>(es);
    }
  }

  void post(std::size_t k) {
    const Stage& st = plan->stages[k];
    const auto& comm = comms[k];
    const int t = tag + st.d;
    // Forward: receive my ghosts from their owners, send the ghosts I own. Adjoint: the reverse.
    const auto& recv_from = fwd() ? st.in : st.out;
    const auto& send_to = fwd() ? st.out : st.in;
    if (st.cross > 0) {
      char* region = static_cast<char*>(staging.data);
      // Device buffers: the communicator gets the device's context (packing above is ordered on
      // its stream before the send; unpacking after wait_all).
      for (const auto& p : recv_from) {
        recv_at.push_back(region);
        reqs.push_back(comm->irecv(region, p.positions * st.cross, dt, p.peer, t, ctx));
        region += p.positions * st.cross * static_cast<index_t>(es);
      }
      for (const auto& p : send_to) {
        // Forward packs the owner's sources; the adjoint packs the ghost cells' gradients.
        stage_io(st, p.runs, fwd(), region, true, false);
        reqs.push_back(comm->isend(region, p.positions * st.cross, dt, p.peer, t, ctx));
        region += p.positions * st.cross * static_cast<index_t>(es);
      }
    }
    for (const auto& r : st.self) {
      const Block g = box(st, r, false), s = box(st, r, true);
      if (fwd()) exec::box_copy(g, s, *ectx);
      else exec::box_add(s, g, *ectx);
    }
    if (fwd())
      for (const auto& r : st.zero) exec::box_zero(box(st, r, false), *ectx);
  }

  void complete(std::size_t k) {
    const Stage& st = plan->stages[k];
    wait_all(reqs);  // receives complete in any order; unpacking below is in peer order
    if (st.cross > 0) {
      const auto& recv_from = fwd() ? st.in : st.out;
      for (std::size_t i = 0; i < recv_from.size(); ++i) stage_io(st, recv_from[i].runs, !fwd(), recv_at[i], false, !fwd());
    }
    reqs.clear();
    recv_at.clear();
  }

  /// Runs stages up to the first one that talks to other ranks, which is left posted.
  void advance() {
    while (next < count()) {
      const std::size_t k = stage_index(next++);
      post(k);
      if (comms[k]) {
        inflight = true;
        return;
      }
      complete(k);
    }
  }

  void finish() {
    if (done) return;
    profile::Scope prof(fwd() ? g_prof_forward_finish : g_prof_adjoint_finish, ectx);
    if (inflight) {
      inflight = false;
      complete(stage_index(next - 1));
    }
    while (next < count()) {
      const std::size_t k = stage_index(next++);
      post(k);
      complete(k);
    }
    if (fwd()) {
      result = buf;
    } else {
      result = Block::allocate(dt, buf.device, len);
      exec::box_copy(result, exec::sub_box(buf, lo, len), *ectx);
    }
    buf = fwd() ? buf : Block{};
    if (staging.data) plan->release_staging(std::move(staging));
    staging = Block{};
    done = true;
  }
};

namespace detail {
std::uint64_t halo_call_key(const char* op, DType dt, const DistSpec& spec, const HaloSpec& halo) {
  return CallKey(op).add(dt).add(spec).add(halo.lo).add(halo.hi).add(halo.modes).value();
}

std::string halo_call_text(DType dt, const DistSpec& spec, const HaloSpec& halo) {
  return fmt::format("{} {} shard sizes {} {}", dt, spec, spec.sizes(), halo);
}
}  // namespace detail

namespace {
bool halo_accumulable(DType dt) {
  return dt == DType::f32 || dt == DType::f64 || dt == DType::bf16 || dt == DType::f16 || dt == DType::c64 ||
         dt == DType::c128 || dt == DType::i32 || dt == DType::i64;  // bf16 / f16: added in f32, rounded per add
}
}  // namespace

HaloTransfer::HaloTransfer(DType dt, const DistSpec& spec, const HaloSpec& halo, Direction dir, const Block& in,
                           bool consume_input, const Block* out)
    : impl_(std::make_unique<Impl>()) {
  const char* op = dir == Direction::forward ? "halo_exchange" : "halo_exchange_adjoint";
  if (checking_collectives(in.device)) [[unlikely]]
    CollectiveFingerprint(op).dtype(dt).spec(spec).field("halo", halo).agree(spec.mesh());
  auto& m = *impl_;
  m.plan = halo_plan(spec, halo, op);  // validates
  m.dt = dt;
  m.dir = dir;
  m.es = dtype_size(dt);
  m.tag = dir == Direction::forward ? kHaloTagForward : kHaloTagAdjoint;
  m.lo = halo.lo;
  m.len = spec.local_box().len;
  m.ext = halo_extended_shape(spec, halo);
  {
    const ExecContext& cur = current_context(in.device);
    m.own_ctx = std::make_unique<ExecContext>(cur.device(), cur.stream());
    m.own_ctx->settings() = cur.settings();
    m.ectx = m.own_ctx.get();
  }
  m.ctx = in.device.is_cpu() ? nullptr : m.ectx;
  profile::Scope prof(dir == Direction::forward ? g_prof_forward_start : g_prof_adjoint_start, m.ectx);
  if (dir == Direction::forward) {
    SHARD_CHECK(dt == in.dtype, op, "block of dtype {} passed as {}", in.dtype, dt);
    SHARD_CHECK(in.shape_vec() == m.len, op, "local block of shape {} does not match {} (expects {} on this rank)",
                in.shape_vec(), spec, m.len);
  } else {
    const bool ok = in.shape_vec() == m.ext && in.dtype == dt;
    // The cheap check folded into this allgather: dtype, layout and halo agree on every rank.
    spec.mesh().comm()->check_all(
        ok, op,
        ok ? std::string()
           : fmt::format("gradient of the extended block has shape {} ({}), expected {} ({}) (local {} + {}) for {}",
                         in.shape_vec(), in.dtype, m.ext, dt, m.len, halo, spec),
        halo_call_key(op, dt, spec, halo), [&] { return halo_call_text(dt, spec, halo); });
    SHARD_CHECK(halo_accumulable(dt), op, "dtype {} cannot be accumulated (f32, f64, bf16, f16, c64, c128, i32, i64)", dt);
  }
  // Communicators of the stages, in plan order (the same on every rank: dims_comm is collective
  // on first use of a set of mesh dims).
  const auto& mesh = spec.mesh();
  for (const auto& st : m.plan->stages)
    m.comms.push_back(st.mesh_dims.empty()       ? CommPtr{}
                      : st.mesh_dims.size() == 1 ? mesh.dim_comm(st.mesh_dims[0])
                                                 : mesh.dims_comm(st.mesh_dims));
  if (m.plan->staging_elements > 0)
    m.staging = m.plan->acquire_staging(static_cast<std::size_t>(m.plan->staging_elements) * m.es, in.device);
  if (dir == Direction::adjoint && consume_input && in.is_contiguous()) {
    m.buf = in;  // the caller handed the gradient over: work in place
  } else if (out) {
    // The caller's extended buffer (fill_ghosts: a user's ghosted array): checked by the caller.
    m.buf = *out;
    const Block inner = exec::sub_box(m.buf, m.lo, m.len);
    bool aliased = inner.data == in.data && inner.rank == in.rank;
    for (int d = 0; aliased && d < in.rank; ++d)
      aliased = inner.strides[static_cast<std::size_t>(d)] == in.strides[static_cast<std::size_t>(d)];
    if (!aliased) exec::box_copy(inner, in, *m.ectx);
  } else {
    m.buf = Block::allocate(dt, in.device, m.ext);
    if (dir == Direction::forward) exec::box_copy(exec::sub_box(m.buf, m.lo, m.len), in, *m.ectx);
    else exec::box_copy(m.buf, in, *m.ectx);
  }
  m.advance();
}

HaloTransfer::~HaloTransfer() {
  if (impl_ && !impl_->done) {
    try {
      impl_->finish();
    } catch (...) {  // never throw from a destructor; the peers got their messages
    }
  }
}

const Block& HaloTransfer::finish() {
  impl_->finish();
  return impl_->result;
}

const Block& HaloTransfer::buffer() const { return impl_->fwd() || !impl_->done ? impl_->buf : impl_->result; }

bool HaloTransfer::finished() const { return impl_->done; }

}  // namespace shard
