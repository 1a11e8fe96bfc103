// CPU implementation of the optim kernel family: the update loops formerly in
// optim/optimizer.hpp, moved.
#include <cmath>

#include "exec/optim_kernels.hpp"

namespace shard::exec {
namespace {

template <class F> void optim_by_dtype(DType dt, F&& f) {
  if (dt == DType::f64) f(double{});
  else f(float{});
}

struct CpuOptim final : OptimKernels {
  void sgd(DType dt, index_t n, void* wp, const void* gp, void* bufp, const SgdParams& o,
           ExecContext&) const override {
    optim_by_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      T* w = static_cast<T*>(wp);
      const T* g = static_cast<const T*>(gp);
      T* buf = static_cast<T*>(bufp);
      const T lr = static_cast<T>(o.live ? o.live[0] : o.lr), mu = static_cast<T>(o.momentum), wd = static_cast<T>(o.weight_decay);
      const bool momentum = o.momentum > 0;
      for (index_t k = 0; k < n; ++k) {
        T d = g[k] + wd * w[k];
        if (momentum) {
          T& v = buf[k];
          v = mu * v + d;
          d = o.nesterov ? d + mu * v : v;
        }
        w[k] -= lr * d;
      }
    });
  }
  void adam(DType dt, index_t n, void* wp, const void* gp, double* m_, double* v_, const AdamParams& o,
            ExecContext&) const override {
    optim_by_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      T* w = static_cast<T*>(wp);
      const T* g = static_cast<const T*>(gp);
      const double lr = o.live ? o.live[0] : o.lr, bc1 = o.live ? o.live[1] : o.bc1, bc2 = o.live ? o.live[2] : o.bc2;
      for (index_t k = 0; k < n; ++k) {
        double gk = g[k];
        double wk = w[k];
        if (!o.decoupled) gk += o.weight_decay * wk;
        else wk *= 1 - lr * o.weight_decay;
        double& m = m_[k];
        double& v = v_[k];
        m = o.beta1 * m + (1 - o.beta1) * gk;
        v = o.beta2 * v + (1 - o.beta2) * gk * gk;
        wk -= lr * (m / bc1) / (std::sqrt(v / bc2) + o.eps);
        w[k] = static_cast<T>(wk);
      }
    });
  }
};

const CpuOptim g_cpu_optim;

}  // namespace

SHARD_CPU_TABLE(optim, g_cpu_optim);

}  // namespace shard::exec
