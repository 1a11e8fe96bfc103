// Distributed neighbour queries (include/shardtensor/dist/points.hpp, issue 17 step 2): kNN and
// radius search of a sharded query set against a sharded support set, bit-identical to the
// unsharded exec::neighbors_knn / neighbors_radius on the whole sets.
//
// Both strategies reduce to the local family (exec/neighbors.hpp): search a set of candidate
// support points, report (d2, global index) lists, merge lists of disjoint candidate sets with
// neighbors_merge. The result is exact because (a) the kernel computes d2 the same way for the same
// (query, support) pair on every rank, (b) the answer of a query is the first `width` entries of
// ALL support points in (d2, global index) order, and the merge of the lists of disjoint subsets
// keeps exactly that order, and (c) every support point that can be in a query's answer is a
// candidate on the query's rank:
//  - ring: every support shard visits every rank (P - 1 split-phase shifts over the flattened
//    ring of all mesh dims), searched with index_offset = the shard's global row offset;
//  - spatial_halo: rank s receives every support point within the query bound of its box (radius:
//    r; kNN: the k-th distance its local search established, see knn_halo_exchange and halo_query).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "dist/point_util.hpp"
#include "shardtensor/dist/consistency.hpp"
#include "shardtensor/dist/dist_spec.hpp"
#include "shardtensor/dist/points.hpp"
#include "shardtensor/dist/ring.hpp"
#include "shardtensor/exec/box.hpp"
#include "shardtensor/exec/points.hpp"
#include "shardtensor/exec/rows.hpp"
#include "shardtensor/tensor/tensor_block.hpp"

