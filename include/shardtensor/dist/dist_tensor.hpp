#pragma once
/// \file dist_tensor.hpp
/// DistTensor<T, Rank>: a global tensor laid out on a DeviceMesh by one Placement per mesh dim,
/// holding this rank's local block. The typed front over DistSpec + detail::redistribute.
#include <algorithm>
#include <optional>

#include "shardtensor/dist/consistency.hpp"
#include "shardtensor/dist/dist_spec.hpp"
#include "shardtensor/dist/ghosts.hpp"
#include "shardtensor/dist/gather.hpp"
#include "shardtensor/dist/redistribute.hpp"
#include "shardtensor/exec/box.hpp"
#include "shardtensor/runtime/context.hpp"
#include "shardtensor/tensor/tensor_block.hpp"
#include "shardtensor/tensor/tensor.hpp"

namespace shard {

/// A global Rank-dimensional tensor distributed over a DeviceMesh. Copies are shallow.
template <class T, int Rank>
class DistTensor {
 public:
  using value_type = T;
  static constexpr int rank = Rank;
  using Local = Tensor<T, Rank>;

  DistTensor() = default;
  /// Wraps an existing local block that matches `spec` on this rank (checked locally; use
  /// from_local for user data, whose checks are collective).
  DistTensor(DistSpec spec, Local local) : spec_(std::move(spec)), local_(std::move(local)) {
    SHARD_CHECK(spec_.ndim() == Rank, "DistTensor", "spec of rank {} for a rank-{} tensor", spec_.ndim(), Rank);
    const auto& len = spec_.local_box().len;
    SHARD_CHECK(std::equal(local_.shape().begin(), local_.shape().end(), len.begin(), len.end()), "DistTensor",
                "local shape {} does not match {} which expects {} on this rank", local_.shape(), spec_,
                spec_.local_box().len);
  }

  // ------------------------------------------------------------------ construction
  /// Zero-copy over this rank's local block (user memory is viewed, not copied). Collective:
  /// per-rank sizes are gathered over the mesh unless `sizes` gives them; the local shapes must
  /// be consistent with one global shape (checked on every rank, never hangs).
  static DistTensor from_local(const Local& local, const DeviceMesh& mesh, std::vector<Placement> placements,
                               const ShardSizes& sizes = {}) {
    return from_local_impl(local, mesh, std::move(placements), nullptr, sizes);
  }
  /// from_local of the interior view of a user's halo-padded array whose memory around the view
  /// holds valid ghost cells as `ghosts` declares (widths per dim, domain-edge modes; see
  /// dist/ghosts.hpp for the whole contract): ops needing a halo within them read the user's
  /// ghosts instead of exchanging. `sizes` as above (`{}`: gathered). Collective; the declaration
  /// must be the same on every rank (checked with the shapes: shard::Error on every rank
  /// otherwise). The ghosts are valid at the view's current storage version (see
  /// mark_ghosts_valid).
  static DistTensor from_local(const Local& local, const DeviceMesh& mesh, std::vector<Placement> placements,
                               const ShardSizes& sizes, const GhostLayers& ghosts) {
    return from_local_impl(local, mesh, std::move(placements), &ghosts, sizes);
  }

