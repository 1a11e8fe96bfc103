// bench_fft: the fft kernel family's CPU table (exec::fft over FFTW3, cached plans) against the
// same transform written directly against FFTW (one plan made beforehand, fftw_execute), in one
// run, interleaved (the order alternates every repetition), one thread. Reports medians, GFLOP/s
// (the usual 5 N log2 N for c2c, 2.5 N log2 N for r2c, N = transformed points per batch entry x
// batch) and the ratio ours / FFTW. Also the first call's time (plan creation included).
//
//   OMP_NUM_THREADS=1 build/bench/bench_fft [--n 128] [--reps 7]
#include <fftw3.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <complex>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <shardtensor/exec/fft.hpp>

using namespace shard;
using exec::FftGeometry;
using exec::FftKind;

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Direct FFTW plan of the same 3-D transform (double or float).
struct Direct {
  bool dbl = true;
  fftw_plan pd = nullptr;
  fftwf_plan pf = nullptr;
  void run() const { dbl ? fftw_execute(pd) : fftwf_execute(pf); }
  ~Direct() {
    if (pd) fftw_destroy_plan(pd);
    if (pf) fftwf_destroy_plan(pf);
  }
};

template <class R>
void bench(const char* name, FftKind kind, index_t n, int reps) {
  const bool dbl = std::is_same_v<R, double>;
  const std::vector<index_t> shape{n, n, n};
  FftGeometry g{kind, false, shape, {0, 1, 2}, 1.0};
  const auto cs = g.complex_shape();
  const index_t nreal = n * n * n, ncplx = cs[0] * cs[1] * cs[2];
  const DType real_dt = dbl ? DType::f64 : DType::f32, cplx_dt = dbl ? DType::c128 : DType::c64;
  const Block in = Block::allocate(kind == FftKind::c2c ? cplx_dt : real_dt, Device::cpu(), shape);
  const Block out = Block::allocate(cplx_dt, Device::cpu(), kind == FftKind::c2c ? shape : cs);
  const Block din = Block::allocate(in.dtype, Device::cpu(), in.shape_vec());
  const Block dout = Block::allocate(out.dtype, Device::cpu(), out.shape_vec());
  for (index_t i = 0; i < in.numel() * (kind == FftKind::c2c ? 2 : 1); ++i) {
    const R v = static_cast<R>(std::sin(0.001 * static_cast<double>(i)));
    static_cast<R*>(in.data)[i] = v;
    static_cast<R*>(din.data)[i] = v;
  }
  Direct d;
  d.dbl = dbl;
  const int ni = static_cast<int>(n);
  if (dbl) {
    d.pd = kind == FftKind::c2c ? fftw_plan_dft_3d(ni, ni, ni, static_cast<fftw_complex*>(din.data),
                                                   static_cast<fftw_complex*>(dout.data), FFTW_FORWARD,
                                                   FFTW_ESTIMATE | FFTW_PRESERVE_INPUT)
                                : fftw_plan_dft_r2c_3d(ni, ni, ni, static_cast<double*>(din.data),
                                                       static_cast<fftw_complex*>(dout.data),
                                                       FFTW_ESTIMATE | FFTW_PRESERVE_INPUT);
  } else {
    d.pf = kind == FftKind::c2c ? fftwf_plan_dft_3d(ni, ni, ni, static_cast<fftwf_complex*>(din.data),
                                                    static_cast<fftwf_complex*>(dout.data), FFTW_FORWARD,
                                                    FFTW_ESTIMATE | FFTW_PRESERVE_INPUT)
                                : fftwf_plan_dft_r2c_3d(ni, ni, ni, static_cast<float*>(din.data),
                                                        static_cast<fftwf_complex*>(dout.data),
                                                        FFTW_ESTIMATE | FFTW_PRESERVE_INPUT);
  }
  ExecContext ctx(Device::cpu());
  const double t0 = now_ms();
  exec::fft(g, in, out, ctx);  // first call: plans
  const double first = now_ms() - t0;
  d.run();
  std::vector<double> ours, direct;
  for (int r = 0; r < reps; ++r) {
    auto a = [&] {
      const double t = now_ms();
      exec::fft(g, in, out, ctx);
      ours.push_back(now_ms() - t);
    };
    auto b = [&] {
      const double t = now_ms();
      d.run();
      direct.push_back(now_ms() - t);
    };
    if (r % 2) { a(); b(); } else { b(); a(); }
  }
  // Same result as the direct plan (bitwise: one algorithm, same flags).
  const bool same = std::memcmp(out.data, dout.data, static_cast<std::size_t>(ncplx) * 2 * sizeof(R)) == 0;
  const double flops = (kind == FftKind::c2c ? 5.0 : 2.5) * static_cast<double>(nreal) * std::log2(static_cast<double>(nreal));
  const double mo = median(ours), md = median(direct);
  std::printf("%-4s %-3s %4lld^3  ours %8.2f ms (%5.2f GFLOP/s)  fftw %8.2f ms (%5.2f GFLOP/s)  ours/fftw %.3f  first call %.1f ms  same=%s\n",
              name, dbl ? "f64" : "f32", static_cast<long long>(n), mo, flops / mo * 1e-6, md, flops / md * 1e-6,
              mo / md, first, same ? "yes" : "NO");
}

}  // namespace

int main(int argc, char** argv) {
  index_t n = 128;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--n") n = std::stoll(argv[i + 1]);
    else if (a == "--reps") reps = std::stoi(argv[i + 1]);
  }
  std::printf("# bench_fft: 3-D transform of n^3 points, one thread, median of %d interleaved repetitions\n", reps);
  bench<double>("c2c", FftKind::c2c, n, reps);
  bench<float>("c2c", FftKind::c2c, n, reps);
  bench<double>("r2c", FftKind::r2c, n, reps);
  bench<float>("r2c", FftKind::r2c, n, reps);
  return 0;
}
