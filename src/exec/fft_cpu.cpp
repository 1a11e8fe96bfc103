// CPU implementation of the fft kernel family (exec/fft.hpp) over FFTW3's guru64 interface: one
// plan per (precision, kind, direction, shape, dims, alignment) created once with FFTW_ESTIMATE
// (which never touches the arrays) under a lock (FFTW's planner is not thread-safe) and cached
// for the process; executions use FFTW's new-array execute functions, which are thread-safe.
// Every dim not transformed is a batch ("howmany") dim of the same plan, so a batched transform is
// one FFTW call whatever the layout. Why FFTW: docs/architecture.md, "Why OpenBLAS, OpenMP, FFTW and nanoflann".
#include <fftw3.h>

#include <complex>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "exec/fft_kernels.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/memory.hpp"

namespace shard::exec {
namespace {

/// FFTW's single- and double-precision APIs behind one name.
template <class R>
struct Fftw;
template <>
struct Fftw<double> {
  using plan = fftw_plan;
  using cplx = fftw_complex;
  using iodim = fftw_iodim64;
  static plan dft(int r, const fftw_iodim64* d, int hr, const fftw_iodim64* hd, cplx* in, cplx* out, int sign,
                  unsigned flags) {
    return fftw_plan_guru64_dft(r, d, hr, hd, in, out, sign, flags);
  }
  static plan r2c(int r, const fftw_iodim64* d, int hr, const fftw_iodim64* hd, double* in, cplx* out, unsigned f) {
    return fftw_plan_guru64_dft_r2c(r, d, hr, hd, in, out, f);
  }
  static plan c2r(int r, const fftw_iodim64* d, int hr, const fftw_iodim64* hd, cplx* in, double* out, unsigned f) {
    return fftw_plan_guru64_dft_c2r(r, d, hr, hd, in, out, f);
  }
  static void exec_dft(plan p, cplx* in, cplx* out) { fftw_execute_dft(p, in, out); }
  static void exec_r2c(plan p, double* in, cplx* out) { fftw_execute_dft_r2c(p, in, out); }
  static void exec_c2r(plan p, cplx* in, double* out) { fftw_execute_dft_c2r(p, in, out); }
  static int alignment(const void* p) { return fftw_alignment_of(static_cast<double*>(const_cast<void*>(p))); }
};
template <>
struct Fftw<float> {
  using plan = fftwf_plan;
  using cplx = fftwf_complex;
  using iodim = fftwf_iodim64;
  static plan dft(int r, const fftwf_iodim64* d, int hr, const fftwf_iodim64* hd, cplx* in, cplx* out, int sign,
                  unsigned flags) {
    return fftwf_plan_guru64_dft(r, d, hr, hd, in, out, sign, flags);
  }
  static plan r2c(int r, const fftwf_iodim64* d, int hr, const fftwf_iodim64* hd, float* in, cplx* out, unsigned f) {
    return fftwf_plan_guru64_dft_r2c(r, d, hr, hd, in, out, f);
  }
  static plan c2r(int r, const fftwf_iodim64* d, int hr, const fftwf_iodim64* hd, cplx* in, float* out, unsigned f) {
    return fftwf_plan_guru64_dft_c2r(r, d, hr, hd, in, out, f);
  }
  static void exec_dft(plan p, cplx* in, cplx* out) { fftwf_execute_dft(p, in, out); }
  static void exec_r2c(plan p, float* in, cplx* out) { fftwf_execute_dft_r2c(p, in, out); }
  static void exec_c2r(plan p, cplx* in, float* out) { fftwf_execute_dft_c2r(p, in, out); }
  static int alignment(const void* p) { return fftwf_alignment_of(static_cast<float*>(const_cast<void*>(p))); }
};

/// Row-major element strides of `s`.
std::vector<std::ptrdiff_t> strides_of(const std::vector<index_t>& s) {
  std::vector<std::ptrdiff_t> st(s.size());
  std::ptrdiff_t acc = 1;
  for (std::size_t d = s.size(); d-- > 0;) {
    st[d] = acc;
    acc *= s[d];
  }
  return st;
}

/// The cache key of a plan: everything FFTW's plan depends on.
using PlanKey = std::tuple<int /*precision*/, int /*kind*/, bool /*inverse*/, std::vector<index_t>, std::vector<int>,
                           int /*in alignment*/, int /*out alignment*/, bool /*in place*/>;

/// Process-wide plan cache of one precision (plans are never destroyed: a handful per geometry).
template <class R>
class PlanCache {
 public:
  using P = typename Fftw<R>::plan;
  P get(const FftGeometry& g, const void* in, void* out) {
    const PlanKey key{sizeof(R), static_cast<int>(g.kind), g.inverse, g.shape, g.dims, Fftw<R>::alignment(in),
                      Fftw<R>::alignment(out), in == out};
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    P p = make(g, in, out);
    SHARD_CHECK(p != nullptr, "fft", "FFTW could not plan a {} transform of shape {} over dims {}",
                g.kind == FftKind::c2c ? "c2c" : g.kind == FftKind::r2c ? "r2c" : "c2r", g.shape, g.dims);
    plans_.emplace(key, p);
    return p;
  }

