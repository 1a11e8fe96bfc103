// The halo plan of a stencil op (dist/halo_transport.hpp): thin faces, whole extended block, and
// the sliced ghost-only adjoint, chosen from the context's ExecSettings. The data moves through
// the box engine and HaloTransfer, so both devices run the same code.
#include "shardtensor/dist/halo_transport.hpp"

#include <algorithm>
#include <tuple>

#include "shardtensor/dist/consistency.hpp"
#include "shardtensor/exec/box.hpp"

namespace shard {
namespace detail {
namespace {

/// The plan's inputs: the op's shape plus the context's policy (transport, slice size).
struct StencilHaloOptions {
  HaloTransport transport = HaloTransport::automatic;
  std::vector<index_t> reach;
  std::vector<int> slice_dims;
  std::size_t chunk_bytes = std::size_t{2} << 20;
  const char* op = "halo_exchange";
};

StencilHaloOptions options_of(const StencilHaloShape& shape, const ExecSettings& s) {
  StencilHaloOptions o;
  o.transport = s.halo_transport;
  o.reach = shape.reach;
  o.slice_dims = shape.slice_dims;
  o.chunk_bytes = std::max<std::size_t>(s.halo_chunk_bytes, 1);
  o.op = shape.op;
  return o;
}

/// Collective consistency check of a stencil op's halo (debug mode, dist/consistency.hpp).
void check_stencil_halo(const char* what, DType dt, const DistSpec& spec, const HaloSpec& halo,
                        const StencilHaloOptions& o, const ExecContext& ctx) {
  if (!ctx.settings().check_collectives) return;
  CollectiveFingerprint(fmt::format("{} {}", o.op, what)).dtype(dt).spec(spec).field("halo", halo)
      .field("reach", o.reach).field("halo transport", static_cast<int>(o.transport))
      .field("halo chunk bytes", o.chunk_bytes).agree(spec.mesh());
}

index_t numel_of(const std::vector<index_t>& s) {
  index_t n = 1;
  for (auto e : s) n *= e;
  return n;
}

Block view(DType dt, Device dev, void* data, const std::vector<index_t>& shape) {
  return Block::view(dt, dev, data, shape.data(), static_cast<int>(shape.size()));
}

/// dst[dlo + i] (op)= src[slo + i] over the box `len`.
void copy_box(const Block& src, const std::vector<index_t>& slo, const Block& dst, const std::vector<index_t>& dlo,
              const std::vector<index_t>& len) {
  exec::box_copy(exec::sub_box(dst, dlo, len), exec::sub_box(src, slo, len), current_context(dst.device));
}
void add_box(const Block& src, const std::vector<index_t>& slo, const Block& dst, const std::vector<index_t>& dlo,
             const std::vector<index_t>& len) {
  exec::box_add(exec::sub_box(dst, dlo, len), exec::sub_box(src, slo, len), current_context(dst.device));
}

/// Calls f(lo, len) for disjoint boxes covering `ext` minus the inner box [ilo, ihi) clamped to
/// ext (an onion decomposition, dim by dim).
template <class F>
void for_each_outer_box(const std::vector<index_t>& ext, const std::vector<index_t>& ilo,
                        const std::vector<index_t>& ihi, F&& f) {
  const std::size_t R = ext.size();
  std::vector<index_t> lo(R, 0), len = ext;
  for (std::size_t d = 0; d < R; ++d) {
    auto emit = [&](index_t a, index_t b) {
      if (b <= a) return;
      auto l = lo, n = len;
      l[d] = a;
      n[d] = b - a;
      for (auto e : n)
        if (e == 0) return;
      f(l, n);
    };
    const index_t a = std::clamp<index_t>(ilo[d], 0, ext[d]), b = std::clamp<index_t>(ihi[d], a, ext[d]);
    emit(0, a);
    emit(b, ext[d]);
    lo[d] = a;
    len[d] = b - a;
  }
}

/// Calls f(in_block, src_row, dst_offset, len) for the pieces of extended-block rows [e0, e1)
/// along the thin dim: below the block (T_ext rows), in it (block rows), above it (T_ext rows).
template <class F>
void thin_pieces(const ThinHalo& th, index_t e0, index_t e1, F&& f) {
  const index_t b0 = th.lo, b1 = th.lo + th.n;
  const index_t a = std::min(e1, b0), c0 = std::max(e0, b0), c1 = std::min(e1, b1), d = std::max(e0, b1);
  if (a > e0) f(false, e0, index_t{0}, a - e0);
  if (c1 > c0) f(true, c0 - th.lo, c0 - e0, c1 - c0);
  if (e1 > d) f(false, d - th.n + th.t, d - e0, e1 - d);
}

/// The dim the sliced adjoint slices and its slice count (-1, 1 when it does not apply).
std::pair<int, index_t> slicing(DType dt, const DistSpec& spec, const HaloSpec& halo, const StencilHaloOptions& opt) {
  int cd = -1;
  for (int d : opt.slice_dims) {
    const auto u = static_cast<std::size_t>(d);
    if (spec.layout(d).parts() == 1 && halo.lo[u] == 0 && halo.hi[u] == 0) {
      cd = d;
      break;
    }
  }
  if (cd < 0) return {-1, 1};
  // The slice count must be the same on every rank (each slice is a collective): from the global
  // size per rank, not from this rank's (uneven) block.
  const double bytes = static_cast<double>(numel_of(spec.global_shape())) * static_cast<double>(dtype_size(dt)) /
                       static_cast<double>(spec.mesh().size());
  const index_t nch =
      std::min<index_t>(spec.local_box().len[static_cast<std::size_t>(cd)],
                        static_cast<index_t>(bytes / static_cast<double>(std::max<std::size_t>(opt.chunk_bytes, 1))) + 1);
  return nch <= 1 ? std::pair<int, index_t>{-1, 1} : std::pair<int, index_t>{cd, nch};
}

}  // namespace

ThinHalo make_thin_halo(const DistSpec& spec, const HaloSpec& halo, const std::vector<index_t>& reach) {
  ThinHalo th;
  int count = 0;
  for (int d = 0; d < halo.ndim(); ++d) {
    const auto u = static_cast<std::size_t>(d);
    if (halo.lo[u] + halo.hi[u] > 0) {
      ++count;
      th.d = d;
    }
  }
  if (count != 1) return th;
  const auto u = static_cast<std::size_t>(th.d);
  th.lo = halo.lo[u];
  th.hi = halo.hi[u];
  th.edge = std::max(std::max(th.lo, th.hi) + 1, u < reach.size() ? reach[u] : index_t{0});
  const ShardLayout& L = spec.layout(th.d);
  std::vector<index_t> ts;
  index_t total = 0;
  for (index_t p = 0; p < L.parts(); ++p) {
    ts.push_back(std::min(L.size(p), 2 * th.edge));
    total += ts.back();
  }
  auto global = spec.global_shape();
  global[u] = total;
  ShardSizes sizes = spec.sizes();
  sizes[u] = L.parts() > 1 ? ts : std::vector<index_t>{};
  th.spec = DistSpec(spec.mesh(), spec.placements(), global, sizes);
  th.n = spec.local_box().len[u];
  th.t = std::min(th.n, 2 * th.edge);
  th.ok = true;
  return th;
}

namespace {
HaloAdjointKind choose_halo_adjoint(DType dt, const DistSpec& spec, const HaloSpec& halo,
                                    const StencilHaloOptions& opt) {
  if (opt.transport != HaloTransport::whole_block && make_thin_halo(spec, halo, opt.reach).ok)
    return HaloAdjointKind::thin;
  return slicing(dt, spec, halo, opt).first >= 0 ? HaloAdjointKind::sliced : HaloAdjointKind::whole_block;
}
}  // namespace

}  // namespace detail

using namespace detail;

// ---------------------------------------------------------------- forward
StencilHaloForward::StencilHaloForward(DType dt, const DistSpec& spec, const HaloSpec& halo, const Block& local,
                                       const StencilHaloShape& shape, ExecContext& ctx)
    : local_(local) {
  const StencilHaloOptions opt = options_of(shape, ctx.settings());
  check_stencil_halo("halo", dt, spec, halo, opt, ctx);
  const bool overlap = ctx.settings().overlap_halo;
  if (opt.transport != HaloTransport::whole_block) th_ = make_thin_halo(spec, halo, opt.reach);
  if (!th_.ok) {
    tr_ = std::make_unique<HaloTransfer>(dt, spec, halo, HaloTransfer::Direction::forward, local);
    if (!overlap) finish();  // benchmark switch: the same work, without the overlap
    return;
  }
  validate_halo(spec, halo, opt.op);  // the real halo's limits (T's are looser)
  Block tl = local;
  if (th_.t != th_.n) {  // T's block: the two faces of the local block
    const auto ud = static_cast<std::size_t>(th_.d);
    auto shape = local.shape_vec();
    shape[ud] = th_.t;
    tl = Block::allocate(dt, local.device, shape);
    auto len = shape;
    len[ud] = th_.edge;
    std::vector<index_t> z(shape.size(), 0), hi(shape.size(), 0), thi(shape.size(), 0);
    hi[ud] = th_.n - th_.edge;
    thi[ud] = th_.edge;
    copy_box(local, z, tl, z, len);
    copy_box(local, hi, tl, thi, len);
  }
  tr_ = std::make_unique<HaloTransfer>(dt, th_.spec, halo, HaloTransfer::Direction::forward, tl);
  if (!overlap) finish();
}

StencilHaloForward::StencilHaloForward(const Block& user_ext) : ext_(user_ext) {
  // th_.ok stays false and tr_ null: finish() has nothing to wait for and read() copies boxes of ext_.
  SHARD_CHECK(user_ext.data != nullptr || user_ext.numel() == 0, "halo (user ghosts)", "null extended block");
}

StencilHaloForward::~StencilHaloForward() = default;

void StencilHaloForward::finish() {
  if (!ext_.data && tr_) ext_ = tr_->finish();
}

void StencilHaloForward::read(const std::vector<index_t>& lo, const Block& dst) {
  finish();
  const auto len = dst.shape_vec();
  const std::vector<index_t> z(len.size(), 0);
  if (!th_.ok) {
    copy_box(ext_, lo, dst, z, len);
    return;
  }
  const auto ud = static_cast<std::size_t>(th_.d);
  thin_pieces(th_, lo[ud], lo[ud] + len[ud], [&](bool in_block, index_t src, index_t dst_off, index_t n) {
    auto slo = lo, dlo = z, l = len;
    slo[ud] = src;
    dlo[ud] = dst_off;
    l[ud] = n;
    if (in_block)  // the other dims have no ghosts: extended coordinates are block coordinates
      copy_box(local_, slo, dst, dlo, l);
    else
      copy_box(ext_, slo, dst, dlo, l);
  });
}

// ---------------------------------------------------------------- adjoint
HaloAdjointKind stencil_halo_adjoint_kind(DType dt, const DistSpec& spec, const HaloSpec& halo,
                                          const StencilHaloShape& shape, const ExecSettings& settings) {
  return choose_halo_adjoint(dt, spec, halo, options_of(shape, settings));
}

struct StencilHaloAdjoint::Impl {
  DType dt{};
  Device dev{};
  DistSpec spec;
  HaloSpec halo;
  HaloAdjointKind kind{};
  StencilHaloOptions opt;
  bool overlap = true, started = false;
  std::vector<GhostGradient> ghosts;
  std::unique_ptr<HaloTransfer> tr;
  bool landed = false;
  Block result;  ///< whole_block: the block's gradient
  // thin
  ThinHalo th;
  // sliced
  int cd = -1;
  index_t nch = 1, next = 0, pending_lo = 0;
  std::vector<index_t> len, ext, inner_lo, inner_hi, zmax, zshape;
  Block zbuf;

