// Front of the row kernel family: shape, dtype and device checks, then dispatch
// (include/shardtensor/exec/rows.hpp).
#include "shardtensor/exec/rows.hpp"

#include "exec/front_util.hpp"
#include "exec/rows_kernels.hpp"
#include "shardtensor/runtime/memory.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

SHARD_KEEP_CPU_TABLE(rows);

namespace {

void check_rows_matrix(const char* op, const char* what, const Block& b, DType dt, index_t rows, index_t width,
                  const ExecContext& ctx) {
  const bool shape_ok = (b.rank == 2 && b.shape[0] == rows && b.shape[1] == width) ||
                        (b.rank == 1 && width == 1 && b.shape[0] == rows);
  SHARD_CHECK(shape_ok, op, "{} must have shape [{}, {}], got {}", what, rows, width, b.shape_vec());
  detail::check_block(op, what, b, dt, rows * width, ctx);
}

void check_geometry(const char* op, const RowsGeometry& g) {
  SHARD_CHECK(g.n_src >= 0 && g.n_index >= 0 && g.width >= 0, op, "negative extent (n_src {}, n_index {}, width {})",
              g.n_src, g.n_index, g.width);
}

const RowsKernels& rows_table(const char* op, const ExecContext& ctx) {
  return kernels_for<RowsKernels>(ctx.device(), op);
}

}  // namespace

void rows_gather(const RowsGeometry& g, const Block& src, const Block& index, const Block& dst, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "rows", "gather", &ctx);
  const char* op = "rows_gather";
  check_geometry(op, g);
  check_rows_matrix(op, "src", src, src.dtype, g.n_src, g.width, ctx);
  check_rows_matrix(op, "dst", dst, src.dtype, g.n_index, g.width, ctx);
  check_rows_matrix(op, "index", index, DType::i64, g.n_index, 1, ctx);
  const auto& t = rows_table(op, ctx);
  if (g.n_index == 0 || g.width == 0) return;
  shard::detail::bump_version(dst.owner);
  t.gather(src.element_bytes(), g, src.data, static_cast<const index_t*>(index.data), dst.data, ctx);
}

void rows_scatter_add(const RowsGeometry& g, const Block& src, const Block& index, const Block& dst,
                      ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "rows", "scatter_add", &ctx);
  const char* op = "rows_scatter_add";
  check_geometry(op, g);
  DType dt = dst.dtype;
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64 || dt == DType::i64 || dt == DType::c64 || dt == DType::c128, op,
              "dtype {} not supported (f32, f64, i64, c64, c128)", dt);
  check_rows_matrix(op, "src", src, dt, g.n_index, g.width, ctx);
  check_rows_matrix(op, "dst", dst, dt, g.n_src, g.width, ctx);
  check_rows_matrix(op, "index", index, DType::i64, g.n_index, 1, ctx);
  const auto& t = rows_table(op, ctx);
  if (g.n_index == 0 || g.width == 0) return;
  RowsGeometry gg = g;
  if (dt == DType::c64 || dt == DType::c128) {
    dt = dt == DType::c64 ? DType::f32 : DType::f64;
    gg.width *= 2;
  }
  shard::detail::bump_version(dst.owner);
  t.scatter_add(dt, gg, src.data, static_cast<const index_t*>(index.data), dst.data, ctx);
}

void rows_scatter(const RowsGeometry& g, const Block& src, const Block& index, const Block& dst, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "rows", "scatter", &ctx);
  const char* op = "rows_scatter";
  check_geometry(op, g);
  check_rows_matrix(op, "src", src, dst.dtype, g.n_index, g.width, ctx);
  check_rows_matrix(op, "dst", dst, dst.dtype, g.n_src, g.width, ctx);
  check_rows_matrix(op, "index", index, DType::i64, g.n_index, 1, ctx);
  const auto& t = rows_table(op, ctx);
  if (g.n_index == 0 || g.width == 0) return;
  shard::detail::bump_version(dst.owner);
  t.scatter(dst.element_bytes(), g, src.data, static_cast<const index_t*>(index.data), dst.data, ctx);
}

}  // namespace shard::exec
