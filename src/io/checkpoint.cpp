// Checkpoints (io/checkpoint.hpp): one HDF5 file, written atomically, verified on load.
// Layout:
//   checkpoint/manifest     u8 text: one line per entry ("param\t<name>", "scalar\t<key>",
//                           "buffer\t<key>\t<dtype>\t<n>", "int\t<key>", "bytes\t<key>", "kind\t<k>")
//   checkpoint/step         i64[1]
//   params/<name>           each parameter's global dataset (replicated: rank 0 writes it;
//                           sharded: every rank its hyperslab, collectively)
//   optimizer/scalars       f64[k], in manifest order
//   optimizer/buffers/<i>   buffers (moments), i-th "buffer" line of the manifest: 1-D (rank 0's
//                           copy) for a replicated parameter's buffer; for a sharded parameter's
//                           ("buffer\t<key>\t<dtype>\t<global n>\tsharded") the global dataset
//                           laid out like the parameter, so it loads at any rank count / mesh
//   state/ints              i64[k]; state/bytes/<i> u8
// Every dataset carries its checksum (io/hdf5.cpp), verified when it is read.
#include "shardtensor/core/fsync.hpp"
#include "shardtensor/io/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "shardtensor/core/hash.hpp"
#include "shardtensor/exec/box.hpp"
#include "shardtensor/io/hdf5.hpp"

namespace shard::io {

namespace {

template <class T>
CommPtr comm_of(const nn::Module<T>& model) {
  auto ps = model.named_parameters();
  return ps.empty() ? std::make_shared<SelfComm>() : ps.front().param->mesh().comm();
}

std::vector<std::string> split(const std::string& s, char c) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, c)) out.push_back(cur);
  return out;
}

DType dtype_from_name(const std::string& name) {
  for (DType c : {DType::f32, DType::f64, DType::c64, DType::c128, DType::i32, DType::i64, DType::u8})
    if (name == dtype_name(c)) return c;
  return DType::f64;
}

/// This rank's block of a parameter (the whole value when replicated), shaped like its box.
template <class T>
Block param_block(const nn::ParameterBase<T>& p) {
  const auto& len = p.spec().local_box().len;
  return Block::view(dtype_of<T>, p.device(), p.data(), len.data(), static_cast<int>(len.size()));
}

/// The optimiser parameter index of a buffer key "<what>.<index>" (OptimizerState's convention),
/// or -1 when the key does not end in an index of `nparams`.
long buffer_param_index(const std::string& key, std::size_t nparams) {
  const auto dot = key.rfind('.');
  if (dot == std::string::npos || dot + 1 == key.size()) return -1;
  long i = 0;
  for (std::size_t c = dot + 1; c < key.size(); ++c) {
    if (key[c] < '0' || key[c] > '9' || i > (1L << 40)) return -1;
    i = 10 * i + (key[c] - '0');
  }
  return i < static_cast<long>(nparams) ? i : -1;
}

/// One optimiser buffer as it goes into the file.
struct BufferEntry {
  std::string key;
  DType dtype = DType::f64;
  index_t n = 0;          ///< global element count
  long param = -1;        ///< optimiser parameter index when the buffer is sharded like it, else -1
  const Block* local = nullptr;  ///< this rank's buffer (null: a sharded buffer this rank holds none of)
};

