// Checkpoints (io/checkpoint.hpp): one HDF5 file, written atomically, verified on load.
// Layout:
//   checkpoint/manifest     u8 text: one line per entry ("param\t<name>", "scalar\t<key>",
//                           "buffer\t<key>\t<dtype>\t<n>", "int\t<key>", "bytes\t<key>", "kind\t<k>")
//   checkpoint/step         i64[1]
//   params/<name>           each parameter's global dataset (replicated: rank 0 writes it)
//   optimizer/scalars       f64[k], in manifest order
//   optimizer/buffers/<i>   1-D buffers (moments), i-th "buffer" line of the manifest
//   state/ints              i64[k]; state/bytes/<i> u8
// Every dataset carries its checksum (io/hdf5.cpp), verified when it is read.
#include "shardtensor/io/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "shardtensor/exec/box.hpp"
#include "shardtensor/io/hdf5.hpp"

namespace shard::io {

namespace {

template <class T>
CommPtr comm_of(const nn::Module<T>& model) {
  auto ps = model.named_parameters();
  return ps.empty() ? std::make_shared<SelfComm>() : ps.front().param->mesh().comm();
}

/// The replicated spec of a parameter (every rank holds the whole value).
template <class T>
DistSpec param_spec(const nn::ParameterBase<T>& p) {
  const auto& mesh = p.mesh();
  return DistSpec(mesh, std::vector<Placement>(static_cast<std::size_t>(mesh.ndim()), Replicate()), p.shape());
}

template <class T>
Block param_block(const nn::ParameterBase<T>& p) {
  const auto shape = p.shape();
  return Block::view(dtype_of<T>, p.device(), p.data(), shape.data(), static_cast<int>(shape.size()));
}

bool clean_key(const std::string& k) { return !k.empty() && k.find_first_of("\t\n") == std::string::npos; }

/// fsync of a path (file or directory); "" or the error.
std::string fsync_path(const std::string& p, bool dir) {
  const int fd = ::open(p.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return fmt::format("open('{}') for fsync: {}", p, std::strerror(errno));
  std::string err;
  if (::fsync(fd) != 0) err = fmt::format("fsync('{}'): {}", p, std::strerror(errno));
  if (::close(fd) != 0 && err.empty()) err = fmt::format("close('{}'): {}", p, std::strerror(errno));
  return err;
}

std::vector<std::string> split(const std::string& s, char c) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, c)) out.push_back(cur);
  return out;
}

}  // namespace

