// CUDA implementation of the norm kernel family (kernels/norm.cu behind src/kernels_api/norm.hpp),
// registered for DeviceKind::cuda when shardtensor::cuda is linked. Statistics travel between
// the host (where the nn layer reduces them across ranks) and stream-ordered device scratch.
#include "cuda/family_util.hpp"
#include "exec/norm_kernels.hpp"
#include "kernels_api/norm.hpp"

namespace shard::exec {
namespace {

using cuda_glue::storage_code;

namespace k = shard::kernels::norm;
using cuda_glue::check;
using cuda_glue::Scratch;

k::Geom geom(const NormGeom& g) { return {static_cast<int>(g.kind), g.A, g.C, g.S, g.G}; }

struct CudaNorm final : NormKernels {
  // bf16 / f16 read and written in place by the kernels (templated on the storage type), as on
  // the CPU: no whole-tensor f32 copies.
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void sums(DType dt, const NormGeom& g, const void* x, const double* mean, double* out,
            ExecContext& ctx) const override {
    const char* op = "norm_sums (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    const auto K = static_cast<std::size_t>(g.stats());
    if (K == 0) return;
    Scratch<double> dm(mean ? K : 0, s, op), dout(K, s, op);
    cuda_glue::upload(dm.get(), mean, K, s, op);
    check(k::sums(storage_code(dt), geom(g), x, dm.get(), dout.get(), s), op);
    cuda_glue::download(out, dout.get(), K, s, op);
  }
  void apply(DType dt, const NormGeom& g, const void* x, const double* mean, const double* invstd, const void* w,
             const void* b, void* y, ExecContext& ctx) const override {
    const char* op = "norm_apply (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    const auto K = static_cast<std::size_t>(g.stats());
    Scratch<double> st(2 * K, s, op);
    cuda_glue::upload(st.get(), mean, K, s, op);
    cuda_glue::upload(st.get() + K, invstd, K, s, op);
    check(k::apply(storage_code(dt), geom(g), x, st.get(), st.get() + K, w, b, y, s), op);
  }
  void backward_sums(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                     const double* invstd, const void* w, double* sg, double* sgx, double* dw, double* db,
                     ExecContext& ctx) const override {
    const char* op = "norm_backward_sums (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    const auto K = static_cast<std::size_t>(g.stats()), C = static_cast<std::size_t>(g.C);
    const bool stats = sg && sgx;
    // [mean, invstd | sg, sgx | dw | db]
    Scratch<double> buf(2 * K + (stats ? 2 * K : 0) + (dw ? C : 0) + (db ? C : 0), s, op);
    double* p = buf.get();
    double* dmean = p;
    double* dinv = p + K;
    double* dsg = stats ? p + 2 * K : nullptr;
    double* dsgx = stats ? p + 3 * K : nullptr;
    double* ddw = dw ? p + (stats ? 4 : 2) * K : nullptr;
    double* ddb = db ? p + (stats ? 4 : 2) * K + (dw ? C : 0) : nullptr;
    cuda_glue::upload(dmean, mean, K, s, op);
    cuda_glue::upload(dinv, invstd, K, s, op);
    check(k::backward_sums(storage_code(dt), geom(g), x, gy, dmean, dinv, w, dsg, dsgx, ddw, ddb, s), op);
    if (stats) {
      check(static_cast<int>(cudaMemcpyAsync(sg, dsg, K * sizeof(double), cudaMemcpyDeviceToHost, s)), op);
      check(static_cast<int>(cudaMemcpyAsync(sgx, dsgx, K * sizeof(double), cudaMemcpyDeviceToHost, s)), op);
    }
    if (dw) check(static_cast<int>(cudaMemcpyAsync(dw, ddw, C * sizeof(double), cudaMemcpyDeviceToHost, s)), op);
    if (db) check(static_cast<int>(cudaMemcpyAsync(db, ddb, C * sizeof(double), cudaMemcpyDeviceToHost, s)), op);
    check(static_cast<int>(cudaStreamSynchronize(s)), op);
  }
  void backward_dx(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                   const double* invstd, const void* w, const double* sg, const double* sgx, double inv_count,
                   void* dx, ExecContext& ctx) const override {
    const char* op = "norm_backward_dx (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    const auto K = static_cast<std::size_t>(g.stats());
    const bool stats = sg && sgx;
    Scratch<double> buf((stats ? 4 : 2) * K, s, op);
    double* p = buf.get();
    cuda_glue::upload(p, mean, K, s, op);
    cuda_glue::upload(p + K, invstd, K, s, op);
    if (stats) {
      cuda_glue::upload(p + 2 * K, sg, K, s, op);
      cuda_glue::upload(p + 3 * K, sgx, K, s, op);
    }
    check(k::backward_dx(storage_code(dt), geom(g), x, gy, p, p + K, w, stats ? p + 2 * K : nullptr,
                         stats ? p + 3 * K : nullptr, inv_count, dx, s),
          op);
  }
  void load_f64(DType dt, index_t n, const void* src, double* host, ExecContext& ctx) const override {
    const char* op = "load_f64 (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    Scratch<double> d(static_cast<std::size_t>(n), s, op);
    check(k::to_f64(storage_code(dt), n, src, d.get(), s), op);
    cuda_glue::download(host, d.get(), static_cast<std::size_t>(n), s, op);
  }
  void store_f64(DType dt, index_t n, const double* host, void* dst, ExecContext& ctx) const override {
    const char* op = "store_f64 (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    Scratch<double> d(static_cast<std::size_t>(n), s, op);
    cuda_glue::upload(d.get(), host, static_cast<std::size_t>(n), s, op);
    check(k::from_f64(storage_code(dt), n, d.get(), dst, s), op);
  }
};

const CudaNorm g_cuda_norm;

}  // namespace

/// Referenced by the shardtensor::cuda registration anchor so that the linker keeps this file.
extern const int norm_cuda_anchor;
const int norm_cuda_anchor = (register_family(DeviceKind::cuda, KernelFamily::norm, &g_cuda_norm), 1);

}  // namespace shard::exec
