#pragma once
/// \file points.hpp
/// Sharded point sets (issue 17): the spatial box partition, the sparse row exchange every
/// point-cloud operation moves data with, and the distributed neighbour queries.
///
/// **Point sets.** A point set is a `DistTensor<T, 2>` of shape [N, D] (coordinates; features
/// are [N, C] with the same row layout) whose dim 0 is sharded over every mesh dim, row-major
/// (`point_placements(mesh)`: rank r holds part r, ranks in the mesh communicator's order), with
/// arbitrary per-rank counts (ragged; empty shards allowed; `point_spec`), and dim 1 unsharded.
/// Global row g of the set is its global index; rank r's rows are
/// `[point_offset(spec, r), point_offset(spec, r + 1))`.
///
/// **Box partitions.** `BoxPartition` is a Cartesian decomposition of an axis-aligned domain,
/// one box per rank, like a simulation's domain decomposition (or a sharded grid's,
/// `BoxPartition::of_grid`). A point set "lies in" a partition when every rank's rows are inside
/// its own box (`check_in_partition`); `partition_by_box` moves points to their owners.
///
/// **RowExchange** (`detail::RowExchange`): each rank sends chosen rows of a local [n, width]
/// matrix to chosen ranks; forward moves rows, the adjoint returns gradients and adds them to
/// the rows they came from. One alltoall of counts to build, one alltoallv per run.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/dist/dist_tensor.hpp"
#include "shardtensor/exec/neighbors.hpp"

namespace shard {

// ------------------------------------------------------------------------------ point sets

/// The placements of a point set on `mesh`: Shard(0) on every mesh dim (row-major over the mesh,
/// so rank r holds part r).
std::vector<Placement> point_placements(const DeviceMesh& mesh);

/// The spec of a [n, dim] point set on `mesh` with `counts[r]` rows on rank r (counts.size() ==
/// mesh.size(), every entry >= 0). Local: every rank must pass the same counts.
DistSpec point_spec(const DeviceMesh& mesh, std::span<const index_t> counts, index_t dim);

/// Throws shard::Error (same outcome on every rank: it reads the spec only) unless `s` is a point
/// set as described above: rank 2, dim 0 sharded by every mesh dim of size > 1 in ascending
/// mesh-dim order, dim 1 not sharded, no Partial. `op` / `what` name the caller in the message.
void check_point_set(const DistSpec& s, const char* op, const char* what);

namespace detail {
/// Throws unless `s`'s dim 0 is sharded by exactly the mesh dims of size > 1, ascending (the row
/// layout of a point set; spec-only, so the same on every rank).
void check_rows_sharded_over_mesh(const DistSpec& s, const char* op, const char* what);
}  // namespace detail

/// Global index of rank r's first row (r == mesh size: the total count N).
index_t point_offset(const DistSpec& s, int r);

/// Rows per rank, in rank order.
std::vector<index_t> point_counts(const DistSpec& s);

/// The spec of a per-point tensor [N, trailing...] whose rows are laid out like the point set
/// `rows` (its mesh and per-rank counts; the trailing dims unsharded): features, neighbour
/// lists, gathered neighbour values.
DistSpec point_rows_spec(const DistSpec& rows, const std::vector<index_t>& trailing);

// ------------------------------------------------------------------------------ box partitions

/// An axis-aligned Cartesian decomposition of the domain [lo, hi] (D coordinate dims) into one
/// box per rank of a mesh. Coordinate dim d is cut at `cuts[d]` (ascending, cuts[d].front() = lo,
/// cuts[d].back() = hi, one slab per index of mesh dim `mesh_dims[d]`, or the single slab
/// {lo, hi} when mesh_dims[d] = -1). Each mesh dim of size > 1 splits exactly one coordinate dim;
/// mesh dims of size 1 may be left out. Rank r's box along d is slab `coords_of(r)[mesh_dims[d]]`.
/// Slabs are half-open [c_k, c_{k+1}) except the last, which is closed: every point of the
/// domain has exactly one owner.
class BoxPartition {
 public:
  BoxPartition() = default;
  BoxPartition(DeviceMesh mesh, std::vector<std::vector<double>> cuts, std::vector<int> mesh_dims);
  /// Equal slabs of [lo, hi] along each coordinate dim d split by mesh_dims[d].
  static BoxPartition uniform(const DeviceMesh& mesh, std::vector<double> lo, std::vector<double> hi,
                              std::vector<int> mesh_dims);
  /// The boxes of a regular grid sharded by `grid`: coordinate dim d is the grid's tensor dim
  /// `grid_dims[d]`, whose n cells of width h = (hi - lo) / n cover [lo[d], hi[d]] (cell i is
  /// [lo + i h, lo + (i + 1) h], centre lo + (i + 1/2) h); the cuts are the shard boundaries
  /// lo + offset * h. Each grid dim must be sharded by at most one mesh dim.
  static BoxPartition of_grid(const DistSpec& grid, std::vector<int> grid_dims, std::vector<double> lo,
                              std::vector<double> hi);

