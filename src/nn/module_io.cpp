// Module parameter save/load. Rank 0 of the parameters' mesh does the file I/O; load broadcasts.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "shardtensor/core/fsync.hpp"
#include "shardtensor/core/hash.hpp"
#include "shardtensor/nn/module.hpp"

namespace shard::nn {

std::uint64_t seed_for(std::uint64_t seed, const std::string& name) noexcept {
  return shard::detail::fnv1a(name, shard::detail::kFnv1aOffset ^ (seed * 0x9e3779b97f4a7c15ull));
}

namespace {
// Format 2: "SHTP", u32 version, u64 count, records (u32 name length, name, u8 dtype, u32 rank,
// i64 shape[rank], data), then a trailer: u64 length of everything before it and its 64-bit
// FNV-1a hash. Loading refuses a short file, trailing bytes and any flipped byte.
constexpr char kMagic[4] = {'S', 'H', 'T', 'P'};
constexpr std::uint32_t kVersion = 2;
constexpr std::size_t kTrailer = 16;

template <class V>
void put(std::vector<unsigned char>& buf, const V& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(&v);
  buf.insert(buf.end(), p, p + sizeof(V));
}
void put_bytes(std::vector<unsigned char>& buf, const void* p, std::size_t n) {
  const auto* c = static_cast<const unsigned char*>(p);
  buf.insert(buf.end(), c, c + n);
}

/// Reads sequentially from a byte buffer; every read is bounds-checked.
struct Reader {
  const std::vector<unsigned char>& buf;
  std::size_t pos = 0, end = 0;
  bool get(void* dst, std::size_t n) {
    if (end - pos < n) return false;
    std::memcpy(dst, buf.data() + pos, n);
    pos += n;
    return true;
  }
};

template <class T>
CommPtr comm_of(const std::vector<NamedParameter<T>>& params) {
  return params.empty() ? std::make_shared<SelfComm>() : params.front().param->mesh().comm();
}

using shard::detail::fsync_path;

/// Writes `buf` to `path` atomically: `<path>.tmp` in the same directory, fwrite + fflush +
/// fclose + fsync (all checked), rename, fsync of the directory. "" or the error.
std::string write_atomically(const std::string& path, const std::vector<unsigned char>& buf) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return fmt::format("cannot open '{}' for writing: {}", tmp, std::strerror(errno));
  bool ok = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
  ok = std::fflush(f) == 0 && ok;
  const int e = errno;
  ok = std::fclose(f) == 0 && ok;
  std::string err;
  if (!ok) err = fmt::format("writing '{}' failed: {}", tmp, std::strerror(errno ? errno : e));
  if (err.empty()) err = fsync_path(tmp, false);
  if (err.empty() && std::rename(tmp.c_str(), path.c_str()) != 0)
    err = fmt::format("rename('{}', '{}'): {}", tmp, path, std::strerror(errno));
  if (!err.empty()) {
    std::remove(tmp.c_str());
    return err;
  }
  const auto dir = std::filesystem::path(path).parent_path();
  return fsync_path(dir.empty() ? std::string(".") : dir.string(), true);
}
}  // namespace

template <class T>
void save_parameters(const std::vector<NamedParameter<T>>& params, const std::string& path) {
  auto comm = comm_of(params);
  std::string err;
  // The whole value of each parameter (an allgather for sharded ones, so every rank takes part).
  std::vector<Tensor<T, 1>> whole;
  for (auto& np : params) whole.push_back(np.param->full_value_host());
  if (comm->rank() == 0) {
    std::vector<unsigned char> buf;
    put_bytes(buf, kMagic, 4);
    put(buf, kVersion);
    put(buf, static_cast<std::uint64_t>(params.size()));
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& np = params[i];
      const auto shape = np.param->shape();
      put(buf, static_cast<std::uint32_t>(np.name.size()));
      put_bytes(buf, np.name.data(), np.name.size());
      put(buf, static_cast<std::uint8_t>(dtype_of<T>));
      put(buf, static_cast<std::uint32_t>(shape.size()));
      put_bytes(buf, shape.data(), 8 * shape.size());
      put_bytes(buf, whole[i].data(), sizeof(T) * static_cast<std::size_t>(whole[i].numel()));
    }
    const std::uint64_t len = buf.size(), hash = shard::detail::fnv1a(buf.data(), buf.size());
    put(buf, len);
    put(buf, hash);
    err = write_atomically(path, buf);
  }
  comm->check_all(err.empty(), "Module::save", err);
}

