// gemm / matmul against naive loops for every transpose combination and padded leading
// dimensions; BLAS thread controls.
#include <catch2/catch_test_macros.hpp>

#include <cstdlib>
#include <string>

#include <shardtensor/exec/blas.hpp>
#include <shardtensor/tensor/ops.hpp>

#include "tensor/test_conv_reference.hpp"

namespace st_tensor_test_gemm {

using namespace shard;
using shard::test::random_tensor;

namespace {
template <class T>
void check_gemm(Trans ta, Trans tb, index_t m, index_t n, index_t k, std::uint64_t seed) {
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  INFO("m " << m << " n " << n << " k " << k << " ta " << (ta == Trans::yes) << " tb " << (tb == Trans::yes));
  const index_t ar = ta == Trans::no ? m : k, ac = ta == Trans::no ? k : m;
  const index_t br = tb == Trans::no ? k : n, bc = tb == Trans::no ? n : k;
  // padded leading dimensions (+3)
  auto a = random_tensor<T, 2>({ar, ac + 3}, seed), b = random_tensor<T, 2>({br, bc + 3}, seed + 1);
  auto c = random_tensor<T, 2>({m, n + 3}, seed + 2);
  auto ref = Tensor<double, 2>::zeros({m, n});
  const double alpha = 0.75, beta = -0.5;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double s = 0;
      for (index_t l = 0; l < k; ++l) {
        const double av = ta == Trans::no ? a(i, l) : a(l, i), bv = tb == Trans::no ? b(l, j) : b(j, l);
        s += av * bv;
      }
      ref(i, j) = alpha * s + beta * static_cast<double>(c(i, j));
    }
  gemm<T>(ta, tb, m, n, k, T(alpha), a.data(), ac + 3, b.data(), bc + 3, T(beta), c.data(), n + 3);
  CHECK(max_rel_diff(shard::test::to_double(c.narrow(1, 0, n)), ref) <= tol);
  // matmul on (strided) views
  auto mm = matmul(a.narrow(1, 0, ac), b.narrow(1, 0, bc), ta, tb);
  auto ref0 = Tensor<double, 2>::zeros({m, n});
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double s = 0;
      for (index_t l = 0; l < k; ++l)
        s += static_cast<double>(ta == Trans::no ? a(i, l) : a(l, i)) * (tb == Trans::no ? b(l, j) : b(j, l));
      ref0(i, j) = s;
    }
  CHECK(max_rel_diff(shard::test::to_double(mm), ref0) <= tol);
}
}  // namespace

TEST_CASE("gemm: all transpose combinations, padded leading dims, f32/f64", "[gemm]") {
  std::uint64_t seed = 1;
  for (auto ta : {Trans::no, Trans::yes})
    for (auto tb : {Trans::no, Trans::yes})
      for (auto [m, n, k] : {std::tuple<index_t, index_t, index_t>{1, 1, 1}, {7, 5, 3}, {16, 300, 144}, {33, 2, 65}}) {
        check_gemm<double>(ta, tb, m, n, k, seed);
        check_gemm<float>(ta, tb, m, n, k, seed);
        seed += 3;
      }
}

TEST_CASE("gemm: k = 0 gives beta * C; bad sizes throw", "[gemm]") {
  auto c = Tensor<double, 2>::full({2, 3}, 4.0);
  double dummy = 0;
  gemm<double>(Trans::no, Trans::no, 2, 3, 0, 1.0, &dummy, 1, &dummy, 3, 0.5, c.data(), 3);
  CHECK(c(1, 2) == 2.0);
  CHECK_THROWS_AS(gemm<double>(Trans::no, Trans::no, 2, 3, 2, 1.0, &dummy, 1, &dummy, 3, 0.0, c.data(), 3), Error);
  CHECK_THROWS_AS(matmul(Tensor<double, 2>::zeros({2, 3}), Tensor<double, 2>::zeros({2, 3})), Error);
}

TEST_CASE("BLAS thread controls: scope sets and restores", "[gemm]") {
  const int before = blas_num_threads();
  CHECK(before >= 1);
  {
    BlasThreadsScope one(1);
    CHECK(blas_num_threads() == 1);
  }
  CHECK(blas_num_threads() == before);
  CHECK_THROWS_AS(set_blas_num_threads(0), Error);
  CHECK(std::string(blas_core_name()).size() > 0);
}

TEST_CASE("BLAS kernels match the CPU (no generic fallback core on AVX2/AVX-512 machines)", "[gemm]") {
  const std::string core = blas_core_name();
  INFO("BLAS core " << core);
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && __builtin_cpu_supports("avx2") && core != "unknown")
    CHECK(core != "Prescott");
}

}  // namespace st_tensor_test_gemm