namespace shard {

namespace {

/// What is asked: kNN (width = k) or radius (width = max_neighbours).
struct QueryKind {
  bool knn = true;
  index_t width = 1;
  double radius = 0;
};

/// The running neighbour lists of this rank's queries and a scratch set for one candidate search.
template <class T>
struct Lists {
  Tensor<std::int64_t, 2> idx, cidx;
  Tensor<T, 2> d2, cd2;
  Tensor<std::int64_t, 1> cnt, ccnt;
  bool empty = true;  ///< nothing searched yet: the first search writes the running lists directly
};

template <class T>
Lists<T> make_lists(index_t nq, index_t w, Device dev) {
  Lists<T> l;
  l.idx = Tensor<std::int64_t, 2>::empty({nq, w}, dev);
  l.cidx = Tensor<std::int64_t, 2>::empty({nq, w}, dev);
  l.d2 = Tensor<T, 2>::empty({nq, w}, dev);
  l.cd2 = Tensor<T, 2>::empty({nq, w}, dev);
  l.cnt = Tensor<std::int64_t, 1>::empty({nq}, dev);
  l.ccnt = Tensor<std::int64_t, 1>::empty({nq}, dev);
  return l;
}

/// Searches the candidate points `cand` ([n, D], contiguous, on ctx's device) for every query and
/// reports indices row + offset. Into the running lists if nothing was searched yet, else into the
/// scratch lists (merge_candidates merges them).
template <class T>
void search_candidates(const QueryKind& qk, exec::NeighborMethod method, const Tensor<T, 2>& query,
                       const Tensor<T, 2>& cand, index_t offset, Lists<T>& l, bool into_running, ExecContext& ctx) {
  const index_t nq = query.shape()[0], D = query.shape()[1];
  const Block q = as_block(query), s = as_block(cand);
  const Block idx = as_block(into_running ? l.idx : l.cidx), d2 = as_block(into_running ? l.d2 : l.cd2);
  if (qk.knn) {
    exec::KnnGeometry g{nq, cand.shape()[0], static_cast<int>(D), qk.width, offset, method};
    exec::neighbors_knn(g, q, s, idx, d2, ctx);
  } else {
    exec::RadiusGeometry g{nq, cand.shape()[0], static_cast<int>(D), qk.radius, qk.width, offset, method};
    exec::neighbors_radius(g, q, s, idx, d2, as_block(into_running ? l.cnt : l.ccnt), ctx);
  }
}

/// Running lists <- merge(running, scratch).
template <class T>
void merge_candidates(const QueryKind& qk, Lists<T>& l, ExecContext& ctx) {
  const exec::NeighborMergeGeometry g{l.idx.shape()[0], qk.width};
  const Block cnt = as_block(l.cnt), ccnt = as_block(l.ccnt);
  exec::neighbors_merge(g, as_block(l.idx), as_block(l.d2), qk.knn ? nullptr : &cnt, as_block(l.cidx), as_block(l.cd2),
                        qk.knn ? nullptr : &ccnt, ctx);
}

/// Searches `cand` and folds its candidates into the running lists.
template <class T>
void add_candidates(const QueryKind& qk, exec::NeighborMethod method, const Tensor<T, 2>& query,
                    const Tensor<T, 2>& cand, index_t offset, Lists<T>& l, ExecContext& ctx) {
  const bool first = l.empty;
  search_candidates(qk, method, query, cand, offset, l, first, ctx);
  if (!first) merge_candidates(qk, l, ctx);
  l.empty = false;
}

// ------------------------------------------------------------------------------ checks

/// Every precondition, on every rank, before the query's first collective: spec-only checks
/// (the same outcome everywhere), then one allgather of per-rank flags (points with a NaN
/// coordinate, counted on the blocks' device; devices),
/// then (spatial_halo) the partition checks, collective themselves. Returns the strategy to run.
template <class T>
NeighborStrategy check_query(const char* op, const DistTensor<T, 2>& query, const DistTensor<T, 2>& support,
                             const NeighborQueryOptions& opts) {
  check_point_set(query.spec(), op, "the query set");
  check_point_set(support.spec(), op, "the support set");
  SHARD_CHECK(query.mesh() == support.mesh(), op, "query and support sets live on different meshes: {}",
              mesh_mismatch(query.mesh(), support.mesh()));
  const index_t D = query.spec().global_shape()[1];
  SHARD_CHECK(support.spec().global_shape()[1] == D, op,
              "query points have {} coordinates but support points have {} (query {}, support {})", D,
              support.spec().global_shape()[1], query.spec(), support.spec());
  SHARD_CHECK(D <= std::numeric_limits<int>::max(), op, "{} coordinates per point is too many", D);
  NeighborStrategy strat = opts.strategy;
  if (strat == NeighborStrategy::automatic)
    strat = opts.partition != nullptr ? NeighborStrategy::spatial_halo : NeighborStrategy::ring;
  SHARD_CHECK(strat != NeighborStrategy::spatial_halo || opts.partition != nullptr, op,
              "the spatial_halo strategy needs the box partition both point sets lie in (opts.partition)");
  if (strat == NeighborStrategy::spatial_halo) {
    const BoxPartition& part = *opts.partition;
    SHARD_CHECK(part.mesh() == query.mesh(), op, "the box partition and the point sets live on different meshes: {}",
                mesh_mismatch(part.mesh(), query.mesh()));
    SHARD_CHECK(part.dim() == D, op, "points have {} coordinates but the partition has {} dims", D, part.dim());
  }

  // data and device checks: one allgather, every rank decides from every rank's flags
  struct Flags {
    std::int64_t nan_query = 0, nan_support = 0;
    std::int32_t query_dev = 0, support_dev = 0;  // DeviceKind * 65536 + index
  };
  // points with a NaN coordinate, counted on the blocks' device (exec::points_owner against a
  // partition whose only box is all of R^D: only NaN falls outside); one count reaches the host
  auto count_nan = [D](const Tensor<T, 2>& t) {
    exec::PointBoxPartition all;
    all.ranks = 1;
    all.offsets.push_back(0);
    for (index_t d = 0; d < D; ++d) {
      all.cuts.push_back(-std::numeric_limits<double>::infinity());
      all.cuts.push_back(std::numeric_limits<double>::infinity());
      all.offsets.push_back(static_cast<index_t>(all.cuts.size()));
      all.strides.push_back(0);
    }
    const Tensor<T, 2> c = t.contiguous();
    if (D == 0 || c.shape()[0] == 0) return std::int64_t{0};
    ExecContext& ctx = current_context(c.device());
    index_t counts[2] = {0, 0};
    const index_t two = 2;
    const Block host = Block::view(DType::i64, Device::cpu(), counts, &two, 1);
    if (ctx.device().is_cpu()) {
      exec::points_owner(all, as_block(c), nullptr, host, ctx);
    } else {
      const Block dev = Block::allocate(DType::i64, ctx.device(), &two, 1);
      exec::points_owner(all, as_block(c), nullptr, dev, ctx);
      exec::box_copy(host, dev, ctx);
      ctx.synchronize();
    }
    return static_cast<std::int64_t>(counts[1]);
  };
  auto dev_code = [](Device d) { return static_cast<std::int32_t>(d.kind) * 65536 + d.index; };
  Flags mine;
  mine.nan_query = count_nan(query.local());
  mine.nan_support = count_nan(support.local());
  mine.query_dev = dev_code(query.device());
  mine.support_dev = dev_code(support.device());
  const auto all = query.mesh().comm()->allgather_value(mine);
  std::string nan_msg;
  bool mixed = false;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const Flags& f = all[r];
    if (f.nan_query > 0 || f.nan_support > 0)
      nan_msg += fmt::format("{}rank {}: {} in the query set, {} in the support set", nan_msg.empty() ? "" : "; ", r,
                             f.nan_query, f.nan_support);
    mixed = mixed || f.query_dev != f.support_dev ||
            static_cast<DeviceKind>(f.query_dev / 65536) != static_cast<DeviceKind>(all[0].query_dev / 65536);
  }
  SHARD_CHECK(nan_msg.empty(), op, "NaN coordinates: {}", nan_msg);
  SHARD_CHECK(!mixed, op,
              "query and support blocks must be on the same device on each rank, and of one device kind on every "
              "rank (query {} / support {} on rank {})",
              query.device(), support.device(), query.mesh().rank());

