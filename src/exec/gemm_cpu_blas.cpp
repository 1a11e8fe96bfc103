// Row-major GEMM over OpenBLAS (cblas) and the BLAS thread-pool controls.
#include "shardtensor/exec/blas.hpp"

#include "shardtensor/core/cpu_isa.hpp"
#include "shardtensor/core/error.hpp"

#include <cblas.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

// OpenBLAS extensions, declared weak so the library also links against another CBLAS (the
// thread controls then do nothing and blas_core_name() reports "unknown").
extern "C" {
void openblas_set_num_threads(int num_threads) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
char* openblas_get_corename(void) __attribute__((weak));
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace shard {
namespace {

/// OpenBLAS builds with DYNAMIC_ARCH pick their kernels from the CPU model at load time and fall
/// back to the SSE3 "Prescott" kernels for models they do not know (OpenBLAS 0.3.21 does not
/// know e.g. Intel family 6 model 0xCF, the reference machine): 4-6x slower sgemm. If the user
/// did not choose a core (OPENBLAS_CORETYPE), re-select the kernels matching `cpu_isa()` once,
/// before any GEMM of ours runs: when the core is a generic fallback, or when
/// SHARDTENSOR_CPU_ISA lowered the level (so an AVX-512 machine runs the BLAS an AVX2-only or
/// pre-AVX machine would: Haswell, or Nehalem for `scalar`).
void fix_blas_core() {
  if (!openblas_get_corename || !gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const std::string core = openblas_get_corename();
  const bool generic = core == "Prescott" || core == "Katmai" || core == "Core2" || core == "Nehalem" ||
                       core == "Unknown" || core == "unknown";
  CpuIsa isa = CpuIsa::scalar;
  try {
    isa = cpu_isa();
  } catch (const Error&) {
    return;  // a bad SHARDTENSOR_CPU_ISA is reported by the first kernel that asks, not at load time
  }
  const bool lowered = cpu_isa_overridden() && isa < cpu_isa_supported();
  if (!generic && !lowered) return;
  const char* want = isa == CpuIsa::avx512 ? "SkylakeX" : isa == CpuIsa::avx2 ? "Haswell" : "Nehalem";
  if (core == want) return;
  setenv("OPENBLAS_CORETYPE", want, 0);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
}

void ensure_blas_core() {
  static std::once_flag once;
  std::call_once(once, fix_blas_core);
}

// At load time, before the application starts threads.
[[maybe_unused]] const bool g_blas_core_fixed = (ensure_blas_core(), true);

}  // namespace

namespace detail {

void gemm_core(DType dt, Trans ta, Trans tb, index_t m, index_t n, index_t k, double alpha, const void* a,
               index_t lda, const void* b, index_t ldb, double beta, void* c, index_t ldc) {
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64, "gemm", "dtype {} not supported (f32, f64 only)", dt);
  SHARD_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm", "negative size m={} n={} k={}", m, n, k);
  const index_t a_cols = ta == Trans::no ? k : m, b_cols = tb == Trans::no ? n : k;
  SHARD_CHECK(lda >= std::max<index_t>(1, a_cols) && ldb >= std::max<index_t>(1, b_cols) &&
                  ldc >= std::max<index_t>(1, n),
              "gemm", "leading dimensions lda={} ldb={} ldc={} too small for m={} n={} k={}", lda, ldb, ldc, m, n, k);
  SHARD_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX,
              "gemm", "sizes exceed the 32-bit BLAS interface (m={} n={} k={})", m, n, k);
  if (m == 0 || n == 0) return;
  ensure_blas_core();
  const auto cta = ta == Trans::no ? CblasNoTrans : CblasTrans;
  const auto ctb = tb == Trans::no ? CblasNoTrans : CblasTrans;
  if (dt == DType::f32) {
    cblas_sgemm(CblasRowMajor, cta, ctb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                static_cast<float>(alpha), static_cast<const float*>(a), static_cast<int>(lda),
                static_cast<const float*>(b), static_cast<int>(ldb), static_cast<float>(beta), static_cast<float*>(c),
                static_cast<int>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, cta, ctb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha,
                static_cast<const double*>(a), static_cast<int>(lda), static_cast<const double*>(b),
                static_cast<int>(ldb), beta, static_cast<double*>(c), static_cast<int>(ldc));
  }
}

}  // namespace detail

int blas_num_threads() noexcept { return openblas_get_num_threads ? openblas_get_num_threads() : 1; }

void set_blas_num_threads(int n) {
  SHARD_CHECK(n >= 1, "set_blas_num_threads", "thread count {} < 1", n);
  if (openblas_set_num_threads) openblas_set_num_threads(n);
}

const char* blas_core_name() noexcept {
  ensure_blas_core();
  return openblas_get_corename ? openblas_get_corename() : "unknown";
}

}  // namespace shard