  ExecContext& ctx() const { return current_context(dev); }

  void post_thin() {
    const auto ud = static_cast<std::size_t>(th.d);
    auto zs = len;
    zs[ud] = th.t + th.lo + th.hi;
    Block z = Block::allocate(dt, dev, zs);
    exec::box_zero(z, ctx());
    for (const auto& gg : ghosts) {
      const auto gl = gg.g.shape_vec();
      thin_pieces(th, gg.lo[ud], gg.lo[ud] + gl[ud], [&](bool in_block, index_t row, index_t off, index_t n) {
        if (in_block) return;  // block cells: zero in gg (counted by the block's own pass)
        auto dlo = gg.lo, slo = std::vector<index_t>(gl.size(), 0), l = gl;
        dlo[ud] = row;
        slo[ud] = off;
        l[ud] = n;
        add_box(gg.g, slo, z, dlo, l);
      });
    }
    ghosts.clear();
    tr = std::make_unique<HaloTransfer>(dt, th.spec, halo, HaloTransfer::Direction::adjoint, z, true);
  }
  void land_thin(const Block& gx) {
    const Block res = tr->finish();
    const auto ud = static_cast<std::size_t>(th.d);
    // T-local rows [0, t) are block rows block_row(j): one run, or the two faces.
    const index_t first = th.t == th.n ? th.t : th.edge;
    for (index_t j0 : {index_t{0}, first}) {
      const index_t n = j0 == 0 ? first : th.t - first;
      if (n <= 0) continue;
      std::vector<index_t> slo(static_cast<std::size_t>(res.rank), 0), dlo = slo;
      auto l = res.shape_vec();
      slo[ud] = j0;
      dlo[ud] = th.block_row(j0);
      l[ud] = n;
      add_box(res, slo, gx, dlo, l);
    }
    tr.reset();
  }

