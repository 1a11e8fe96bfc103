// gpusim lane: tensor cores through nvcuda::wmma (tests/gpusim/cuda_sim_wmma_kernels.cu) against
// a host double reference: m16n16k16 with f16 A / B fragments (row_major and col_major) and f32
// or f16 accumulators, every matrix in __shared__ memory with a padded leading dimension (72
// halves, 68 floats; the padding holds NaN), 16x16x16 and tiled 64x64x64 GEMMs on one warp and
// on four, accumulators loaded / stored row- and column-major, fill_fragment, elementwise work on
// frag.x[i] and the row-index trick (a fragment loaded from a matrix of row indices names the row
// of each element of an mma's result), fragments in global memory (.global and generic
// wmma.load / wmma.store), and the m32n8k16 / m8n32k16 shapes. What it checks in the
// simulator: scripts/gpusim/gpgpu-sim.patch (wmma.load / wmma.mma / wmma.store).
// The kernels are in shardtensor_gpusim_tests only: in the normal build (shardtensor_cuda_tests,
// no .cu) the launchers are absent and the test skips.
#include "cuda_sim_wmma.hpp"
#include "gpusim_support.hpp"

// Weak: absent from shardtensor_cuda_tests (see above).
extern "C" {
__attribute__((weak)) const char* st_gpusim_wmma_gemm(int, int, int, int, int, int, int, int, const float*,
                                                      const float*, const float*, float*);
__attribute__((weak)) const char* st_gpusim_wmma_rowscale(const float*, const float*, const float*,
                                                          const float*, float*, float*);
__attribute__((weak)) const char* st_gpusim_wmma_global(int, const float*, const float*, const float*, float*);
__attribute__((weak)) const char* st_gpusim_wmma_shape(int, int, int, int, const float*, const float*,
                                                       const float*, float*);
}

namespace st_gpusim_cuda_sim_wmma {

using namespace gpusim;

namespace {

#define WMMA_REQUIRE_KERNELS()                                                                   \
  GPUSIM_REQUIRE_GPU();                                                                          \
  if (st_gpusim_wmma_gemm == nullptr)                                                            \
  SKIP("the wmma kernels (cuda_sim_wmma_kernels.cu) are built into shardtensor_gpusim_tests only")

/// n values k / den with k uniform in [-lim, lim] (few mantissa bits: exact in f16, and their
/// products and sums exact in f32).
std::vector<float> grid_vals(std::size_t n, unsigned seed, int lim, int den) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> u(-lim, lim);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(u(g)) / static_cast<float>(den);
  return v;
}

/// n values uniform in [-1, 1) rounded to f16 (a full f16 mantissa).
std::vector<float> f16_vals(std::size_t n, unsigned seed) {
  std::vector<float> v(n);
  const auto r = rand_vals(n, seed);
  for (std::size_t i = 0; i < n; ++i) {
    // round to 11 significant bits (f16's): the nearest multiple of 2^(e-11)
    int e = 0;
    std::frexp(r[i], &e);
    const double q = std::ldexp(1.0, std::max(e - 11, -24));  // f16 subnormals: spacing 2^-24
    v[i] = static_cast<float>(std::nearbyint(r[i] / q) * q);
  }
  return v;
}

/// d = a (m x k) * b (k x n) + c0, all row-major, in double.
std::vector<double> ref_gemm(int m, int n, int k, const std::vector<float>& a, const std::vector<float>& b,
                             const std::vector<float>& c0) {
  std::vector<double> d(static_cast<std::size_t>(m) * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = c0[i * n + j];
      for (int p = 0; p < k; ++p) s += static_cast<double>(a[i * k + p]) * b[p * n + j];
      d[i * n + j] = s;
    }
  return d;
}

struct GemmCase {
  int m, n, k, warps;
  bool a_col, b_col, c_col, f16_acc, full_f16;  // full_f16: full-mantissa f16 inputs (else grid values)
};

std::string name(const GemmCase& c) {
  return std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + " warps " +
         std::to_string(c.warps) + " A " + (c.a_col ? "col" : "row") + " B " + (c.b_col ? "col" : "row") +
         " C " + (c.c_col ? "col" : "row") + (c.f16_acc ? " f16 acc" : " f32 acc") +
         (c.full_f16 ? " full-mantissa inputs" : "");
}

void run_gemm(const GemmCase& c, unsigned seed) {
  const auto sz = [](int r, int q) { return static_cast<std::size_t>(r) * static_cast<std::size_t>(q); };
  std::vector<float> a, b, c0;
  if (c.full_f16) {
    a = f16_vals(sz(c.m, c.k), seed);
    b = f16_vals(sz(c.k, c.n), seed + 1);
    c0 = f16_vals(sz(c.m, c.n), seed + 2);
  } else if (c.f16_acc) {  // integers: every partial sum exact in f16 (|d| < 2048)
    a = grid_vals(sz(c.m, c.k), seed, 3, 1);
    b = grid_vals(sz(c.k, c.n), seed + 1, 3, 1);
    c0 = grid_vals(sz(c.m, c.n), seed + 2, 8, 1);
  } else {  // multiples of 1/8 and 1/64: d needs ~15 significant bits (f16 accumulation fails)
    a = grid_vals(sz(c.m, c.k), seed, 16, 8);
    b = grid_vals(sz(c.k, c.n), seed + 1, 16, 8);
    c0 = grid_vals(sz(c.m, c.n), seed + 2, 512, 64);
  }
  std::vector<float> d(sz(c.m, c.n), -12345.f);
  const char* err = st_gpusim_wmma_gemm(c.m, c.n, c.k, c.warps, c.a_col, c.b_col, c.c_col, c.f16_acc,
                                        a.data(), b.data(), c0.data(), d.data());
  INFO(name(c));
  REQUIRE(err == nullptr);
  const auto ref = ref_gemm(c.m, c.n, c.k, a, b, c0);
  const std::vector<double> got(d.begin(), d.end());
  const double e = rel_err(got, ref);
  // grid values: exact; full-mantissa f16 inputs: f32 rounding of the partial sums only
  const double tol = c.full_f16 ? 1e-6 : 0.0;
  INFO("relative error " << e << " (tolerance " << tol << "); worst " << worst(got, ref));
  CHECK(e <= tol);
}

}  // namespace

