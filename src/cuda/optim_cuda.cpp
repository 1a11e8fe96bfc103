// CUDA implementation of the optim kernel family: host glue to kernels/optim.cu (firewall:
// src/kernels_api/optim.hpp). Registered for DeviceKind::cuda when shardtensor::cuda is linked.
#include <cuda_runtime.h>

#include "cuda/family_util.hpp"
#include "exec/optim_kernels.hpp"
#include "kernels_api/optim.hpp"

namespace shard::exec {
namespace {

using cuda_glue::check_rc;
using cuda_glue::DeviceScope;
using cuda_glue::is_f64;

struct CudaOptim final : OptimKernels {
  void sgd(DType dt, index_t n, void* w, const void* g, void* buf, const SgdParams& p, ExecContext& ctx) const override {
    DeviceScope scope(ctx, "SGD::step");
    check_rc(kernels::opt_sgd(is_f64(dt), n, w, g, buf, p.lr, p.momentum, p.weight_decay, p.nesterov ? 1 : 0, p.live,
                              ctx.stream().handle),
             "SGD::step", ctx);
  }
  void adam(DType dt, index_t n, void* w, const void* g, double* m, double* v, const AdamParams& p,
            ExecContext& ctx) const override {
    DeviceScope scope(ctx, "Adam::step");
    check_rc(kernels::opt_adam(is_f64(dt), n, w, g, m, v, p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.bc1, p.bc2,
                               p.decoupled ? 1 : 0, p.live, ctx.stream().handle),
             "Adam::step", ctx);
  }
};

const CudaOptim g_cuda_optim;
struct Registrar {
  Registrar() { register_family(DeviceKind::cuda, KernelFamily::optim, &g_cuda_optim); }
} g_registrar;

}  // namespace

/// Anchor: referencing it keeps this file (and its registrar) in a static link.
void cuda_link_optim() noexcept {}

}  // namespace shard::exec
