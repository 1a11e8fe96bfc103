#pragma once
/// \file blas.hpp
/// Row-major GEMM on host memory (a thin wrapper over OpenBLAS cblas_sgemm / cblas_dgemm; the CPU
/// implementation of the GEMM kernel family, whose device-generic front is exec/gemm.hpp) and
/// control of the BLAS thread pool.
///
/// Threading policy (measured on the 2-core reference machine with bench/bench_conv_local,
/// conv2d 16->16 3x3 on 1x16x1024^2, im2col path, forward + backward, 2 threads): OpenMP over
/// the (batch, group, tile) work units with single-threaded BLAS inside took 348-416 ms, a
/// serial tile loop with 2 BLAS threads 416-432 ms (load ~3, interleaved runs; 1.24-1.49 s vs
/// 1.79-1.80 s under load ~11), so the
/// conv kernels parallelise over tiles and hold a BlasThreadsScope(1) inside their parallel
/// region: the per-tile GEMMs are small (M = C_out/groups, K = C_in/groups x kernel volume)
/// and the im2col copies then run in parallel too (ConvThreading::blas selects the other policy
/// for comparison). Code that issues one large GEMM on its own (e.g. a Linear layer) leaves the
/// pool at its default size (OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else all cores) and
/// lets BLAS thread.
///
/// OpenBLAS builds with DYNAMIC_ARCH pick kernels from the CPU model at load time and fall back
/// to the SSE3 "Prescott" kernels for models they do not know (OpenBLAS 0.3.21 on the reference
/// machine's Xeon, family 6 model 0xCF: sgemm 12 GFLOP/s instead of 69 on 2 threads). Unless
/// OPENBLAS_CORETYPE is set, shardtensor re-selects SkylakeX (AVX-512) or Haswell (AVX2)
/// kernels once at load time in that case (blas_core_name() reports the choice).
#include <type_traits>

#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/exec/gemm.hpp"
#include "shardtensor/tensor/tensor.hpp"

namespace shard {

namespace detail {
/// Type-erased row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C on host memory
/// (dt = f32 or f64; leading dimensions are row strides of the stored matrices).
void gemm_core(DType dt, Trans ta, Trans tb, index_t m, index_t n, index_t k, double alpha, const void* a,
               index_t lda, const void* b, index_t ldb, double beta, void* c, index_t ldc);
}  // namespace detail

/// Row-major C[m,n] = alpha * op(A) * op(B) + beta * C on host pointers (OpenBLAS). op(A) is
/// m x k (A stored m x k with row stride lda, or k x m if ta == yes); likewise op(B) is k x n.
template <class T>
void gemm(Trans ta, Trans tb, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda, const T* b,
          index_t ldb, T beta, T* c, index_t ldc) {
  static_assert(is_float_type<T>, "gemm supports float, double, bf16 and f16");
  detail::gemm_core(dtype_of<T>, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// op(A) * op(B) of two host matrices (any strides with a unit inner stride, else copied).
template <class T>
Tensor<T, 2> matmul(const Tensor<T, 2>& a, const Tensor<T, 2>& b, Trans ta = Trans::no, Trans tb = Trans::no) {
  static_assert(is_float_type<T>, "matmul supports float, double, bf16 and f16");
  SHARD_CHECK(a.device().is_cpu() && b.device().is_cpu(), "matmul", "host tensors required (got {}, {})", a.device(),
              b.device());
  auto unit = [](const Tensor<T, 2>& t) { return t.stride(1) == 1 && t.stride(0) >= std::max<index_t>(1, t.size(1)); };
  const Tensor<T, 2> ac = unit(a) ? a : a.clone(), bc = unit(b) ? b : b.clone();
  const index_t m = ta == Trans::no ? ac.size(0) : ac.size(1), ka = ta == Trans::no ? ac.size(1) : ac.size(0);
  const index_t kb = tb == Trans::no ? bc.size(0) : bc.size(1), n = tb == Trans::no ? bc.size(1) : bc.size(0);
  SHARD_CHECK(ka == kb, "matmul", "inner dimensions differ: op(A) is {}x{}, op(B) is {}x{} (A {}, B {})", m, ka, kb,
              n, ac.shape(), bc.shape());
  auto c = Tensor<T, 2>::empty({m, n});
  gemm<T>(ta, tb, m, n, ka, T(1), ac.data(), std::max<index_t>(1, ac.stride(0)), bc.data(),
          std::max<index_t>(1, bc.stride(0)), T(0), c.data(), std::max<index_t>(1, n));
  return c;
}

/// Number of threads the BLAS library uses for one call.
int blas_num_threads() noexcept;
/// Sets the number of threads the BLAS library uses for one call (>= 1; process-wide).
void set_blas_num_threads(int n);
/// Name of the CPU kernel family BLAS selected at run time (e.g. "SkylakeX"), for reports.
const char* blas_core_name() noexcept;

/// RAII: sets the BLAS thread count for a scope and restores the previous count on exit. Not
/// for concurrent use from several threads (the BLAS setting is process-wide).
class BlasThreadsScope {
 public:
  /// Uses `n` BLAS threads until the scope ends.
  explicit BlasThreadsScope(int n) : previous_(blas_num_threads()) {
    if (n != previous_) set_blas_num_threads(n);
  }
  ~BlasThreadsScope() {
    if (blas_num_threads() != previous_) set_blas_num_threads(previous_);
  }
  BlasThreadsScope(const BlasThreadsScope&) = delete;
  BlasThreadsScope& operator=(const BlasThreadsScope&) = delete;

 private:
  int previous_;
};

}  // namespace shard