  // ------------------------------------------------------------------ declared ghost layers
  /// The ghost layers declared by from_local (null when none; dropped by every op that makes a
  /// new tensor).
  const GhostLayers* ghost_layers() const noexcept { return ghosts_ ? &ghosts_->layers : nullptr; }
  /// True if ghost layers are declared and valid on this rank: declared valid and the storage
  /// version unchanged since (local; ops agree on it over the mesh, dist/halo.hpp).
  bool ghosts_current() const noexcept {
    return ghosts_ && ghosts_->valid && ghosts_->version == local_.version();
  }
  /// Declares the ghost cells valid again at the current storage version (after the simulation's
  /// own exchange). Local, no communication; seen by every copy of this handle.
  void mark_ghosts_valid() const {
    SHARD_CHECK(ghosts_ != nullptr, "DistTensor::mark_ghosts_valid",
                "no ghost layers declared (from_local with GhostLayers)");
    ghosts_->valid = true;
    ghosts_->version = local_.version();
  }
  /// Declares the ghost cells stale: ops run their own exchange until mark_ghosts_valid.
  void mark_ghosts_stale() const noexcept {
    if (ghosts_) ghosts_->valid = false;
  }
  /// This rank's block extended by lo[d] / hi[d] declared ghost cells along dim d (each within the
  /// declaration): a strided view of the user's memory around the block (no copy).
  Local ghosted_local(const std::vector<index_t>& lo, const std::vector<index_t>& hi) const {
    SHARD_CHECK(ghosts_ != nullptr, "DistTensor::ghosted_local", "no ghost layers declared");
    const auto& g = ghosts_->layers;
    Shape<Rank> shape = local_.shape();
    index_t off = 0;
    for (int d = 0; d < Rank; ++d) {
      const auto u = static_cast<std::size_t>(d);
      SHARD_CHECK(lo[u] >= 0 && hi[u] >= 0 && lo[u] <= g.lo[u] && hi[u] <= g.hi[u], "DistTensor::ghosted_local",
                  "widths lo {} hi {} exceed the declared ghost layers lo {} hi {}", lo, hi, g.lo, g.hi);
      shape[u] += lo[u] + hi[u];
      off += lo[u] * local_.strides()[u];
    }
    return Local::adopt(local_.storage(), local_.data() - off, shape, local_.strides(), local_.device());
  }
  /// A copy in library memory (what autograd saves of a user view): the local block and, when
  /// ghost layers are declared, the ghost cells with it (a padded buffer whose interior is the
  /// new local block; the ghosts stay valid if they were). Not collective.
  DistTensor snapshot() const {
    if (!ghosts_) return DistTensor(spec_, local_.clone());
    const auto& g = ghosts_->layers;
    const Local src = ghosted_local(g.lo, g.hi);
    Local padded = Local::empty(src.shape(), local_.device());
    padded.copy_from(src);
    Shape<Rank> lo{};
    for (int d = 0; d < Rank; ++d) lo[d] = g.lo[static_cast<std::size_t>(d)];
    DistTensor out(spec_, padded.slice(lo, local_.shape()));
    out.ghosts_ = std::make_shared<detail::GhostState>(
        detail::GhostState{g, ghosts_current(), out.local_.version()});
    return out;
  }

