// CUDA kernels of the optim family (launchers: src/kernels_api/optim.hpp): one fused
// elementwise update per optimiser, the same arithmetic as src/exec/optim_cpu.cpp.
#include <cuda_runtime.h>

#include "kernels_api/optim.hpp"

namespace shard::kernels {
namespace {

using idx = op_idx;
constexpr int kThreads = 256;

#define SHARD_OPT_LOOP(i, n) \
  for (idx i = blockIdx.x * static_cast<idx>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<idx>(gridDim.x) * blockDim.x)

int grid_for(idx n) {
  const idx g = (n + kThreads - 1) / kThreads;
  return static_cast<int>(g < 1 ? 1 : (g > 65535 ? 65535 : g));
}

template <class T>
__global__ void sgd_kernel(idx n, T* __restrict__ w, const T* __restrict__ g, T* __restrict__ buf, T lr, T mu, T wd,
                           bool momentum, bool nesterov) {
  SHARD_OPT_LOOP(k, n) {
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
                            double bc1, double bc2, bool decoupled) {
  SHARD_OPT_LOOP(k, n) {
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
            void* stream) {
  if (n <= 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const bool momentum = mu > 0;
  if (is_f64)
    sgd_kernel<double><<<grid_for(n), kThreads, 0, s>>>(n, static_cast<double*>(w), static_cast<const double*>(g),
                                                        static_cast<double*>(buf), lr, mu, wd, momentum, nesterov != 0);
  else
    sgd_kernel<float><<<grid_for(n), kThreads, 0, s>>>(n, static_cast<float*>(w), static_cast<const float*>(g),
                                                       static_cast<float*>(buf), static_cast<float>(lr),
                                                       static_cast<float>(mu), static_cast<float>(wd), momentum,
                                                       nesterov != 0);
  return static_cast<int>(cudaGetLastError());
}

int opt_adam(int is_f64, idx n, void* w, const void* g, double* m, double* v, double lr, double beta1, double beta2,
             double eps, double wd, double bc1, double bc2, int decoupled, void* stream) {
  if (n <= 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  if (is_f64)
    adam_kernel<double><<<grid_for(n), kThreads, 0, s>>>(n, static_cast<double*>(w), static_cast<const double*>(g), m,
                                                         v, lr, beta1, beta2, eps, wd, bc1, bc2, decoupled != 0);
  else
    adam_kernel<float><<<grid_for(n), kThreads, 0, s>>>(n, static_cast<float*>(w), static_cast<const float*>(g), m, v,
                                                        lr, beta1, beta2, eps, wd, bc1, bc2, decoupled != 0);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace shard::kernels