  if (strat == NeighborStrategy::spatial_halo) {
    // owners on the blocks' device: only per-rank counts reach the host
    check_in_partition(query.spec(), as_block(query.local().contiguous()), *opts.partition, op);
    check_in_partition(support.spec(), as_block(support.local().contiguous()), *opts.partition, op);
  }
  return strat;
}

// ------------------------------------------------------------------------------ ring

/// The ring strategy: this rank's support shard travels around the ring of all ranks (the mesh
/// flattened row-major, DeviceMesh::dims_comm order, so ring position j is mesh rank
/// ring.mesh_rank_of(j)). Step s searches the shard of ring position index - s (already here)
/// while the shift delivering the shard of index - s - 1 is in flight; P - 1 shifts. Sizes come
/// from the support spec (ragged and empty shards need no count exchange).
template <class T>
std::int64_t ring_query(const QueryKind& qk, exec::NeighborMethod method, const Tensor<T, 2>& query,
                        const DistTensor<T, 2>& support, Lists<T>& l, ExecContext& ctx) {
  const DeviceMesh& mesh = support.mesh();
  std::vector<int> dims(static_cast<std::size_t>(mesh.ndim()));
  std::iota(dims.begin(), dims.end(), 0);
  const RingShift ring(mesh, dims);
  const auto counts = point_counts(support.spec());
  const index_t D = support.spec().global_shape()[1];
  const int P = ring.size();
  std::int64_t sent = 0;
  Tensor<T, 2> cur = support.local().contiguous();
  for (int s = 0; s < P; ++s) {
    const int from = ring.mesh_rank_of(ring.neighbor(-s));
    RingShift::Transfer tr;
    Tensor<T, 2> next;
    if (s + 1 < P) {
      const int next_from = ring.mesh_rank_of(ring.neighbor(-(s + 1)));
      next = Tensor<T, 2>::empty({counts[static_cast<std::size_t>(next_from)], D}, cur.device());
      const RingSegment seg{cur.data(), cur.numel(), next.data(), next.numel()};
      tr = ring.start(std::span<const RingSegment>(&seg, 1), dtype_of<T>, RingDirection::forward, &ctx);
      sent += cur.numel();
    }
    add_candidates(qk, method, query, cur, point_offset(support.spec(), from), l, ctx);
    if (s + 1 < P) {
      tr.finish();
      cur = next;
    }
  }
  return sent;
}

// ------------------------------------------------------------------------------ spatial halo

/// Squared-distance threshold (double) that no rounding can push a true candidate over: a support
/// point p is a candidate of query q when the kernel's d2_T(q, p) <= b (b: the kernel's r2, or a
/// k-th distance, in T). The kernel accumulates D squared rounded differences in T, so the exact
/// |q - p|^2 <= b (1 + (D + 2) u_T) + D * (underflow of a square) with u_T the unit roundoff; the
/// box distance in double adds (D + 2) u_double relative. For q in box s, dist2(p, box s) <=
/// |q - p|^2 exactly, so sending every p with dist2_to_box(s, p) <= threshold(b) sends every
/// candidate. The margins here are several times those bounds (extra candidates are harmless:
/// the kernel applies the exact test). +inf stays +inf.
template <class T>
exec::PointBoundScale inflation(index_t D) {
  const double rel = 8.0 * static_cast<double>(D + 2) * static_cast<double>(std::numeric_limits<T>::epsilon());
  const double abs = 4.0 * static_cast<double>(D) * static_cast<double>(std::numeric_limits<T>::min());
  return {1.0 + rel, abs};
}
template <class T>
double inflated(double b, index_t D) {
  const exec::PointBoundScale s = inflation<T>(D);
  return b * s.scale + s.add;
}

/// Every rank's box of `part` as exec::PointBoxes, each with threshold 0 except `skip` (-1).
exec::PointBoxes partition_boxes(const BoxPartition& part, int skip) {
  exec::PointBoxes b;
  b.dims = part.dim();
  const int P = part.mesh().size();
  for (int r = 0; r < P; ++r) {
    for (int d = 0; d < b.dims; ++d) {
      b.lo.push_back(part.lo(r, d));
      b.hi.push_back(part.hi(r, d));
    }
    b.threshold.push_back(r == skip ? -1.0 : 0.0);
  }
  return b;
}

/// The rows of `pts` ([n, D] on ctx's device) that each box of `boxes` selects
/// (exec::points_near_boxes_*): CSR offsets by box on the host (n_boxes + 1) and the rows, grouped
/// by box and ascending within a group, on ctx's device. Only the per-box counts reach the host.
struct BoxRows {
  std::vector<index_t> offsets;
  Block rows;
};
BoxRows near_box_rows(const exec::PointBoxes& boxes, const Block& pts, const Block* point_bound,
                      const exec::PointBoundScale& sc, ExecContext& ctx) {
  const index_t nb = boxes.boxes();
  std::vector<index_t> counts(static_cast<std::size_t>(nb), 0);
  const Block host = Block::view(DType::i64, Device::cpu(), counts.data(), &nb, 1);
  if (ctx.device().is_cpu()) {
    exec::points_near_boxes_count(boxes, pts, point_bound, sc, host, ctx);
  } else {
    const Block dev = Block::allocate(DType::i64, ctx.device(), &nb, 1);
    exec::points_near_boxes_count(boxes, pts, point_bound, sc, dev, ctx);
    exec::box_copy(host, dev, ctx);
    ctx.synchronize();
  }
  BoxRows r;
  r.offsets.assign(static_cast<std::size_t>(nb) + 1, 0);
  for (index_t b = 0; b < nb; ++b)
    r.offsets[static_cast<std::size_t>(b) + 1] = r.offsets[static_cast<std::size_t>(b)] + counts[static_cast<std::size_t>(b)];
  const index_t total = r.offsets.back();
  r.rows = Block::allocate(DType::i64, ctx.device(), &total, 1);
  exec::points_near_boxes_rows(boxes, pts, point_bound, sc,
                               detail::index_block(std::span<const index_t>(r.offsets).first(static_cast<std::size_t>(nb)), ctx),
                               r.rows, ctx);
  return r;
}

/// The exchange that sends every point of `pts` ([n, D] on ctx's device) to each box that selects
/// it (near_box_rows). Collective over comm (one alltoall of counts).
detail::RowExchange box_selection_exchange(const CommPtr& comm, const exec::PointBoxes& boxes, const Block& pts,
                                           const Block* point_bound, const exec::PointBoundScale& sc,
                                           ExecContext& ctx) {
  BoxRows r = near_box_rows(boxes, pts, point_bound, sc, ctx);
  return detail::RowExchange::with_rows_block(comm, pts.shape[0], std::move(r.offsets), std::move(r.rows));
}

/// The received candidates can only change the lists of queries near another rank's box: every
/// received point p lies in another rank's (half-open) box, so |q - p| >= the distance from q to
/// the nearest other box. A candidate enters q's list only if the kernel's d2_T(q, p) <= q's bound
/// (radius: the kernel's r2; kNN: q's current k-th d2, ties included), which implies
/// |q - p|^2 <= inflated(bound) (see inflated). So only the queries that some other rank's box
/// selects with that bound (exec::points_near_boxes_*, the test the kNN query shipping uses; for a
/// query inside this rank's box the distance to the nearest other box is its distance to the
/// nearest shared face) are searched, as a subset gathered by row (rows_gather), and their
/// candidate lists are scattered (rows_scatter) into padded scratch lists (-1 / +inf / count 0)
/// for the merge, which leaves the other rows unchanged. On uniform data the subset is a thin
/// shell of the box. On any device: only the per-box counts reach the host. A query near several
/// boxes is listed once per box; on the host the list is made unique, on a device it is searched
/// once per listing (the same result each time, written to the same row: rows_scatter allows it).
template <class T>
void search_boundary_queries(const QueryKind& qk, exec::NeighborMethod method, const Tensor<T, 2>& query,
                             const Tensor<T, 2>& cand, const BoxPartition& part, int me, Lists<T>& l,
                             ExecContext& ctx) {
  const index_t nq = query.shape()[0], D = query.shape()[1], w = qk.width;
  const Device dev = ctx.device();
  const Tensor<T, 2> q = query.contiguous();
  exec::PointBoxes boxes = partition_boxes(part, me);
  const Block d2 = as_block(l.d2);
  const Block* bound = nullptr;
  exec::PointBoundScale sc{};
  if (qk.knn) {
    bound = &d2;  // q's current k-th d2 (the last column), inflated
    sc = inflation<T>(D);
  } else {
    const double r2 = inflated<T>(static_cast<double>(static_cast<T>(qk.radius * qk.radius)), D);
    for (int r = 0; r < part.mesh().size(); ++r)
      if (r != me) boxes.threshold[static_cast<std::size_t>(r)] = r2;
  }
  BoxRows sel = near_box_rows(boxes, as_block(q), bound, sc, ctx);
  index_t ns = sel.offsets.back();
  if (dev.is_cpu() && ns > 0) {  // one listing per query (and ascending, as before)
    auto* r = static_cast<index_t*>(sel.rows.data);
    std::sort(r, r + ns);
    ns = static_cast<index_t>(std::unique(r, r + ns) - r);
    const index_t l0[1] = {0}, len[1] = {ns};
    sel.rows = sel.rows.slice(l0, len);
  }
  l.cidx.fill(std::int64_t{-1});
  l.cd2.fill(std::numeric_limits<T>::infinity());
  l.ccnt.fill(std::int64_t{0});
  if (ns == 0) return;
  auto sub = Tensor<T, 2>::empty({ns, D}, dev);
  exec::rows_gather({nq, ns, D}, as_block(q), sel.rows, as_block(sub), ctx);
  Lists<T> sl = make_lists<T>(ns, w, dev);
  search_candidates(qk, method, sub, cand, 0, sl, true, ctx);
  exec::rows_scatter({nq, ns, w}, as_block(sl.idx), sel.rows, as_block(l.cidx), ctx);
  exec::rows_scatter({nq, ns, w}, as_block(sl.d2), sel.rows, as_block(l.cd2), ctx);
  if (!qk.knn) exec::rows_scatter({nq, ns, 1}, as_block(sl.cnt), sel.rows, as_block(l.ccnt), ctx);
}

/// kNN rows of the spatial halo: which of this rank's support points (`own`, [ns, D]) each other
/// rank needs, found by shipping queries instead of guessing a box-wide bound (one far query would
/// otherwise make a rank's bound, and its traffic, huge: clustered data).
///  1. After the local search, query q has the bound b_q = its k-th local d2 (+inf when it has
///     fewer than k local candidates). Rank s sends q (coordinates and b_q, `query_elements`) to
///     every rank p whose box is within inflated(b_q) of q: only there can a point of q's answer
///     lie (same argument as the box thresholds of the radius query, see inflated).
///  2. Rank p searches its own points for the k nearest of every received query, with the same
///     kernel (bitwise the same d2 for the same pair on any rank) and the same order: p's points
///     in q's true answer are a prefix of p's own (d2, index) order, so they are among these k;
///     and each has d2 <= b_q (q's true k-th d2 is <= its local one). So p sends s exactly the
///     union, over s's queries, of those entries with d2 <= b_q (ties kept), each row once,
///     ascending — a superset of what s's answers need, usually far smaller than a box-wide bound.
/// Steps 1 and 2 run on the blocks' device (exec::points_near_boxes_*, neighbors_knn,
/// points_list_filter); the host sees the per-rank query counts and the cut index lists (k
/// indices per received query), from which it builds the union. Returns the support exchange
/// and sets `query_elements` (the query elements this rank sent).
template <class T>
detail::RowExchange knn_halo_exchange(exec::NeighborMethod method, const Tensor<T, 2>& query, const Tensor<T, 2>& own,
                                      const BoxPartition& part, const Lists<T>& l, const CommPtr& comm, index_t k,
                                      std::int64_t& query_elements, std::int64_t& received, ExecContext& ctx) {
  const int P = comm->size(), me = comm->rank();
  const index_t nq = query.shape()[0], D = query.shape()[1], ns = own.shape()[0];
  const Device dev = ctx.device();
  const Block qb = as_block(query), d2 = as_block(l.d2);
  const detail::RowExchange qx = box_selection_exchange(comm, partition_boxes(part, me), qb, &d2, inflation<T>(D), ctx);
  // the queries' bounds (the last column of their lists) as a contiguous [nq] block, and sent along
  auto kth = Tensor<T, 1>::empty({nq}, dev);
  if (nq > 0) {
    const index_t stride = k;
    const Block col = Block::view(d2.dtype, d2.device, static_cast<T*>(d2.data) + (k - 1), &nq, 1, &stride, d2.owner);
    exec::box_copy(as_block(kth), col, ctx);
  }
  const Block rq = qx.forward(qb, ctx);
  const Block rb = qx.forward(as_block(kth), ctx);
  const index_t m = qx.n_recv();
  std::vector<index_t> cut(static_cast<std::size_t>(m * k), -1);
  if (m > 0 && ns > 0) {
    const index_t shape[2] = {m, k};
    const Block idx = Block::allocate(DType::i64, dev, shape, 2), dd = Block::allocate(dtype_of<T>, dev, shape, 2);
    exec::KnnGeometry g{m, ns, static_cast<int>(D), k, 0, method};
    exec::neighbors_knn(g, rq, as_block(own), idx, dd, ctx);
    exec::points_list_filter(exec::PointListGeometry{m, k, 1}, dd, rb, idx, ctx);
    exec::box_copy(Block::view(DType::i64, Device::cpu(), cut.data(), shape, 2), idx, ctx);
    if (!dev.is_cpu()) ctx.synchronize();
  }
  std::vector<char> mark(static_cast<std::size_t>(ns), 0);
  std::vector<index_t> offsets(static_cast<std::size_t>(P) + 1, 0), rows;
  for (int s = 0; s < P; ++s) {
    const std::size_t begin = rows.size();
    for (index_t j = qx.recv_offsets()[static_cast<std::size_t>(s)]; j < qx.recv_offsets()[static_cast<std::size_t>(s) + 1]; ++j)
      for (index_t e = 0; e < k; ++e) {
        const index_t r = cut[static_cast<std::size_t>(j * k + e)];
        if (r >= 0 && !mark[static_cast<std::size_t>(r)]) {
          mark[static_cast<std::size_t>(r)] = 1;
          rows.push_back(r);
        }
      }
    std::sort(rows.begin() + static_cast<std::ptrdiff_t>(begin), rows.end());
    for (std::size_t i = begin; i < rows.size(); ++i) mark[static_cast<std::size_t>(rows[i])] = 0;
    offsets[static_cast<std::size_t>(s) + 1] = static_cast<index_t>(rows.size());
  }
  query_elements = qx.n_send_remote() * (D + 1);
  received = m - qx.recv_counts()[static_cast<std::size_t>(me)];
  return detail::RowExchange(comm, ns, std::move(offsets), std::move(rows));
}

/// The spatial-halo strategy. This rank searches its own support shard first (index_offset = its
/// global offset), then receives from every other rank p the support points that may be
/// neighbours of a query in its box and searches them.
///
/// Which points rank p sends to rank s (every s != p is tested; box_dist2(p, s) is an exact quick
/// reject, since rounding is monotone and p's points lie in p's closed box):
///  - radius: dist2_to_box(s, x) <= inflated(r2_T), r2_T = the kernel's r2 (radius^2 rounded to T);
///  - kNN: the points of p among the k nearest of some query q of s whose bound (its local k-th
///    d2) reaches p's box, with d2 <= that bound: s ships those queries to p first
///    (knn_halo_exchange). A query with fewer than k local candidates (bound +inf) is shipped to
///    every rank, and each answers with at most k points: no "send everything" fallback.
/// A rank without queries gets nothing. Every selection runs on the blocks' device.
///
/// Tie order: the kernel breaks equal d2 by reported index = row + index_offset. The received rows
/// have non-contiguous global indices, so they are searched with index_offset 0 and each reported
/// local row is mapped through `gidx` (row -> global index, exec::points_remap on the device).
/// RowExchange delivers rows grouped by source rank in ascending rank order, each group in the
/// order its source listed them; every source lists its rows ascending and its global indices are
/// offset(p) + row, and offset(p) + count(p) <= offset(p + 1), so gidx is strictly increasing over
/// the received rows (checked below on host blocks). A strictly increasing map preserves the
/// (d2, index) order of any two entries (equal d2: row a < row b <=> gidx[a] < gidx[b]), so the
/// mapped list is exactly the list a search with the global indices would report; its rows are
/// disjoint from the own shard's, so merging gives the order of the union.
template <class T>
std::int64_t halo_query(const QueryKind& qk, exec::NeighborMethod method, const Tensor<T, 2>& query,
                        const DistTensor<T, 2>& support, const BoxPartition& part, Lists<T>& l,
                        std::int64_t& queries_received, ExecContext& ctx) {
  const DeviceMesh& mesh = support.mesh();
  const CommPtr& comm = mesh.comm();
  const int P = mesh.size(), me = mesh.rank();
  const index_t D = support.spec().global_shape()[1];
  const index_t own_offset = point_offset(support.spec(), me);
  const Tensor<T, 2> own = support.local().contiguous();
  add_candidates(qk, method, query, own, own_offset, l, ctx);

  // the rows to send, CSR by destination, each destination's rows ascending
  const index_t ns = own.shape()[0];
  const index_t nq = query.shape()[0];
  std::int64_t query_elements = 0;
  detail::RowExchange ex;
  if (qk.knn) {
    ex = knn_halo_exchange(method, query, own, part, l, comm, qk.width, query_elements, queries_received, ctx);
  } else {
    // radius: every point within r of a box is sent to it (the threshold of a box without
    // queries is < 0: nothing is sent there)
    const double b = nq > 0 ? inflated<T>(static_cast<double>(static_cast<T>(qk.radius * qk.radius)), D) : -1.0;
    const std::vector<double> thr = comm->allgather_value(b);
    exec::PointBoxes boxes = partition_boxes(part, me);
    for (int s = 0; s < P; ++s) {
      const double t = thr[static_cast<std::size_t>(s)];
      boxes.threshold[static_cast<std::size_t>(s)] = s != me && t >= 0 && ns > 0 && part.box_dist2(me, s) <= t ? t : -1.0;
    }
    ex = box_selection_exchange(comm, boxes, as_block(own), nullptr, {}, ctx);
  }

  // the candidates and their global indices
  auto cand = Tensor<T, 2>::empty({ex.n_recv(), D}, own.device());
  ex.forward(as_block(own), as_block(cand), ctx);
  auto gsrc = Tensor<std::int64_t, 1>::empty({ns});
  for (index_t i = 0; i < ns; ++i) gsrc.data()[i] = own_offset + i;
  auto gidx = Tensor<std::int64_t, 1>::empty({ex.n_recv()}, own.device());
  ex.forward(as_block(own.device().is_cpu() ? gsrc : gsrc.to(own.device())), as_block(gidx), ctx);
  if (ex.n_recv() == 0) return ex.n_send_remote() * D + query_elements;
  if (gidx.device().is_cpu())
    for (index_t i = 1; i < gidx.numel(); ++i)
      SHARD_CHECK(gidx.data()[i - 1] < gidx.data()[i], "neighbour query (spatial_halo)",
                  "internal: received global indices not ascending at row {}", i);

  search_boundary_queries(qk, method, query, cand, part, me, l, ctx);
  exec::points_remap(as_block(gidx), as_block(l.cidx), ctx);
  merge_candidates(qk, l, ctx);
  return ex.n_send_remote() * D + query_elements;
}

// ------------------------------------------------------------------------------ driver

template <class T>
Neighbors<T> run_query(const char* op, const QueryKind& qk, const DistTensor<T, 2>& query,
                       const DistTensor<T, 2>& support, const NeighborQueryOptions& opts) {
  const NeighborStrategy strat = check_query(op, query, support, opts);
  const Device dev = query.device();
  ExecContext& ctx = current_context(dev);
  const Tensor<T, 2> q = query.local().contiguous();
  const index_t nq = q.shape()[0], w = qk.width;
  Lists<T> l = make_lists<T>(nq, w, dev);

  Neighbors<T> out;
  out.strategy = strat;
  out.query = query.spec();
  out.support = support.spec();
  out.elements_sent = strat == NeighborStrategy::ring
                          ? ring_query(qk, opts.method, q, support, l, ctx)
                          : halo_query(qk, opts.method, q, support, *opts.partition, l, out.queries_received, ctx);
  if (qk.knn) {
    const index_t ns = support.spec().global_shape()[0];
    l.cnt.fill(std::min(qk.width, ns));
  }
  const DistSpec& qs = query.spec();
  out.indices = DistTensor<std::int64_t, 2>(point_rows_spec(qs, {w}), l.idx);
  out.dist2 = DistTensor<T, 2>(point_rows_spec(qs, {w}), l.d2);
  out.counts = DistTensor<std::int64_t, 1>(point_rows_spec(qs, {}), l.cnt);
  return out;
}

}  // namespace

