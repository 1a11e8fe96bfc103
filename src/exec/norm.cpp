// Norm kernel family front: device dispatch (see include/shardtensor/exec/norm.hpp).
#include "shardtensor/exec/norm.hpp"

#include "exec/front_util.hpp"
#include "exec/norm_kernels.hpp"
#include "exec/strided_rows.hpp"

namespace shard::exec {

/// Keeps src/exec/norm_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
extern const int* const norm_cpu_keep;
const int* const norm_cpu_keep = &norm_cpu_anchor;

namespace {
const NormKernels& table(const char* op, DType dt, Device dev, const ExecContext& ctx) {
  return detail::front_table<NormKernels>(op, dt, dev, ctx);
}

/// The geometry and x the table reads: a strided x (g.xrank > 0) as it is where the table takes
/// strides, else one contiguous copy on x's device (kept alive by `copy`).
struct Input {
  NormGeom g;
  const void* x;
  Block copy;
};
Input input(const char* op, const NormKernels& tab, DType dt, const NormGeom& g, const void* x, Device dev,
            ExecContext& ctx) {
  if (g.xrank == 0) return {g, x, {}};
  SHARD_CHECK(g.xrank >= 1 && g.xrank <= kMaxBlockRank && g.cdim >= 0 && g.cdim < g.xrank, op,
              "strided input of rank {} with channel dim {}", g.xrank, g.cdim);
  index_t a = 1, s = 1;  // extents of the dims before and after the channel dim
  for (int d = 0; d < g.cdim; ++d) a *= g.xshape[static_cast<std::size_t>(d)];
  for (int d = g.cdim + 1; d < g.xrank; ++d) s *= g.xshape[static_cast<std::size_t>(d)];
  SHARD_CHECK(a == g.A && s == g.S && g.xshape[static_cast<std::size_t>(g.cdim)] == g.C, op,
              "strided input of shape {} does not match [A {}, C {}, S {}]",
              std::vector<index_t>(g.xshape.begin(), g.xshape.begin() + g.xrank), g.A, g.C, g.S);
  if (tab.takes_strided_input()) return {g, x, {}};
  Input in{g, nullptr, {}};
  in.g.xrank = 0;
  const Block v = Block::view(dt, dev, const_cast<void*>(x), g.xshape.data(), g.xrank, g.xstrides.data());
  in.copy = detail::materialize(v, ctx);
  in.x = in.copy.data;
  return in;
}
}  // namespace

void norm_sums(DType dt, const NormGeom& g, const void* x, const double* mean, double* out, Device dev,
               ExecContext& ctx) {
  const auto& tab = table("norm_sums", dt, dev, ctx);
  const Input in = input("norm_sums", tab, dt, g, x, dev, ctx);
  tab.sums(dt, in.g, in.x, mean, out, ctx);
}

void norm_apply(DType dt, const NormGeom& g, const void* x, const double* mean, const double* invstd, const void* w,
                const void* b, void* y, Device dev, ExecContext& ctx) {
  const auto& tab = table("norm_apply", dt, dev, ctx);
  const Input in = input("norm_apply", tab, dt, g, x, dev, ctx);
  tab.apply(dt, in.g, in.x, mean, invstd, w, b, y, ctx);
}

void norm_backward_sums(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                        const double* invstd, const void* w, double* sg, double* sgx, double* dw, double* db,
                        Device dev, ExecContext& ctx) {
  const auto& tab = table("norm_backward_sums", dt, dev, ctx);
  const Input in = input("norm_backward_sums", tab, dt, g, x, dev, ctx);
  tab.backward_sums(dt, in.g, in.x, gy, mean, invstd, w, sg, sgx, dw, db, ctx);
}

void norm_backward_dx(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                      const double* invstd, const void* w, const double* sg, const double* sgx, double inv_count,
                      void* dx, Device dev, ExecContext& ctx) {
  const auto& tab = table("norm_backward_dx", dt, dev, ctx);
  const Input in = input("norm_backward_dx", tab, dt, g, x, dev, ctx);
  tab.backward_dx(dt, in.g, in.x, gy, mean, invstd, w, sg, sgx, inv_count, dx, ctx);
}

void load_f64(DType dt, index_t n, const void* src, double* host, Device dev, ExecContext& ctx) {
  if (n > 0) table("load_f64", dt, dev, ctx).load_f64(dt, n, src, host, ctx);
}

void store_f64(DType dt, index_t n, const double* host, void* dst, Device dev, ExecContext& ctx) {
  if (n > 0) table("store_f64", dt, dev, ctx).store_f64(dt, n, host, dst, ctx);
}

}  // namespace shard::exec