/// The buffers of `os`, in key order, agreed on by every rank. A sharded parameter's buffers
/// exist only on ranks whose block is non-empty (optimisers allocate them lazily), so the list of
/// those is taken from the rank holding the most, and every other rank must hold a subset
/// of it, missing only buffers of parameters it has no elements of. Collective.
template <class T>
std::vector<BufferEntry> agreed_buffers(const optim::OptimizerState& os,
                                        const std::vector<std::shared_ptr<nn::ParameterBase<T>>>& ps, Communicator& comm) {
  std::vector<BufferEntry> out;
  std::string mine;  // "key\tdtype\n" of this rank's sharded buffers
  std::string err;
  for (auto& [k, b] : os.buffers) {
    const long i = buffer_param_index(k, ps.size());
    if (i < 0 || !ps[static_cast<std::size_t>(i)]->sharded()) {
      out.push_back({k, b.dtype, b.numel(), -1, &b});
      continue;
    }
    const auto& p = *ps[static_cast<std::size_t>(i)];
    if (err.empty() && (b.rank != 1 || b.numel() != p.numel()))
      err = fmt::format("optimiser buffer '{}' has {} elements, its sharded parameter {} has {} on this rank", k,
                        b.numel(), i, p.numel());
    mine += fmt::format("{}\t{}\n", k, dtype_name(b.dtype));
  }
  comm.check_all(err.empty(), "save_checkpoint", err);
  const auto counts = comm.allgather_value(static_cast<std::int64_t>(mine.size()));
  int leader = 0;
  for (std::size_t r = 1; r < counts.size(); ++r)
    if (counts[r] > counts[static_cast<std::size_t>(leader)]) leader = static_cast<int>(r);
  std::string lines(static_cast<std::size_t>(counts[static_cast<std::size_t>(leader)]), '\0');
  if (comm.rank() == leader) lines = mine;
  if (!lines.empty()) comm.broadcast(lines.data(), static_cast<index_t>(lines.size()), DType::u8, leader);
  std::size_t held = 0;
  for (const auto& line : split(lines, '\n')) {
    const auto w = split(line, '\t');
    if (w.size() != 2) continue;
    const long i = buffer_param_index(w[0], ps.size());
    const auto& p = *ps[static_cast<std::size_t>(i)];
    BufferEntry e{w[0], dtype_from_name(w[1]), p.global_numel(), i, nullptr};
    if (auto it = os.buffers.find(w[0]); it != os.buffers.end()) {
      e.local = &it->second;
      ++held;
    } else if (err.empty() && p.numel() != 0) {
      err = fmt::format("rank {} holds {} elements of sharded parameter {} but no optimiser buffer '{}' (rank {} has one)",
                        comm.rank(), p.numel(), i, w[0], leader);
    }
    out.push_back(e);
  }
  if (err.empty() && static_cast<std::size_t>(std::count(mine.begin(), mine.end(), '\n')) != held)
    err = fmt::format("rank {} holds optimiser buffers of sharded parameters that rank {} lacks", comm.rank(), leader);
  comm.check_all(err.empty(), "save_checkpoint", err);
  std::sort(out.begin(), out.end(), [](const BufferEntry& a, const BufferEntry& b) { return a.key < b.key; });
  return out;
}

bool clean_key(const std::string& k) { return !k.empty() && k.find_first_of("\t\n") == std::string::npos; }

using shard::detail::fsync_path;


}  // namespace

