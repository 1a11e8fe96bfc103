#pragma once
// The profiler's process-wide store (src/runtime/profiler.cpp), shared with the table and the
// environment handling (src/runtime/profiler_report.cpp). Private to the runtime layer.
#include <vector>

#include "shardtensor/runtime/profiler.hpp"

namespace shard::profile::detail {

/// Reads SHARDTENSOR_PROFILE once (throws shard::Error on a bad value; retried then) and turns
/// collection on when it says so. Called by the first profiled scope and by Profiler.
void ensure_env_read();
/// Store side of ensure_env_read (profiler.cpp): the variable's verdict, and "read".
void set_env_enabled(bool on) noexcept;
void clear_unread() noexcept;
/// True when SHARDTENSOR_PROFILE turned collection on.
bool env_enabled() noexcept;
/// A Profiler started (+1) or stopped (-1).
void profilers_delta(int d) noexcept;
/// Every registered row, totals since the process started, in registration order (rows only
/// grow, so two snapshots compare index by index). `wait`: wait for the device events of
/// finished scopes first (outside the step); else only those already complete are resolved.
std::vector<ProfileRow> snapshot(bool wait);
/// Called once when rows are first collected: registers the at-exit table (profiler_report.cpp).
void register_exit_report() noexcept;
/// The MPI world rank when known (MPI_Comm_rank while MPI is up, cached), else the launcher's
/// environment (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, SLURM_PROCID), else 0.
int world_rank() noexcept;

}  // namespace shard::profile::detail