 private:
  static DistTensor from_local_impl(const Local& local, const DeviceMesh& mesh, std::vector<Placement> placements,
                                    const GhostLayers* ghosts, const ShardSizes& sizes) {
    const auto& comm = mesh.comm();
    // Debug mode: what the checks below cannot compare (they agree the placements, the ghost
    // declaration and given sizes against the extents themselves, with messages of their own).
    if (detail::checking_collectives(local.device())) [[unlikely]]
      detail::CollectiveFingerprint("DistTensor::from_local").dtype(dtype_of<T>).field("tensor rank", Rank).mesh(mesh)
          .text("explicit sizes", sizes.empty() ? "none" : "given").agree(mesh);
    // Local validation first, then agreement, both through one collective check.
    std::string err;
    if (static_cast<int>(placements.size()) != mesh.ndim())
      err = fmt::format("{} placements for a {}-D mesh", placements.size(), mesh.ndim());
    for (auto& p : placements)
      if (err.empty() && p.is_shard() && (p.dim < 0 || p.dim >= Rank))
        err = fmt::format("placement {} names a dim outside a rank-{} tensor", p, Rank);
    if (err.empty() && !sizes.empty() && static_cast<int>(sizes.size()) != Rank)
      err = fmt::format("explicit sizes given for {} dims of a rank-{} tensor", sizes.size(), Rank);
    if (err.empty() && ghosts) {
      const auto& g = *ghosts;
      if (g.ndim() != Rank || static_cast<int>(g.hi.size()) != Rank || static_cast<int>(g.edge.size()) != Rank)
        err = fmt::format("ghost layers describe {} / {} / {} dims (lo / hi / edge) of a rank-{} tensor", g.lo.size(),
                          g.hi.size(), g.edge.size(), Rank);
      for (int d = 0; d < Rank && err.empty(); ++d) {
        const auto u = static_cast<std::size_t>(d);
        if (g.lo[u] < 0 || g.hi[u] < 0)
          err = fmt::format("ghost widths lo {} hi {} must be >= 0", g.lo, g.hi);
        else if ((g.lo[u] > 0 || g.hi[u] > 0) && local.strides()[u] <= 0)
          err = fmt::format("ghost layers on dim {} whose stride is {} (ghosts need a positive stride; "
                            "view strides {})",
                            d, local.strides()[u], local.strides());
      }
    }
    // The cheap check folded into this allgather: the element type and tensor rank agree.
    comm->check_all(err.empty(), "DistTensor::from_local", err,
                    detail::CallKey("DistTensor::from_local").add(dtype_of<T>).add(Rank).value(),
                    [] { return fmt::format("DistTensor<{}, {}>", dtype_of<T>, Rank); });
    // Gather (local shape, placements) from every rank: the placements must agree too.
    std::vector<index_t> mine = to_vec(local.shape());
    for (const auto& p : placements) {
      mine.push_back(static_cast<index_t>(p.kind));
      mine.push_back(p.is_shard() ? p.dim : -1);
      mine.push_back(p.is_partial() ? static_cast<index_t>(p.op) : -1);
    }
    // The ghost declaration (none: widths -1) must agree too.
    const std::size_t gbegin = mine.size();
    for (int d = 0; d < Rank; ++d) {
      const auto u = static_cast<std::size_t>(d);
      mine.push_back(ghosts ? ghosts->lo[u] : -1);
      mine.push_back(ghosts ? ghosts->hi[u] : -1);
      mine.push_back(ghosts && ghosts->edge[u] ? static_cast<index_t>(*ghosts->edge[u]) : -1);
    }
    auto shapes = comm->allgather_vectors(mine);
    for (int r = 0; r < mesh.size() && err.empty(); ++r) {
      const auto& theirs = shapes[static_cast<std::size_t>(r)];
      if (theirs.size() != mine.size() ||
          !std::equal(mine.begin() + Rank, mine.begin() + static_cast<std::ptrdiff_t>(gbegin), theirs.begin() + Rank))
        err = fmt::format("placements [{}] differ from rank {}'s (every rank must pass the same ones)",
                          fmt::join(placements, ", "), r);
      else if (!std::equal(mine.begin() + static_cast<std::ptrdiff_t>(gbegin), mine.end(),
                           theirs.begin() + static_cast<std::ptrdiff_t>(gbegin)))
        err = ghosts ? fmt::format("ghost layers lo {} hi {} (edge modes included) differ from rank {}'s (every rank "
                                   "must declare the same ones, or none)",
                                   ghosts->lo, ghosts->hi, r)
                     : fmt::format("no ghost layers declared here, but rank {} declares some (every rank must "
                                   "declare the same ones, or none)",
                                   r);
    }
    std::vector<index_t> global(Rank);
    ShardSizes s(Rank);
    for (int d = 0; d < Rank && err.empty(); ++d) {
      std::vector<int> mdims;
      for (int m = 0; m < mesh.ndim(); ++m)
        if (placements[static_cast<std::size_t>(m)].is_shard(d)) mdims.push_back(m);
      index_t parts = 1;
      for (int m : mdims) parts *= mesh.size(m);
      std::vector<index_t> part_size(static_cast<std::size_t>(parts), -1);
      for (int r = 0; r < mesh.size() && err.empty(); ++r) {
        const auto c = mesh.coords_of(r);
        index_t part = 0;
        for (int m : mdims) part = part * mesh.size(m) + c[static_cast<std::size_t>(m)];
        const index_t e = shapes[static_cast<std::size_t>(r)][static_cast<std::size_t>(d)];
        auto& ps = part_size[static_cast<std::size_t>(part)];
        if (ps >= 0 && ps != e)
          err = fmt::format("local extents of dim {} disagree between ranks holding the same part ({} vs {} on rank {})",
                            d, ps, e, r);
        ps = e;
      }
      index_t tot = 0;
      for (auto v : part_size) tot += v;
      global[static_cast<std::size_t>(d)] = tot;
      if (!sizes.empty() && !sizes[static_cast<std::size_t>(d)].empty() && sizes[static_cast<std::size_t>(d)] != part_size)
        err = fmt::format("given sizes {} for dim {} do not match the local extents {}", sizes[static_cast<std::size_t>(d)],
                          d, part_size);
      if (parts > 1) s[static_cast<std::size_t>(d)] = part_size;
    }
    comm->check_all(err.empty(), "DistTensor::from_local", err);
    DistTensor out(DistSpec(mesh, std::move(placements), global, s), local);
    if (ghosts) out.ghosts_ = std::make_shared<detail::GhostState>(detail::GhostState{*ghosts, true, local.version()});
    return out;
  }

