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
  int any = rc != 0 ? 1 : 0, all = 0;
  MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (all && rc == 0) std::fprintf(stderr, "[rank %d] passed locally, but another rank failed\n", rank);
  MPI_Finalize();
  return all;
}
