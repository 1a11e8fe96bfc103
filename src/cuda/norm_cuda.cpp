// CUDA implementation of the norm kernel family (kernels/norm.cu behind src/kernels_api/norm.hpp),
// registered for DeviceKind::cuda when shardtensor::cuda is linked. The statistics are device
// arrays of doubles owned by the nn layer (reduced across ranks by device collectives): no entry
// copies to or from the host or synchronises.
#include "cuda/family_util.hpp"
#include "exec/norm_kernels.hpp"
#include "kernels_api/norm.hpp"

namespace shard::exec {
namespace {

using cuda_glue::storage_code;

namespace k = shard::kernels::norm;
using cuda_glue::check;

k::Geom geom(const NormGeom& g) { return {static_cast<int>(g.kind), g.A, g.C, g.S, g.G, static_cast<int>(g.act)}; }
/// The context's stream-ordered workspace, sized for the chunk partials of g.
double* workspace(const NormGeom& g, ExecContext& ctx) {
  const auto n = static_cast<std::size_t>(k::workspace(geom(g)));
  return static_cast<double*>(ctx.workspace((n ? n : 1) * sizeof(double)));
}

struct CudaNorm final : NormKernels {
  // bf16 / f16 read and written in place by the kernels (templated on the storage type), as on
  // the CPU: no whole-tensor f32 copies.
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  // The statistics are device pointers (the nn layer keeps them on the device): every entry only
  // queues kernels on the context's stream.
  void sums(DType dt, const NormGeom& g, const void* x, const double* mean, double* out,
            ExecContext& ctx) const override {
    const char* op = "norm_sums (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    check(k::sums(storage_code(dt), geom(g), x, mean, out, workspace(g, ctx), s), op);
  }
  void moments(DType dt, const NormGeom& g, const void* x, double* sum, double* m2, double* lmean,
               ExecContext& ctx) const override {
    const char* op = "norm_moments (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    check(k::moments(storage_code(dt), geom(g), x, sum, m2, lmean, workspace(g, ctx), s), op);
  }
  void apply(DType dt, const NormGeom& g, const void* x, const double* mean, const double* invstd, const void* w,
             const void* b, const void* r, void* y, ExecContext& ctx) const override {
    const char* op = "norm_apply (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    k::Geom kg = geom(g);
    kg.res = r;
    check(k::apply(storage_code(dt), kg, x, mean, invstd, w, b, y, s), op);
  }
  void backward_sums(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                     const double* invstd, const void* w, const void* b, const void* r, double* sg, double* sgx,
                     double* dw, double* db, ExecContext& ctx) const override {
    const char* op = "norm_backward_sums (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    k::Geom kg = geom(g);
    kg.res = r;
    check(k::backward_sums(storage_code(dt), kg, x, gy, mean, invstd, w, b, sg && sgx ? sg : nullptr,
                           sg && sgx ? sgx : nullptr, dw, db, workspace(g, ctx), s),
          op);
  }
  void backward_dx(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                   const double* invstd, const void* w, const void* b, const void* r, const double* sg,
                   const double* sgx, double inv_count, void* dx, void* dr, ExecContext& ctx) const override {
    const char* op = "norm_backward_dx (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    const bool stats = sg && sgx;
    k::Geom kg = geom(g);
    kg.res = r;
    kg.dres = dr;
    check(k::backward_dx(storage_code(dt), kg, x, gy, mean, invstd, w, b, stats ? sg : nullptr,
                         stats ? sgx : nullptr, inv_count, dx, s),
          op);
  }
  void load_f64(DType dt, index_t n, const void* src, double* out, ExecContext& ctx) const override {
    const char* op = "load_f64 (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    check(k::to_f64(storage_code(dt), n, src, out, s), op);
  }
  void store_f64(DType dt, index_t n, const double* v, void* dst, ExecContext& ctx) const override {
    const char* op = "store_f64 (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    check(k::from_f64(storage_code(dt), n, v, dst, s), op);
  }
  void finish(const NormFinishArgs& a, ExecContext& ctx) const override {
    const char* op = "norm_finish (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    k::Finish f{};
    f.mode = static_cast<int>(a.mode);
    f.K = a.K;
    f.count = a.count;
    f.eps = a.eps;
    f.momentum = a.momentum;
    f.v = a.v;
    f.mean = a.mean;
    f.rm = a.run_mean ? a.run_mean->data : nullptr;
    f.rv = a.run_var ? a.run_var->data : nullptr;
    f.rm_f64 = a.run_mean && a.run_mean->dtype == DType::f64;
    f.rv_f64 = a.run_var && a.run_var->dtype == DType::f64;
    f.check = a.check;
    f.P = a.P;
    f.aux = a.local_mean;
    f.local_count = a.local_count;
    check(k::finish(f, s), op);
  }
};

const CudaNorm g_cuda_norm;

}  // namespace

/// Referenced by the shardtensor::cuda registration anchor so that the linker keeps this file.
extern const int norm_cuda_anchor;
const int norm_cuda_anchor = (register_family(DeviceKind::cuda, KernelFamily::norm, &g_cuda_norm), 1);

}  // namespace shard::exec