  void post_slice(index_t k) {
    const auto uc = static_cast<std::size_t>(cd);
    const index_t s0 = balanced_offset(len[uc], nch, k), s1 = s0 + balanced_size(len[uc], nch, k);
    auto shape = ext;
    shape[uc] = s1 - s0;
    Block z = view(dt, dev, zbuf.data, shape);
    z.owner = zbuf.owner;
    if (shape != zshape) {  // another slice extent: the zero layout moved
      exec::box_zero(view(dt, dev, zbuf.data, zmax), ctx());
      zshape = shape;
    }
    for (const auto& gg : ghosts) {
      const auto gl = gg.g.shape_vec();
      const index_t a = std::max(s0, gg.lo[uc]), b = std::min(s1, gg.lo[uc] + gl[uc]);
      if (b <= a) continue;
      auto slo = std::vector<index_t>(gl.size(), 0), dlo = gg.lo, l = gl;
      slo[uc] = a - gg.lo[uc];
      dlo[uc] = a - s0;
      l[uc] = b - a;
      add_box(gg.g, slo, z, dlo, l);
    }
    auto gk = spec.global_shape();
    gk[uc] = s1 - s0;
    const DistSpec chunk_spec(spec.mesh(), spec.placements(), gk, spec.sizes());
    tr = std::make_unique<HaloTransfer>(dt, chunk_spec, halo, HaloTransfer::Direction::adjoint, z, true);
    pending_lo = s0;
  }
  void land_slice(const Block& gx) {
    if (!tr) return;
    const Block res = tr->finish();
    tr.reset();
    const auto uc = static_cast<std::size_t>(cd);
    for_each_outer_box(res.shape_vec(), inner_lo, inner_hi,
                       [&](const std::vector<index_t>& lo, const std::vector<index_t>& l) {
                         auto d = lo;
                         d[uc] += pending_lo;
                         add_box(res, lo, gx, d, l);
                       });
    // Restore the zero buffer: the ghosts and the faces the adjoint added into.
    const Block z = view(dt, dev, zbuf.data, zshape);
    std::vector<index_t> zlo(len.size()), zhi(len.size());
    for (std::size_t u = 0; u < len.size(); ++u) {
      zlo[u] = inner_lo[u] + halo.lo[u];
      zhi[u] = inner_hi[u] + halo.lo[u];
    }
    for_each_outer_box(zshape, zlo, zhi, [&](const std::vector<index_t>& lo, const std::vector<index_t>& l) {
      exec::box_zero(exec::sub_box(z, lo, l), ctx());
    });
  }
};

StencilHaloAdjoint::StencilHaloAdjoint(DType dt, const DistSpec& spec, const HaloSpec& halo,
                                       const StencilHaloShape& shape, ExecContext& ctx)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.dt = dt;
  m.dev = ctx.device();
  m.spec = spec;
  m.halo = halo;
  m.opt = options_of(shape, ctx.settings());
  check_stencil_halo("halo adjoint", dt, spec, halo, m.opt, ctx);
  m.overlap = ctx.settings().overlap_halo;
  m.kind = choose_halo_adjoint(dt, spec, halo, m.opt);
}