TEST_CASE("wmma m16n16k16 f32 accumulators: 16x16x16 on one warp, every A / B layout", "[wmma]") {
  WMMA_REQUIRE_KERNELS();
  unsigned seed = 100;
  for (bool a_col : {false, true})
    for (bool b_col : {false, true}) run_gemm({16, 16, 16, 1, a_col, b_col, false, false, false}, seed += 3);
}

TEST_CASE("wmma m16n16k16 f32 accumulators: tiled 64x64x64 through shared memory", "[wmma]") {
  WMMA_REQUIRE_KERNELS();
  // one warp over all 16 tiles (A row, B col: Q K^T of an attention kernel)
  run_gemm({64, 64, 64, 1, false, true, false, false, false}, 200);
  // four warps, every A / B layout
  unsigned seed = 210;
  for (bool a_col : {false, true})
    for (bool b_col : {false, true}) run_gemm({64, 64, 64, 4, a_col, b_col, false, false, false}, seed += 3);
  // accumulators loaded / stored column-major; a non-square shape
  run_gemm({64, 64, 64, 4, true, false, true, false, false}, 230);
  run_gemm({48, 32, 64, 4, false, true, true, false, false}, 240);
  // full-mantissa f16 inputs: within f32 rounding of the exact result
  run_gemm({64, 64, 64, 4, false, false, false, false, true}, 250);
  run_gemm({64, 64, 64, 4, false, true, false, false, true}, 260);
}

TEST_CASE("wmma m16n16k16 f16 accumulators", "[wmma]") {
  WMMA_REQUIRE_KERNELS();
  run_gemm({16, 16, 16, 1, false, false, false, true, false}, 300);
  run_gemm({16, 16, 16, 1, true, true, true, true, false}, 310);
  run_gemm({64, 32, 48, 4, false, true, false, true, false}, 320);
  run_gemm({32, 64, 64, 4, true, false, true, true, false}, 330);
}