 public:

  /// Distributes a full tensor. root < 0: every rank holds the same full tensor (each keeps its
  /// block, no communication). root >= 0: only `root` holds it (others may pass an empty
  /// tensor); blocks are scattered from root. Partial placements put the value on coordinate 0.
  /// Runs on `full`'s device; the result never shares memory with `full`.
  static DistTensor distribute(const Local& full, const DeviceMesh& mesh, std::vector<Placement> placements,
                               int root = -1, const ShardSizes& sizes = {}) {
    std::vector<index_t> gshape = to_vec(full.shape());
    if (detail::checking_collectives(full.device())) [[unlikely]]
      detail::CollectiveFingerprint("DistTensor::distribute").dtype(dtype_of<T>).field("root", root).mesh(mesh)
          .text("global shape", root < 0 ? fmt::format("{}", gshape) : "(from the root)")
          .field("placements", fmt::format("[{}]", fmt::join(placements, ", ")))
          .text("explicit sizes", detail::sizes_text(sizes)).agree(mesh);
    if (root >= 0) {
      SHARD_CHECK(root < mesh.size(), "DistTensor::distribute", "root {} out of range for {} ranks", root, mesh.size());
      mesh.comm()->broadcast(gshape.data(), Rank, DType::i64, root);
    }
    DistSpec target(mesh, std::move(placements), gshape, sizes);
    // Start from "replicated on root" (or everywhere) and let redistribute do the rest.
    std::vector<Placement> rep(static_cast<std::size_t>(mesh.ndim()), Replicate());
    DistSpec rep_spec(mesh, rep, gshape);
    if (root < 0) {
      auto block = detail::redistribute(rep_spec, as_block(full),
                                        target.with_placements(target.placements(), target.sizes()));
      Local local = owned(block, full);
      // Never alias the caller's tensor (nothing moved, e.g. Replicate): copy, on its device.
      if (local.data() == full.data()) local = full.to(full.device());
      return DistTensor(target, local);
    }
    // Scatter from root: root packs every rank's box (Partial dims: the value on coordinate 0).
    const auto& comm = mesh.comm();
    const int P = mesh.size();
    std::vector<index_t> sc(static_cast<std::size_t>(P), 0), sd(static_cast<std::size_t>(P), 0),
        rc(static_cast<std::size_t>(P), 0), rd(static_cast<std::size_t>(P), 0);
    std::vector<Placement> nonpartial = target.placements();
    for (auto& p : nonpartial)
      if (p.is_partial()) p = Replicate();
    DistSpec np(mesh, nonpartial, gshape, target.sizes());
    // Runs on the device of each rank's `full` (root: the tensor's; others: that of the possibly
    // empty tensor they pass): root packs on its device, the communicator gets that device's
    // context (null on the host).
    const Device dev = full.device();
    ExecContext* ctx = dev.is_cpu() ? nullptr : &current_context(dev);
    Block sendbuf;
    if (comm->rank() == root) {
      index_t tot = 0;
      for (int r = 0; r < P; ++r) tot += np.box_of(r).numel();
      sendbuf = Block::allocate(dtype_of<T>, dev, {tot});
      const Block src = as_block(full);
      index_t off = 0;
      for (int r = 0; r < P; ++r) {
        const Box b = np.box_of(r);
        sd[static_cast<std::size_t>(r)] = off;
        sc[static_cast<std::size_t>(r)] = b.numel();
        const Block dst = Block::view(dtype_of<T>, dev, static_cast<T*>(sendbuf.data) + off, b.len.data(), Rank,
                                      nullptr, sendbuf.owner);
        exec::box_copy(dst, exec::sub_box(src, b.lo, b.len), current_context(dev));
        off += b.numel();
      }
    }
    const Box mine = np.local_box();
    rc[static_cast<std::size_t>(root)] = mine.numel();
    Local out = Local::empty(from_vec(mine.len), dev);
    comm->alltoallv(sendbuf.data, sc, sd, out.data(), rc, rd, dtype_of<T>, ctx);
    auto block = detail::redistribute(np, as_block(out), target);
    return DistTensor(target, owned(block, out));
  }

