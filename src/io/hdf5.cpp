// Parallel HDF5 I/O of DistTensors (io/hdf5.hpp). One global dataset per tensor; each rank
// selects its own hyperslab (or none: replicas other than the box writer, empty shards) and
// every rank takes part in one collective H5Dwrite/H5Dread (H5FD_MPIO_COLLECTIVE). Every
// failure is turned into shard::Error on every rank through Communicator::check_all, so no
// rank is left inside a collective HDF5 call another rank never makes.
#include "shardtensor/io/hdf5.hpp"

#include <algorithm>
#include <cstring>
#include <optional>

#include "shardtensor/config.hpp"
#include "shardtensor/dist/gather.hpp"
#include "shardtensor/dist/redistribute.hpp"
#include "shardtensor/exec/box.hpp"

#if SHARDTENSOR_HAS_HDF5
#include <hdf5.h>

#include "shardtensor/comm/mpi_comm.hpp"
#endif

namespace shard::io {

namespace detail {

namespace {
inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/// One element's term: its global linear index and its bytes (up to 16).
inline std::uint64_t element_hash(std::uint64_t gidx, const unsigned char* p, std::size_t es) {
  std::uint64_t w[2] = {0, 0};
  std::memcpy(w, p, std::min<std::size_t>(es, 16));
  return mix64(mix64(gidx) ^ w[0] ^ mix64(w[1] + 0x51ed27ull));
}
}  // namespace

std::uint64_t box_checksum(DType dt, const std::vector<index_t>& global_shape, const Box& box, const void* data) {
  const int R = static_cast<int>(global_shape.size());
  const std::size_t es = dtype_size(dt);
  if (box.numel() == 0) return 0;
  if (R == 0) return element_hash(0, static_cast<const unsigned char*>(data), es);
  std::vector<index_t> gstride(static_cast<std::size_t>(R), 1);
  for (int d = R - 2; d >= 0; --d)
    gstride[static_cast<std::size_t>(d)] = gstride[static_cast<std::size_t>(d) + 1] * global_shape[static_cast<std::size_t>(d) + 1];
  const index_t inner = box.len[static_cast<std::size_t>(R) - 1];
  const index_t rows = box.numel() / inner;
  std::uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) if (rows * inner > 65536)
  for (index_t row = 0; row < rows; ++row) {
    // Global index of the row's first element: unravel `row` over the box's outer dims.
    index_t rem = row, g = box.lo[static_cast<std::size_t>(R) - 1];
    for (int d = R - 2; d >= 0; --d) {
      const index_t l = box.len[static_cast<std::size_t>(d)];
      g += (box.lo[static_cast<std::size_t>(d)] + rem % l) * gstride[static_cast<std::size_t>(d)];
      rem /= l;
    }
    const auto* p = static_cast<const unsigned char*>(data) + static_cast<std::size_t>(row * inner) * es;
    std::uint64_t s = 0;
    for (index_t i = 0; i < inner; ++i) s += element_hash(static_cast<std::uint64_t>(g + i), p + static_cast<std::size_t>(i) * es, es);
    sum += s;
  }
  return sum;
}

}  // namespace detail


#if SHARDTENSOR_HAS_HDF5

bool hdf5_available() noexcept { return true; }

namespace {
/// The sum (mod 2^64) of every rank's value.
std::uint64_t sum_over_ranks(Communicator& comm, std::uint64_t v) {
  std::uint64_t s = 0;
  for (auto x : comm.allgather_value(static_cast<std::int64_t>(v))) s += static_cast<std::uint64_t>(x);
  return s;
}
}  // namespace

namespace {

/// Silences HDF5's automatic error printing for a scope (restores the caller's handler).
struct QuietErrors {
  H5E_auto2_t fn = nullptr;
  void* data = nullptr;
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &fn, &data);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, fn, data); }
};

/// The innermost messages of HDF5's error stack ("" when empty), then clears it.
std::string h5_error() {
  std::string out;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned n, const H5E_error2_t* e, void* p) -> herr_t {
        auto& s = *static_cast<std::string*>(p);
        if (n < 3 && e->desc && *e->desc) s += fmt::format("{}{}", s.empty() ? "" : "; ", e->desc);
        return 0;
      },
      &out);
  H5Eclear2(H5E_DEFAULT);
  return out.empty() ? "HDF5 call failed" : out;
}

