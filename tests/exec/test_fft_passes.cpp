// The CUDA fft table's decomposition into cuFFT executions (src/cuda/fft_passes.hpp), checked
// without a GPU: every pass is run through FFTW's advanced interface (fftw_plan_many_dft*, the
// same layout semantics as cufftMakePlanMany64: n, inembed/onembed, stride, dist, batch), with
// the same loops, pointer steps and buffers (c2r on a scratch copy), and the result is compared
// with the CPU table (exec::fft). Covers trailing, leading and middle dims (both batch choices),
// runs longer than cuFFT's rank 3, several runs, and r2c / c2r with the halved dim anywhere.
#include <catch2/catch_test_macros.hpp>

#include <fftw3.h>

#include <complex>
#include <cstring>
#include <random>
#include <vector>

#include <shardtensor/exec/fft.hpp>

#include "cuda/fft_passes.hpp"

namespace st_exec_test_fft_passes {

using namespace shard;
using exec::FftGeometry;
using exec::FftKind;
namespace fp = exec::fft_passes;

namespace {

using cd = std::complex<double>;

index_t numel_of(const std::vector<index_t>& s) {
  index_t n = 1;
  for (index_t e : s) n *= e;
  return n;
}

/// Runs the passes of `g` with FFTW (double precision) the way fft_cuda.cpp runs them with cuFFT.
void run_passes(const FftGeometry& g, const void* in, void* out) {
  const auto passes = fp::schedule(g);
  std::vector<cd> scratch;
  if (g.kind == FftKind::c2r) {
    scratch.assign(static_cast<const cd*>(in), static_cast<const cd*>(in) + numel_of(g.complex_shape()));
    if (g.dims.size() == 1) {  // what kernels/fft.cu's fft_c2r_real_edges does
      const auto d = static_cast<std::size_t>(g.dims[0]);
      const auto cs = g.complex_shape();
      const long long outer = fp::prod(cs, 0, d), h = cs[d], inner = fp::prod(cs, d + 1, cs.size());
      for (long long o = 0; o < outer; ++o)
        for (long long i = 0; i < inner; ++i) {
          scratch[static_cast<std::size_t>((o * h) * inner + i)].imag(0);
          if (g.shape[d] % 2 == 0) scratch[static_cast<std::size_t>((o * h + h - 1) * inner + i)].imag(0);
        }
    }
  }
  const int sign = g.kind == FftKind::c2c ? (g.inverse ? FFTW_BACKWARD : FFTW_FORWARD)
                                          : (g.kind == FftKind::r2c ? FFTW_FORWARD : FFTW_BACKWARD);
  auto buf = [&](fp::Buf b) -> char* {
    return b == fp::Buf::in ? static_cast<char*>(const_cast<void*>(in))
           : b == fp::Buf::out ? static_cast<char*>(out)
                               : reinterpret_cast<char*>(scratch.data());
  };
  for (const auto& p : passes) {
    REQUIRE(p.rank >= 1);
    REQUIRE(p.rank <= 3);
    int n[3], ie[3], oe[3];
    for (int i = 0; i < 3; ++i) {
      n[i] = static_cast<int>(p.n[i]);
      ie[i] = static_cast<int>(p.inembed[i]);
      oe[i] = static_cast<int>(p.onembed[i]);
    }
    const std::size_t in_elem = p.kind == fp::PassKind::r2c ? sizeof(double) : sizeof(cd);
    const std::size_t out_elem = p.kind == fp::PassKind::c2r ? sizeof(double) : sizeof(cd);
    for (long long l = 0; l < p.loops; ++l) {
      char* i = buf(p.src) + static_cast<std::size_t>(l * p.in_step) * in_elem;
      char* o = buf(p.dst) + static_cast<std::size_t>(l * p.out_step) * out_elem;
      const auto is = static_cast<int>(p.istride), id = static_cast<int>(p.idist);
      const auto os = static_cast<int>(p.ostride), od = static_cast<int>(p.odist), b = static_cast<int>(p.batch);
      fftw_plan plan = nullptr;
      // FFTW_ESTIMATE never touches the arrays; plans are made per call (a test, not a hot path).
      if (p.kind == fp::PassKind::c2c)
        plan = fftw_plan_many_dft(p.rank, n, b, reinterpret_cast<fftw_complex*>(i), ie, is, id,
                                  reinterpret_cast<fftw_complex*>(o), oe, os, od, sign, FFTW_ESTIMATE);
      else if (p.kind == fp::PassKind::r2c)
        plan = fftw_plan_many_dft_r2c(p.rank, n, b, reinterpret_cast<double*>(i), ie, is, id,
                                      reinterpret_cast<fftw_complex*>(o), oe, os, od, FFTW_ESTIMATE);
      else
        plan = fftw_plan_many_dft_c2r(p.rank, n, b, reinterpret_cast<fftw_complex*>(i), ie, is, id,
                                      reinterpret_cast<double*>(o), oe, os, od, FFTW_ESTIMATE | FFTW_DESTROY_INPUT);
      REQUIRE(plan != nullptr);
      fftw_execute(plan);
      fftw_destroy_plan(plan);
    }
  }
  if (g.scale != 1.0) {
    const index_t n = g.kind == FftKind::c2r ? numel_of(g.shape) : 2 * numel_of(g.complex_shape());
    auto* o = static_cast<double*>(out);
    for (index_t k = 0; k < n; ++k) o[k] *= g.scale;
  }
}

std::vector<double> randoms(index_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(gen);
  return v;
}

template <class T>
double max_rel(const T* a, const T* b, index_t n) {
  double num = 0, den = 0;
  for (index_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(cd(a[i]) - cd(b[i])));
    den = std::max(den, std::abs(cd(b[i])));
  }
  return den > 0 ? num / den : num;
}

const std::vector<std::pair<std::vector<index_t>, std::vector<int>>> kCases = {
    {{7}, {0}},                       // one dim
    {{3, 5, 4}, {2}},                 // trailing: inner 1
    {{3, 5, 4}, {0}},                 // leading: outer 1
    {{2, 5, 9}, {1}},                 // middle, outer < inner: batch over inner, loop over outer
    {{9, 5, 2}, {1}},                 // middle, outer > inner: batch over outer, loop over inner
    {{3, 5, 7}, {0, 2}},              // two runs
    {{2, 3, 5, 4, 3}, {1, 2, 3}},     // a rank-3 middle run
    {{2, 3, 5, 4, 3}, {0, 1, 2, 3, 4}},  // a run of 5: chunks {0, 1} and {2, 3, 4}
    {{3, 2, 5, 3, 2, 3}, {0, 1, 2, 3, 5}},  // a run of 4 ({0}, {1, 2, 3}) and {5}
    {{4, 1, 6, 5}, {1, 2}},           // extent-1 transformed dim
    {{5, 6, 2}, {0, 1}},              // halved dim not last in the array (r2c / c2r)
};

}  // namespace

