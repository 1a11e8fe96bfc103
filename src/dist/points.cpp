// Point sets, box partitions and the sparse row exchange (include/shardtensor/dist/points.hpp).
#include "shardtensor/dist/points.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "shardtensor/exec/box.hpp"
#include "shardtensor/exec/points.hpp"
#include "shardtensor/exec/rows.hpp"
#include "shardtensor/runtime/memory.hpp"
#include "dist/point_util.hpp"

namespace shard {

// ------------------------------------------------------------------------------ point sets

std::vector<Placement> point_placements(const DeviceMesh& mesh) {
  return std::vector<Placement>(static_cast<std::size_t>(mesh.ndim()), Shard(0));
}

DistSpec point_spec(const DeviceMesh& mesh, std::span<const index_t> counts, index_t dim) {
  const char* op = "point_spec";
  SHARD_CHECK(static_cast<int>(counts.size()) == mesh.size(), op, "{} counts for a mesh of {} ranks", counts.size(),
              mesh.size());
  SHARD_CHECK(dim >= 1, op, "point dimension must be >= 1, got {}", dim);
  index_t n = 0;
  for (index_t c : counts) {
    SHARD_CHECK(c >= 0, op, "negative point count {}", c);
    n += c;
  }
  ShardSizes sizes(2);
  sizes[0].assign(counts.begin(), counts.end());
  return DistSpec(mesh, point_placements(mesh), {n, dim}, sizes);
}

void check_point_set(const DistSpec& s, const char* op, const char* what) {
  SHARD_CHECK(s.ndim() == 2, op, "{} must be a [N, D] point set, got rank {} ({})", what, s.ndim(), s);
  SHARD_CHECK(!s.has_partial(), op, "{} must not be Partial ({})", what, s);
  SHARD_CHECK(s.sharding_mesh_dims(1).empty(), op, "{}: the coordinate / feature dim 1 must not be sharded ({})", what,
              s);
  detail::check_rows_sharded_over_mesh(s, op, what);
}

void detail::check_rows_sharded_over_mesh(const DistSpec& s, const char* op, const char* what) {
  const auto& m = s.mesh();
  std::vector<int> want;
  for (int d = 0; d < m.ndim(); ++d)
    if (m.size(d) > 1) want.push_back(d);
  std::vector<int> have;
  for (int d : s.sharding_mesh_dims(0))
    if (m.size(d) > 1) have.push_back(d);
  SHARD_CHECK(have == want, op,
              "{} must have its rows (dim 0) sharded over every mesh dim in ascending order "
              "(point_placements(mesh)), got {}",
              what, s);
}

index_t point_offset(const DistSpec& s, int r) {
  const auto& m = s.mesh();
  SHARD_CHECK(r >= 0 && r <= m.size(), "point_offset", "rank {} outside [0, {}]", r, m.size());
  if (r == m.size()) return s.global_shape()[0];
  return s.box_of(r).lo[0];
}

std::vector<index_t> point_counts(const DistSpec& s) {
  std::vector<index_t> c(static_cast<std::size_t>(s.mesh().size()));
  for (int r = 0; r < s.mesh().size(); ++r) c[static_cast<std::size_t>(r)] = s.box_of(r).len[0];
  return c;
}

DistSpec point_rows_spec(const DistSpec& rows, const std::vector<index_t>& trailing) {
  std::vector<index_t> g{rows.global_shape()[0]};
  g.insert(g.end(), trailing.begin(), trailing.end());
  ShardSizes sizes(g.size());
  sizes[0] = point_counts(rows);
  return DistSpec(rows.mesh(), point_placements(rows.mesh()), g, sizes);
}

// ------------------------------------------------------------------------------ box partitions

BoxPartition::BoxPartition(DeviceMesh mesh, std::vector<std::vector<double>> cuts, std::vector<int> mesh_dims)
    : mesh_(std::move(mesh)), cuts_(std::move(cuts)), mesh_dims_(std::move(mesh_dims)) {
  const char* op = "BoxPartition";
  SHARD_CHECK(!cuts_.empty(), op, "at least one coordinate dim");
  SHARD_CHECK(cuts_.size() == mesh_dims_.size(), op, "{} cut lists but {} mesh dims", cuts_.size(), mesh_dims_.size());
  std::vector<int> used(static_cast<std::size_t>(mesh_.ndim()), 0);
  for (std::size_t d = 0; d < cuts_.size(); ++d) {
    const int m = mesh_dims_[d];
    SHARD_CHECK(m >= -1 && m < mesh_.ndim(), op, "coordinate dim {}: mesh dim {} outside [-1, {})", d, m, mesh_.ndim());
    const std::size_t slabs = m < 0 ? 1 : static_cast<std::size_t>(mesh_.size(m));
    SHARD_CHECK(cuts_[d].size() == slabs + 1, op, "coordinate dim {}: {} cuts for {} slabs (need {})", d,
                cuts_[d].size(), slabs, slabs + 1);
    for (std::size_t k = 0; k + 1 < cuts_[d].size(); ++k)
      SHARD_CHECK(std::isfinite(cuts_[d][k]) && std::isfinite(cuts_[d][k + 1]) && cuts_[d][k] <= cuts_[d][k + 1], op,
                  "coordinate dim {}: cuts must be finite and ascending, got {}", d, fmt::join(cuts_[d], ", "));
    SHARD_CHECK(cuts_[d].front() < cuts_[d].back(), op, "coordinate dim {}: empty domain [{}, {}]", d,
                cuts_[d].front(), cuts_[d].back());
    if (m >= 0) {
      SHARD_CHECK(used[static_cast<std::size_t>(m)] == 0, op, "mesh dim {} splits two coordinate dims", m);
      used[static_cast<std::size_t>(m)] = 1;
    }
  }
  for (int m = 0; m < mesh_.ndim(); ++m)
    SHARD_CHECK(used[static_cast<std::size_t>(m)] || mesh_.size(m) == 1, op,
                "mesh dim {} (size {}) splits no coordinate dim: every rank needs its own box", m, mesh_.size(m));
  // Per-rank boxes and the mesh's row-major strides, so owner / lo / hi / distances allocate nothing
  // (they run once per point in the partition checks and the halo selection).
  const int P = mesh_.size(), D = dim();
  stride_.assign(static_cast<std::size_t>(mesh_.ndim()), 1);
  for (int m = mesh_.ndim() - 2; m >= 0; --m)
    stride_[static_cast<std::size_t>(m)] = stride_[static_cast<std::size_t>(m) + 1] * mesh_.size(m + 1);
  box_.resize(static_cast<std::size_t>(P) * static_cast<std::size_t>(D) * 2);
  for (int r = 0; r < P; ++r) {
    const auto c = mesh_.coords_of(r);
    for (int d = 0; d < D; ++d) {
      const int m = mesh_dims_[static_cast<std::size_t>(d)];
      const std::size_t k = m < 0 ? 0 : static_cast<std::size_t>(c[static_cast<std::size_t>(m)]);
      const std::size_t at = (static_cast<std::size_t>(r) * static_cast<std::size_t>(D) + static_cast<std::size_t>(d)) * 2;
      box_[at] = cuts_[static_cast<std::size_t>(d)][k];
      box_[at + 1] = cuts_[static_cast<std::size_t>(d)][k + 1];
    }
  }
}

BoxPartition BoxPartition::uniform(const DeviceMesh& mesh, std::vector<double> lo, std::vector<double> hi,
                                   std::vector<int> mesh_dims) {
  SHARD_CHECK(lo.size() == hi.size() && lo.size() == mesh_dims.size(), "BoxPartition::uniform",
              "lo ({}), hi ({}) and mesh_dims ({}) must have one entry per coordinate dim", lo.size(), hi.size(),
              mesh_dims.size());
  std::vector<std::vector<double>> cuts(lo.size());
  for (std::size_t d = 0; d < lo.size(); ++d) {
    const int m = mesh_dims[d];
    const int n = (m >= 0 && m < mesh.ndim()) ? mesh.size(m) : 1;
    cuts[d].resize(static_cast<std::size_t>(n) + 1);
    for (int k = 0; k <= n; ++k) cuts[d][static_cast<std::size_t>(k)] = lo[d] + (hi[d] - lo[d]) * k / n;
    cuts[d].back() = hi[d];
  }
  return BoxPartition(mesh, std::move(cuts), std::move(mesh_dims));
}

BoxPartition BoxPartition::of_grid(const DistSpec& grid, std::vector<int> grid_dims, std::vector<double> lo,
                                   std::vector<double> hi) {
  const char* op = "BoxPartition::of_grid";
  SHARD_CHECK(lo.size() == hi.size() && lo.size() == grid_dims.size(), op,
              "lo ({}), hi ({}) and grid_dims ({}) must have one entry per coordinate dim", lo.size(), hi.size(),
              grid_dims.size());
  SHARD_CHECK(!grid.has_partial(), op, "the grid must not be Partial ({})", grid);
  std::vector<std::vector<double>> cuts(lo.size());
  std::vector<int> mdims(lo.size(), -1);
  std::vector<int> covered(static_cast<std::size_t>(grid.mesh().ndim()), 0);
  for (std::size_t d = 0; d < lo.size(); ++d) {
    const int gd = grid_dims[d];
    SHARD_CHECK(gd >= 0 && gd < grid.ndim(), op, "grid dim {} outside [0, {})", gd, grid.ndim());
    SHARD_CHECK(lo[d] < hi[d], op, "coordinate dim {}: empty domain [{}, {}]", d, lo[d], hi[d]);
    const auto& sm = grid.sharding_mesh_dims(gd);
    std::vector<int> big;
    for (int m : sm)
      if (grid.mesh().size(m) > 1) big.push_back(m);
    SHARD_CHECK(big.size() <= 1, op, "grid dim {} is sharded by {} mesh dims; a box partition needs at most one", gd,
                big.size());
    const index_t n = grid.global_shape()[static_cast<std::size_t>(gd)];
    SHARD_CHECK(n >= 1, op, "grid dim {} is empty", gd);
    const double h = (hi[d] - lo[d]) / static_cast<double>(n);
    if (big.empty()) {
      cuts[d] = {lo[d], hi[d]};
      continue;
    }
    const int m = big[0];
    mdims[d] = m;
    covered[static_cast<std::size_t>(m)] = 1;
    const auto& layout = grid.layout(gd);
    const int parts = grid.mesh().size(m);
    cuts[d].resize(static_cast<std::size_t>(parts) + 1);
    for (int k = 0; k < parts; ++k) cuts[d][static_cast<std::size_t>(k)] = lo[d] + h * static_cast<double>(layout.offset(k));
    cuts[d][0] = lo[d];
    cuts[d].back() = hi[d];
  }
  for (int m = 0; m < grid.mesh().ndim(); ++m)
    SHARD_CHECK(covered[static_cast<std::size_t>(m)] || grid.mesh().size(m) == 1, op,
                "mesh dim {} does not shard any of the grid dims {}: the grid is not a spatial decomposition", m,
                fmt::join(grid_dims, ", "));
  return BoxPartition(grid.mesh(), std::move(cuts), std::move(mdims));
}

double BoxPartition::lo(int r, int d) const {
  return box_[(static_cast<std::size_t>(r) * static_cast<std::size_t>(dim()) + static_cast<std::size_t>(d)) * 2];
}
double BoxPartition::hi(int r, int d) const {
  return box_[(static_cast<std::size_t>(r) * static_cast<std::size_t>(dim()) + static_cast<std::size_t>(d)) * 2 + 1];
}

int BoxPartition::owner(const double* p) const {
  int rank = 0;
  for (int d = 0; d < dim(); ++d) {
    const auto& c = cuts_[static_cast<std::size_t>(d)];
    const double x = p[d];
    if (!(x >= c.front() && x <= c.back())) return -1;  // outside, or NaN
    // the slab k with c[k] <= x < c[k+1]; the last slab also takes x == hi (and, when trailing
    // slabs are empty, the last non-empty one does)
    auto it = std::upper_bound(c.begin(), c.end(), x);
    int k = static_cast<int>(it - c.begin()) - 1;
    const int last = static_cast<int>(c.size()) - 2;
    if (k > last) k = last;
    while (k > 0 && c[static_cast<std::size_t>(k)] == c[static_cast<std::size_t>(k) + 1] && x == c.back()) --k;
    const int m = mesh_dims_[static_cast<std::size_t>(d)];
    if (m >= 0) rank += k * stride_[static_cast<std::size_t>(m)];
  }
  return rank;
}

bool BoxPartition::contains(int r, const double* p) const { return owner(p) == r; }

double BoxPartition::dist2_to_box(int r, const double* p) const {
  double s = 0;
  for (int d = 0; d < dim(); ++d) {
    const double l = lo(r, d), h = hi(r, d), x = p[d];
    const double e = x < l ? l - x : (x > h ? x - h : 0.0);
    s += e * e;
  }
  return s;
}

double BoxPartition::box_dist2(int a, int b) const {
  double s = 0;
  for (int d = 0; d < dim(); ++d) {
    const double gap = std::max({0.0, lo(b, d) - hi(a, d), lo(a, d) - hi(b, d)});
    s += gap * gap;
  }
  return s;
}

bool operator==(const BoxPartition& a, const BoxPartition& b) {
  return a.mesh_ == b.mesh_ && a.cuts_ == b.cuts_ && a.mesh_dims_ == b.mesh_dims_;
}

void detail::check_points_against(const DistSpec& spec, const Block& points, const BoxPartition& part,
                                  const char* op) {
  check_point_set(spec, op, "points");
  SHARD_CHECK(spec.mesh() == part.mesh(), op, "the point set and the box partition live on different meshes: {}",
              mesh_mismatch(spec.mesh(), part.mesh()));
  const index_t D = spec.global_shape()[1];
  SHARD_CHECK(D == part.dim(), op, "points have {} coordinates but the partition has {} dims", D, part.dim());
  SHARD_CHECK(points.dtype == DType::f32 || points.dtype == DType::f64, op, "points must be f32 or f64, got {}",
              points.dtype);
  const index_t n = spec.local_box().len[0];
  SHARD_CHECK(points.is_contiguous() && points.numel() == n * D, op, "points block {} does not match {}",
              points.shape_vec(), spec);
}

void detail::agree_none_bad(const CommPtr& comm, std::int64_t bad, const char* op, const char* what,
                            const char* unit) {
  const auto all = comm->allgather_value(bad);
  std::string msg;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] > 0) msg += fmt::format("{}rank {}: {} {}", msg.empty() ? "" : "; ", r, all[r], unit);
  SHARD_CHECK(msg.empty(), op, "{}: {}", what, msg);
}

