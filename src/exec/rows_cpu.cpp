// CPU table of the row kernel family (see include/shardtensor/exec/rows.hpp): gather is one
// memcpy per row (zeros for index -1), scatter one memcpy per named row, scatter-add adds rows in
// index order (deterministic).
// Indices are checked (a corrupted index is a bug upstream, reported rather than written through).
#include <cstdint>
#include <cstring>

#include "exec/rows_kernels.hpp"
#include "shardtensor/core/error.hpp"

namespace shard::exec {
namespace {

void check_index(const char* op, index_t v, index_t n) {
  SHARD_CHECK(v >= -1 && v < n, op, "row index {} outside [-1, {})", v, n);
}

template <class T>
void scatter_add_t(const RowsGeometry& g, const T* src, const index_t* index, T* dst) {
  const index_t w = g.width;
  for (index_t i = 0; i < g.n_index; ++i) {
    const index_t r = index[i];
    check_index("rows_scatter_add", r, g.n_src);
    if (r < 0) continue;
    T* d = dst + r * w;
    const T* s = src + i * w;
    for (index_t c = 0; c < w; ++c) d[c] += s[c];
  }
}

struct CpuRows final : RowsKernels {
  void gather(std::size_t eb, const RowsGeometry& g, const void* src, const index_t* index, void* dst,
              ExecContext&) const override {
    const std::size_t row = eb * static_cast<std::size_t>(g.width);
    const auto* s = static_cast<const unsigned char*>(src);
    auto* d = static_cast<unsigned char*>(dst);
    for (index_t i = 0; i < g.n_index; ++i) {
      const index_t r = index[i];
      check_index("rows_gather", r, g.n_src);
      if (r < 0)
        std::memset(d + static_cast<std::size_t>(i) * row, 0, row);
      else
        std::memcpy(d + static_cast<std::size_t>(i) * row, s + static_cast<std::size_t>(r) * row, row);
    }
  }
  void scatter(std::size_t eb, const RowsGeometry& g, const void* src, const index_t* index, void* dst,
               ExecContext&) const override {
    const std::size_t row = eb * static_cast<std::size_t>(g.width);
    const auto* s = static_cast<const unsigned char*>(src);
    auto* d = static_cast<unsigned char*>(dst);
    for (index_t i = 0; i < g.n_index; ++i) {
      const index_t r = index[i];
      check_index("rows_scatter", r, g.n_src);
      if (r >= 0) std::memcpy(d + static_cast<std::size_t>(r) * row, s + static_cast<std::size_t>(i) * row, row);
    }
  }
  void scatter_add(DType dt, const RowsGeometry& g, const void* src, const index_t* index, void* dst,
                   ExecContext&) const override {
    switch (dt) {
      case DType::f32: scatter_add_t(g, static_cast<const float*>(src), index, static_cast<float*>(dst)); break;
      case DType::f64: scatter_add_t(g, static_cast<const double*>(src), index, static_cast<double*>(dst)); break;
      case DType::i64:
        scatter_add_t(g, static_cast<const std::int64_t*>(src), index, static_cast<std::int64_t*>(dst));
        break;
      default: SHARD_FAIL("rows_scatter_add", "dtype {} not supported on the CPU", dt);
    }
  }
};

const CpuRows g_cpu_rows;

}  // namespace

SHARD_CPU_TABLE(rows, g_cpu_rows);

}  // namespace shard::exec
