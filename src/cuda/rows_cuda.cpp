// CUDA implementation of the row family: host glue to kernels/rows.cu (firewall:
// src/kernels_api/rows.hpp). Registered for DeviceKind::cuda when shardtensor::cuda is linked.
// Asynchronous on the context's stream. Unlike the CPU table, indices are not checked (that would
// need a synchronisation): an index outside [-1, rows) acts as -1 and nothing is read or written
// out of bounds. Scatter-add uses atomics (see include/shardtensor/exec/rows.hpp).
#include <cuda_runtime.h>

#include "cuda/family_util.hpp"
#include "exec/rows_kernels.hpp"
#include "kernels_api/rows.hpp"

namespace shard::exec {
namespace {

using cuda_glue::check_rc;
using cuda_glue::DeviceScope;

static_assert(sizeof(index_t) == sizeof(kernels::rows_idx), "index_t is the launchers' 64-bit index");

struct CudaRows final : RowsKernels {
  void gather(std::size_t elem_bytes, const RowsGeometry& g, const void* src, const index_t* index, void* dst,
              ExecContext& ctx) const override {
    const char* op = "rows_gather";
    DeviceScope scope(ctx, op);
    check_rc(kernels::rows_gather(static_cast<int>(elem_bytes), g.n_src, g.n_index, g.width, src, index, dst,
                                  ctx.stream().handle),
             op, ctx);
  }
  void scatter(std::size_t elem_bytes, const RowsGeometry& g, const void* src, const index_t* index, void* dst,
               ExecContext& ctx) const override {
    const char* op = "rows_scatter";
    DeviceScope scope(ctx, op);
    check_rc(kernels::rows_scatter(static_cast<int>(elem_bytes), g.n_src, g.n_index, g.width, src, index, dst,
                                   ctx.stream().handle),
             op, ctx);
  }
  void scatter_add(DType dt, const RowsGeometry& g, const void* src, const index_t* index, void* dst,
                   ExecContext& ctx) const override {
    const char* op = "rows_scatter_add";
    kernels::RowsAddType type;
    switch (dt) {
      case DType::f32: type = kernels::rows_f32; break;
      case DType::f64: type = kernels::rows_f64; break;
      case DType::i64: type = kernels::rows_i64; break;
      default: SHARD_FAIL(op, "dtype {} not supported on CUDA", dt);
    }
    DeviceScope scope(ctx, op);
    check_rc(kernels::rows_scatter_add(type, g.n_src, g.n_index, g.width, src, index, dst, ctx.stream().handle), op,
             ctx);
  }
};

const CudaRows g_cuda_rows;
struct Registrar {
  Registrar() { register_family(DeviceKind::cuda, KernelFamily::rows, &g_cuda_rows); }
} g_registrar;

}  // namespace

/// Anchor: referencing it keeps this file (and its registrar) in a static link.
void cuda_link_rows() noexcept {}

}  // namespace shard::exec
