#pragma once
/// \file hdf5.hpp
/// Parallel HDF5 I/O of DistTensors: one global dataset per tensor, every rank writing/reading
/// its own hyperslab with collective MPI-IO (H5FD_MPIO_COLLECTIVE). Uneven shards and empty
/// shards work; Partial placements are reduced before writing; a replicated box is written by
/// one replica (coordinate 0 on the non-Shard mesh dims). Each dataset carries attributes
/// `shard_dtype`, `shard_placements`, `shard_mesh_shape`, `shard_global_shape` and
/// `shard_checksum` (a position-keyed 64-bit hash of the global data, computed collectively and
/// verified on every read). A file is read back at any rank count and mesh: the reader gives
/// its own mesh and placements; the global shape comes from the file.
///
/// HDF5 stays private to libshardtensor (no HDF5 header here). Built only with
/// SHARDTENSOR_ENABLE_HDF5 (config.hpp: SHARDTENSOR_HAS_HDF5); without it every function
/// throws shard::Error saying so. A communicator that is not an MpiComm (SelfComm) opens the
/// file with HDF5's serial driver.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/dist/dist_tensor.hpp"

namespace shard::io {

/// True when this build has parallel HDF5.
bool hdf5_available() noexcept;

/// An HDF5 file opened collectively by the ranks of a communicator. Move-only; the destructor
/// closes without reporting errors — call close() to have them thrown (on every rank).
class H5File {
 public:
  enum class Mode { read, create };  ///< create truncates an existing file
  H5File() = default;
  /// Opens (Mode::read) or creates (Mode::create) `path` on every rank of `comm` (collective).
  /// Failures (missing, truncated or not-HDF5 files) throw shard::Error on every rank.
  H5File(const std::string& path, CommPtr comm, Mode mode);
  ~H5File();
  H5File(H5File&&) noexcept;
  H5File& operator=(H5File&&) noexcept;
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  /// Flushes everything to storage (MPI_File_sync on MPI-IO) and closes; every error is thrown
  /// on every rank. Collective. A closed file does nothing.
  void close();
  bool is_open() const noexcept;
  const std::string& path() const noexcept;
  const CommPtr& comm() const noexcept;
  /// The HDF5 file id (hid_t), for the implementation and for callers with their own HDF5 code.
  std::int64_t id() const noexcept;
  /// True if a dataset (or group) `name` exists (same answer on every rank).
  bool exists(const std::string& name) const;