  int dim() const { return static_cast<int>(cuts_.size()); }
  const DeviceMesh& mesh() const { return mesh_; }
  const std::vector<std::vector<double>>& cuts() const { return cuts_; }
  const std::vector<int>& mesh_dims() const { return mesh_dims_; }
  double domain_lo(int d) const { return cuts_[static_cast<std::size_t>(d)].front(); }
  double domain_hi(int d) const { return cuts_[static_cast<std::size_t>(d)].back(); }
  /// Rank r's box along coordinate dim d.
  double lo(int r, int d) const;
  double hi(int r, int d) const;
  /// The rank owning point p (dim() coordinates), or -1 when p is outside the domain or NaN.
  int owner(const double* p) const;
  /// Whether p lies in rank r's box (with the half-open rule above).
  bool contains(int r, const double* p) const;
  /// Squared Euclidean distance from p to rank r's closed box (0 inside), in double.
  double dist2_to_box(int r, const double* p) const;
  /// Squared distance between the closed boxes of ranks a and b.
  double box_dist2(int a, int b) const;
  /// Same mesh object, cuts and mesh dims.
  friend bool operator==(const BoxPartition& a, const BoxPartition& b);

 private:
  DeviceMesh mesh_;
  std::vector<std::vector<double>> cuts_;
  std::vector<int> mesh_dims_;
  std::vector<int> stride_;   ///< row-major strides of the mesh dims
  std::vector<double> box_;   ///< [rank][dim][lo, hi]
};

/// Throws shard::Error on every rank unless every rank's points lie in its own box of `part`
/// (and the set's mesh is the partition's, and D == part.dim()); the message names each rank
/// with points outside its box and how many (NaN coordinates count as outside). Collective (one
/// allgather over the mesh). `points` is a contiguous [n, D] block (f32 or f64) on any device:
/// the owners are computed there (exec::points_owner) and only per-rank counts reach the host.
void check_in_partition(const DistSpec& points_spec, const Block& points, const BoxPartition& part, const char* op);

namespace detail {

// ------------------------------------------------------------------------------ row exchange

/// A sparse exchange of rows over a communicator (see the file comment). Rows arrive grouped by
/// source rank (ascending), each group in the order its source listed them. A row may be sent to
/// several ranks, to one rank several times, and to its own rank (a local copy).
class RowExchange {
 public:
  RowExchange() = default;
  /// `send_offsets`: comm->size() + 1 ascending offsets into `send_rows` (CSR by destination);
  /// `send_rows`: local row indices in [0, n_src). Collective over `comm` (one alltoall of counts).
  RowExchange(CommPtr comm, index_t n_src, std::vector<index_t> send_offsets, std::vector<index_t> send_rows);
  /// The same with the send rows as an i64 block [send_offsets.back()] on the device of the
  /// contexts forward / adjoint_add will run on (made there, e.g. by exec::points_bucket_rows, and
  /// trusted to lie in [0, n_src): it is not read on the host). send_rows() is then empty unless the
  /// block is a host block.
  static RowExchange with_rows_block(CommPtr comm, index_t n_src, std::vector<index_t> send_offsets, Block send_rows);

