// gpusim lane: the spectral family (kernels/spectral.cu, src/cuda/spectral_cuda.cpp; the FNO
// layer's per-mode channel mix) against the CPU table: forward, input gradient, weight gradient,
// each gradient alone, c64 and c128, shapes with one batch / one channel / odd mode counts.
// Complex blocks are passed to the tables as interleaved (re, im) real arrays.
#include "exec/spectral_kernels.hpp"
#include "gpusim_support.hpp"

namespace st_gpusim_cuda_sim_spectral {

using namespace gpusim;
using exec::SpectralKernels;

namespace {
const SpectralKernels& cu() { return exec::kernels_for<SpectralKernels>(gpu(), "test"); }
const SpectralKernels& cpu() { return exec::kernels_for<SpectralKernels>(Device::cpu(), "test"); }

template <class T>
void spectral(index_t B, index_t I, index_t O, index_t K, unsigned seed) {
  INFO("B " << B << " I " << I << " O " << O << " K " << K);
  const exec::SpectralGeometry g{B, I, O, K};
  Pair<T> x({B, I, K, 2}, seed), w({I, O, K, 2}, seed + 1), gy({B, O, K, 2}, seed + 2);
  Pair<T> y({B, O, K, 2}), gx({B, I, K, 2}), gw({I, O, K, 2});
  const DType real = dtype_of<T>;
  cpu().forward(real, g, x.h.data, w.h.data, y.h.data, hctx());
  cu().forward(real, g, x.d.data, w.d.data, y.d.data, gctx());
  GPUSIM_CHECK_CLOSE(y, T, "spectral forward");
  cpu().backward(real, g, x.h.data, w.h.data, gy.h.data, gx.h.data, gw.h.data, hctx());
  cu().backward(real, g, x.d.data, w.d.data, gy.d.data, gx.d.data, gw.d.data, gctx());
  GPUSIM_CHECK_CLOSE(gx, T, "spectral grad x");
  GPUSIM_CHECK_CLOSE(gw, T, "spectral grad w");
  // Each gradient alone (the other pointer null) gives the same values.
  Pair<T> gx2({B, I, K, 2}), gw2({I, O, K, 2});
  cu().backward(real, g, x.d.data, w.d.data, gy.d.data, gx2.d.data, nullptr, gctx());
  cu().backward(real, g, x.d.data, w.d.data, gy.d.data, nullptr, gw2.d.data, gctx());
  CHECK(rel_err(gx2.device(), gx.host()) <= tol<T>());
  CHECK(rel_err(gw2.device(), gw.host()) <= tol<T>());
  // The CPU table itself against a direct complex evaluation of one element of each output.
  const auto* xp = static_cast<const T*>(x.h.data);
  const auto* wp = static_cast<const T*>(w.h.data);
  const auto* yp = static_cast<const T*>(y.h.data);
  const index_t b = B - 1, o = O - 1, k = K / 2;
  double re = 0, im = 0;
  for (index_t i = 0; i < I; ++i) {
    const index_t xi = 2 * ((b * I + i) * K + k), wi = 2 * ((i * O + o) * K + k);
    re += double(xp[xi]) * wp[wi] - double(xp[xi + 1]) * wp[wi + 1];
    im += double(xp[xi]) * wp[wi + 1] + double(xp[xi + 1]) * wp[wi];
  }
  const index_t yi = 2 * ((b * O + o) * K + k);
  CHECK(std::abs(yp[yi] - re) <= 10 * tol<T>() * std::max(1.0, std::abs(re)));
  CHECK(std::abs(yp[yi + 1] - im) <= 10 * tol<T>() * std::max(1.0, std::abs(im)));
}
}  // namespace

TEST_CASE("gpusim spectral: FNO channel mix forward and gradients", "[gpusim][spectral]") {
  GPUSIM_REQUIRE_GPU();
  SECTION("c64") {
    spectral<float>(2, 3, 4, 7, 11u);
    spectral<float>(1, 1, 2, 5, 12u);
  }
  SECTION("c128") {
    spectral<double>(2, 3, 4, 7, 21u);
    spectral<double>(3, 2, 1, 9, 22u);
  }
}

}  // namespace st_gpusim_cuda_sim_spectral
