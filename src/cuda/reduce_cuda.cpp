// CUDA implementation of the reduce kernel family: host glue to kernels/reduce.cu (firewall:
// src/kernels_api/reduce.hpp). Registered for DeviceKind::cuda when shardtensor::cuda is linked.
#include <cuda_runtime.h>

#include "cuda/family_util.hpp"
#include "exec/reduce_kernels.hpp"
#include "kernels_api/reduce.hpp"

namespace shard::exec {
namespace {

using cuda_glue::check_rc;
using cuda_glue::DeviceScope;
using cuda_glue::is_f64;

double* workspace_doubles(ExecContext& ctx, index_t count) {
  return static_cast<double*>(ctx.workspace(static_cast<std::size_t>(count > 0 ? count : 1) * sizeof(double)));
}

struct CudaReduce final : ReduceKernels {
  void reduce_sum(const Block& x, const Block& out, double scale, ExecContext& ctx) const override {
    DeviceScope scope(ctx, "sum");
    check_rc(kernels::rd_reduce_dims(is_f64(x.dtype), 0, x.rank, x.shape.data(), out.shape.data(), x.data, out.data,
                                     scale, ctx.stream().handle),
             "sum", ctx);
  }
  void reduce_max(const Block& x, const Block& out, ExecContext& ctx) const override {
    DeviceScope scope(ctx, "max");
    check_rc(kernels::rd_reduce_dims(is_f64(x.dtype), 1, x.rank, x.shape.data(), out.shape.data(), x.data, out.data,
                                     1.0, ctx.stream().handle),
             "max", ctx);
  }
  void broadcast_scaled(const Block& g, const Block& gx, double scale, ExecContext& ctx) const override {
    DeviceScope scope(ctx, "sum_backward");
    check_rc(kernels::rd_broadcast_scaled(is_f64(gx.dtype), gx.rank, gx.shape.data(), g.shape.data(), g.data, gx.data,
                                          scale, ctx.stream().handle),
             "sum_backward", ctx);
  }
  void max_ties(const Block& x, const Block& m, const Block& ties, ExecContext& ctx) const override {
    DeviceScope scope(ctx, "max_backward");
    check_rc(kernels::rd_max_ties(is_f64(x.dtype), x.rank, x.shape.data(), m.shape.data(), x.data, m.data,
                                  static_cast<double*>(ties.data), ctx.stream().handle),
             "max_backward", ctx);
  }
  void max_backward(const Block& x, const Block& m, const Block& g, const Block& ties, const Block& gx,
                    ExecContext& ctx) const override {
    DeviceScope scope(ctx, "max_backward");
    check_rc(kernels::rd_max_backward(is_f64(x.dtype), x.rank, x.shape.data(), m.shape.data(), x.data, m.data, g.data,
                                      static_cast<const double*>(ties.data), gx.data, ctx.stream().handle),
             "max_backward", ctx);
  }
  double global_sum(int kind, DType dt, index_t n, const void* a, const void* b, ExecContext& ctx) const override {
    const char* op = kind == 0 ? "sum" : kind == 1 ? "dot" : "mse_loss";
    DeviceScope scope(ctx, op);
    double* ws = workspace_doubles(ctx, kernels::rd_global_sum_workspace(n));
    double out = 0;
    check_rc(kernels::rd_global_sum(is_f64(dt), kind, n, a, b, ws, &out, ctx.stream().handle), op, ctx);
    return out;
  }
  void global_sum_into(int kind, DType dt, index_t n, const void* a, const void* b, double scale, void* out,
                       ExecContext& ctx) const override {
    const char* op = kind == 0 ? "sum" : kind == 1 ? "dot" : "mse_loss";
    DeviceScope scope(ctx, op);
    double* ws = workspace_doubles(ctx, kernels::rd_global_sum_workspace(n));
    check_rc(kernels::rd_global_sum_into(is_f64(dt), kind, n, a, b, ws, scale, out, ctx.stream().handle), op, ctx);
  }
  void mse_backward(double scale, const void* g, DType dt, index_t n, const void* p, const void* t, void* gp, void* gt,
                    ExecContext& ctx) const override {
    DeviceScope scope(ctx, "mse_loss_backward");
    check_rc(kernels::rd_mse_backward(is_f64(dt), n, scale, g, p, t, gp, gt, ctx.stream().handle),
             "mse_loss_backward", ctx);
  }
  void rel_l2_sums(DType dt, index_t samples, index_t inner, const void* p, const void* t, double* sums,
                   ExecContext& ctx) const override {
    DeviceScope scope(ctx, "rel_l2_loss");
    double* ws = workspace_doubles(ctx, kernels::rd_rel_l2_workspace(samples, inner));
    check_rc(kernels::rd_rel_l2_sums(is_f64(dt), samples, inner, p, t, ws, sums, ctx.stream().handle), "rel_l2_loss",
             ctx);
  }
  void rel_l2_backward(DType dt, index_t samples, index_t inner, const void* p, const void* t, const double* coef,
                       void* gp, void* gt, ExecContext& ctx) const override {
    const char* op = "rel_l2_loss_backward";
    DeviceScope scope(ctx, op);
    check_rc(kernels::rd_rel_l2_backward(is_f64(dt), samples, inner, p, t, coef, gp, gt, ctx.stream().handle), op, ctx);
  }
  void rel_l2_value(DType dt, index_t samples, index_t global, const double* sums, const double* check, index_t P,
                    void* out, ExecContext& ctx) const override {
    DeviceScope scope(ctx, "rel_l2_loss");
    check_rc(kernels::rd_rel_l2_value(is_f64(dt), samples, global, sums, check, P, out, ctx.stream().handle),
             "rel_l2_loss", ctx);
  }
  void rel_l2_coefficients(DType dt, index_t samples, index_t global, const double* sums, const double* check,
                           index_t P, const void* g, double* coef, ExecContext& ctx) const override {
    const char* op = "rel_l2_loss_backward";
    DeviceScope scope(ctx, op);
    check_rc(kernels::rd_rel_l2_coefficients(is_f64(dt), samples, global, sums, check, P, g, coef,
                                             ctx.stream().handle),
             op, ctx);
  }
};

const CudaReduce g_cuda_reduce;
struct Registrar {
  Registrar() { register_family(DeviceKind::cuda, KernelFamily::reduce, &g_cuda_reduce); }
} g_registrar;

}  // namespace

/// Anchor: referencing it keeps this file (and its registrar) in a static link.
void cuda_link_reduce() noexcept {}

}  // namespace shard::exec
