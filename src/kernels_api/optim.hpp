#pragma once
// Kernel firewall for the optim family (kernels/optim.cu): plain C++17. Fused elementwise
// optimiser updates; launchers queue work on `stream` and return a cudaError_t as int.
#include <cstdint>

namespace shard::kernels {

using op_idx = std::int64_t;

/// d = g + wd w; if momentum: buf = mu buf + d, d = nesterov ? d + mu buf : buf; w -= lr d (in T).
/// `live` (device, may be null): {lr} read when the kernel runs, replacing lr.
int opt_sgd(int is_f64, op_idx n, void* w, const void* g, void* buf, double lr, double mu, double wd, int nesterov,
            const double* live, void* stream);
/// Adam/AdamW in double: m, v moments; bc1, bc2 bias corrections; decoupled: AdamW. `live`
/// (device, may be null): {lr, bc1, bc2} read when the kernel runs, replacing those.
int opt_adam(int is_f64, op_idx n, void* w, const void* g, double* m, double* v, double lr, double beta1, double beta2,
             double eps, double wd, double bc1, double bc2, int decoupled, const double* live, void* stream);

}  // namespace shard::kernels
