// CPU table of the spectral kernel family (see include/shardtensor/exec/spectral.hpp). The mode
// index is innermost and contiguous in every operand, so each (b, o) row is a sum over i of
// complex multiply-adds of two contiguous mode vectors (the compiler vectorises the split
// real / imaginary arithmetic); rows are spread over OpenMP threads when there are many.
#include <complex>

#include "exec/spectral_kernels.hpp"

namespace shard::exec {
namespace {

template <class R>
void forward_t(const SpectralGeometry& g, const std::complex<R>* x, const std::complex<R>* w, std::complex<R>* y) {
  const index_t B = g.batch, I = g.cin, O = g.cout, K = g.modes;
#pragma omp parallel for collapse(2) if (B * O * I * K > 65536)
  for (index_t b = 0; b < B; ++b)
    for (index_t o = 0; o < O; ++o) {
      R* yr = reinterpret_cast<R*>(y + (b * O + o) * K);
      for (index_t k = 0; k < 2 * K; ++k) yr[k] = 0;
      for (index_t i = 0; i < I; ++i) {
        const R* xr = reinterpret_cast<const R*>(x + (b * I + i) * K);
        const R* wr = reinterpret_cast<const R*>(w + (i * O + o) * K);
        for (index_t k = 0; k < K; ++k) {
          const R a = xr[2 * k], bi = xr[2 * k + 1], c = wr[2 * k], d = wr[2 * k + 1];
          yr[2 * k] += a * c - bi * d;
          yr[2 * k + 1] += a * d + bi * c;
        }
      }
    }
}

template <class R>
void backward_t(const SpectralGeometry& g, const std::complex<R>* x, const std::complex<R>* w,
                const std::complex<R>* gy, std::complex<R>* gx, std::complex<R>* gw) {
  const index_t B = g.batch, I = g.cin, O = g.cout, K = g.modes;
  if (gx) {
    // gx[b, i, k] = sum_o gy[b, o, k] * conj(w[i, o, k])
#pragma omp parallel for collapse(2) if (B * O * I * K > 65536)
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < I; ++i) {
        R* out = reinterpret_cast<R*>(gx + (b * I + i) * K);
        for (index_t k = 0; k < 2 * K; ++k) out[k] = 0;
        for (index_t o = 0; o < O; ++o) {
          const R* gr = reinterpret_cast<const R*>(gy + (b * O + o) * K);
          const R* wr = reinterpret_cast<const R*>(w + (i * O + o) * K);
          for (index_t k = 0; k < K; ++k) {
            const R a = gr[2 * k], bi = gr[2 * k + 1], c = wr[2 * k], d = wr[2 * k + 1];
            out[2 * k] += a * c + bi * d;
            out[2 * k + 1] += bi * c - a * d;
          }
        }
      }
  }
  if (gw) {
    // gw[i, o, k] = sum_b conj(x[b, i, k]) * gy[b, o, k]
#pragma omp parallel for collapse(2) if (B * O * I * K > 65536)
    for (index_t i = 0; i < I; ++i)
      for (index_t o = 0; o < O; ++o) {
        R* out = reinterpret_cast<R*>(gw + (i * O + o) * K);
        for (index_t k = 0; k < 2 * K; ++k) out[k] = 0;
        for (index_t b = 0; b < B; ++b) {
          const R* xr = reinterpret_cast<const R*>(x + (b * I + i) * K);
          const R* gr = reinterpret_cast<const R*>(gy + (b * O + o) * K);
          for (index_t k = 0; k < K; ++k) {
            const R a = xr[2 * k], bi = xr[2 * k + 1], c = gr[2 * k], d = gr[2 * k + 1];
            out[2 * k] += a * c + bi * d;
            out[2 * k + 1] += a * d - bi * c;
          }
        }
      }
  }
}

struct CpuSpectral final : SpectralKernels {
  void forward(DType real, const SpectralGeometry& g, const void* x, const void* w, void* y,
               ExecContext&) const override {
    if (real == DType::f64)
      forward_t(g, static_cast<const std::complex<double>*>(x), static_cast<const std::complex<double>*>(w),
                static_cast<std::complex<double>*>(y));
    else
      forward_t(g, static_cast<const std::complex<float>*>(x), static_cast<const std::complex<float>*>(w),
                static_cast<std::complex<float>*>(y));
  }
  void backward(DType real, const SpectralGeometry& g, const void* x, const void* w, const void* gy, void* gx,
                void* gw, ExecContext&) const override {
    if (real == DType::f64)
      backward_t(g, static_cast<const std::complex<double>*>(x), static_cast<const std::complex<double>*>(w),
                 static_cast<const std::complex<double>*>(gy), static_cast<std::complex<double>*>(gx),
                 static_cast<std::complex<double>*>(gw));
    else
      backward_t(g, static_cast<const std::complex<float>*>(x), static_cast<const std::complex<float>*>(w),
                 static_cast<const std::complex<float>*>(gy), static_cast<std::complex<float>*>(gx),
                 static_cast<std::complex<float>*>(gw));
  }
};

const CpuSpectral g_cpu_spectral;

}  // namespace

SHARD_CPU_TABLE(spectral, g_cpu_spectral);

}  // namespace shard::exec