 private:
  static P make(const FftGeometry& g, const void* in, void* out) {
    // Strides in elements of each side: real-space shape for the real side, complex shape for
    // the complex side (c2c: both the same shape).
    const auto cs = g.complex_shape();
    const auto rst = strides_of(g.shape), cst = strides_of(cs);
    const auto& ist = g.kind == FftKind::c2r ? cst : rst;
    const auto& ost = g.kind == FftKind::r2c ? cst : rst;
    const auto& ishape = g.kind == FftKind::c2r ? cs : g.shape;
    using D = typename Fftw<R>::iodim;
    std::vector<D> dims, batch;
    std::vector<bool> is_dim(g.shape.size(), false);
    for (int d : g.dims) {
      const auto u = static_cast<std::size_t>(d);
      is_dim[u] = true;
      // The transform length is always the real-space (logical) extent.
      dims.push_back({static_cast<std::ptrdiff_t>(g.shape[u]), ist[u], ost[u]});
    }
    for (std::size_t u = 0; u < g.shape.size(); ++u)
      if (!is_dim[u]) batch.push_back({static_cast<std::ptrdiff_t>(ishape[u]), ist[u], ost[u]});
    const unsigned flags = FFTW_ESTIMATE | (g.kind == FftKind::c2r ? FFTW_DESTROY_INPUT : FFTW_PRESERVE_INPUT);
    using C = typename Fftw<R>::cplx;
    auto* ci = static_cast<C*>(const_cast<void*>(in));
    auto* co = static_cast<C*>(out);
    const int nd = static_cast<int>(dims.size()), nb = static_cast<int>(batch.size());
    if (g.kind == FftKind::c2c)
      return Fftw<R>::dft(nd, dims.data(), nb, batch.data(), ci, co, g.inverse ? FFTW_BACKWARD : FFTW_FORWARD, flags);
    if (g.kind == FftKind::r2c)
      return Fftw<R>::r2c(nd, dims.data(), nb, batch.data(), static_cast<R*>(const_cast<void*>(in)), co, flags);
    return Fftw<R>::c2r(nd, dims.data(), nb, batch.data(), ci, static_cast<R*>(out), flags);
  }

  std::mutex mu_;
  std::map<PlanKey, P> plans_;
};

template <class R>
PlanCache<R>& cache() {
  static PlanCache<R>* c = new PlanCache<R>();  // never destroyed: plans outlive static teardown
  return *c;
}

index_t numel_of(const std::vector<index_t>& s) {
  index_t n = 1;
  for (index_t e : s) n *= e;
  return n;
}

template <class R>
void run(const FftGeometry& g, const void* in, void* out) {
  using C = typename Fftw<R>::cplx;
  if (g.kind == FftKind::c2r) {
    // FFTW's multi-dimensional c2r destroys its input: transform a scratch copy (64-byte aligned,
    // so one plan per geometry serves every call).
    const index_t n = numel_of(g.complex_shape());
    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(std::complex<R>);
    std::shared_ptr<void> scratch = allocate_bytes(bytes, Device::cpu());
    std::memcpy(scratch.get(), in, bytes);
    auto p = cache<R>().get(g, scratch.get(), out);
    Fftw<R>::exec_c2r(p, static_cast<C*>(scratch.get()), static_cast<R*>(out));
  } else if (g.kind == FftKind::r2c) {
    auto p = cache<R>().get(g, in, out);
    Fftw<R>::exec_r2c(p, static_cast<R*>(const_cast<void*>(in)), static_cast<C*>(out));
  } else {
    auto p = cache<R>().get(g, in, out);
    Fftw<R>::exec_dft(p, static_cast<C*>(const_cast<void*>(in)), static_cast<C*>(out));
  }
  if (g.scale != 1.0) {
    const index_t n = g.kind == FftKind::c2r ? numel_of(g.shape) : 2 * numel_of(g.complex_shape());
    R* o = static_cast<R*>(out);
    const R s = static_cast<R>(g.scale);
#pragma omp parallel for if (n > 65536)
    for (index_t i = 0; i < n; ++i) o[i] *= s;
  }
}

struct CpuFft final : FftKernels {
  void fft(DType real, const FftGeometry& g, const void* in, void* out, ExecContext&) const override {
    if (real == DType::f64) run<double>(g, in, out);
    else run<float>(g, in, out);
  }
};

const CpuFft g_cpu_fft;

}  // namespace

SHARD_CPU_TABLE(fft, g_cpu_fft);

}  // namespace shard::exec