/// RAII for an hid_t with its close function; close() reports failure.
struct Hid {
  hid_t id = -1;
  herr_t (*closer)(hid_t) = nullptr;
  Hid() = default;
  Hid(hid_t i, herr_t (*c)(hid_t)) : id(i), closer(c) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid(Hid&& o) noexcept : id(o.id), closer(o.closer) { o.id = -1; }
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      if (id >= 0 && closer) closer(id);
      id = o.id;
      closer = o.closer;
      o.id = -1;
    }
    return *this;
  }
  ~Hid() {
    if (id >= 0 && closer) closer(id);
  }
  bool close() {
    const bool ok = id < 0 || closer(id) >= 0;
    id = -1;
    return ok;
  }
  operator hid_t() const { return id; }
  bool ok() const { return id >= 0; }
};

/// HDF5 memory/file type of a dtype (compound {r, i} for complex, as h5py writes them;
/// bf16/f16 as 16-bit unsigned storage, the dtype attribute says what they are).
Hid h5_type(DType dt) {
  switch (dt) {
    case DType::f32: return {H5Tcopy(H5T_NATIVE_FLOAT), H5Tclose};
    case DType::f64: return {H5Tcopy(H5T_NATIVE_DOUBLE), H5Tclose};
    case DType::i32: return {H5Tcopy(H5T_NATIVE_INT32), H5Tclose};
    case DType::i64: return {H5Tcopy(H5T_NATIVE_INT64), H5Tclose};
    case DType::u8: return {H5Tcopy(H5T_NATIVE_UINT8), H5Tclose};
    case DType::bf16:
    case DType::f16: return {H5Tcopy(H5T_NATIVE_UINT16), H5Tclose};
    case DType::c64:
    case DType::c128: {
      const bool d = dt == DType::c128;
      const hid_t part = d ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT;
      const std::size_t ps = d ? 8 : 4;
      hid_t t = H5Tcreate(H5T_COMPOUND, 2 * ps);
      H5Tinsert(t, "r", 0, part);
      H5Tinsert(t, "i", ps, part);
      return {t, H5Tclose};
    }
  }
  return {};
}

std::vector<hsize_t> hs(const std::vector<index_t>& v) { return {v.begin(), v.end()}; }

