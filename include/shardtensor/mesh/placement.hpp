#pragma once
/// \file placement.hpp
/// Placement: the closed set Shard{dim} | Replicate{} | Partial{op} describing how a tensor
/// lies along one mesh dimension.
#include <cstdint>
#include <fmt/format.h>

#include "shardtensor/comm/reduce_op.hpp"

namespace shard {

/// How a tensor is laid out along one mesh dimension.
///  - Shard{d}: tensor dim d is split into blocks, one per rank along the mesh dim.
///  - Replicate{}: every rank along the mesh dim holds the same data.
///  - Partial{op}: every rank holds a partial value; the tensor is their reduction by `op`.
struct Placement {
  enum class Kind : std::uint8_t { shard, replicate, partial };
  Kind kind = Kind::replicate;
  int dim = -1;                  ///< tensor dim for Shard, else -1
  ReduceOp op = ReduceOp::sum;   ///< reduction for Partial

  constexpr bool is_shard() const { return kind == Kind::shard; }
  constexpr bool is_shard(int d) const { return kind == Kind::shard && dim == d; }
  constexpr bool is_replicate() const { return kind == Kind::replicate; }
  constexpr bool is_partial() const { return kind == Kind::partial; }
  friend constexpr bool operator==(const Placement& a, const Placement& b) {
    return a.kind == b.kind && (a.kind != Kind::shard || a.dim == b.dim) && (a.kind != Kind::partial || a.op == b.op);
  }
};

/// Shard{d}: split tensor dim d across the mesh dim.
constexpr Placement Shard(int d) { return {Placement::Kind::shard, d, ReduceOp::sum}; }
/// Replicate{}: same data on every rank of the mesh dim.
constexpr Placement Replicate() { return {Placement::Kind::replicate, -1, ReduceOp::sum}; }
/// Partial{op}: pending reduction across the mesh dim.
constexpr Placement Partial(ReduceOp op = ReduceOp::sum) { return {Placement::Kind::partial, -1, op}; }

}  // namespace shard

template <> struct fmt::formatter<shard::Placement> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx> auto format(const shard::Placement& p, Ctx& ctx) const {
    switch (p.kind) {
      case shard::Placement::Kind::shard: return fmt::format_to(ctx.out(), "Shard({})", p.dim);
      case shard::Placement::Kind::replicate: return fmt::format_to(ctx.out(), "Replicate()");
      default: return fmt::format_to(ctx.out(), "Partial({})", shard::reduce_op_name(p.op));
    }
  }
};
