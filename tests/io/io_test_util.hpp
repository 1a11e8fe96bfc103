#pragma once
// Shared helpers of the I/O tests: a temporary directory every world rank agrees on.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/mpi_harness.hpp"

namespace shard::test {

/// A fresh directory under $TMPDIR (or /tmp) made by world rank 0, its name broadcast (collective
/// over MPI_COMM_WORLD).
inline std::string shared_tmpdir(const char* tag) {
  auto world = MpiComm::world();
  std::string path;
  std::vector<char> buf(512, '\0');
  if (world->rank() == 0) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/shardtensor_" + tag + "_XXXXXX";
    std::vector<char> t(tmpl.begin(), tmpl.end());
    t.push_back('\0');
    if (::mkdtemp(t.data())) std::snprintf(buf.data(), buf.size(), "%s", t.data());
  }
  world->broadcast(buf.data(), static_cast<index_t>(buf.size()), DType::u8, 0);
  path = buf.data();
  REQUIRE(!path.empty());
  return path;
}

/// Removes `dir` on world rank 0 after every rank is done with it (collective).
inline void remove_shared_tmpdir(const std::string& dir) {
  auto world = MpiComm::world();
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace shard::test
