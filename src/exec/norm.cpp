// Norm kernel family front: device dispatch (see include/shardtensor/exec/norm.hpp).
#include "shardtensor/exec/norm.hpp"

#include "exec/front_util.hpp"
#include "exec/norm_kernels.hpp"

namespace shard::exec {

/// Keeps src/exec/norm_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
extern const int* const norm_cpu_keep;
const int* const norm_cpu_keep = &norm_cpu_anchor;

namespace {
const NormKernels& table(const char* op, DType dt, Device dev, const ExecContext& ctx) {
  return detail::front_table<NormKernels>(op, dt, dev, ctx);
}
}  // namespace

void norm_sums(DType dt, const NormGeom& g, const void* x, const double* mean, double* out, Device dev,
               ExecContext& ctx) {
  table("norm_sums", dt, dev, ctx).sums(dt, g, x, mean, out, ctx);
}

void norm_apply(DType dt, const NormGeom& g, const void* x, const double* mean, const double* invstd, const void* w,
                const void* b, void* y, Device dev, ExecContext& ctx) {
  table("norm_apply", dt, dev, ctx).apply(dt, g, x, mean, invstd, w, b, y, ctx);
}

void norm_backward_sums(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                        const double* invstd, const void* w, double* sg, double* sgx, double* dw, double* db,
                        Device dev, ExecContext& ctx) {
  table("norm_backward_sums", dt, dev, ctx).backward_sums(dt, g, x, gy, mean, invstd, w, sg, sgx, dw, db, ctx);
}

void norm_backward_dx(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                      const double* invstd, const void* w, const double* sg, const double* sgx, double inv_count,
                      void* dx, Device dev, ExecContext& ctx) {
  table("norm_backward_dx", dt, dev, ctx).backward_dx(dt, g, x, gy, mean, invstd, w, sg, sgx, inv_count, dx, ctx);
}

void load_f64(DType dt, index_t n, const void* src, double* host, Device dev, ExecContext& ctx) {
  if (n > 0) table("load_f64", dt, dev, ctx).load_f64(dt, n, src, host, ctx);
}

void store_f64(DType dt, index_t n, const double* host, void* dst, Device dev, ExecContext& ctx) {
  if (n > 0) table("store_f64", dt, dev, ctx).store_f64(dt, n, host, dst, ctx);
}

}  // namespace shard::exec
