#pragma once
// MPI test harness (DiHydrogen's for_comms pattern): run a test body on communicators of every
// size 1..world by splitting MPI_COMM_WORLD, so one `mpiexec -n 4` covers 1, 2, 3 and 4 ranks.
#include <catch2/catch_test_macros.hpp>
#include <mpi.h>

#include <exception>
#include <functional>
#include <shardtensor/shardtensor.hpp>

namespace shard::test {

/// World size of this run.
inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// Calls body(comm) with a communicator of each size p = 1..world (ranks >= p sit out that
/// round). Sub-communicators are MpiComm except p == 1, which also runs once with SelfComm.
/// Collective over MPI_COMM_WORLD: every rank must call it.
/// An exception escaping body on some ranks (a failed REQUIRE, an unexpected shard::Error) ends
/// the round on every rank: the ranks agree on it after the round and all leave together (the
/// thrower rethrows, the others throw "another rank failed"). Otherwise the thrower would skip
/// the rounds' collectives and the world would be out of step for every later test case (wrong
/// messages matched, hangs) instead of one clear failure.
inline void for_each_comm_size(const std::function<void(CommPtr)>& body, int min_size = 1, int max_size = 1 << 30) {
  auto world = MpiComm::world();
  for (int p = min_size; p <= std::min(world->size(), max_size); ++p) {
    const bool in = world->rank() < p;
    auto sub = world->split(in ? 0 : -1, world->rank());
    std::exception_ptr err;
    if (in) {
      INFO("communicator size " << p);
      try {
        body(sub);
      } catch (...) {
        err = std::current_exception();
      }
    }
    int failed = err ? 1 : 0, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (err) std::rethrow_exception(err);
    if (any) FAIL("another rank failed in the round on " << p << " ranks (see its report)");
  }
}

/// Same as for_each_comm_size, plus one SelfComm round on every rank (no MPI in the backend).
inline void for_each_comm(const std::function<void(CommPtr)>& body, int min_size = 1) {
  {
    INFO("SelfComm");
    body(std::make_shared<SelfComm>());
  }
  for_each_comm_size(body, min_size);
}

/// Runs `f` and returns the shard::Error message, or "" if nothing was thrown.
template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const shard::Error& e) {
    return e.what();
  }
  return "";
}

/// Relative-error tolerance of the oracle for T (DESIGN.md §5).
template <class T> constexpr double tol() { return std::is_same_v<T, double> ? 1e-10 : 1e-5; }

}  // namespace shard::test