TEST_CASE("fft_passes: the schedule's chunks respect cuFFT's rank limit and the r2c / c2r order", "[exec][fft]") {
  FftGeometry g{FftKind::c2c, false, {2, 3, 5, 4, 3}, {0, 1, 2, 3, 4}, 1.0};
  auto p = fp::schedule(g);
  REQUIRE(p.size() == 2);
  CHECK(p[0].rank == 2);
  CHECK(p[1].rank == 3);
  CHECK(p[0].src == fp::Buf::in);
  CHECK(p[1].src == fp::Buf::out);
  g.kind = FftKind::r2c;
  p = fp::schedule(g);
  REQUIRE(p.size() == 2);
  CHECK(p[0].kind == fp::PassKind::r2c);
  CHECK(p[0].rank == 3);  // the chunk of dims.back()
  CHECK(p[1].kind == fp::PassKind::c2c);
  g.kind = FftKind::c2r;
  p = fp::schedule(g);
  REQUIRE(p.size() == 2);
  CHECK(p[0].kind == fp::PassKind::c2c);
  CHECK(p[0].src == fp::Buf::scratch);
  CHECK(p[1].kind == fp::PassKind::c2r);
  CHECK(p[1].dst == fp::Buf::out);
  // A middle dim: one plan, looped over the smaller side.
  p = fp::schedule(FftGeometry{FftKind::c2c, false, {9, 5, 2}, {1}, 1.0});
  REQUIRE(p.size() == 1);
  CHECK(p[0].batch == 9);
  CHECK(p[0].loops == 2);
  // A trailing set: one execution.
  p = fp::schedule(FftGeometry{FftKind::c2c, false, {6, 5, 4}, {1, 2}, 1.0});
  REQUIRE(p.size() == 1);
  CHECK(p[0].loops == 1);
  CHECK(p[0].batch == 6);
}

