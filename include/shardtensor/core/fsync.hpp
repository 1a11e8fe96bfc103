#pragma once
/// \file fsync.hpp
/// fsync of a path, shared by the two atomic writers (nn/module_io.cpp's Module::save and
/// io/checkpoint.cpp's save_checkpoint): write <path>.tmp, fsync it, rename, fsync the directory.
/// In core/ (public, namespace detail) so that nn/ and io/ share it without including another
/// layer's private header; the POSIX calls stay in src/core/fsync.cpp.
#include <string>

namespace shard::detail {

/// fsync of a file (dir = false) or directory (dir = true); "" on success, else the error.
std::string fsync_path(const std::string& p, bool dir);

}  // namespace shard::detail
