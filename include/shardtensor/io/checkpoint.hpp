#pragma once
/// \file checkpoint.hpp
/// Training checkpoints in one parallel-HDF5 file: model parameters, optimiser state (moments,
/// step count, learning rate), the training step and the caller's own state (scheduler and
/// data-order state, RNG seeds/counters: an opaque key -> int / key -> bytes map).
///
/// Writing is atomic: the file is written as `<path>.tmp` in the same directory, flushed to
/// storage (MPI_File_sync), fsync'ed, renamed over `path`, and the directory is fsync'ed; every
/// error (HDF5 close, fsync, rename) is thrown on every rank and the previous checkpoint is left
/// untouched. Loading verifies every dataset's checksum (io/hdf5.hpp) and refuses a truncated
/// or corrupted file with shard::Error on every rank, before anything in the model or the
/// optimiser is changed. Parameters are stored as global datasets, so a checkpoint written at
/// one rank count and mesh loads at any other. Sharded parameters (e.g. a ViT's positional
/// embedding) are written and read hyperslab by hyperslab under their spec, and so are their
/// optimiser moments, laid out like the parameter: both load into whatever rank count, mesh and
/// placement the model has.
///
/// Resume in a training loop:
/// \code
///   io::TrainingState st;
///   if (resume) st = io::load_checkpoint(path, model, &opt);
///   for (long step = st.step; step < steps; ++step) {
///     ...train...
///     if ((step + 1) % every == 0 || step + 1 == steps) io::save_checkpoint(path, model, &opt, {step + 1});
///   }
/// \endcode
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>

#include "shardtensor/io/hdf5.hpp"
#include "shardtensor/nn/module.hpp"
#include "shardtensor/optim/optimizer.hpp"

namespace shard::io {

/// What the training loop itself must carry across a restart. The maps are the caller's: rank
/// 0's values are stored, and every rank gets them back on load.
struct TrainingState {
  std::int64_t step = 0;                          ///< steps completed
  std::map<std::string, std::int64_t> ints;       ///< e.g. "epoch", "rng.counter", "data.cursor"
  std::map<std::string, std::string> bytes;       ///< opaque blobs (serialised RNG engines, ...)
  friend bool operator==(const TrainingState&, const TrainingState&) = default;
};

/// Writes `model`'s parameters, `opt`'s state (may be null) and `state` to `path` atomically.
/// Collective over the parameters' mesh.
template <class T>
void save_checkpoint(const std::string& path, const nn::Module<T>& model,
                     const std::type_identity_t<optim::Optimizer<master_t<T>>>* opt, const TrainingState& state);

/// Loads a checkpoint written by save_checkpoint into `model` (same parameter names and shapes,
/// any rank count / mesh) and `opt` (may be null; must be the same kind of optimiser) and
/// returns the training state. Collective over the parameters' mesh. On any error nothing is
/// modified and shard::Error is thrown on every rank.
template <class T>
TrainingState load_checkpoint(const std::string& path, const nn::Module<T>& model,
                              std::type_identity_t<optim::Optimizer<master_t<T>>>* opt);

}  // namespace shard::io
