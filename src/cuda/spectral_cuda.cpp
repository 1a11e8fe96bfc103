// CUDA implementation of the spectral kernel family: host glue to kernels/spectral.cu (firewall:
// src/kernels_api/spectral.hpp). Registered for DeviceKind::cuda when shardtensor::cuda is linked.
#include <cuda_runtime.h>

#include "cuda/family_util.hpp"
#include "exec/spectral_kernels.hpp"
#include "kernels_api/spectral.hpp"

namespace shard::exec {
namespace {

using cuda_glue::check_rc;
using cuda_glue::DeviceScope;
using cuda_glue::is_f64;

struct CudaSpectral final : SpectralKernels {
  void forward(DType real, const SpectralGeometry& g, const void* x, const void* w, void* y,
               ExecContext& ctx) const override {
    DeviceScope scope(ctx, "spectral_mul_forward");
    check_rc(kernels::spectral_forward(is_f64(real), g.batch, g.cin, g.cout, g.modes, x, w, y, ctx.stream().handle),
             "spectral_mul_forward", ctx);
  }
  void backward(DType real, const SpectralGeometry& g, const void* x, const void* w, const void* gy, void* gx,
                void* gw, ExecContext& ctx) const override {
    DeviceScope scope(ctx, "spectral_mul_backward");
    check_rc(kernels::spectral_backward(is_f64(real), g.batch, g.cin, g.cout, g.modes, x, w, gy, gx, gw,
                                        ctx.stream().handle),
             "spectral_mul_backward", ctx);
  }
};

const CudaSpectral g_cuda_spectral;
struct Registrar {
  Registrar() { register_family(DeviceKind::cuda, KernelFamily::spectral, &g_cuda_spectral); }
} g_registrar;

}  // namespace

/// Anchor: referencing it keeps this file (and its registrar) in a static link.
void cuda_link_spectral() noexcept {}

}  // namespace shard::exec
