#pragma once
/// \file redistribute.hpp
/// The type-erased core of DistTensor: moving local blocks between two DistSpecs of one global
/// tensor, as a typed plan that is built once per (source spec, target spec) on each rank,
/// cached, and executed many times. The typed front (DistTensor<T,Rank>) runs it on Blocks.
///
/// A plan is a list of steps (DESIGN.md §3-4):
///  A. Partial mesh dims the target does not keep: `reduce_scatterv` straight into a Shard when
///     possible, else `allreduce` to Replicate;
///  B. Shard/Replicate data movement: `local` (every rank's target box lies in its current box:
///     a slice), `allgatherv` (one mesh dim Shard(d) -> Replicate), else one `alltoallv` of box
///     intersections over the mesh dims that change;
///  C. `create_partial`: Replicate -> Partial (sum keeps the value on coordinate 0 only).
/// Steps carry this rank's counts and boxes, and the mesh dims whose communicator they use (the
/// communicators themselves are looked up from the mesh at execution, so a cached plan keeps no
/// communicator alive).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/dist/dist_spec.hpp"
#include "shardtensor/runtime/block.hpp"

namespace shard::detail {

/// What one step of a redistribution does.
enum class RedistStepKind : std::uint8_t {
  local,            ///< copy a sub-box of the local block (no communication)
  allgatherv,       ///< Shard(d) -> Replicate over one mesh dim: one allgatherv
  alltoallv,        ///< box intersections exchanged over the group of the changing mesh dims
  reduce_scatterv,  ///< Partial -> Shard(d) over one mesh dim: one reduce-scatter-v
  allreduce,        ///< Partial -> Replicate over one mesh dim: one allreduce
  create_partial,   ///< Replicate -> Partial (no communication; sum: zeros off coordinate 0)
};

/// Name of a step kind ("local", "allgatherv", ...).
const char* redist_step_name(RedistStepKind k) noexcept;

/// One step, for this rank. Boxes are in local coordinates of the step's input block (send side,
/// `local`) or output block (receive side); counts and displacements are in elements, one per
/// rank of the step's communicator.
struct RedistStep {
  RedistStepKind kind = RedistStepKind::local;
  std::vector<int> mesh_dims;      ///< communicator: mesh.dim_comm / mesh.dims_comm of these dims
  ReduceOp op = ReduceOp::sum;     ///< reduce_scatterv, allreduce, create_partial
  int tensor_dim = -1;             ///< dim gathered (allgatherv) or scattered (reduce_scatterv)
  std::vector<index_t> in_shape, out_shape;  ///< this rank's block before and after the step
  std::vector<index_t> send_counts, send_displs, recv_counts, recv_displs;
  std::vector<Box> send_boxes;     ///< alltoallv / reduce_scatterv: what goes to each rank
  std::vector<Box> recv_boxes;     ///< alltoallv / allgatherv: where each rank's data lands
  Box local_src, local_dst;        ///< local: the copied box; alltoallv: this rank's own part
  bool has_self = false;           ///< alltoallv: own part moved by a local copy
  bool send_direct = false;        ///< alltoallv: boxes are runs of a contiguous input (no packing)
  std::vector<index_t> send_direct_displs;  ///< displacements when sending directly
  bool recv_direct = false;        ///< alltoallv / allgatherv: data lands in the output unpacked
  bool zero = false;               ///< create_partial: this rank holds zeros
};

/// A redistribution from one DistSpec to another, for this rank. Printable (fmt).
struct RedistributePlan {
  std::vector<index_t> in_shape, out_shape;  ///< this rank's block under the source / target
  std::vector<RedistStep> steps;             ///< empty: nothing to do (equal specs)
  /// The step kinds in order (what tests and benchmarks inspect).
  std::vector<RedistStepKind> kinds() const;
  /// Number of steps that communicate.
  int collectives() const;
};

/// The plan for this rank (cached per process by the two specs and the mesh; planning never
/// communicates). Throws shard::Error (the same on every rank) for specs on different meshes or
/// of different global shapes.
std::shared_ptr<const RedistributePlan> redistribute_plan(const DistSpec& src, const DistSpec& dst);

/// Runs `plan` (built for src -> dst on `mesh`) on this rank's block `in`; collective over the
/// steps' communicators. Returns `in` itself when the plan is empty.
Block execute_redistribute(const RedistributePlan& plan, const DeviceMesh& mesh, const Block& in);

/// Returns this rank's block under `dst` given its block `in` under `src` (same mesh and global
/// shape): the cached plan, executed. Collective over the mesh when data must move.
/// `check`: run the collective consistency check when it is on (dist/consistency.hpp; false when
/// the caller has checked the call already).
Block redistribute(const DistSpec& src, const Block& in, const DistSpec& dst, bool check = true);

/// Plans held by the cache (for tests).
std::size_t redistribute_plan_cache_size() noexcept;

}  // namespace shard::detail

template <> struct fmt::formatter<shard::detail::RedistStepKind> : fmt::formatter<fmt::string_view> {
  template <class Ctx> auto format(shard::detail::RedistStepKind k, Ctx& ctx) const {
    return fmt::formatter<fmt::string_view>::format(shard::detail::redist_step_name(k), ctx);
  }
};
template <> struct fmt::formatter<shard::detail::RedistStep> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx> auto format(const shard::detail::RedistStep& s, Ctx& ctx) const {
    auto out = fmt::format_to(ctx.out(), "{}(mesh_dims={}, {} -> {}", s.kind, s.mesh_dims, s.in_shape, s.out_shape);
    if (!s.send_counts.empty()) out = fmt::format_to(out, ", send={}", s.send_counts);
    if (!s.recv_counts.empty()) out = fmt::format_to(out, ", recv={}", s.recv_counts);
    if (s.tensor_dim >= 0) out = fmt::format_to(out, ", dim={}", s.tensor_dim);
    return fmt::format_to(out, ")");
  }
};
template <> struct fmt::formatter<shard::detail::RedistributePlan> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx> auto format(const shard::detail::RedistributePlan& p, Ctx& ctx) const {
    auto out = fmt::format_to(ctx.out(), "RedistributePlan({} -> {}: [", p.in_shape, p.out_shape);
    for (std::size_t i = 0; i < p.steps.size(); ++i) out = fmt::format_to(out, "{}{}", i ? ", " : "", p.steps[i]);
    return fmt::format_to(out, "])");
  }
};