template <class T>
void save_checkpoint(const std::string& path, const nn::Module<T>& model,
                     const std::type_identity_t<optim::Optimizer<T>>* opt, const TrainingState& state) {
  auto comm = comm_of(model);
  const auto params = model.named_parameters();
  const optim::OptimizerState os = opt ? opt->state() : optim::OptimizerState{};
  // Validate everything before the file is created (identical on every rank).
  std::string err;
  if (!hdf5_available()) err = "shardtensor was built without HDF5 (SHARDTENSOR_ENABLE_HDF5=OFF)";
  for (auto& np : params)
    if (err.empty() && (!clean_key(np.name) || np.name.front() == '/' || np.name.find("//") != std::string::npos))
      err = fmt::format("parameter name '{}' cannot be stored", np.name);
  for (auto& np : params)  // the spec is the same on every rank, so every rank refuses alike
    if (err.empty() && np.param->sharded())
      err = fmt::format("parameter '{}' is sharded; checkpoints of sharded parameters (and their sharded optimizer "
                        "state) are not supported yet",
                        np.name);
  for (auto& [k, v] : state.ints)
    if (err.empty() && !clean_key(k)) err = fmt::format("state key '{}' is empty or holds a tab/newline", k);
  for (auto& [k, v] : state.bytes)
    if (err.empty() && !clean_key(k)) err = fmt::format("state key '{}' is empty or holds a tab/newline", k);
  comm->check_all(err.empty(), "save_checkpoint", err);

  std::string manifest = fmt::format("format\t1\ndtype\t{}\n", dtype_name(dtype_of<T>));
  for (auto& np : params) manifest += fmt::format("param\t{}\n", np.name);
  if (opt) {
    manifest += fmt::format("kind\t{}\n", os.kind);
    for (auto& [k, v] : os.scalars) manifest += fmt::format("scalar\t{}\n", k);
    for (auto& [k, b] : os.buffers) manifest += fmt::format("buffer\t{}\t{}\t{}\n", k, dtype_name(b.dtype), b.numel());
  }
  for (auto& [k, v] : state.ints) manifest += fmt::format("int\t{}\n", k);
  for (auto& [k, v] : state.bytes) manifest += fmt::format("bytes\t{}\n", k);
  // Rank 0's values are written, but every rank must have the same entries: each entry is one
  // collective dataset write.
  {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : manifest) h = (h ^ c) * 0x100000001b3ull;
    const auto all = comm->allgather_value(static_cast<std::int64_t>(h));
    for (std::size_t r = 0; r < all.size() && err.empty(); ++r)
      if (all[r] != all[0])
        err = fmt::format("rank {} has other parameters, optimiser buffers or state keys than rank 0 (every rank must "
                          "pass the same entries)", r);
    comm->check_all(err.empty(), "save_checkpoint", err);
  }
  const std::string tmp = path + ".tmp";
  try {
    H5File f(tmp, comm, H5File::Mode::create);
    detail::write_bytes(f, "checkpoint/manifest", DType::u8, manifest.data(), static_cast<index_t>(manifest.size()));
    detail::write_bytes(f, "checkpoint/step", DType::i64, &state.step, 1);
    for (auto& np : params) detail::write_dataset(f, "params/" + np.name, param_spec(*np.param), param_block(*np.param));
    if (opt) {
      std::vector<double> sc;
      for (auto& [k, v] : os.scalars) sc.push_back(v);
      detail::write_bytes(f, "optimizer/scalars", DType::f64, sc.data(), static_cast<index_t>(sc.size()));
      int i = 0;
      for (auto& [k, b] : os.buffers)
        detail::write_bytes(f, fmt::format("optimizer/buffers/{}", i++), b.dtype, b.data, b.numel());
    }
    std::vector<std::int64_t> ints;
    for (auto& [k, v] : state.ints) ints.push_back(v);
    detail::write_bytes(f, "state/ints", DType::i64, ints.data(), static_cast<index_t>(ints.size()));
    int i = 0;
    for (auto& [k, v] : state.bytes)
      detail::write_bytes(f, fmt::format("state/bytes/{}", i++), DType::u8, v.data(), static_cast<index_t>(v.size()));
    f.close();
  } catch (...) {
    if (comm->rank() == 0) std::remove(tmp.c_str());
    throw;
  }
  // Make it durable, then atomically replace the previous checkpoint.
  if (comm->rank() == 0) {
    err = fsync_path(tmp, false);
    if (err.empty() && std::rename(tmp.c_str(), path.c_str()) != 0)
      err = fmt::format("rename('{}', '{}'): {}", tmp, path, std::strerror(errno));
    if (err.empty()) {
      auto dir = std::filesystem::path(path).parent_path();
      err = fsync_path(dir.empty() ? std::string(".") : dir.string(), true);
    } else {
      std::remove(tmp.c_str());
    }
  }
  comm->check_all(err.empty(), "save_checkpoint", err);
}

