// The fft kernel family on CUDA (src/cuda/fft_cuda.cpp, cuFFT) against the CPU table (FFTW) on
// the same data: c2c forward and inverse, r2c, c2r (from a Hermitian spectrum, and for one dim
// from an arbitrary one: the zero / Nyquist imaginary parts are ignored as FFTW does), fp32 and
// fp64, odd and prime extents, trailing, leading, middle and split dim subsets, runs of more than
// 3 dims, extent-1 dims, scale, in-place c2c, a context on a stream of its own, repeated calls
// (cached plans), and inputs left unchanged. Skips without a GPU.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/shardtensor.hpp>

#include <complex>
#include <cstring>
#include <random>
#include <vector>

#include "shardtensor/exec/fft.hpp"
#include "shardtensor/runtime/device_runtime.hpp"

namespace st_exec_cuda_fft {

using namespace shard;
using exec::FftGeometry;
using exec::FftKind;

namespace {

index_t numel_of(const std::vector<index_t>& s) {
  index_t n = 1;
  for (index_t e : s) n *= e;
  return n;
}

/// A CPU block and its copy on cuda:0 (same dtype and shape, contiguous).
struct Pair {
  Block host, dev;
};

std::size_t bytes_of(const Block& b) { return static_cast<std::size_t>(numel_of(b.shape_vec())) * dtype_size(b.dtype); }

void upload(const Block& host, const Block& dev) {
  exec::cuda_runtime("test").copy(dev.data, dev.device, host.data, Device::cpu(), bytes_of(host),
                                  current_context(dev.device).stream(), true);
}
std::vector<unsigned char> download(const Block& dev) {
  std::vector<unsigned char> h(bytes_of(dev));
  exec::cuda_runtime("test").synchronize(Stream{}, dev.device.index);
  exec::cuda_runtime("test").copy(h.data(), Device::cpu(), dev.data, dev.device, h.size(),
                                  current_context(dev.device).stream(), true);
  return h;
}

/// Random values (uniform in [-1, 1]) of dtype `dt` on the host and on the GPU.
Pair random_pair(DType dt, const std::vector<index_t>& s, unsigned seed) {
  Pair p{Block::allocate(dt, Device::cpu(), s), Block::allocate(dt, Device::cuda(0), s)};
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const std::size_t reals = bytes_of(p.host) / (dt == DType::f32 || dt == DType::c64 ? sizeof(float) : sizeof(double));
  if (dt == DType::f32 || dt == DType::c64)
    for (std::size_t i = 0; i < reals; ++i) static_cast<float*>(p.host.data)[i] = static_cast<float>(u(gen));
  else
    for (std::size_t i = 0; i < reals; ++i) static_cast<double*>(p.host.data)[i] = u(gen);
  upload(p.host, p.dev);
  return p;
}
Pair empty_pair(DType dt, const std::vector<index_t>& s) {
  return {Block::allocate(dt, Device::cpu(), s), Block::allocate(dt, Device::cuda(0), s)};
}

/// max |gpu - cpu| / max |cpu| over the reals of two blocks of `dt` (the GPU one downloaded).
double rel_diff(DType dt, const std::vector<unsigned char>& gpu, const Block& cpu) {
  const bool f32 = dt == DType::f32 || dt == DType::c64;
  const std::size_t n = gpu.size() / (f32 ? sizeof(float) : sizeof(double));
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double a = f32 ? reinterpret_cast<const float*>(gpu.data())[i] : reinterpret_cast<const double*>(gpu.data())[i];
    const double b = f32 ? static_cast<const float*>(cpu.data)[i] : static_cast<const double*>(cpu.data)[i];
    num = std::max(num, std::abs(a - b));
    den = std::max(den, std::abs(b));
  }
  return den > 0 ? num / den : num;
}

bool same_bytes(const std::vector<unsigned char>& gpu, const Block& cpu) {
  return gpu.size() == bytes_of(cpu) && std::memcmp(gpu.data(), cpu.data, gpu.size()) == 0;
}

double tol(DType real) { return real == DType::f64 ? 1e-11 : 2e-5; }
DType complex_of(DType real) { return real == DType::f32 ? DType::c64 : DType::c128; }

const std::vector<std::pair<std::vector<index_t>, std::vector<int>>> kCases = {
    {{17}, {0}},                           // prime, one dim
    {{97, 31}, {0}},                       // prime extents, leading dim
    {{3, 4, 5}, {2}},                      // trailing
    {{2, 13, 40}, {1}},                    // middle, outer < inner
    {{40, 13, 2}, {1}},                    // middle, outer > inner
    {{6, 5, 7}, {0, 2}},                   // two runs
    {{2, 13, 11}, {1, 2}},                 // trailing pair, odd
    {{5, 7, 3, 2}, {0, 1, 2, 3}},          // a run of 4 (cuFFT's rank is at most 3)
    {{4, 3, 5, 2, 3}, {0, 1, 2, 3, 4}},    // a run of 5
    {{3, 2, 5, 3, 2, 3}, {0, 1, 2, 3, 5}}, // a run of 4 and a single dim
    {{2, 1, 6, 3}, {1, 2}},                // extent-1 transformed dim
    {{5, 6, 2}, {0, 1}},                   // halved dim not the array's last
    {{4, 96, 97}, {1, 2}},                 // larger, even x prime
    {{3, 64, 65, 2}, {1, 2}},              // middle pair
};

/// Runs `g` on the CPU and on the GPU (context `gctx`) and checks they agree and the GPU input
/// is unchanged. `in` must hold the same values on both sides.
void compare(const FftGeometry& g, DType real, const Pair& in, ExecContext& gctx) {
  const bool r2c = g.kind == FftKind::r2c, c2r = g.kind == FftKind::c2r;
  const DType odt = c2r ? real : complex_of(real);
  const auto oshape = r2c ? g.complex_shape() : g.shape;
  Pair out = empty_pair(odt, oshape);
  ExecContext cctx(Device::cpu());
  exec::fft(g, in.host, out.host, cctx);
  for (int rep = 0; rep < 2; ++rep) {  // the second call runs on the cached plans
    exec::fft(g, in.dev, out.dev, gctx);
    gctx.synchronize();
    CHECK(rel_diff(odt, download(out.dev), out.host) < tol(real));
  }
  CHECK(same_bytes(download(in.dev), in.host));  // input unchanged (c2r: cuFFT ran on a copy)
}

}  // namespace