TEST_CASE("fft_passes: the CUDA table's passes, run through FFTW, equal the CPU table", "[exec][fft]") {
  ExecContext ctx(Device::cpu());
  for (const auto& [s, dims] : kCases) {
    for (int kind = 0; kind < 4; ++kind) {  // c2c forward, c2c inverse, r2c, c2r
      INFO("rank " << s.size() << ", dims " << dims.size() << " from " << dims[0] << ", kind " << kind);
      FftGeometry g{kind < 2 ? FftKind::c2c : kind == 2 ? FftKind::r2c : FftKind::c2r, kind == 1, s, dims, 0.5};
      const auto cs = g.complex_shape();
      const index_t nr = numel_of(s), nc = numel_of(cs);
      if (g.kind == FftKind::r2c) {
        Block in = Block::allocate(DType::f64, Device::cpu(), s);
        const auto v = randoms(nr, 3);
        std::memcpy(in.data, v.data(), v.size() * sizeof(double));
        Block ref = Block::allocate(DType::c128, Device::cpu(), cs), got = Block::allocate(DType::c128, Device::cpu(), cs);
        exec::fft(g, in, ref, ctx);
        run_passes(g, in.data, got.data);
        CHECK(max_rel(static_cast<const cd*>(got.data), static_cast<const cd*>(ref.data), nc) < 1e-12);
        CHECK(std::memcmp(in.data, v.data(), v.size() * sizeof(double)) == 0);
      } else if (g.kind == FftKind::c2r) {
        // A Hermitian-consistent spectrum: r2c of real data.
        Block x = Block::allocate(DType::f64, Device::cpu(), s);
        const auto v = randoms(nr, 4);
        std::memcpy(x.data, v.data(), v.size() * sizeof(double));
        Block spec = Block::allocate(DType::c128, Device::cpu(), cs);
        exec::fft(FftGeometry{FftKind::r2c, false, s, dims, 1.0}, x, spec, ctx);
        const std::vector<cd> before(static_cast<const cd*>(spec.data), static_cast<const cd*>(spec.data) + nc);
        Block ref = Block::allocate(DType::f64, Device::cpu(), s), got = Block::allocate(DType::f64, Device::cpu(), s);
        exec::fft(g, spec, ref, ctx);
        run_passes(g, spec.data, got.data);
        CHECK(max_rel(static_cast<const double*>(got.data), static_cast<const double*>(ref.data), nr) < 1e-12);
        CHECK(std::memcmp(spec.data, before.data(), before.size() * sizeof(cd)) == 0);
      } else {
        Block in = Block::allocate(DType::c128, Device::cpu(), s);
        const auto re = randoms(nr, 5), im = randoms(nr, 6);
        auto* pi = static_cast<cd*>(in.data);
        for (index_t i = 0; i < nr; ++i) pi[i] = cd(re[static_cast<std::size_t>(i)], im[static_cast<std::size_t>(i)]);
        const std::vector<cd> before(pi, pi + nr);
        Block ref = Block::allocate(DType::c128, Device::cpu(), s), got = Block::allocate(DType::c128, Device::cpu(), s);
        exec::fft(g, in, ref, ctx);
        run_passes(g, in.data, got.data);
        CHECK(max_rel(static_cast<const cd*>(got.data), static_cast<const cd*>(ref.data), nr) < 1e-12);
        CHECK(std::memcmp(in.data, before.data(), before.size() * sizeof(cd)) == 0);
        // In place (in == out), as the front allows for c2c.
        run_passes(g, in.data, in.data);
        CHECK(max_rel(static_cast<const cd*>(in.data), static_cast<const cd*>(ref.data), nr) < 1e-12);
      }
    }
  }
}

TEST_CASE("fft_passes: a 1-D c2r ignores the imaginary parts of the zero and Nyquist frequencies", "[exec][fft]") {
  // What the CUDA table's fft_c2r_real_edges kernel enforces; FFTW's 1-D c2r (the CPU table) does
  // the same by construction. Shapes [3, 5] over dim 1 (n = 8, h = 5) and dim 0 (n = 6, h = 4).
  ExecContext ctx(Device::cpu());
  for (const auto& [s, dim] : std::vector<std::pair<std::vector<index_t>, int>>{{{3, 8}, 1}, {{6, 5}, 0}}) {
    FftGeometry g{FftKind::c2r, false, s, {dim}, 1.0};
    const auto cs = g.complex_shape();
    const index_t nc = numel_of(cs), nr = numel_of(s);
    Block spec = Block::allocate(DType::c128, Device::cpu(), cs);
    const auto re = randoms(nc, 9), im = randoms(nc, 10);
    auto* p = static_cast<cd*>(spec.data);
    for (index_t i = 0; i < nc; ++i) p[i] = cd(re[static_cast<std::size_t>(i)], im[static_cast<std::size_t>(i)]);
    Block ref = Block::allocate(DType::f64, Device::cpu(), s), got = Block::allocate(DType::f64, Device::cpu(), s);
    exec::fft(g, spec, ref, ctx);
    run_passes(g, spec.data, got.data);
    CHECK(max_rel(static_cast<const double*>(got.data), static_cast<const double*>(ref.data), nr) < 1e-12);
  }
}

}  // namespace st_exec_test_fft_passes