StencilHaloAdjoint::~StencilHaloAdjoint() = default;  // an unfinished HaloTransfer completes itself

HaloAdjointKind StencilHaloAdjoint::kind() const { return impl_->kind; }

void StencilHaloAdjoint::start(const Block& grad_ext) {
  auto& m = *impl_;
  SHARD_CHECK(m.kind == HaloAdjointKind::whole_block && !m.started, m.opt.op,
              "the halo plan takes the ghost cells' gradients here (kind {}), not the extended block's",
              static_cast<int>(m.kind));
  m.started = true;
  m.tr = std::make_unique<HaloTransfer>(m.dt, m.spec, m.halo, HaloTransfer::Direction::adjoint, grad_ext, true);
  if (!m.overlap) m.tr->finish();  // benchmark switch
}

void StencilHaloAdjoint::start(std::vector<GhostGradient> ghosts) {
  auto& m = *impl_;
  SHARD_CHECK(m.kind != HaloAdjointKind::whole_block && !m.started, m.opt.op,
              "the halo plan takes the extended block's gradient here, not the ghost cells'");
  m.started = true;
  m.ghosts = std::move(ghosts);
  const DistSpec& spec = m.spec;
  const HaloSpec& halo = m.halo;
  const StencilHaloOptions& opt = m.opt;
  const DType dt = m.dt;
  m.len = spec.local_box().len;
  m.ext = halo_extended_shape(spec, halo);
  if (m.kind == HaloAdjointKind::thin) {
    m.th = make_thin_halo(spec, halo, opt.reach);
    SHARD_CHECK(m.th.ok, "StencilHaloAdjoint", "thin transport for {} needs exactly one dim with ghosts", halo);
    validate_halo(spec, halo, opt.op);
    m.post_thin();
    return;
  }
  std::tie(m.cd, m.nch) = slicing(dt, spec, halo, opt);
  SHARD_CHECK(m.cd >= 0, "StencilHaloAdjoint", "no dim of {} can be sliced for {}", spec, halo);
  const std::size_t R = m.len.size();
  // Faces that can receive gradients from the adjoint: within max(lo, hi) + 1 of the block faces
  // along every dim with a halo (the sources of every ghost cell, in every mode).
  m.inner_lo.resize(R);
  m.inner_hi.resize(R);
  for (std::size_t u = 0; u < R; ++u) {
    const index_t n = m.len[u];
    if (halo.lo[u] + halo.hi[u] == 0) {
      m.inner_lo[u] = 0;
      m.inner_hi[u] = n;
    } else {
      const index_t r = std::max(halo.lo[u], halo.hi[u]) + 1;
      m.inner_lo[u] = std::min(r, n);
      m.inner_hi[u] = std::max(m.inner_lo[u], n - r);
    }
  }
  const auto uc = static_cast<std::size_t>(m.cd);
  index_t max_chunk = 0;
  for (index_t k = 0; k < m.nch; ++k) max_chunk = std::max(max_chunk, balanced_size(m.len[uc], m.nch, k));
  m.zmax = m.ext;
  m.zmax[uc] = max_chunk;
  m.zbuf = Block::allocate(dt, m.dev, m.zmax);
  exec::box_zero(m.zbuf, m.ctx());
  m.zshape = m.zmax;
  m.post_slice(0);
  m.next = 1;
}