template <class T>
TrainingState load_checkpoint(const std::string& path, const nn::Module<T>& model,
                              std::type_identity_t<optim::Optimizer<T>>* opt) {
  auto comm = comm_of(model);
  const auto params = model.named_parameters();
  comm->check_all(hdf5_available(), "load_checkpoint", "shardtensor was built without HDF5 (SHARDTENSOR_ENABLE_HDF5=OFF)");
  for (auto& np : params)
    SHARD_CHECK(!np.param->sharded(), "load_checkpoint",
                "parameter '{}' is sharded; checkpoints of sharded parameters are not supported yet", np.name);
  H5File f(path, comm, H5File::Mode::read);
  std::string err;
  comm->check_all(f.exists("checkpoint/manifest"), "load_checkpoint",
                  fmt::format("'{}' is not a shardtensor checkpoint (no checkpoint/manifest)", path));
  const auto mbytes = detail::read_bytes(f, "checkpoint/manifest", DType::u8);
  const std::string manifest(mbytes.begin(), mbytes.end());
  std::vector<std::string> names, scalars, ints, bytes;
  std::vector<std::pair<std::string, index_t>> buffers;
  std::vector<DType> buffer_dtypes;
  std::string kind, dtype;
  for (const auto& line : split(manifest, '\n')) {
    const auto w = split(line, '\t');
    if (w.size() < 2) continue;
    if (w[0] == "param") names.push_back(w[1]);
    else if (w[0] == "kind") kind = w[1];
    else if (w[0] == "dtype") dtype = w[1];
    else if (w[0] == "scalar") scalars.push_back(w[1]);
    else if (w[0] == "int") ints.push_back(w[1]);
    else if (w[0] == "bytes") bytes.push_back(w[1]);
    else if (w[0] == "buffer" && w.size() == 4) {
      buffers.emplace_back(w[1], std::stoll(w[3]));
      DType d = DType::f64;
      for (DType c : {DType::f32, DType::f64, DType::c64, DType::c128, DType::i32, DType::i64, DType::u8})
        if (w[2] == dtype_name(c)) d = c;
      buffer_dtypes.push_back(d);
    }
  }
  // The model must have exactly the checkpoint's parameters, in order.
  if (dtype != dtype_name(dtype_of<T>))
    err = fmt::format("'{}' holds {} parameters, the model is {}", path, dtype, dtype_name(dtype_of<T>));
  else if (names.size() != params.size())
    err = fmt::format("'{}' holds {} parameters, the model has {}", path, names.size(), params.size());
  for (std::size_t i = 0; err.empty() && i < names.size(); ++i)
    if (names[i] != params[i].name)
      err = fmt::format("parameter {} of '{}' is '{}', the model's is '{}'", i, path, names[i], params[i].name);
  if (err.empty() && opt && kind.empty()) err = fmt::format("'{}' holds no optimiser state", path);
  comm->check_all(err.empty(), "load_checkpoint", err);

  // Read everything first (shapes and checksums checked), then commit.
  std::vector<Block> values;
  for (auto& np : params)
    values.push_back(detail::read_dataset(f, "params/" + np.name, param_spec(*np.param), dtype_of<T>, Device::cpu()));
  optim::OptimizerState os;
  if (opt) {
    os.kind = kind;
    const auto sc = detail::read_bytes(f, "optimizer/scalars", DType::f64);
    comm->check_all(sc.size() == scalars.size() * sizeof(double), "load_checkpoint",
                    fmt::format("'{}': optimizer/scalars does not match the manifest", path));
    for (std::size_t i = 0; i < scalars.size(); ++i) {
      double v;
      std::memcpy(&v, sc.data() + i * sizeof(double), sizeof(double));
      os.scalars[scalars[i]] = v;
    }
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      const auto raw = detail::read_bytes(f, fmt::format("optimizer/buffers/{}", i), buffer_dtypes[i]);
      const index_t n = static_cast<index_t>(raw.size() / dtype_size(buffer_dtypes[i]));
      Block b = Block::allocate(buffer_dtypes[i], Device::cpu(), {n});
      if (!raw.empty()) std::memcpy(b.data, raw.data(), raw.size());
      os.buffers.emplace(buffers[i].first, b);
    }
  }
  TrainingState st;
  {
    const auto s = detail::read_bytes(f, "checkpoint/step", DType::i64);
    comm->check_all(s.size() == 8, "load_checkpoint", fmt::format("'{}': checkpoint/step is not one integer", path));
    std::memcpy(&st.step, s.data(), 8);
    const auto iv = detail::read_bytes(f, "state/ints", DType::i64);
    comm->check_all(iv.size() == ints.size() * 8, "load_checkpoint",
                    fmt::format("'{}': state/ints does not match the manifest", path));
    for (std::size_t i = 0; i < ints.size(); ++i) std::memcpy(&st.ints[ints[i]], iv.data() + 8 * i, 8);
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      const auto b = detail::read_bytes(f, fmt::format("state/bytes/{}", i), DType::u8);
      st.bytes[bytes[i]] = std::string(b.begin(), b.end());
    }
  }
  f.close();
  // Commit: the optimiser first (its checks are local but identical on every rank), then values.
  if (opt) {
    err.clear();
    try {
      opt->load_state(os);
    } catch (const Error& e) {
      err = e.what();
    }
    comm->check_all(err.empty(), "load_checkpoint", err);
  }
  for (std::size_t i = 0; i < params.size(); ++i) exec::box_copy(param_block(*params[i].param), values[i]);
  return st;
}

template void save_checkpoint<float>(const std::string&, const nn::Module<float>&, const optim::Optimizer<float>*,
                                     const TrainingState&);
template void save_checkpoint<double>(const std::string&, const nn::Module<double>&, const optim::Optimizer<double>*,
                                      const TrainingState&);
template TrainingState load_checkpoint<float>(const std::string&, const nn::Module<float>&, optim::Optimizer<float>*);
template TrainingState load_checkpoint<double>(const std::string&, const nn::Module<double>&, optim::Optimizer<double>*);

}  // namespace shard::io