  /// All zeros under the given placements (Partial dims hold zeros everywhere).
  static DistTensor zeros(const Shape<Rank>& global_shape, const DeviceMesh& mesh, std::vector<Placement> placements,
                          const ShardSizes& sizes = {}, Device dev = Device::cpu()) {
    if (detail::checking_collectives(dev)) [[unlikely]]
      layout_fingerprint("DistTensor::zeros", global_shape, mesh, placements, sizes).agree(mesh);
    DistSpec spec(mesh, std::move(placements), to_vec(global_shape), sizes);
    return DistTensor(spec, Local::zeros(from_vec(spec.local_box().len), dev));
  }
  /// Deterministic random tensor: the same seed gives the same global tensor at any rank count and
  /// any placements (Partial dims: the value on coordinate 0 for sum, on every rank otherwise).
  static DistTensor random(const Shape<Rank>& global_shape, const DeviceMesh& mesh, std::vector<Placement> placements,
                           std::uint64_t seed, RandomInit init = {}, const ShardSizes& sizes = {},
                           Device dev = Device::cpu()) {
    if (detail::checking_collectives(dev)) [[unlikely]]
      layout_fingerprint("DistTensor::random", global_shape, mesh, placements, sizes).field("seed", seed)
          .text("init", fmt::format("{} ({}, {})", init.kind == RandomInit::Kind::uniform ? "uniform" : "normal", init.a,
                                    init.b))
          .agree(mesh);
    DistSpec spec(mesh, std::move(placements), to_vec(global_shape), sizes);
    const Box b = spec.local_box();
    Local local = Local::empty(from_vec(b.len), dev);
    bool zero = false;
    for (int m = 0; m < mesh.ndim(); ++m)
      zero = zero || (spec.placement(m).is_partial() && spec.placement(m).op == ReduceOp::sum && mesh.coord(m) != 0);
    if (zero) local.fill(T(0));
    else local.fill_random(seed, from_vec(b.lo), global_shape, init);
    return DistTensor(spec, local);
  }

  // ------------------------------------------------------------------ accessors
  const DistSpec& spec() const { return spec_; }
  const DeviceMesh& mesh() const { return spec_.mesh(); }
  const std::vector<Placement>& placements() const { return spec_.placements(); }
  Shape<Rank> global_shape() const { return from_vec(spec_.global_shape()); }
  /// This rank's block.
  const Local& local() const { return local_; }
  /// Global offset of this rank's block.
  Shape<Rank> local_offset() const { return from_vec(spec_.local_box().lo); }
  /// Layout of tensor dim d.
  const ShardLayout& layout(int d) const { return spec_.layout(d); }
  Device device() const { return local_.device(); }
  /// The same distributed tensor with its local block copied to `dev` (this tensor when already there).
  DistTensor to(Device dev) const { return dev == device() ? *this : DistTensor(spec_, local_.to(dev)); }
  bool defined() const { return spec_.ndim() == Rank && Rank > 0 ? true : local_.data() != nullptr; }

  // ------------------------------------------------------------------ redistribution
  /// The same global tensor under other placements (and optionally explicit target sizes).
  /// Collective over the mesh; uses one collective per step (see redistribute.cpp).
  DistTensor redistribute(std::vector<Placement> placements, const ShardSizes& sizes = {}) const {
    // Checked before the target spec is built (its local validation could throw on one rank only).
    if (detail::checking_collectives(device())) [[unlikely]]
      detail::CollectiveFingerprint("redistribute").dtype(dtype_of<T>).spec(spec_)
          .field("target placements", fmt::format("[{}]", fmt::join(placements, ", ")))
          .text("target explicit sizes", detail::sizes_text(sizes)).agree(mesh());
    return redistribute_to(spec_.with_placements(std::move(placements), sizes), false);
  }
  /// The same global tensor under `target` (same mesh and global shape).
  DistTensor redistribute(const DistSpec& target) const { return redistribute_to(target, true); }
  /// The whole global tensor on every rank (collective).
  Local full_tensor() const {
    std::vector<Placement> rep(static_cast<std::size_t>(mesh().ndim()), Replicate());
    auto r = redistribute(rep);
    return r.local_;
  }