void StencilHaloAdjoint::progress(const Block& gx) {
  auto& m = *impl_;
  if (!m.overlap) {  // benchmark switch: land everything now
    finish(gx);
    return;
  }
  if (m.kind != HaloAdjointKind::sliced) return;
  for (; m.next < m.nch; ++m.next) {
    m.land_slice(gx);
    m.post_slice(m.next);
  }
}

Block StencilHaloAdjoint::finish(const Block& gx) {
  auto& m = *impl_;
  SHARD_CHECK(m.started, m.opt.op, "the halo adjoint was not started");
  if (m.kind == HaloAdjointKind::whole_block) {
    if (!m.landed) {
      m.result = m.tr->finish();
      m.tr.reset();
      m.landed = true;
    }
    return m.result;
  }
  if (!m.landed) {
    if (m.kind == HaloAdjointKind::thin) {
      m.land_thin(gx);
    } else {
      for (; m.next < m.nch; ++m.next) {
        m.land_slice(gx);
        m.post_slice(m.next);
      }
      m.land_slice(gx);
    }
    m.landed = true;
  }
  return gx;
}

Block stencil_halo_adjoint_of_box(DType dt, const DistSpec& spec, const HaloSpec& halo, const StencilHaloShape& shape,
                                  const Block& gbox, const std::vector<index_t>& lo, ExecContext& ctx) {
  StencilHaloAdjoint adj(dt, spec, halo, shape, ctx);
  const auto ext = detail::halo_extended_shape(spec, halo);
  const auto blk = spec.local_box().len;
  const int R = static_cast<int>(ext.size());
  const bool have = gbox.data != nullptr && gbox.numel() > 0;
  SHARD_CHECK(!have || (gbox.rank == R && static_cast<int>(lo.size()) == R), shape.op,
              "box gradient of rank {} at {} for a rank-{} extended block", gbox.rank, lo, R);
  if (have)
    for (int d = 0; d < R; ++d) {
      const auto u = static_cast<std::size_t>(d);
      SHARD_CHECK(lo[u] >= 0 && lo[u] + gbox.shape[u] <= ext[u], shape.op,
                  "box gradient {} at {} outside the extended block {}", gbox.shape_vec(), lo, ext);
    }
  auto zeros = [&](const std::vector<index_t>& s) {
    Block b = Block::allocate(dt, ctx.device(), s);
    exec::box_zero(b, ctx);
    return b;
  };
  if (adj.wants_extended_gradient()) {
    bool whole = have && gbox.is_contiguous();
    for (int d = 0; d < R && whole; ++d)
      whole = lo[static_cast<std::size_t>(d)] == 0 && gbox.shape[static_cast<std::size_t>(d)] == ext[static_cast<std::size_t>(d)];
    Block g = whole ? gbox : zeros(ext);
    if (have && !whole) exec::box_copy(exec::sub_box(g, lo, gbox.shape_vec()), gbox, ctx);
    adj.start(g);
    return adj.finish();
  }
  // thin / sliced: the box's cells inside the block are the block's own gradient; the rest
  // (zeroed at the block's cells, as GhostGradient requires) travels to the owners.
  Block gx = zeros(blk);
  std::vector<GhostGradient> ghosts;
  if (have) {
    std::vector<index_t> in_box(static_cast<std::size_t>(R)), in_gx(in_box), len(in_box);
    bool overlap = true;
    for (int d = 0; d < R; ++d) {
      const auto u = static_cast<std::size_t>(d);
      const index_t a = std::max(lo[u], halo.lo[u]), e = std::min(lo[u] + gbox.shape[u], halo.lo[u] + blk[u]);
      overlap = overlap && e > a;
      in_box[u] = a - lo[u];
      in_gx[u] = a - halo.lo[u];
      len[u] = std::max<index_t>(0, e - a);
    }
    if (overlap) {
      exec::box_add(exec::sub_box(gx, in_gx, len), exec::sub_box(gbox, in_box, len), ctx);
      exec::box_zero(exec::sub_box(gbox, in_box, len), ctx);
    }
    ghosts.push_back({lo, gbox});
  }
  adj.start(std::move(ghosts));
  adj.progress(gx);
  return adj.finish(gx);
}

}  // namespace shard
