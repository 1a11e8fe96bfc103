#pragma once
// fsync of a path (private core utility), shared by the two atomic writers (nn/module_io.cpp's
// Module::save and io/checkpoint.cpp's save_checkpoint): write <path>.tmp, fsync it, rename, fsync
// the directory. In core/ so that nn/ does not include io/'s private headers.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

namespace shard::detail {

/// fsync of a file or directory; "" or the error.
inline std::string fsync_path(const std::string& p, bool dir) {
  const int fd = ::open(p.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return fmt::format("open('{}') for fsync: {}", p, std::strerror(errno));
  std::string err;
  if (::fsync(fd) != 0) err = fmt::format("fsync('{}'): {}", p, std::strerror(errno));
  if (::close(fd) != 0 && err.empty()) err = fmt::format("close('{}'): {}", p, std::strerror(errno));
  return err;
}

}  // namespace shard::detail
