#pragma once
// Private to src/dist/halo*.cpp: the communication plan of a halo exchange (pure algebra, no data).
//
// Per tensor dim d with ghost widths (lo, hi), every ghost index of a part is mapped to a source
// global index (boundary mode) and that index's owner part. Consecutive ghost indices with the
// same owner and a source step of +1 or -1 (reflect runs backwards) form a Run. A Stage (one dim)
// moves, for every peer, the slabs of its runs in one message; slabs span the dims processed
// earlier with their ghosts (corners) and the other dims' interiors.
#include <memory>
#include <mutex>
#include <vector>

#include "shardtensor/dist/halo.hpp"

namespace shard::detail {

/// Source global index of ghost global index g along a dim of extent n, or -1 (zero boundary).
index_t halo_source_index(index_t g, index_t n, Boundary mode);

/// Ghost positions [ghost, ghost+len) along the dim (extended-block coordinates of the part that
/// receives them) filled from the owner's interior positions src, src+step, ... (owner-local).
struct HaloRun {
  index_t ghost = 0, len = 0, src = 0, step = 1;
};

/// The runs exchanged with one peer in one stage (one message).
struct HaloPeerRuns {
  int peer = 0;
  std::vector<HaloRun> runs;
  index_t positions = 0;  ///< sum of run lengths
};

/// One dim's exchange, in forward terms (the adjoint swaps sends and receives).
struct HaloStage {
  int d = 0;
  std::vector<int> mesh_dims;          ///< the dim's communicator (mesh.dim_comm / dims_comm); empty
                                       ///< for a dim in one part (local padding)
  std::vector<HaloPeerRuns> in;        ///< my ghost runs, by owner (src: owner-local)
  std::vector<HaloPeerRuns> out;       ///< peers' ghost runs I own (src: my local)
  std::vector<HaloRun> self, zero;     ///< my ghost runs I own / without a source
  std::vector<index_t> region_lo, region_len;  ///< slab box in my extended block (dim d unused)
  index_t cross = 0;                   ///< elements per position along d
  /// Elements exchanged with other ranks (received + sent) in this stage.
  index_t staged_elements() const {
    index_t n = 0;
    for (const auto& p : in) n += p.positions * cross;
    for (const auto& p : out) n += p.positions * cross;
    return n;
  }
};

/// The cached plan of one (spec, halo) on this rank: its stages, plus a pool of staging buffers
/// reused by every transfer that runs it (a transfer takes one at start, returns it at finish,
/// so concurrent transfers of one plan never share one).
struct HaloPlan {
  std::vector<HaloStage> stages;  ///< forward execution order
  index_t staging_elements = 0;   ///< the largest stage's staged_elements()

  /// A staging buffer of at least `bytes` bytes on `dev` (from the pool, or new).
  Block acquire_staging(std::size_t bytes, Device dev) const;
  /// Returns a buffer to the pool.
  void release_staging(Block b) const;

 private:
  mutable std::mutex mu_;
  mutable std::vector<Block> pool_;
};

/// The plan of (spec, halo) on this rank, cached per process (planning never communicates).
/// Validates `halo` first (throws the same shard::Error on every rank).
std::shared_ptr<const HaloPlan> halo_plan(const DistSpec& spec, const HaloSpec& halo, const char* op);

/// The stages of this rank in forward execution order: sharded dims first, then unsharded ones,
/// ascending within each group (the order is the same on every rank). Pure algebra.
std::vector<HaloStage> plan_halo_stages(const DistSpec& spec, const HaloSpec& halo);

}  // namespace shard::detail