TEST_CASE("CUDA fft: c2c forward and inverse equal the CPU table, in and out of place", "[cuda][exec][fft]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped");
  ExecContext gctx(Device::cuda(0));
  unsigned seed = 1;
  for (DType real : {DType::f64, DType::f32}) {
    for (const auto& [s, dims] : kCases) {
      for (bool inverse : {false, true}) {
        INFO("real " << (real == DType::f64 ? "f64" : "f32") << ", rank " << s.size() << ", dims " << dims.size()
                     << " from " << dims[0] << ", inverse " << inverse);
        const FftGeometry g{FftKind::c2c, inverse, s, dims, inverse ? 0.25 : 1.0};
        const Pair in = random_pair(complex_of(real), s, seed++);
        compare(g, real, in, gctx);
        // In place on the GPU: equals the CPU's out-of-place result.
        Pair ref = empty_pair(complex_of(real), s);
        ExecContext cctx(Device::cpu());
        exec::fft(g, in.host, ref.host, cctx);
        exec::fft(g, in.dev, in.dev, gctx);
        gctx.synchronize();
        CHECK(rel_diff(complex_of(real), download(in.dev), ref.host) < tol(real));
      }
    }
  }
}

TEST_CASE("CUDA fft: r2c and c2r equal the CPU table; c2r leaves its input alone", "[cuda][exec][fft]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped");
  ExecContext gctx(Device::cuda(0));
  unsigned seed = 100;
  for (DType real : {DType::f64, DType::f32}) {
    for (const auto& [s, dims] : kCases) {
      INFO("real " << (real == DType::f64 ? "f64" : "f32") << ", rank " << s.size() << ", dims " << dims.size()
                   << " from " << dims[0]);
      const FftGeometry g{FftKind::r2c, false, s, dims, 1.0};
      const Pair x = random_pair(real, s, seed++);
      compare(g, real, x, gctx);
      // c2r of a Hermitian spectrum (the CPU r2c of x, uploaded), scaled back to x.
      const auto cs = g.complex_shape();
      Pair spec = empty_pair(complex_of(real), cs);
      ExecContext cctx(Device::cpu());
      exec::fft(g, x.host, spec.host, cctx);
      upload(spec.host, spec.dev);
      index_t N = 1;
      for (int d : dims) N *= s[static_cast<std::size_t>(d)];
      compare(FftGeometry{FftKind::c2r, false, s, dims, 1.0 / static_cast<double>(N)}, real, spec, gctx);
    }
  }
}

TEST_CASE("CUDA fft: a 1-D c2r ignores the zero and Nyquist imaginary parts, as the CPU table", "[cuda][exec][fft]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped");
  ExecContext gctx(Device::cuda(0));
  for (DType real : {DType::f64, DType::f32})
    for (const auto& [s, dim] : std::vector<std::pair<std::vector<index_t>, int>>{
             {{3, 8}, 1}, {{3, 9}, 1}, {{6, 5}, 0}, {{2, 64, 3}, 1}}) {
      const FftGeometry g{FftKind::c2r, false, s, {dim}, 1.0};
      const Pair spec = random_pair(complex_of(real), g.complex_shape(), 7);  // not Hermitian
      compare(g, real, spec, gctx);
    }
}

TEST_CASE("CUDA fft: a context on its own stream", "[cuda][exec][fft]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped");
  const auto& rt = exec::cuda_runtime("test");
  const Stream st = rt.create_stream(0);
  {
    ExecContext sctx(Device::cuda(0), st);
    for (DType real : {DType::f64, DType::f32}) {
      const std::vector<index_t> s{8, 30, 31};
      compare(FftGeometry{FftKind::c2c, false, s, {0, 2}, 1.0}, real, random_pair(complex_of(real), s, 3), sctx);
      compare(FftGeometry{FftKind::r2c, false, s, {1, 2}, 0.5}, real, random_pair(real, s, 4), sctx);
    }
  }
  rt.destroy_stream(st, 0);
}

}  // namespace st_exec_cuda_fft