namespace {
/// Collective consistency check of a distributed neighbour query (debug mode, dist/consistency.hpp).
template <class T>
void check_query_call(const char* op, const DistTensor<T, 2>& query, const DistTensor<T, 2>& support,
                      const NeighborQueryOptions& opts, const char* param, const std::string& value, index_t width) {
  if (!detail::checking_collectives(query.device())) return;
  detail::CollectiveFingerprint(op).dtype(dtype_of<T>).spec(query.spec(), "query ").spec(support.spec(), "support ")
      .text(param, value).field("max_neighbours", width).field("strategy", static_cast<int>(opts.strategy))
      .field("partition", opts.partition != nullptr).agree(query.mesh());
}
}  // namespace

template <class T>
Neighbors<T> knn(const DistTensor<T, 2>& query, const DistTensor<T, 2>& support, index_t k,
                 const NeighborQueryOptions& opts) {
  const char* op = "knn";
  check_query_call(op, query, support, opts, "k", std::to_string(k), k);
  SHARD_CHECK(k >= 1, op, "k must be >= 1, got {}", k);
  return run_query(op, QueryKind{true, k, 0.0}, query, support, opts);
}

template <class T>
Neighbors<T> radius_neighbors(const DistTensor<T, 2>& query, const DistTensor<T, 2>& support, double radius,
                              index_t max_neighbours, const NeighborQueryOptions& opts) {
  const char* op = "radius_neighbors";
  check_query_call(op, query, support, opts, "radius", fmt::format("{}", radius), max_neighbours);
  SHARD_CHECK(radius >= 0 && std::isfinite(radius), op, "radius must be finite and >= 0, got {}", radius);
  SHARD_CHECK(max_neighbours >= 1, op, "max_neighbours must be >= 1, got {}", max_neighbours);
  return run_query(op, QueryKind{false, max_neighbours, radius}, query, support, opts);
}

#define SHARD_POINT_QUERIES(T)                                                                                 \
  template Neighbors<T> knn<T>(const DistTensor<T, 2>&, const DistTensor<T, 2>&, index_t,                      \
                               const NeighborQueryOptions&);                                                   \
  template Neighbors<T> radius_neighbors<T>(const DistTensor<T, 2>&, const DistTensor<T, 2>&, double, index_t, \
                                            const NeighborQueryOptions&);
SHARD_POINT_QUERIES(float)
SHARD_POINT_QUERIES(double)
#undef SHARD_POINT_QUERIES

}  // namespace shard
