// CUDA implementation of the neighbour-search family: host glue to kernels/neighbors.cu
// (firewall: src/kernels_api/neighbors.hpp). Registered for DeviceKind::cuda when
// shardtensor::cuda is linked. Results equal the CPU table's bit for bit (same d2, same (d2,
// index) order, same padding); NeighborMethod is ignored (always brute force).
//  - knn / radius refuse NaN coordinates as the CPU table does: the kernel raises a device flag,
//    and the call waits for the context's stream to read it (so these two calls are synchronous);
//  - merge is asynchronous on the context's stream (stream-ordered scratch for the merged rows).
// Limits of this table: n_support <= 2^31 - 1, dim <= kernels::kNeighborsMaxDim.
#include <cuda_runtime.h>

#include <climits>
#include <limits>

#include "cuda/family_util.hpp"
#include "exec/neighbors_kernels.hpp"
#include "kernels_api/neighbors.hpp"

namespace shard::exec {
namespace {

using cuda_glue::check;
using cuda_glue::check_rc;
using cuda_glue::DeviceScope;
using cuda_glue::is_f64;
using cuda_glue::Scratch;

static_assert(sizeof(index_t) == sizeof(kernels::nb_idx), "index_t is the launchers' 64-bit index");

/// One search (r2 already rounded to the points' type, +inf for kNN); throws on NaN coordinates.
void search(const char* op, DType dt, index_t nq, index_t ns, int dim, index_t width, double r2, index_t offset,
            const void* query, const void* support, index_t* indices, void* dist2, index_t* counts,
            ExecContext& ctx) {
  SHARD_CHECK(ns <= INT_MAX, op, "the CUDA table searches at most 2^31 - 1 support points per call, got {}", ns);
  SHARD_CHECK(dim <= kernels::kNeighborsMaxDim, op, "the CUDA table takes point dimensions up to {}, got {}",
              kernels::kNeighborsMaxDim, dim);
  DeviceScope scope(ctx, op);
  const auto s = static_cast<cudaStream_t>(ctx.stream().handle);
  Scratch<int> flag(1, s, op);
  check(static_cast<int>(cudaMemsetAsync(flag.get(), 0, sizeof(int), s)), op);
  check_rc(kernels::neighbors_search(is_f64(dt), nq, ns, dim, width, r2, offset, query, support, indices, dist2,
                                     counts, flag.get(), s),
           op, ctx);
  int nan_seen = 0;
  check(static_cast<int>(cudaMemcpyAsync(&nan_seen, flag.get(), sizeof(int), cudaMemcpyDeviceToHost, s)), op);
  check(static_cast<int>(cudaStreamSynchronize(s)), op);
  SHARD_CHECK(nan_seen == 0, op, "query or support has NaN coordinate(s)");
}

struct CudaNeighbors final : NeighborsKernels {
  void knn(DType dt, const KnnGeometry& g, const void* query, const void* support, index_t* indices, void* dist2,
           ExecContext& ctx) const override {
    search("neighbors_knn", dt, g.n_query, g.n_support, g.dim, g.k, std::numeric_limits<double>::infinity(),
           g.index_offset, query, support, indices, dist2, nullptr, ctx);
  }
  void radius(DType dt, const RadiusGeometry& g, const void* query, const void* support, index_t* indices,
              void* dist2, index_t* counts, ExecContext& ctx) const override {
    // As the CPU table: r2 in double, rounded to the points' type (exact in double again).
    double r2 = g.radius * g.radius;
    if (dt == DType::f32) r2 = static_cast<double>(static_cast<float>(r2));
    search("neighbors_radius", dt, g.n_query, g.n_support, g.dim, g.max_neighbours, r2, g.index_offset, query,
           support, indices, dist2, counts, ctx);
  }
  void merge(DType dt, const NeighborMergeGeometry& g, index_t* indices, void* dist2, index_t* counts,
             const index_t* cand_indices, const void* cand_dist2, const index_t* /*cand_counts: the padding marks
             the valid entries*/, ExecContext& ctx) const override {
    const char* op = "neighbors_merge";
    DeviceScope scope(ctx, op);
    const auto s = static_cast<cudaStream_t>(ctx.stream().handle);
    const auto n = static_cast<std::size_t>(g.n_query * g.width);
    const std::size_t dbytes = n * dtype_size(dt);
    Scratch<index_t> mi(n, s, op);
    Scratch<unsigned char> md(dbytes, s, op);
    check_rc(kernels::neighbors_merge(is_f64(dt), g.n_query, g.width, indices, dist2, cand_indices, cand_dist2,
                                      mi.get(), md.get(), counts, s),
             op, ctx);
    check(static_cast<int>(cudaMemcpyAsync(indices, mi.get(), n * sizeof(index_t), cudaMemcpyDeviceToDevice, s)), op);
    check(static_cast<int>(cudaMemcpyAsync(dist2, md.get(), dbytes, cudaMemcpyDeviceToDevice, s)), op);
  }
};

const CudaNeighbors g_cuda_neighbors;
struct Registrar {
  Registrar() { register_family(DeviceKind::cuda, KernelFamily::neighbors, &g_cuda_neighbors); }
} g_registrar;

}  // namespace

/// Anchor: referencing it keeps this file (and its registrar) in a static link.
void cuda_link_neighbors() noexcept {}

}  // namespace shard::exec
