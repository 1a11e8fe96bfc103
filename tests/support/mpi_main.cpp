// Catch2 main for the MPI test binary: initialises MPI, runs the session on every rank, and
// makes every rank agree on the result (a failure on any rank fails every rank's exit code).
#include <catch2/catch_session.hpp>
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  // Catch2 returns 4 when every test case was skipped (e.g. GPU tests without a GPU). Every rank
  // returns 4 only if every rank skipped everything (ctest maps it to "Skipped" through
  // SKIP_RETURN_CODE); any other non-zero code on any rank fails every rank.
  const int skipped_all = rc == 4 ? 1 : 0;
  int failed = rc != 0 && rc != 4 ? 1 : 0, any_failed = 0, every_skipped = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&skipped_all, &every_skipped, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (any_failed && !failed) std::fprintf(stderr, "[rank %d] passed locally, but another rank failed\n", rank);
  MPI_Finalize();
  if (any_failed) return 1;
  return every_skipped ? 4 : 0;
}