 private:
  std::int64_t id_ = -1;
  std::string path_;
  CommPtr comm_;
};

/// What the file says about a dataset.
struct DatasetInfo {
  DType dtype = DType::f32;
  std::vector<index_t> shape;        ///< global shape
  std::string placements;            ///< as written (informational)
  std::vector<index_t> mesh_shape;   ///< mesh of the writer (informational)
};

namespace detail {
/// Writes the global tensor (spec, local) as dataset `name` (intermediate groups are created).
/// Collective over the file's communicator, which must have the mesh's size.
void write_dataset(H5File& f, const std::string& name, const DistSpec& spec, const Block& local);
/// Reads dataset `name` into this rank's box of `spec` (whose global shape must match the
/// file's), as dtype `dt` on `dev`; checks dtype and shape, verifies the checksum. Collective.
Block read_dataset(H5File& f, const std::string& name, const DistSpec& spec, DType dt, Device dev);
/// Dtype and shape of dataset `name` (shard::Error on every rank if it is missing). Collective.
DatasetInfo dataset_info(const H5File& f, const std::string& name);
/// Creates an empty dataset `name` of `dt` and global `shape` for region writes, chunked by
/// `chunk` (one extent per dim, each clamped to [1, shape]; empty: contiguous layout). Carries
/// shard_dtype and shard_global_shape, no shard_checksum (regions are written piecewise).
/// Collective.
void create_dataset(H5File& f, const std::string& name, DType dt, const std::vector<index_t>& shape,
                    const std::vector<index_t>& chunk);
/// Writes the global tensor (spec, local) into the region [origin, origin + spec's global shape)
/// of the existing dataset `name` (same rank and dtype). Collective.
void write_region(H5File& f, const std::string& name, const DistSpec& spec, const Block& local,
                  const std::vector<index_t>& origin);
/// Reads the region [origin, origin + spec's global shape) of dataset `name` into this rank's box
/// of `spec`, as `dt` on `dev`. Any numeric HDF5 dataset (written by h5py, netCDF-4, ...): HDF5
/// converts the stored type to `dt`; no checksum is verified. Collective.
Block read_region(H5File& f, const std::string& name, const DistSpec& spec, DType dt, Device dev,
                  const std::vector<index_t>& origin);
/// The global shape of any dataset `name` (no shardtensor attributes needed). Collective.
std::vector<index_t> dataset_shape(const H5File& f, const std::string& name);
/// Small replicated data (every rank passes the same bytes; rank 0 writes them): a 1-D dataset.
void write_bytes(H5File& f, const std::string& name, DType dt, const void* data, index_t count);
/// Reads a 1-D dataset written by write_bytes on every rank (checksum verified). Collective.
std::vector<unsigned char> read_bytes(H5File& f, const std::string& name, DType dt);
/// Position-keyed 64-bit hash of a contiguous host box `data` of `box` within `global_shape`
/// (sum over elements of mix(global index, element bits), mod 2^64): the sums of disjoint boxes
/// covering a tensor add up to the same value at any decomposition.
std::uint64_t box_checksum(DType dt, const std::vector<index_t>& global_shape, const Box& box, const void* data);
}  // namespace detail

/// Writes `x` as dataset `name` of `f` (collective over x's mesh, whose communicator must be
/// the file's, or one of the same size).
template <class T, int R>
void write(H5File& f, const std::string& name, const DistTensor<T, R>& x) {
  detail::write_dataset(f, name, x.spec(), as_block(x.local()));
}

/// Reads dataset `name` of `f` as a DistTensor on `mesh` under `placements` (and explicit
/// `sizes`): any rank count and mesh shape; dtype and rank must match the file.
template <class T, int R>
DistTensor<T, R> read(H5File& f, const std::string& name, const DeviceMesh& mesh, std::vector<Placement> placements,
                      const ShardSizes& sizes = {}, Device dev = Device::cpu()) {
  const DatasetInfo info = detail::dataset_info(f, name);
  mesh.comm()->check_all(static_cast<int>(info.shape.size()) == R, "io::read",
                         fmt::format("dataset '{}' in '{}' has rank {} (shape {}), a rank-{} tensor was asked for", name,
                                     f.path(), info.shape.size(), info.shape, R));
  DistSpec spec(mesh, std::move(placements), info.shape, sizes);
  return DistTensor<T, R>(spec, tensor_of<T, R>(detail::read_dataset(f, name, spec, dtype_of<T>, dev)));
}

/// Reads dataset `name` into `x` (same global shape and dtype as the file; x keeps its spec).
template <class T, int R>
void read_into(H5File& f, const std::string& name, DistTensor<T, R>& x) {
  const Block b = detail::read_dataset(f, name, x.spec(), dtype_of<T>, x.device());
  auto dst = x.local();
  dst.copy_from(tensor_of<T, R>(b));
}

/// Time series and other datasets written or read piece by piece (one frame at a time, a window
/// of frames): create the dataset once, chunked so that a piece is a whole number of chunks, then
/// write or read regions of it. A region is a DistTensor whose global shape is the region's
/// extent; its shards select the ranks' hyperslabs. read_region also reads datasets written by
/// other tools (e.g. h5py arrays of radar or satellite fields), converting their element type.
template <class T>
void create_dataset(H5File& f, const std::string& name, const std::vector<index_t>& shape,
                    const std::vector<index_t>& chunk = {}) {
  detail::create_dataset(f, name, dtype_of<T>, shape, chunk);
}
template <class T, int R>
void write_region(H5File& f, const std::string& name, const DistTensor<T, R>& x, const std::vector<index_t>& origin) {
  detail::write_region(f, name, x.spec(), as_block(x.local()), origin);
}
template <class T, int R>
DistTensor<T, R> read_region(H5File& f, const std::string& name, const DeviceMesh& mesh,
                             std::vector<Placement> placements, const std::vector<index_t>& origin,
                             const std::vector<index_t>& shape, const ShardSizes& sizes = {},
                             Device dev = Device::cpu()) {
  mesh.comm()->check_all(static_cast<int>(shape.size()) == R && static_cast<int>(origin.size()) == R,
                         "io::read_region",
                         fmt::format("a rank-{} region needs {} extents and origins, got {} and {}", R, R,
                                     shape.size(), origin.size()));
  DistSpec spec(mesh, std::move(placements), shape, sizes);
  return DistTensor<T, R>(spec, tensor_of<T, R>(detail::read_region(f, name, spec, dtype_of<T>, dev, origin)));
}
inline std::vector<index_t> dataset_shape(const H5File& f, const std::string& name) {
  return detail::dataset_shape(f, name);
}

/// Creates (truncates) `path` and writes `x` as dataset `name` (collective).
template <class T, int R>
void write_hdf5(const std::string& path, const std::string& name, const DistTensor<T, R>& x) {
  H5File f(path, x.mesh().comm(), H5File::Mode::create);
  write(f, name, x);
  f.close();
}

/// Opens `path` and reads dataset `name` under the reader's mesh and placements (collective).
template <class T, int R>
DistTensor<T, R> read_hdf5(const std::string& path, const std::string& name, const DeviceMesh& mesh,
                           std::vector<Placement> placements, const ShardSizes& sizes = {},
                           Device dev = Device::cpu()) {
  H5File f(path, mesh.comm(), H5File::Mode::read);
  auto x = read<T, R>(f, name, mesh, std::move(placements), sizes, dev);
  f.close();
  return x;
}

}  // namespace shard::io