Block detail::index_block(std::span<const index_t> v, ExecContext& ctx) {
  const index_t n = static_cast<index_t>(v.size());
  Block host = Block::view(DType::i64, Device::cpu(), const_cast<index_t*>(v.data()), &n, 1);
  if (ctx.device().is_cpu()) return host;
  Block dev = Block::allocate(DType::i64, ctx.device(), &n, 1);
  exec::box_copy(dev, host, ctx);
  return dev;
}

std::vector<index_t> detail::point_owners(const BoxPartition& part, const Block& points, const Block* owner,
                                          ExecContext& ctx) {
  exec::PointBoxPartition flat;
  flat.ranks = part.mesh().size();
  const int D = part.dim();
  std::vector<index_t> mesh_stride(static_cast<std::size_t>(part.mesh().ndim()), 1);
  for (int m = part.mesh().ndim() - 2; m >= 0; --m)
    mesh_stride[static_cast<std::size_t>(m)] = mesh_stride[static_cast<std::size_t>(m) + 1] * part.mesh().size(m + 1);
  flat.offsets.push_back(0);
  for (int d = 0; d < D; ++d) {
    const auto& c = part.cuts()[static_cast<std::size_t>(d)];
    flat.cuts.insert(flat.cuts.end(), c.begin(), c.end());
    flat.offsets.push_back(static_cast<index_t>(flat.cuts.size()));
    const int m = part.mesh_dims()[static_cast<std::size_t>(d)];
    flat.strides.push_back(m < 0 ? 0 : mesh_stride[static_cast<std::size_t>(m)]);
  }
  const index_t nc = flat.ranks + 1;
  std::vector<index_t> counts(static_cast<std::size_t>(nc));
  const Block host = Block::view(DType::i64, Device::cpu(), counts.data(), &nc, 1);
  const index_t n = points.numel() / D, shape[2] = {n, D};
  const Block pts = Block::view(points.dtype, points.device, points.data, shape, 2, nullptr, points.owner);
  if (ctx.device().is_cpu()) {
    exec::points_owner(flat, pts, owner, host, ctx);
    return counts;
  }
  const Block dev = Block::allocate(DType::i64, ctx.device(), &nc, 1);
  exec::points_owner(flat, pts, owner, dev, ctx);
  exec::box_copy(host, dev, ctx);
  ctx.synchronize();
  return counts;
}

