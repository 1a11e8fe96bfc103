#include "shardtensor/core/fsync.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace shard::detail {

std::string fsync_path(const std::string& p, bool dir) {
  const int fd = ::open(p.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return fmt::format("open('{}') for fsync: {}", p, std::strerror(errno));
  std::string err;
  if (::fsync(fd) != 0) err = fmt::format("fsync('{}'): {}", p, std::strerror(errno));
  if (::close(fd) != 0 && err.empty()) err = fmt::format("close('{}'): {}", p, std::strerror(errno));
  return err;
}

}  // namespace shard::detail