template <class T>
void load_parameters(const std::vector<NamedParameter<T>>& params, const std::string& path) {
  auto comm = comm_of(params);
  std::string err;
  std::vector<T> flat;
  index_t total = 0;
  for (auto& np : params) total += np.param->global_numel();
  if (comm->rank() == 0) {
    flat.resize(static_cast<std::size_t>(total));
    std::vector<unsigned char> buf;
    if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
      unsigned char chunk[1 << 16];
      std::size_t n;
      while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) buf.insert(buf.end(), chunk, chunk + n);
      if (std::ferror(f)) err = fmt::format("reading '{}' failed", path);
      std::fclose(f);
    } else {
      err = fmt::format("cannot open '{}': {}", path, std::strerror(errno));
    }
    std::uint64_t len = 0, hash = 0;
    if (err.empty()) {
      if (buf.size() < 16 + kTrailer || std::memcmp(buf.data(), kMagic, 4) != 0)
        err = fmt::format("'{}' is not a shardtensor parameter file (or is truncated: {} bytes)", path, buf.size());
      else {
        std::uint32_t version = 0;
        std::memcpy(&version, buf.data() + 4, 4);
        std::memcpy(&len, buf.data() + buf.size() - kTrailer, 8);
        std::memcpy(&hash, buf.data() + buf.size() - 8, 8);
        if (version != kVersion)
          err = fmt::format("'{}' is a version {} parameter file, this build reads version {}", path, version, kVersion);
        else if (len != buf.size() - kTrailer)
          err = fmt::format("'{}' is truncated or has trailing bytes ({} bytes, the trailer says {})", path, buf.size(),
                            len + kTrailer);
        else if (shard::detail::fnv1a(buf.data(), len) != hash)
          err = fmt::format("'{}' is corrupted (checksum mismatch)", path);
      }
    }
    Reader rd{buf, 8, static_cast<std::size_t>(len)};
    std::uint64_t count = 0;
    if (err.empty() && (!rd.get(&count, 8) || count != params.size()))
      err = fmt::format("'{}' holds {} parameters, the module has {}", path, count, params.size());
    index_t off = 0;
    for (std::size_t i = 0; err.empty() && i < params.size(); ++i) {
      const auto& np = params[i];
      std::uint32_t nlen = 0, rank = 0;
      std::uint8_t dt = 0;
      std::string name;
      bool ok = rd.get(&nlen, 4) && nlen < (1u << 20);
      if (ok) {
        name.resize(nlen);
        ok = rd.get(name.data(), nlen);
      }
      ok = ok && rd.get(&dt, 1) && rd.get(&rank, 4) && rank <= 8;
      std::vector<index_t> shape(rank);
      ok = ok && rd.get(shape.data(), 8 * rank);
      if (!ok) { err = fmt::format("'{}' is malformed at parameter {}", path, i); break; }
      if (name != np.name || shape != np.param->shape() || dt != static_cast<std::uint8_t>(dtype_of<T>)) {
        err = fmt::format("parameter {} in '{}' is '{}' of shape {} ({}), the module expects '{}' of shape {} ({})",
                          i, path, name, shape, static_cast<DType>(dt), np.name, np.param->shape(), dtype_of<T>);
        break;
      }
      if (!rd.get(flat.data() + off, sizeof(T) * static_cast<std::size_t>(np.param->global_numel()))) {
        err = fmt::format("'{}' is malformed at parameter {}", path, i);
        break;
      }
      off += np.param->global_numel();
    }
    if (err.empty() && rd.pos != rd.end) err = fmt::format("'{}' has unread bytes after the last parameter", path);
  }
  comm->check_all(err.empty(), "Module::load", err);
  if (comm->rank() != 0) flat.resize(static_cast<std::size_t>(total));
  comm->broadcast(flat.data(), total, dtype_of<T>, 0);
  index_t off = 0;
  for (auto& np : params) {
    np.param->assign_from_full(flat.data() + off);  // this rank's block (the whole, if replicated)
    off += np.param->global_numel();
  }
}

template void save_parameters<float>(const std::vector<NamedParameter<float>>&, const std::string&);
template void save_parameters<double>(const std::vector<NamedParameter<double>>&, const std::string&);
template void load_parameters<float>(const std::vector<NamedParameter<float>>&, const std::string&);
template void load_parameters<double>(const std::vector<NamedParameter<double>>&, const std::string&);

}  // namespace shard::nn