void check_in_partition(const DistSpec& spec, const Block& points, const BoxPartition& part, const char* op) {
  detail::check_points_against(spec, points, part, op);
  const int me = spec.mesh().rank();
  const auto counts = detail::point_owners(part, points, nullptr, current_context(points.device));
  const std::int64_t outside = spec.local_box().len[0] - counts[static_cast<std::size_t>(me)];
  detail::agree_none_bad(spec.mesh().comm(), outside, op, "points outside their rank's partition box (or NaN)",
                         "point(s)");
}

// ------------------------------------------------------------------------------ row exchange

namespace detail {

RowExchange::RowExchange(CommPtr comm, index_t n_src, std::vector<index_t> send_offsets, std::vector<index_t> send_rows)
    : comm_(std::move(comm)), n_src_(n_src), send_offsets_(std::move(send_offsets)), send_rows_(std::move(send_rows)) {
  const char* op = "RowExchange";
  SHARD_CHECK(comm_ != nullptr, op, "null communicator");
  const int P = comm_->size();
  SHARD_CHECK(static_cast<int>(send_offsets_.size()) == P + 1 && send_offsets_.front() == 0 &&
                  send_offsets_.back() == static_cast<index_t>(send_rows_.size()),
              op, "send_offsets must have {} entries from 0 to {} (got {})", P + 1, send_rows_.size(),
              send_offsets_.size());
  for (int p = 0; p < P; ++p)
    SHARD_CHECK(send_offsets_[static_cast<std::size_t>(p) + 1] >= send_offsets_[static_cast<std::size_t>(p)], op,
                "send_offsets must be ascending");
  for (index_t r : send_rows_) SHARD_CHECK(r >= 0 && r < n_src_, op, "send row {} outside [0, {})", r, n_src_);
  init(op);
}

RowExchange RowExchange::with_rows_block(CommPtr comm, index_t n_src, std::vector<index_t> send_offsets,
                                         Block send_rows) {
  RowExchange x;
  x.comm_ = std::move(comm);
  x.n_src_ = n_src;
  x.send_offsets_ = std::move(send_offsets);
  x.send_rows_block_ = std::move(send_rows);
  x.init_rows_block();
  return x;
}

void RowExchange::init_rows_block() {
  const char* op = "RowExchange";
  SHARD_CHECK(send_rows_block_.dtype == DType::i64 && send_rows_block_.rank == 1 && send_rows_block_.is_contiguous() &&
                  !send_offsets_.empty() && send_rows_block_.numel() == send_offsets_.back(),
              op, "send rows must be a contiguous i64 block of the {} rows send_offsets ends at (got {} {})",
              send_offsets_.empty() ? 0 : send_offsets_.back(), send_rows_block_.dtype, send_rows_block_.shape_vec());
  if (send_rows_block_.device.is_cpu()) {
    const auto* r = static_cast<const index_t*>(send_rows_block_.data);
    send_rows_.assign(r, r + send_rows_block_.numel());
  }
  init(op);
}

void RowExchange::init(const char* op) {
  SHARD_CHECK(comm_ != nullptr, op, "null communicator");
  const int P = comm_->size();
  SHARD_CHECK(static_cast<int>(send_offsets_.size()) == P + 1 && send_offsets_.front() == 0, op,
              "send_offsets must have {} entries from 0 to {} (got {})", P + 1, n_send(), send_offsets_.size());
  send_counts_.resize(static_cast<std::size_t>(P));
  for (int p = 0; p < P; ++p) {
    const auto u = static_cast<std::size_t>(p);
    send_counts_[u] = send_offsets_[u + 1] - send_offsets_[u];
    SHARD_CHECK(send_counts_[u] >= 0, op, "send_offsets must be ascending");
  }
  recv_counts_.resize(static_cast<std::size_t>(P));
  comm_->alltoall(send_counts_.data(), recv_counts_.data(), 1, DType::i64);
  recv_offsets_.assign(static_cast<std::size_t>(P) + 1, 0);
  for (int p = 0; p < P; ++p)
    recv_offsets_[static_cast<std::size_t>(p) + 1] = recv_offsets_[static_cast<std::size_t>(p)] + recv_counts_[static_cast<std::size_t>(p)];
}

Block RowExchange::rows_on(ExecContext& ctx) const {
  if (send_rows_block_.data != nullptr && send_rows_block_.device == ctx.device()) return send_rows_block_;
  if (!send_rows_block_.device.is_cpu() && send_rows_block_.data != nullptr) {
    Block b = Block::allocate(DType::i64, ctx.device(), send_rows_block_.shape.data(), 1);
    exec::box_copy(b, send_rows_block_, ctx);
    return b;
  }
  return index_block(send_rows_, ctx);
}

index_t RowExchange::n_send_remote() const {
  const auto me = static_cast<std::size_t>(comm_->rank());
  return n_send() - send_counts_[me];
}

namespace {

index_t row_width(const char* op, const char* what, const Block& b, index_t rows) {
  SHARD_CHECK(b.rank == 1 || b.rank == 2, op, "{} must be [rows] or [rows, width], got {}", what, b.shape_vec());
  SHARD_CHECK(b.shape[0] == rows, op, "{} has {} rows, expected {}", what, b.shape[0], rows);
  SHARD_CHECK(b.is_contiguous(), op, "{} must be contiguous", what);
  return b.rank == 2 ? b.shape[1] : 1;
}

std::vector<index_t> scaled(std::span<const index_t> v, index_t w) {
  std::vector<index_t> out(v.begin(), v.end());
  for (auto& x : out) x *= w;
  return out;
}

}  // namespace

void RowExchange::forward(const Block& src, const Block& dst, ExecContext& ctx) const {
  const char* op = "RowExchange::forward";
  const index_t w = row_width(op, "src", src, n_src_);
  SHARD_CHECK(row_width(op, "dst", dst, n_recv()) == w && dst.dtype == src.dtype, op,
              "dst {} {} does not match src {} {}", dst.dtype, dst.shape_vec(), src.dtype, src.shape_vec());
  const index_t ns = n_send();
  index_t shape[2] = {ns, w};
  Block send = Block::allocate(src.dtype, ctx.device(), shape, 2);
  const Block idx = rows_on(ctx);
  exec::RowsGeometry g{n_src_, ns, w};
  Block src2 = src;
  if (src2.rank == 1) src2 = Block::view(src.dtype, src.device, src.data, std::array<index_t, 2>{n_src_, 1}.data(), 2, nullptr, src.owner);
  exec::rows_gather(g, src2, idx, send, ctx);
  const auto sc = scaled(send_counts_, w), so = scaled(std::span<const index_t>(send_offsets_).first(send_counts_.size()), w);
  const auto rc = scaled(recv_counts_, w), ro = scaled(std::span<const index_t>(recv_offsets_).first(recv_counts_.size()), w);
  comm_->alltoallv(send.data, sc, so, dst.data, rc, ro, src.dtype, ctx.device().is_cpu() ? nullptr : &ctx);
  shard::detail::bump_version(dst.owner);
}

Block RowExchange::forward(const Block& src, ExecContext& ctx) const {
  const index_t w = row_width("RowExchange::forward", "src", src, n_src_);
  index_t shape[2] = {n_recv(), w};
  Block dst = Block::allocate(src.dtype, ctx.device(), shape, src.rank);
  if (src.rank == 1) dst = Block::allocate(src.dtype, ctx.device(), shape, 1);
  forward(src, dst, ctx);
  return dst;
}

void RowExchange::adjoint_add(const Block& g_recv, const Block& g_src, ExecContext& ctx) const {
  const char* op = "RowExchange::adjoint_add";
  const index_t w = row_width(op, "g_recv", g_recv, n_recv());
  SHARD_CHECK(row_width(op, "g_src", g_src, n_src_) == w && g_src.dtype == g_recv.dtype, op,
              "g_src {} {} does not match g_recv {} {}", g_src.dtype, g_src.shape_vec(), g_recv.dtype,
              g_recv.shape_vec());
  const index_t ns = n_send();
  index_t shape[2] = {ns, w};
  Block back = Block::allocate(g_recv.dtype, ctx.device(), shape, 2);
  const auto sc = scaled(send_counts_, w), so = scaled(std::span<const index_t>(send_offsets_).first(send_counts_.size()), w);
  const auto rc = scaled(recv_counts_, w), ro = scaled(std::span<const index_t>(recv_offsets_).first(recv_counts_.size()), w);
  comm_->alltoallv(g_recv.data, rc, ro, back.data, sc, so, g_recv.dtype, ctx.device().is_cpu() ? nullptr : &ctx);
  const Block idx = rows_on(ctx);
  Block dst = g_src;
  if (dst.rank == 1) dst = Block::view(g_src.dtype, g_src.device, g_src.data, std::array<index_t, 2>{n_src_, 1}.data(), 2, nullptr, g_src.owner);
  exec::rows_scatter_add(exec::RowsGeometry{n_src_, ns, w}, back, idx, dst, ctx);
}

}  // namespace detail
}  // namespace shard