template <class T>
void save_checkpoint(const std::string& path, const nn::Module<T>& model,
                     const std::type_identity_t<optim::Optimizer<master_t<T>>>* opt, const TrainingState& state) {
  using P = master_t<T>;  // the parameters' dtype (f32 masters of a bf16 / f16 model)
  auto comm = comm_of(model);
  const auto params = model.named_parameters();
  const optim::OptimizerState os = opt ? opt->state() : optim::OptimizerState{};
  // Validate everything before the file is created (identical on every rank).
  std::string err;
  if (!hdf5_available()) err = "shardtensor was built without HDF5 (SHARDTENSOR_ENABLE_HDF5=OFF)";
  for (auto& np : params)
    if (err.empty() && (!clean_key(np.name) || np.name.front() == '/' || np.name.find("//") != std::string::npos))
      err = fmt::format("parameter name '{}' cannot be stored", np.name);
  for (auto& [k, v] : state.ints)
    if (err.empty() && !clean_key(k)) err = fmt::format("state key '{}' is empty or holds a tab/newline", k);
  for (auto& [k, v] : state.bytes)
    if (err.empty() && !clean_key(k)) err = fmt::format("state key '{}' is empty or holds a tab/newline", k);
  comm->check_all(err.empty(), "save_checkpoint", err);

  const std::vector<BufferEntry> buffers =
      opt ? agreed_buffers<P>(os, opt->params(), *comm) : std::vector<BufferEntry>{};
  std::string manifest = fmt::format("format\t1\ndtype\t{}\n", dtype_name(dtype_of<P>));
  for (auto& np : params) manifest += fmt::format("param\t{}\n", np.name);
  if (opt) {
    manifest += fmt::format("kind\t{}\n", os.kind);
    for (auto& [k, v] : os.scalars) manifest += fmt::format("scalar\t{}\n", k);
    for (auto& b : buffers)
      manifest += fmt::format("buffer\t{}\t{}\t{}{}\n", b.key, dtype_name(b.dtype), b.n, b.param >= 0 ? "\tsharded" : "");
  }
  for (auto& [k, v] : state.ints) manifest += fmt::format("int\t{}\n", k);
  for (auto& [k, v] : state.bytes) manifest += fmt::format("bytes\t{}\n", k);
  // Rank 0's values are written, but every rank must have the same entries: each entry is one
  // collective dataset write.
  {
    const std::uint64_t h = shard::detail::fnv1a(manifest);
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
    for (auto& np : params) detail::write_dataset(f, "params/" + np.name, np.param->spec(), param_block(*np.param));
    if (opt) {
      std::vector<double> sc;
      for (auto& [k, v] : os.scalars) sc.push_back(v);
      detail::write_bytes(f, "optimizer/scalars", DType::f64, sc.data(), static_cast<index_t>(sc.size()));
      int i = 0;
      for (auto& b : buffers) {
        const std::string name = fmt::format("optimizer/buffers/{}", i++);
        if (b.param < 0) {
          detail::write_bytes(f, name, b.dtype, b.local->data, b.n);
          continue;
        }
        // Laid out like its parameter: this rank's block of the global buffer (none when empty).
        const auto& p = *opt->params()[static_cast<std::size_t>(b.param)];
        const auto& len = p.spec().local_box().len;
        detail::write_dataset(f, name, p.spec(),
                              Block::view(b.dtype, Device::cpu(), b.local ? b.local->data : nullptr, len.data(),
                                          static_cast<int>(len.size())));
      }
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
                              std::type_identity_t<optim::Optimizer<master_t<T>>>* opt) {
  using P = master_t<T>;  // the parameters' dtype (f32 masters of a bf16 / f16 model)
  auto comm = comm_of(model);
  const auto params = model.named_parameters();
  comm->check_all(hdf5_available(), "load_checkpoint", "shardtensor was built without HDF5 (SHARDTENSOR_ENABLE_HDF5=OFF)");
  H5File f(path, comm, H5File::Mode::read);
  std::string err;
  comm->check_all(f.exists("checkpoint/manifest"), "load_checkpoint",
                  fmt::format("'{}' is not a shardtensor checkpoint (no checkpoint/manifest)", path));
  const auto mbytes = detail::read_bytes(f, "checkpoint/manifest", DType::u8);
  const std::string manifest(mbytes.begin(), mbytes.end());
  std::vector<std::string> names, scalars, ints, bytes;
  std::vector<std::pair<std::string, index_t>> buffers;
  std::vector<DType> buffer_dtypes;
  std::vector<bool> buffer_sharded;
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
    else if (w[0] == "buffer" && (w.size() == 4 || (w.size() == 5 && w[4] == "sharded"))) {
      buffers.emplace_back(w[1], std::stoll(w[3]));
      buffer_dtypes.push_back(dtype_from_name(w[2]));
      buffer_sharded.push_back(w.size() == 5);
    }
  }
  // The model must have exactly the checkpoint's parameters, in order.
  if (dtype != dtype_name(dtype_of<P>))
    err = fmt::format("'{}' holds {} parameters, the model's are {}", path, dtype, dtype_name(dtype_of<P>));
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
    values.push_back(detail::read_dataset(f, "params/" + np.name, np.param->spec(), dtype_of<P>, Device::cpu()));
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
      if (buffer_sharded[i]) {
        // Laid out like its parameter: read this rank's block under the parameter's spec now.
        const long pi = buffer_param_index(buffers[i].first, opt->params().size());
        comm->check_all(pi >= 0, "load_checkpoint",
                        fmt::format("'{}': optimiser buffer '{}' belongs to no parameter of this optimiser ({} of them)",
                                    path, buffers[i].first, opt->params().size()));
        const auto& p = *opt->params()[static_cast<std::size_t>(pi)];
        const Block local = detail::read_dataset(f, fmt::format("optimizer/buffers/{}", i), p.spec(), buffer_dtypes[i],
                                                 Device::cpu());
        Block b = Block::allocate(buffer_dtypes[i], Device::cpu(), {local.numel()});
        if (local.numel() > 0) std::memcpy(b.data, local.data, static_cast<std::size_t>(local.numel()) * dtype_size(buffer_dtypes[i]));
        os.buffers.emplace(buffers[i].first, b);
        continue;
      }
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
  for (std::size_t i = 0; i < params.size(); ++i) {
    exec::box_copy(param_block(*params[i].param), values[i]);
    params[i].param->value_flat().bump_version();  // written in place (saved graphs, cached casts)
  }
  return st;
}

template void save_checkpoint<float>(const std::string&, const nn::Module<float>&, const optim::Optimizer<float>*,
                                     const TrainingState&);
template void save_checkpoint<double>(const std::string&, const nn::Module<double>&, const optim::Optimizer<double>*,
                                      const TrainingState&);
template TrainingState load_checkpoint<float>(const std::string&, const nn::Module<float>&, optim::Optimizer<float>*);
template TrainingState load_checkpoint<double>(const std::string&, const nn::Module<double>&, optim::Optimizer<double>*);
// bf16 / f16 models: f32 master parameters and optimiser state (a bf16 run's checkpoint resumes
// an fp32 run and vice versa).
template void save_checkpoint<bf16>(const std::string&, const nn::Module<bf16>&, const optim::Optimizer<float>*,
                                    const TrainingState&);
template void save_checkpoint<f16>(const std::string&, const nn::Module<f16>&, const optim::Optimizer<float>*,
                                   const TrainingState&);
template TrainingState load_checkpoint<bf16>(const std::string&, const nn::Module<bf16>&, optim::Optimizer<float>*);
template TrainingState load_checkpoint<f16>(const std::string&, const nn::Module<f16>&, optim::Optimizer<float>*);

}  // namespace shard::io
