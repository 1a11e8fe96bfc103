#pragma once
/// \file reduce_op.hpp
/// ReduceOp: the reduction of a collective (allreduce, reduce-scatter) and of a Partial placement
/// (mesh/placement.hpp). It lives here, below the mesh, so comm/ does not include mesh/.
#include <cstdint>
#include <fmt/format.h>

namespace shard {

/// Reduction operator of a Partial placement (and of allreduce / reduce-scatter).
enum class ReduceOp : std::uint8_t { sum, avg, max, min };

constexpr const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

}  // namespace shard

template <> struct fmt::formatter<shard::ReduceOp> : fmt::formatter<fmt::string_view> {
  template <class Ctx> auto format(shard::ReduceOp op, Ctx& ctx) const {
    return fmt::formatter<fmt::string_view>::format(shard::reduce_op_name(op), ctx);
  }
};