  const CommPtr& comm() const { return comm_; }
  index_t n_src() const { return n_src_; }
  index_t n_send() const { return send_offsets_.empty() ? 0 : send_offsets_.back(); }
  index_t n_recv() const { return recv_offsets_.empty() ? 0 : recv_offsets_.back(); }
  /// Rows arriving from each rank, and their offsets (size + 1) in the received matrix.
  std::span<const index_t> recv_counts() const { return recv_counts_; }
  std::span<const index_t> recv_offsets() const { return recv_offsets_; }
  std::span<const index_t> send_counts() const { return send_counts_; }
  std::span<const index_t> send_offsets() const { return send_offsets_; }
  std::span<const index_t> send_rows() const { return send_rows_; }
  /// Rows this rank sends to OTHER ranks (its traffic; local copies excluded).
  index_t n_send_remote() const;

  /// dst [n_recv, width] (or [n_recv] for width 1) = the rows every rank sent here; src
  /// [n_src, width]. Any dtype; both blocks contiguous on ctx's device. Collective.
  void forward(const Block& src, const Block& dst, ExecContext& ctx) const;
  /// forward into a new contiguous [n_recv, width] block of src's dtype.
  Block forward(const Block& src, ExecContext& ctx) const;
  /// The adjoint: g_src [n_src, width] += the gradients g_recv [n_recv, width] of the received
  /// rows, each added to the row it was sent from (rows sent several times get the sum). f32,
  /// f64, c64, c128, i64. Collective.
  void adjoint_add(const Block& g_recv, const Block& g_src, ExecContext& ctx) const;

 private:
  void init(const char* op);
  void init_rows_block();
  /// The send rows as a block on ctx's device.
  Block rows_on(ExecContext& ctx) const;

  CommPtr comm_;
  index_t n_src_ = 0;
  std::vector<index_t> send_offsets_, send_rows_, send_counts_, recv_counts_, recv_offsets_;
  Block send_rows_block_;  ///< the Block constructor's rows (empty otherwise)
};

// ------------------------------------------------------------------------------ point plans

/// partition_by_box's routing plan: every local row of a point set goes to the rank of `part`
/// whose box holds it (rows arrive ordered by source rank, then source row). Built from the
/// points' coordinates: checks (every rank gets the same error: mesh, D, dtype, points outside
/// the domain or NaN, naming each rank and its count), the owners and their bucketing on the
/// points' device (exec::points_owner / points_bucket_rows; only the per-rank counts reach the
/// host), one RowExchange (one alltoall of counts) and one allgather of the routed counts.
/// `points`: this rank's rows, a contiguous [n, D] f32 / f64 block on any device. Collective. Apply it with
/// `exchange->forward` (any per-point tensor), adjoint `exchange->adjoint_add`.
struct BoxRoutingPlan {
  std::shared_ptr<const RowExchange> exchange;  ///< source rows -> their owners
  DistSpec target;                              ///< [N, D] layout after routing
};
BoxRoutingPlan box_routing_plan(const DistSpec& points_spec, const Block& points, const BoxPartition& part,
                                const char* op);

/// The gather plan of a neighbour list (F::gather_neighbors; built on the first gather and cached
/// on the Neighbors object): which support rows a rank needs, requested once each from their
/// owners (one alltoall of request counts + one alltoallv of the requested global indices), the
/// owners' RowExchange of those rows (send_rows = the requested local rows, per requester), and
/// the expansion (q, k) -> received row that the rows family applies. The received matrix holds
/// this rank's distinct valid indices in ascending global order; `expand[q * width + k]` is the
/// row of entry (q, k) in it (-1 for padding).
struct NeighborGatherPlan {
  DistSpec support;                             ///< the support set the lists index
  std::weak_ptr<void> indices;                  ///< the local index storage it was built from
  index_t n_query = 0;                          ///< this rank's query rows
  index_t width = 0;                            ///< entries per row (K)
  std::shared_ptr<const RowExchange> exchange;  ///< owners -> requesters
  std::vector<index_t> expand;                  ///< [n_query * width]
  index_t n_unique() const { return exchange->n_recv(); }

