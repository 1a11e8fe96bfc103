#pragma once
// Shared by the collective-agreement tests (mpi_collective_check.cpp, mpi_cheap_checks.cpp).
#include <shardtensor/exec/context.hpp>

#include "support/mpi_harness.hpp"

namespace shard::test {

/// Turns the consistency mode on (or off) for the calling thread's CPU work for the scope,
/// whatever SHARDTENSOR_CHECK_COLLECTIVES says.
struct CheckCollectives {
  explicit CheckCollectives(bool on) { ctx.settings().check_collectives = on; }
  ExecContext ctx{Device::cpu()};
  ContextGuard guard{ctx};
};

/// Every rank of `comm` must be here; fails if any is not (or is out of step).
inline void check_in_step(const CommPtr& comm) {
  int one = 1;
  comm->allreduce_inplace(&one, 1, ReduceOp::sum);
  CHECK(one == comm->size());
}

/// Rows of a balanced split of n over p parts on part r.
inline index_t rows_of(index_t n, int p, int r) { return n / p + (r < n % p ? 1 : 0); }

}  // namespace shard::test
