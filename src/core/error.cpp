#include "shardtensor/core/error.hpp"

#include "shardtensor/config.hpp"
#if SHARDTENSOR_HAS_MPI
#include <mpi.h>
#endif

namespace shard::detail {

int error_rank() noexcept {
#if SHARDTENSOR_HAS_MPI
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) {
    int r = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
#endif
  return -1;
}

void throw_error(const char* op, const std::string& what, const char* file, int line) {
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  const int r = error_rank();
  if (r >= 0) throw Error(fmt::format("shardtensor: {}: {} [rank {}] ({}:{})", op, what, r, base, line));
  throw Error(fmt::format("shardtensor: {}: {} ({}:{})", op, what, base, line));
}

}  // namespace shard::detail