  /// dst [n_query, width, C] (contiguous) = features[indices] (zeros for padding); features
  /// [n_support_local, C] contiguous, both on ctx's device. Collective (one alltoallv).
  void forward(const Block& features, const Block& dst, ExecContext& ctx) const;
  /// The adjoint: a new [n_support_local, C] block, the gradients g [n_query, width, C] summed
  /// onto the support rows they were gathered from (on their owners). Collective.
  Block adjoint(const Block& g, ExecContext& ctx) const;
};

/// The gather plan of lists whose local indices are `indices` ([n_query, K] contiguous host
/// i64) over `support`. Errors on every rank for indices outside [-1, Ns). Collective.
std::shared_ptr<const NeighborGatherPlan> neighbor_gather_plan(const DistSpec& support, const Block& indices,
                                                               const char* op);

}  // namespace detail

// ------------------------------------------------------------------------------ neighbour queries

/// How a distributed query finds candidates on other ranks.
///  - ring: support shards travel around the ring of all ranks (split-phase: the next shard is in
///    flight while the current one is searched) and each one's candidates are merged into the
///    running lists. Any distribution of points.
///  - spatial_halo: both point sets lie in one BoxPartition; each rank receives only the support
///    points that can be neighbours of a query in its box (within r of the box; for kNN within
///    the bound its local search established). Far less traffic than the ring.
///  - automatic: spatial_halo when a partition is given, ring otherwise.
enum class NeighborStrategy : unsigned char { automatic, ring, spatial_halo };

struct NeighborQueryOptions {
  NeighborStrategy strategy = NeighborStrategy::automatic;
  /// The partition both point sets lie in (required by spatial_halo; checked, collectively).
  const BoxPartition* partition = nullptr;
  /// The local search method (exec/neighbors.hpp); every method gives the same answer.
  exec::NeighborMethod method = exec::NeighborMethod::automatic;
};

/// The result of a distributed query: per query row (rows sharded like the query set), the
/// global indices of its neighbours in the support set and their squared distances, in
/// (d2, global index) order, padded with -1 / +inf to a fixed width (k, or max_neighbours), and
/// the count of valid entries. Identical on every rank count and strategy to the unsharded query.
template <class T>
struct Neighbors {
  DistTensor<std::int64_t, 2> indices;  ///< [Nq, width], rows laid out as the query set
  DistTensor<T, 2> dist2;               ///< [Nq, width]
  DistTensor<std::int64_t, 1> counts;   ///< [Nq]
  DistSpec query;                       ///< spec of the query point set
  DistSpec support;                     ///< spec of the support point set (gathers check features against it)
  NeighborStrategy strategy = NeighborStrategy::ring;  ///< the strategy that ran
  std::int64_t elements_sent = 0;       ///< point-set elements this rank sent to other ranks (traffic)
  /// spatial_halo kNN: the queries other ranks shipped here to be answered from this rank's support
  /// points (each answered with an index list of up to k rows; 0 for radius and ring).
  std::int64_t queries_received = 0;
  /// The plan of F::gather_neighbors (which support rows this rank needs from whom), built by the
  /// first gather (collective) and reused by later gathers through this object or copies made
  /// after it. Not part of the result's value; never set it by hand.
  mutable std::shared_ptr<const detail::NeighborGatherPlan> gather_plan;
  index_t width() const { return indices.spec().global_shape()[1]; }
};

/// The k nearest support points of every query point (exact; ties by global index; k > Ns pads).
/// Collective over the mesh. Errors on every rank: mismatched coordinate dims or meshes, k <= 0,
/// NaN coordinates, points outside the partition (spatial_halo).
template <class T>
Neighbors<T> knn(const DistTensor<T, 2>& query, const DistTensor<T, 2>& support, index_t k,
                 const NeighborQueryOptions& opts = {});

/// Every support point within `radius` of each query point (d2 <= radius^2 rounded to T), the
/// nearest max_neighbours of them in (d2, index) order. Errors on every rank: as knn, plus
/// radius < 0 or NaN, max_neighbours <= 0.
template <class T>
Neighbors<T> radius_neighbors(const DistTensor<T, 2>& query, const DistTensor<T, 2>& support, double radius,
                              index_t max_neighbours, const NeighborQueryOptions& opts = {});

}  // namespace shard
