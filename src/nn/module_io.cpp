// Module parameter save/load. Rank 0 of the parameters' mesh does the file I/O; load broadcasts.
#include <cstdio>
#include <cstring>

#include "shardtensor/nn/module.hpp"

namespace shard::nn {

std::uint64_t seed_for(std::uint64_t seed, const std::string& name) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull ^ (seed * 0x9e3779b97f4a7c15ull);
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace {
constexpr char kMagic[4] = {'S', 'H', 'T', 'P'};
constexpr std::uint32_t kVersion = 1;

struct File {
  std::FILE* f = nullptr;
  ~File() {
    if (f) std::fclose(f);
  }
};

template <class T>
CommPtr comm_of(const std::vector<NamedParameter<T>>& params) {
  return params.empty() ? std::make_shared<SelfComm>() : params.front().param->mesh().comm();
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
    File file{std::fopen(path.c_str(), "wb")};
    if (!file.f) {
      err = fmt::format("cannot open '{}' for writing", path);
    } else {
      bool ok = std::fwrite(kMagic, 1, 4, file.f) == 4;
      ok = ok && std::fwrite(&kVersion, 4, 1, file.f) == 1;
      const std::uint64_t count = params.size();
      ok = ok && std::fwrite(&count, 8, 1, file.f) == 1;
      for (std::size_t i = 0; i < params.size(); ++i) {
        const auto& np = params[i];
        const auto len = static_cast<std::uint32_t>(np.name.size());
        const auto dt = static_cast<std::uint8_t>(dtype_of<T>);
        const auto shape = np.param->shape();
        const auto rank = static_cast<std::uint32_t>(shape.size());
        ok = ok && std::fwrite(&len, 4, 1, file.f) == 1 && std::fwrite(np.name.data(), 1, len, file.f) == len;
        ok = ok && std::fwrite(&dt, 1, 1, file.f) == 1 && std::fwrite(&rank, 4, 1, file.f) == 1;
        ok = ok && std::fwrite(shape.data(), 8, rank, file.f) == rank;
        const auto n = static_cast<std::size_t>(whole[i].numel());
        ok = ok && std::fwrite(whole[i].data(), sizeof(T), n, file.f) == n;
      }
      if (!ok) err = fmt::format("write to '{}' failed", path);
    }
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
    File file{std::fopen(path.c_str(), "rb")};
    flat.resize(static_cast<std::size_t>(total));
    if (!file.f) {
      err = fmt::format("cannot open '{}'", path);
    } else {
      char magic[4] = {};
      std::uint32_t version = 0;
      std::uint64_t count = 0;
      bool ok = std::fread(magic, 1, 4, file.f) == 4 && std::memcmp(magic, kMagic, 4) == 0;
      ok = ok && std::fread(&version, 4, 1, file.f) == 1 && version == kVersion;
      ok = ok && std::fread(&count, 8, 1, file.f) == 1;
      if (!ok) err = fmt::format("'{}' is not a shardtensor parameter file (version {})", path, kVersion);
      else if (count != params.size())
        err = fmt::format("'{}' holds {} parameters, the module has {}", path, count, params.size());
      index_t off = 0;
      for (std::size_t i = 0; err.empty() && i < params.size(); ++i) {
        const auto& np = params[i];
        std::uint32_t len = 0, rank = 0;
        std::uint8_t dt = 0;
        std::string name;
        ok = std::fread(&len, 4, 1, file.f) == 1 && len < (1u << 20);
        if (ok) {
          name.resize(len);
          ok = std::fread(name.data(), 1, len, file.f) == len;
        }
        ok = ok && std::fread(&dt, 1, 1, file.f) == 1 && std::fread(&rank, 4, 1, file.f) == 1 && rank <= 8;
        std::vector<index_t> shape(rank);
        ok = ok && std::fread(shape.data(), 8, rank, file.f) == rank;
        if (!ok) { err = fmt::format("'{}' is truncated", path); break; }
        if (name != np.name || shape != np.param->shape() || dt != static_cast<std::uint8_t>(dtype_of<T>)) {
          err = fmt::format("parameter {} in '{}' is '{}' of shape {} ({}), the module expects '{}' of shape {} ({})",
                            i, path, name, shape, static_cast<DType>(dt), np.name, np.param->shape(), dtype_of<T>);
          break;
        }
        const auto n = static_cast<std::size_t>(np.param->global_numel());
        if (std::fread(flat.data() + off, sizeof(T), n, file.f) != n) { err = fmt::format("'{}' is truncated", path); break; }
        off += np.param->global_numel();
      }
    }
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