/// The file's transfer property list: collective MPI-IO under an MPI communicator.
Hid transfer_plist(const H5File& f) {
  Hid dx(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  if (dynamic_cast<const MpiComm*>(f.comm().get())) H5Pset_dxpl_mpio(dx, H5FD_MPIO_COLLECTIVE);
  return dx;
}

void write_string_attr(hid_t obj, const char* name, const std::string& v, bool& ok) {
  if (!ok) return;
  Hid t(H5Tcopy(H5T_C_S1), H5Tclose);
  ok = t.ok() && H5Tset_size(t, std::max<std::size_t>(v.size(), 1)) >= 0;
  Hid sp(H5Screate(H5S_SCALAR), H5Sclose);
  Hid a(ok ? H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT) : -1, H5Aclose);
  ok = a.ok() && H5Awrite(a, t, v.empty() ? " " : v.data()) >= 0 && a.close();
}
std::string read_string_attr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return "";
  Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  Hid t(H5Aget_type(a), H5Tclose);
  const std::size_t n = H5Tget_size(t);
  if (n == 0 || n > (1u << 20)) return "";
  std::string s(n, '\0');
  Hid mt(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mt, n);
  if (H5Aread(a, mt, s.data()) < 0) return "";
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}
void write_i64_attr(hid_t obj, const char* name, const std::vector<std::int64_t>& v, bool& ok) {
  if (!ok) return;
  const hsize_t n = std::max<hsize_t>(v.size(), 1);
  std::vector<std::int64_t> w = v.empty() ? std::vector<std::int64_t>{0} : v;
  Hid sp(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Hid a(H5Acreate2(obj, name, H5T_NATIVE_INT64, sp, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  ok = a.ok() && H5Awrite(a, H5T_NATIVE_INT64, w.data()) >= 0 && a.close();
}
std::vector<std::int64_t> read_i64_attr(hid_t obj, const char* name, bool& found) {
  found = false;
  if (H5Aexists(obj, name) <= 0) return {};
  Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  Hid sp(H5Aget_space(a), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(sp);
  if (n < 0 || n > 64) return {};
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  if (H5Aread(a, H5T_NATIVE_INT64, v.data()) < 0) return {};
  found = true;
  return v;
}

std::optional<DType> h5_dtype_from_name(const std::string& s) {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8, DType::c64,
                  DType::c128})
    if (s == dtype_name(d)) return d;
  return std::nullopt;
}

/// Selects this rank's part of a collective transfer: `box` of the rank-R file space and a
/// contiguous memory space of box.numel() elements when `active` and the box is non-empty;
/// otherwise an empty selection on both (the rank still takes part in the collective call).
bool select_box(hid_t fspace, Hid& mspace, int R, bool active, const Box& box) {
  if (active && box.numel() > 0) {
    bool ok = true;
    if (R > 0) {
      auto lo = hs(box.lo), len = hs(box.len);
      ok = H5Sselect_hyperslab(fspace, H5S_SELECT_SET, lo.data(), nullptr, len.data(), nullptr) >= 0;
    }
    const hsize_t n = static_cast<hsize_t>(box.numel());
    mspace = Hid(H5Screate_simple(1, &n, nullptr), H5Sclose);
    return ok && mspace.ok();
  }
  const hsize_t one = 1;
  bool ok = H5Sselect_none(fspace) >= 0;
  mspace = Hid(H5Screate_simple(1, &one, nullptr), H5Sclose);
  return ok && mspace.ok() && H5Sselect_none(mspace) >= 0;
}

/// Creates dataset `name` and writes this rank's box (or nothing), collectively; attributes
/// (identical on every rank) and the checksum (collective sum of every writer's share).
void write_core(H5File& f, const std::string& name, DType dt, const std::vector<index_t>& gshape, bool writes,
                const Box& box, const void* data, const std::string& placements, const std::vector<index_t>& mesh_shape) {
  auto& comm = *f.comm();
  std::string err;
  if (!f.is_open()) err = "the file is not open";
  else if (f.exists(name)) err = fmt::format("dataset '{}' already exists in '{}'", name, f.path());
  comm.check_all(err.empty(), "io::write", err);
  const std::uint64_t sum = sum_over_ranks(comm, writes ? detail::box_checksum(dt, gshape, box, data) : 0);
  QuietErrors quiet;
  bool ok = true;
  const int R = static_cast<int>(gshape.size());
  auto dims = hs(gshape);
  Hid type = h5_type(dt);
  Hid fspace(R == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(R, dims.data(), nullptr), H5Sclose);
  Hid lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl, 1);
  Hid dset(H5Dcreate2(static_cast<hid_t>(f.id()), name.c_str(), type, fspace, lcpl, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  ok = dset.ok() && fspace.ok() && type.ok();
  // Selections: own box, or none. Memory space: the box, contiguous.
  Hid mspace;
  if (ok) ok = select_box(fspace, mspace, R, writes, box);
  const unsigned char dummy[16] = {};
  Hid dx = transfer_plist(f);
  if (ok) ok = H5Dwrite(dset, type, mspace, fspace, dx, writes && box.numel() > 0 ? data : dummy) >= 0;
  write_string_attr(dset, "shard_dtype", dtype_name(dt), ok);
  write_string_attr(dset, "shard_placements", placements, ok);
  write_i64_attr(dset, "shard_mesh_shape", {mesh_shape.begin(), mesh_shape.end()}, ok);
  write_i64_attr(dset, "shard_global_shape", {gshape.begin(), gshape.end()}, ok);
  write_i64_attr(dset, "shard_checksum", {static_cast<std::int64_t>(sum)}, ok);
  ok = dset.close() && ok;
  if (!ok) err = fmt::format("writing dataset '{}' ({} of shape {}) to '{}' failed: {}", name, dtype_name(dt), gshape,
                             f.path(), h5_error());
  comm.check_all(ok, "io::write", err);
}

/// Reads this rank's box of dataset `name` into `data` (contiguous host), collectively; ranks
/// with `counts` contribute their box to the checksum, which must equal the stored one.
void read_core(H5File& f, const std::string& name, DType dt, const std::vector<index_t>& gshape, bool reads,
               bool counts, const Box& box, void* data) {
  auto& comm = *f.comm();
  QuietErrors quiet;
  const int R = static_cast<int>(gshape.size());
  Hid type = h5_type(dt);
  Hid dset(H5Dopen2(static_cast<hid_t>(f.id()), name.c_str(), H5P_DEFAULT), H5Dclose);
  Hid fspace(dset.ok() ? H5Dget_space(dset) : -1, H5Sclose);
  bool ok = dset.ok() && fspace.ok() && type.ok();
  Hid mspace;
  if (ok) ok = select_box(fspace, mspace, R, reads, box);
  unsigned char dummy[16] = {};
  Hid dx = transfer_plist(f);
  if (ok) ok = H5Dread(dset, type, mspace, fspace, dx, reads && box.numel() > 0 ? data : dummy) >= 0;
  bool found = false;
  std::vector<std::int64_t> stored = ok ? read_i64_attr(dset, "shard_checksum", found) : std::vector<std::int64_t>{};
  std::string err;
  if (!ok) err = fmt::format("reading dataset '{}' of '{}' failed: {}", name, f.path(), h5_error());
  else if (!found || stored.size() != 1)
    err = fmt::format("dataset '{}' of '{}' has no shard_checksum attribute (not written by shardtensor, or damaged)",
                      name, f.path());
  comm.check_all(err.empty(), "io::read", err);
  const std::uint64_t sum = sum_over_ranks(comm, counts && reads ? detail::box_checksum(dt, gshape, box, data) : 0);
  if (sum != static_cast<std::uint64_t>(stored[0]))
    err = fmt::format("checksum mismatch in dataset '{}' of '{}' (stored {:#018x}, data {:#018x}): the file is corrupted",
                      name, f.path(), static_cast<std::uint64_t>(stored[0]), sum);
  comm.check_all(err.empty(), "io::read", err);
}

}  // namespace

H5File::H5File(const std::string& path, CommPtr comm, Mode mode) : path_(path), comm_(std::move(comm)) {
  SHARD_CHECK(comm_ != nullptr, "H5File", "null communicator for '{}'", path);
  QuietErrors quiet;
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (auto* mc = dynamic_cast<MpiComm*>(comm_.get())) H5Pset_fapl_mpio(fapl, mc->native(), MPI_INFO_NULL);
  else
    SHARD_CHECK(comm_->size() == 1, "H5File", "a {}-rank {} communicator cannot open '{}' (needs MpiComm)", comm_->size(),
                comm_->backend(), path);
  hid_t id = mode == Mode::create ? H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl)
                                  : H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  std::string err;
  if (id < 0)
    err = fmt::format("cannot {} '{}': {}", mode == Mode::create ? "create" : "open", path, h5_error());
  const bool ok = id >= 0;
  try {
    comm_->check_all(ok, "H5File", err);
  } catch (...) {
    if (id >= 0) H5Fclose(id);
    throw;
  }
  id_ = id;
}

H5File::~H5File() {
  if (id_ >= 0) {
    QuietErrors quiet;
    H5Fclose(static_cast<hid_t>(id_));
  }
}
H5File::H5File(H5File&& o) noexcept : id_(o.id_), path_(std::move(o.path_)), comm_(std::move(o.comm_)) { o.id_ = -1; }
H5File& H5File::operator=(H5File&& o) noexcept {
  if (this != &o) {
    if (id_ >= 0) H5Fclose(static_cast<hid_t>(id_));
    id_ = o.id_;
    path_ = std::move(o.path_);
    comm_ = std::move(o.comm_);
    o.id_ = -1;
  }
  return *this;
}

void H5File::close() {
  if (id_ < 0) return;
  QuietErrors quiet;
  const hid_t id = static_cast<hid_t>(id_);
  id_ = -1;
  unsigned intent = 0;
  H5Fget_intent(id, &intent);
  bool ok = true;
  // Writers: flush to storage (MPI_File_sync under MPI-IO, fsync-free flush otherwise).
  if (intent & H5F_ACC_RDWR) ok = H5Fflush(id, H5F_SCOPE_GLOBAL) >= 0;
  ok = H5Fclose(id) >= 0 && ok;
  comm_->check_all(ok, "H5File::close", ok ? "" : fmt::format("closing '{}' failed: {}", path_, h5_error()));
}

bool H5File::is_open() const noexcept { return id_ >= 0; }
const std::string& H5File::path() const noexcept { return path_; }
const CommPtr& H5File::comm() const noexcept { return comm_; }
std::int64_t H5File::id() const noexcept { return id_; }

bool H5File::exists(const std::string& name) const {
  SHARD_CHECK(id_ >= 0, "H5File::exists", "'{}' is not open", path_);
  QuietErrors quiet;
  // Walk the path component by component (H5Lexists needs every parent to exist).
  std::size_t pos = 0;
  while (true) {
    const std::size_t next = name.find('/', pos);
    const std::string prefix = name.substr(0, next);
    if (!prefix.empty() && H5Lexists(static_cast<hid_t>(id_), prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    if (next == std::string::npos) return true;
    pos = next + 1;
  }
}

namespace detail {

DatasetInfo dataset_info(const H5File& f, const std::string& name) {
  auto& comm = *f.comm();
  std::string err;
  DatasetInfo info;
  if (!f.is_open()) err = "the file is not open";
  else if (!f.exists(name)) err = fmt::format("no dataset '{}' in '{}'", name, f.path());
  if (err.empty()) {
    QuietErrors quiet;
    Hid dset(H5Dopen2(static_cast<hid_t>(f.id()), name.c_str(), H5P_DEFAULT), H5Dclose);
    Hid sp(dset.ok() ? H5Dget_space(dset) : -1, H5Sclose);
    const int nd = sp.ok() ? H5Sget_simple_extent_ndims(sp) : -1;
    if (nd < 0 || nd > 8) err = fmt::format("cannot open dataset '{}' of '{}': {}", name, f.path(), h5_error());
    else {
      std::vector<hsize_t> dims(static_cast<std::size_t>(nd));
      H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
      info.shape.assign(dims.begin(), dims.end());
      const auto dt = h5_dtype_from_name(read_string_attr(dset, "shard_dtype"));
      if (!dt) err = fmt::format("dataset '{}' of '{}' has no valid shard_dtype attribute", name, f.path());
      else info.dtype = *dt;
      info.placements = read_string_attr(dset, "shard_placements");
      bool found = false;
      auto ms = read_i64_attr(dset, "shard_mesh_shape", found);
      info.mesh_shape.assign(ms.begin(), ms.end());
      if (err.empty()) {
        Hid ft(H5Dget_type(dset), H5Tclose);
        if (!ft.ok() || H5Tget_size(ft) != dtype_size(info.dtype))
          err = fmt::format("dataset '{}' of '{}': stored element size does not match its dtype {}", name, f.path(),
                            dtype_name(info.dtype));
      }
    }
  }
  comm.check_all(err.empty(), "io::read", err);
  return info;
}

/// This rank's block on the host, contiguous, with Partial placements reduced (np: spec without
/// partials): what a writer replica writes.
static Block host_without_partials(const shard::DistSpec& spec, const shard::DistSpec& np, const Block& local) {
  Block host = local;
  if (!host.device.is_cpu() || !host.is_contiguous()) {
    host = Block::allocate(local.dtype, Device::cpu(), local.shape.data(), local.rank);
    exec::box_copy(host, local);
  }
  if (spec.has_partial()) {
    host = shard::detail::redistribute(spec, host, np);
    if (!host.is_contiguous()) {
      Block c = Block::allocate(host.dtype, Device::cpu(), host.shape.data(), host.rank);
      exec::box_copy(c, host);
      host = c;
    }
  }
  return host;
}

void write_dataset(H5File& f, const std::string& name, const DistSpec& spec, const Block& local) {
  auto& comm = *f.comm();
  std::string err;
  if (spec.mesh().size() != comm.size())
    err = fmt::format("the tensor's mesh has {} ranks, the file '{}' is open on {}", spec.mesh().size(), f.path(),
                      comm.size());
  comm.check_all(err.empty(), "io::write", err);
  // Partials reduced first (allreduce, O(local)); the writer replica writes its box.
  const shard::DistSpec np = shard::detail::without_partials(spec);
  const Block host = host_without_partials(spec, np, local);
  const bool writes = shard::detail::is_box_writer(np, spec.mesh().comm()->rank());
  write_core(f, name, local.dtype, spec.global_shape(), writes, np.local_box(), host.data,
             fmt::format("[{}]", fmt::join(spec.placements(), ", ")),
             std::vector<index_t>(spec.mesh().shape().begin(), spec.mesh().shape().end()));
}

Block read_dataset(H5File& f, const std::string& name, const DistSpec& spec, DType dt, Device dev) {
  auto& comm = *f.comm();
  const DatasetInfo info = dataset_info(f, name);
  std::string err;
  if (spec.mesh().size() != comm.size())
    err = fmt::format("the reader's mesh has {} ranks, the file '{}' is open on {}", spec.mesh().size(), f.path(),
                      comm.size());
  else if (info.dtype != dt)
    err = fmt::format("dataset '{}' of '{}' holds {}, {} was asked for", name, f.path(), dtype_name(info.dtype),
                      dtype_name(dt));
  else if (info.shape != spec.global_shape())
    err = fmt::format("dataset '{}' of '{}' has shape {}, the reader expects {}", name, f.path(), info.shape,
                      spec.global_shape());
  comm.check_all(err.empty(), "io::read", err);
  const shard::DistSpec np = shard::detail::without_partials(spec);
  const Box& box = np.local_box();
  Block host = Block::allocate(dt, Device::cpu(), box.len);
  const bool counts = shard::detail::is_box_writer(np, spec.mesh().comm()->rank());
  read_core(f, name, dt, info.shape, true, counts, box, host.data);
  if (spec.has_partial()) host = shard::detail::redistribute(np, host, spec);
  if (dev.is_cpu()) return host;
  Block out = Block::allocate(dt, dev, host.shape.data(), host.rank);
  exec::box_copy(out, host);
  return out;
}

void create_dataset(H5File& f, const std::string& name, DType dt, const std::vector<index_t>& shape,
                    const std::vector<index_t>& chunk) {
  auto& comm = *f.comm();
  std::string err;
  const int R = static_cast<int>(shape.size());
  if (!f.is_open()) err = "the file is not open";
  else if (f.exists(name)) err = fmt::format("dataset '{}' already exists in '{}'", name, f.path());
  else if (R == 0) err = fmt::format("dataset '{}': create_dataset needs at least one dim", name);
  else if (!chunk.empty() && chunk.size() != shape.size())
    err = fmt::format("dataset '{}': chunk {} has {} extents, the shape {} has {}", name, chunk, chunk.size(), shape, R);
  for (index_t e : shape)
    if (err.empty() && e < 0) err = fmt::format("dataset '{}': negative extent in shape {}", name, shape);
  comm.check_all(err.empty(), "io::create_dataset", err);
  QuietErrors quiet;
  auto dims = hs(shape);
  Hid type = h5_type(dt);
  Hid fspace(H5Screate_simple(R, dims.data(), nullptr), H5Sclose);
  Hid lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl, 1);
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  bool ok = fspace.ok() && type.ok() && dcpl.ok();
  index_t numel = 1;
  for (index_t e : shape) numel *= e;
  if (ok && !chunk.empty() && numel > 0) {
    std::vector<hsize_t> c(shape.size());
    for (std::size_t d = 0; d < shape.size(); ++d) c[d] = static_cast<hsize_t>(std::clamp<index_t>(chunk[d], 1, shape[d]));
    ok = H5Pset_chunk(dcpl, R, c.data()) >= 0;
    // Parallel HDF5 writes chunked datasets collectively only with early allocation.
    if (ok) ok = H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) >= 0;
  }
  Hid dset(ok ? H5Dcreate2(static_cast<hid_t>(f.id()), name.c_str(), type, fspace, lcpl, dcpl, H5P_DEFAULT) : -1,
           H5Dclose);
  ok = ok && dset.ok();
  write_string_attr(dset, "shard_dtype", dtype_name(dt), ok);
  write_i64_attr(dset, "shard_global_shape", {shape.begin(), shape.end()}, ok);
  ok = dset.close() && ok;
  if (!ok) err = fmt::format("creating dataset '{}' ({} of shape {}, chunk {}) in '{}' failed: {}", name, dtype_name(dt),
                             shape, chunk, f.path(), h5_error());
  comm.check_all(ok, "io::create_dataset", err);
}

std::vector<index_t> dataset_shape(const H5File& f, const std::string& name) {
  auto& comm = *f.comm();
  std::string err;
  std::vector<index_t> shape;
  if (!f.is_open()) err = "the file is not open";
  else if (!f.exists(name)) err = fmt::format("no dataset '{}' in '{}'", name, f.path());
  if (err.empty()) {
    QuietErrors quiet;
    Hid dset(H5Dopen2(static_cast<hid_t>(f.id()), name.c_str(), H5P_DEFAULT), H5Dclose);
    Hid sp(dset.ok() ? H5Dget_space(dset) : -1, H5Sclose);
    const int nd = sp.ok() ? H5Sget_simple_extent_ndims(sp) : -1;
    if (nd < 0 || nd > 8) err = fmt::format("cannot open dataset '{}' of '{}': {}", name, f.path(), h5_error());
    else {
      std::vector<hsize_t> dims(static_cast<std::size_t>(nd));
      H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
      shape.assign(dims.begin(), dims.end());
    }
  }
  comm.check_all(err.empty(), "io::dataset_shape", err);
  return shape;
}

namespace {
/// Checks that [origin, origin + extent) lies inside dataset `name` (same rank); the error text.
std::string region_error(const H5File& f, const std::string& name, const std::vector<index_t>& file_shape,
                         const std::vector<index_t>& origin, const std::vector<index_t>& extent, int mesh_size) {
  if (mesh_size != f.comm()->size())
    return fmt::format("the tensor's mesh has {} ranks, the file '{}' is open on {}", mesh_size, f.path(),
                       f.comm()->size());
  if (origin.size() != extent.size() || file_shape.size() != extent.size())
    return fmt::format("region at {} of extent {} does not match dataset '{}' of '{}' with shape {}", origin, extent,
                       name, f.path(), file_shape);
  for (std::size_t d = 0; d < extent.size(); ++d)
    if (origin[d] < 0 || origin[d] + extent[d] > file_shape[d])
      return fmt::format("region at {} of extent {} is outside dataset '{}' of '{}' with shape {}", origin, extent,
                         name, f.path(), file_shape);
  return "";
}

/// One collective transfer of this rank's box shifted by `origin` (write or read).
void region_transfer(H5File& f, const std::string& name, DType dt, bool active, Box box,
                     const std::vector<index_t>& origin, void* data, bool write, const char* op) {
  QuietErrors quiet;
  for (std::size_t d = 0; d < origin.size(); ++d) box.lo[d] += origin[d];
  Hid type = h5_type(dt);
  Hid dset(H5Dopen2(static_cast<hid_t>(f.id()), name.c_str(), H5P_DEFAULT), H5Dclose);
  Hid fspace(dset.ok() ? H5Dget_space(dset) : -1, H5Sclose);
  bool ok = dset.ok() && fspace.ok() && type.ok();
  Hid mspace;
  if (ok) ok = select_box(fspace, mspace, static_cast<int>(origin.size()), active, box);
  unsigned char dummy[16] = {};
  void* buf = active && box.numel() > 0 ? data : dummy;
  Hid dx = transfer_plist(f);
  if (ok) ok = (write ? H5Dwrite(dset, type, mspace, fspace, dx, buf) : H5Dread(dset, type, mspace, fspace, dx, buf)) >= 0;
  ok = dset.close() && ok;
  f.comm()->check_all(ok, op,
                      ok ? "" : fmt::format("{} region at {} of dataset '{}' of '{}' failed: {}", write ? "writing" : "reading",
                                            origin, name, f.path(), h5_error()));
}
}  // namespace

void write_region(H5File& f, const std::string& name, const DistSpec& spec, const Block& local,
                  const std::vector<index_t>& origin) {
  std::string err;
  if (!f.is_open()) err = "the file is not open";
  f.comm()->check_all(err.empty(), "io::write_region", err);
  const DatasetInfo info = dataset_info(f, name);
  err = region_error(f, name, info.shape, origin, spec.global_shape(), spec.mesh().size());
  if (err.empty() && info.dtype != local.dtype)
    err = fmt::format("dataset '{}' of '{}' holds {}, the tensor {}", name, f.path(), dtype_name(info.dtype),
                      dtype_name(local.dtype));
  f.comm()->check_all(err.empty(), "io::write_region", err);
  const shard::DistSpec np = shard::detail::without_partials(spec);
  const Block host = host_without_partials(spec, np, local);
  const bool writes = shard::detail::is_box_writer(np, spec.mesh().comm()->rank());
  region_transfer(f, name, local.dtype, writes, np.local_box(), origin, host.data, true, "io::write_region");
}

Block read_region(H5File& f, const std::string& name, const DistSpec& spec, DType dt, Device dev,
                  const std::vector<index_t>& origin) {
  const std::vector<index_t> shape = detail::dataset_shape(f, name);
  const std::string err = region_error(f, name, shape, origin, spec.global_shape(), spec.mesh().size());
  f.comm()->check_all(err.empty(), "io::read_region", err);
  const shard::DistSpec np = shard::detail::without_partials(spec);
  const Box& box = np.local_box();
  Block host = Block::allocate(dt, Device::cpu(), box.len);
  region_transfer(f, name, dt, true, box, origin, host.data, false, "io::read_region");
  if (spec.has_partial()) host = shard::detail::redistribute(np, host, spec);
  if (dev.is_cpu()) return host;
  Block out = Block::allocate(dt, dev, host.shape.data(), host.rank);
  exec::box_copy(out, host);
  return out;
}

void write_bytes(H5File& f, const std::string& name, DType dt, const void* data, index_t count) {
  const bool root = f.comm()->rank() == 0;
  write_core(f, name, dt, {count}, root, Box{{0}, {count}}, data, "[R]", {f.comm()->size()});
}

std::vector<unsigned char> read_bytes(H5File& f, const std::string& name, DType dt) {
  const DatasetInfo info = dataset_info(f, name);
  std::string err;
  if (info.dtype != dt || info.shape.size() != 1)
    err = fmt::format("dataset '{}' of '{}' is {} of shape {}, a 1-D {} was expected", name, f.path(),
                      dtype_name(info.dtype), info.shape, dtype_name(dt));
  f.comm()->check_all(err.empty(), "io::read", err);
  std::vector<unsigned char> out(static_cast<std::size_t>(info.shape[0]) * dtype_size(dt));
  read_core(f, name, dt, info.shape, true, f.comm()->rank() == 0, Box{{0}, info.shape}, out.data());
  return out;
}

}  // namespace detail

#else  // no HDF5

bool hdf5_available() noexcept { return false; }

namespace {
[[noreturn]] void no_hdf5(const char* op) {
  SHARD_FAIL(op, "shardtensor was built without HDF5 (SHARDTENSOR_ENABLE_HDF5=OFF; install libhdf5-openmpi-dev)");
}
}  // namespace

H5File::H5File(const std::string&, CommPtr, Mode) { no_hdf5("H5File"); }
H5File::~H5File() = default;
H5File::H5File(H5File&&) noexcept = default;
H5File& H5File::operator=(H5File&&) noexcept = default;
void H5File::close() {}
bool H5File::is_open() const noexcept { return false; }
const std::string& H5File::path() const noexcept { return path_; }
const CommPtr& H5File::comm() const noexcept { return comm_; }
std::int64_t H5File::id() const noexcept { return -1; }
bool H5File::exists(const std::string&) const { no_hdf5("H5File::exists"); }
namespace detail {
DatasetInfo dataset_info(const H5File&, const std::string&) { no_hdf5("io::read"); }
void write_dataset(H5File&, const std::string&, const DistSpec&, const Block&) { no_hdf5("io::write"); }
Block read_dataset(H5File&, const std::string&, const DistSpec&, DType, Device) { no_hdf5("io::read"); }
void write_bytes(H5File&, const std::string&, DType, const void*, index_t) { no_hdf5("io::write"); }
void create_dataset(H5File&, const std::string&, DType, const std::vector<index_t>&, const std::vector<index_t>&) {
  no_hdf5("io::create_dataset");
}
void write_region(H5File&, const std::string&, const DistSpec&, const Block&, const std::vector<index_t>&) {
  no_hdf5("io::write_region");
}
Block read_region(H5File&, const std::string&, const DistSpec&, DType, Device, const std::vector<index_t>&) {
  no_hdf5("io::read_region");
}
std::vector<index_t> dataset_shape(const H5File&, const std::string&) { no_hdf5("io::dataset_shape"); }
std::vector<unsigned char> read_bytes(H5File&, const std::string&, DType) { no_hdf5("io::read"); }
}  // namespace detail

#endif

}  // namespace shard::io