  /// The whole global tensor on mesh rank `root` only: a contiguous tensor of the global shape
  /// on this tensor's device there, an empty tensor on every other rank. Partial placements are
  /// reduced first. Memory: O(global) on the root, O(local) elsewhere (dist/gather.hpp).
  /// Collective over the mesh.
  Local gather_to(int root = 0) const {
    const Block b = detail::gather_to(spec_, as_block(local_), root);
    return mesh().comm()->rank() == root ? tensor_of<T, Rank>(b) : Local();
  }
  /// Distributes `full`, significant on mesh rank `root` only (others may pass an empty
  /// tensor), to `placements` (and explicit `sizes`): the inverse of gather_to, with O(global)
  /// memory on the root and O(local) elsewhere. The global shape comes from the root; the local
  /// blocks land on `dev`. Partial(sum) dims hold the value on coordinate 0, zeros elsewhere.
  /// Collective over the mesh.
  static DistTensor scatter_from(const Local& full, int root, const DeviceMesh& mesh, std::vector<Placement> placements,
                                 const ShardSizes& sizes = {}, Device dev = Device::cpu()) {
    if (detail::checking_collectives(dev)) [[unlikely]]
      detail::CollectiveFingerprint("DistTensor::scatter_from").dtype(dtype_of<T>).field("root", root).mesh(mesh)
          .field("placements", fmt::format("[{}]", fmt::join(placements, ", ")))
          .text("explicit sizes", detail::sizes_text(sizes)).agree(mesh);
    SHARD_CHECK(root >= 0 && root < mesh.size(), "scatter_from", "root {} out of range for a mesh of {} ranks", root,
                mesh.size());
    std::vector<index_t> gshape = to_vec(full.shape());
    mesh.comm()->broadcast(gshape.data(), Rank, DType::i64, root);
    DistSpec spec(mesh, std::move(placements), gshape, sizes);
    const Block b = detail::scatter_from(spec, mesh.comm()->rank() == root ? as_block(full) : Block{}, root,
                                         dtype_of<T>, dev);
    return DistTensor(spec, tensor_of<T, Rank>(b));
  }

  // ------------------------------------------------------------------ helpers (public for ops)
  static std::vector<index_t> to_vec(const Shape<Rank>& s) { return std::vector<index_t>(s.begin(), s.end()); }
  static Shape<Rank> from_vec(const std::vector<index_t>& v) {
    Shape<Rank> s{};
    for (int d = 0; d < Rank; ++d) s[static_cast<std::size_t>(d)] = v[static_cast<std::size_t>(d)];
    return s;
  }

 private:
  /// The tensor viewing block `b` (on `in`'s device); `in` itself when `b` is its very view.
  static Local owned(const Block& b, const Local& in) {
    if (b.data == in.data() && b.shape_vec() == to_vec(in.shape()) && b.strides_vec() == to_vec(in.strides()))
      return in;
    return tensor_of<T, Rank>(b);
  }

  /// redistribute to `target`; `check`: the collective consistency check in detail::redistribute.
  DistTensor redistribute_to(const DistSpec& target, bool check) const {
    // Runs on the local block's own device (detail::redistribute allocates, packs and
    // communicates there).
    auto block = detail::redistribute(spec_, as_block(local_), target, check);
    return DistTensor(target, owned(block, local_));
  }
  /// The fingerprint of a constructor's layout arguments (before they are validated).
  static detail::CollectiveFingerprint layout_fingerprint(const char* op, const Shape<Rank>& global_shape,
                                                          const DeviceMesh& mesh,
                                                          const std::vector<Placement>& placements,
                                                          const ShardSizes& sizes) {
    detail::CollectiveFingerprint f(op);
    f.dtype(dtype_of<T>).field("global shape", global_shape).mesh(mesh);
    f.text("placements", fmt::format("[{}]", fmt::join(placements, ", "))).text("explicit sizes", detail::sizes_text(sizes));
    return f;
  }

  DistSpec spec_;
  Local local_;
  std::shared_ptr<detail::GhostState> ghosts_;  ///< declared ghost layers (from_local), shared by copies
};

/// Declares that this rank's block of `t` was modified through a pointer shardtensor does not see
/// (see Tensor::bump_version): a backward that saved it then throws on every rank.
template <class T, int Rank>
void mark_modified(const DistTensor<T, Rank>& t) noexcept {
  t.local().bump_version();
}

}  // namespace shard
