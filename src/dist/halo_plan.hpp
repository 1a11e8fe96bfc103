#pragma once
// Private to src/dist/halo*.cpp: the communication plan of a halo exchange (pure algebra, no data).
//
// Per tensor dim d with ghost widths (lo, hi), every ghost index of a part is mapped to a source
// global index (boundary mode) and that index's owner part. Consecutive ghost indices with the
// same owner and a source step of +1 or -1 (reflect runs backwards) form a Run. A Stage (one dim)
// moves, for every peer, the slabs of its runs in one message; slabs span the dims processed
// earlier with their ghosts (corners) and the other dims' interiors.
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
  CommPtr comm;                        ///< null for a dim in one part (local padding)
  std::vector<HaloPeerRuns> in;        ///< my ghost runs, by owner (src: owner-local)
  std::vector<HaloPeerRuns> out;       ///< peers' ghost runs I own (src: my local)
  std::vector<HaloRun> self, zero;     ///< my ghost runs I own / without a source
  std::vector<index_t> region_lo, region_len;  ///< slab box in my extended block (dim d unused)
  index_t cross = 0;                   ///< elements per position along d
};

/// The stages of this rank in forward execution order: sharded dims first, then unsharded ones,
/// ascending within each group (the order is the same on every rank). Collective on first use
/// of a multi-mesh-dim communicator (mesh.dims_comm).
std::vector<HaloStage> plan_halo_stages(const DistSpec& spec, const HaloSpec& halo);

}  // namespace shard::detail