TEST_CASE("wmma row-index trick: a fragment of row indices names the rows of an mma's result", "[wmma]") {
  WMMA_REQUIRE_KERNELS();
  const auto a = grid_vals(256, 400, 16, 8), b = grid_vals(256, 401, 16, 4);
  std::vector<float> row_scale(16), col_add(16);
  for (int i = 0; i < 16; ++i) row_scale[i] = static_cast<float>(i + 1) * (i % 2 ? -0.5f : 0.25f);
  for (int j = 0; j < 16; ++j) col_add[j] = static_cast<float>(j * 100);
  std::vector<float> d(256, -1.f), ridx(256, -1.f);
  const char* err = st_gpusim_wmma_rowscale(a.data(), b.data(), row_scale.data(), col_add.data(), d.data(),
                                            ridx.data());
  REQUIRE(err == nullptr);
  std::vector<double> ref(256), got(d.begin(), d.end()), ridx_ref(256), ridx_got(ridx.begin(), ridx.end());
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      double s = 0;
      for (int p = 0; p < 16; ++p) s += static_cast<double>(a[i * 16 + p]) * (0.5 * b[p * 16 + j]);
      ref[i * 16 + j] = s * row_scale[i] + col_add[j];
      ridx_ref[i * 16 + j] = i;
    }
  INFO("row indices stored back: worst " << worst(ridx_got, ridx_ref));
  CHECK(rel_err(ridx_got, ridx_ref) == 0.0);
  INFO("row-scaled result: worst " << worst(got, ref));
  CHECK(rel_err(got, ref) == 0.0);
}

TEST_CASE("wmma fragments loaded from and stored to global memory (and through a generic pointer)", "[wmma]") {
  WMMA_REQUIRE_KERNELS();
  for (int via_shared : {0, 1}) {
    const auto a = grid_vals(256, 600 + 3 * via_shared, 16, 8), b = grid_vals(256, 601 + 3 * via_shared, 16, 8);
    const auto c0 = grid_vals(256, 602 + 3 * via_shared, 512, 64);
    std::vector<float> d(16 * 20, -1.f);
    INFO((via_shared ? "A through shared memory and a generic pointer" : "A, B, C0 and D in global memory"));
    REQUIRE(st_gpusim_wmma_global(via_shared, a.data(), b.data(), c0.data(), d.data()) == nullptr);
    const auto ref = ref_gemm(16, 16, 16, a, b, c0);
    std::vector<double> got(256);
    int pad_changed = 0;  // the store must leave the padding columns 16..19 (sentinel -777) alone
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 16; ++j) got[i * 16 + j] = d[i * 20 + j];
      for (int j = 16; j < 20; ++j) pad_changed += d[i * 20 + j] != -777.f;
    }
    INFO("worst " << worst(got, ref));
    CHECK(rel_err(got, ref) == 0.0);
    CHECK(pad_changed == 0);
  }
}

TEST_CASE("wmma m32n8k16 and m8n32k16", "[wmma]") {
  WMMA_REQUIRE_KERNELS();
  unsigned seed = 500;
  for (int shape = 0; shape < 2; ++shape)
    for (bool a_col : {false, true}) {
      const bool b_col = !a_col;
      const int m = shape ? 8 : 32, n = shape ? 32 : 8;
      const auto a = grid_vals(static_cast<std::size_t>(m) * 16, seed++, 16, 8);
      const auto b = grid_vals(static_cast<std::size_t>(n) * 16, seed++, 16, 8);
      const auto c0 = grid_vals(static_cast<std::size_t>(m) * n, seed++, 512, 64);
      std::vector<float> d(static_cast<std::size_t>(m) * n, -1.f);
      INFO("m" << m << "n" << n << "k16, A " << (a_col ? "col" : "row") << ", B " << (b_col ? "col" : "row"));
      REQUIRE(st_gpusim_wmma_shape(m, n, a_col, b_col, a.data(), b.data(), c0.data(), d.data()) == nullptr);
      const auto ref = ref_gemm(m, n, 16, a, b, c0);
      const std::vector<double> got(d.begin(), d.end());
      INFO("worst " << worst(got, ref));
      CHECK(rel_err(got, ref) == 0.0);
    }
}

}  // namespace st_gpusim_cuda_sim_wmma
