// CUDA kernels of the optim family (launchers: src/kernels_api/optim.hpp): one fused
// elementwise update per optimiser, the same arithmetic as src/exec/optim_cpu.cpp.
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_api/optim.hpp"

namespace shard::kernels {
namespace {

using idx = op_idx;
using namespace cu;

template <class T>
__global__ void sgd_kernel(idx n, T* __restrict__ w, const T* __restrict__ g, T* __restrict__ buf, T lr, T mu, T wd,
                           bool momentum, bool nesterov, const double* __restrict__ live) {
  if (live) lr = static_cast<T>(live[0]);
  SHARD_GRID_STRIDE(k, n) {
    T d = g[k] + wd * w[k];
    if (momentum) {
      const T v = mu * buf[k] + d;
      buf[k] = v;
      d = nesterov ? d + mu * v : v;
    }
    w[k] -= lr * d;
  }
}

template <class T>
__global__ void adam_kernel(idx n, T* __restrict__ w, const T* __restrict__ g, double* __restrict__ m_,
                            double* __restrict__ v_, double lr, double beta1, double beta2, double eps, double wd,
                            double bc1, double bc2, bool decoupled, const double* __restrict__ live) {
  if (live) {
    lr = live[0];
    bc1 = live[1];
    bc2 = live[2];
  }
  SHARD_GRID_STRIDE(k, n) {
    double gk = g[k];
    double wk = w[k];
    if (!decoupled) gk += wd * wk;
    else wk *= 1 - lr * wd;
    const double m = beta1 * m_[k] + (1 - beta1) * gk;
    const double v = beta2 * v_[k] + (1 - beta2) * gk * gk;
    m_[k] = m;
    v_[k] = v;
    wk -= lr * (m / bc1) / (sqrt(v / bc2) + eps);
    w[k] = static_cast<T>(wk);
  }
}

}  // namespace

int opt_sgd(int is_f64, idx n, void* w, const void* g, void* buf, double lr, double mu, double wd, int nesterov,
            const double* live, void* stream) {
  if (n <= 0) return 0;
  const bool momentum = mu > 0;
  return by_float_type(is_f64, [&](auto t) {
    using T = decltype(t);
    sgd_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
        n, static_cast<T*>(w), static_cast<const T*>(g), static_cast<T*>(buf), static_cast<T>(lr), static_cast<T>(mu),
        static_cast<T>(wd), momentum, nesterov != 0, live);
    return last_error();
  });
}

int opt_adam(int is_f64, idx n, void* w, const void* g, double* m, double* v, double lr, double beta1, double beta2,
             double eps, double wd, double bc1, double bc2, int decoupled, const double* live, void* stream) {
  if (n <= 0) return 0;
  return by_float_type(is_f64, [&](auto t) {
    using T = decltype(t);
    adam_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(n, static_cast<T*>(w), static_cast<const T*>(g), m,
                                                                     v, lr, beta1, beta2, eps, wd, bc1, bc2,
                                                                     decoupled != 0, live);
    return last_error();
  });
}

}  // namespace shard::kernels
