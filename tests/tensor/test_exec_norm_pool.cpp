// Serial tests of the norm / pool / resize / GEMM kernel-family fronts (exec/*.hpp) on the host:
// the strided-batched GEMM and the bias epilogues against plain loops, and the bad-input errors
// (operands on different devices, a CUDA device without a usable CUDA backend, a bad dtype).
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <shardtensor/exec/gemm.hpp>
#include <shardtensor/exec/norm.hpp>
#include <shardtensor/exec/pool.hpp>
#include <shardtensor/exec/resize.hpp>
#include <shardtensor/tensor/gemm.hpp>
#include <shardtensor/tensor/ops.hpp>

using namespace shard;
using Catch::Matchers::ContainsSubstring;

TEMPLATE_TEST_CASE("exec::gemm_strided_batched matches one shard::gemm per matrix", "[exec][gemm]", float, double) {
  using T = TestType;
  const index_t m = 5, n = 4, k = 6, batch = 3;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      const index_t lda = (ta == Trans::no ? k : m) + 1, ldb = (tb == Trans::no ? n : k) + 2, ldc = n + 1;
      const index_t sa = (ta == Trans::no ? m : k) * lda, sb = (tb == Trans::no ? k : n) * ldb, sc = m * ldc;
      auto a = Tensor<T, 1>::empty({sa * batch}), b = Tensor<T, 1>::empty({sb * batch});
      auto c = Tensor<T, 1>::empty({sc * batch});
      a.fill_random(1, {0}, a.shape());
      b.fill_random(2, {0}, b.shape());
      c.fill_random(3, {0}, c.shape());
      auto want = c.clone();
      for (index_t i = 0; i < batch; ++i)
        gemm<T>(ta, tb, m, n, k, T(0.5), a.data() + i * sa, lda, b.data() + i * sb, ldb, T(2), want.data() + i * sc,
                ldc);
      exec::gemm_strided_batched(dtype_of<T>, ta, tb, m, n, k, 0.5, a.data(), lda, sa, b.data(), ldb, sb, 2.0,
                                 c.data(), ldc, sc, batch, Device::cpu(), current_context());
      CHECK(max_rel_diff(c, want) == 0.0);
    }
}

TEMPLATE_TEST_CASE("exec::add_bias and exec::bias_grad match plain loops", "[exec][gemm]", float, double) {
  using T = TestType;
  for (index_t S : {index_t{1}, index_t{7}}) {
    const index_t A = 3, C = 4;
    auto y = Tensor<T, 3>::empty({A, C, S}), b = Tensor<T, 1>::empty({C});
    y.fill_random(4, {0, 0, 0}, y.shape());
    b.fill_random(5, {0}, b.shape());
    auto want = y.clone();
    for (index_t a = 0; a < A; ++a)
      for (index_t c = 0; c < C; ++c)
        for (index_t s = 0; s < S; ++s) want(a, c, s) += b(c);
    exec::add_bias(dtype_of<T>, A, C, S, b.data(), y.data(), Device::cpu(), current_context());
    CHECK(max_rel_diff(y, want) == 0.0);
    auto db = Tensor<T, 1>::empty({C});
    exec::bias_grad(dtype_of<T>, A, C, S, y.data(), db.data(), Device::cpu(), current_context());
    for (index_t c = 0; c < C; ++c) {
      double acc = 0;
      for (index_t a = 0; a < A; ++a)
        for (index_t s = 0; s < S; ++s) acc += static_cast<double>(y(a, c, s));
      CHECK(std::abs(static_cast<double>(db(c)) - acc) <= 1e-6 * (1 + std::abs(acc)));
    }
  }
}

TEST_CASE("kernel-family fronts refuse mismatched devices, a missing CUDA backend and bad dtypes", "[exec][bad]") {
  ExecContext cpu_ctx;
  float x[4] = {1, 2, 3, 4}, y[4] = {};
  double stats[4] = {};
  exec::NormGeom g{exec::NormKind::batch, 1, 2, 2, 1};
  // Data said to be on a GPU, context on the host.
  CHECK_THROWS_WITH(exec::norm_sums(DType::f32, g, x, nullptr, stats, Device::cuda(0), cpu_ctx),
                    ContainsSubstring("different devices") && ContainsSubstring("norm_sums"));
  exec::PoolGeometry pg;
  CHECK_THROWS_WITH(exec::avg_pool_forward(DType::f32, pg, x, y, Device::cuda(0), cpu_ctx),
                    ContainsSubstring("different devices"));
  // A bad dtype.
  CHECK_THROWS_WITH(exec::avg_pool_forward(DType::i32, pg, x, y, Device::cpu(), cpu_ctx), ContainsSubstring("i32"));
  CHECK_THROWS_WITH(exec::gemm(DType::u8, Trans::no, Trans::no, 1, 1, 1, 1.0, x, 1, x, 1, 0.0, y, 1, Device::cpu(),
                               cpu_ctx),
                    ContainsSubstring("gemm"));
  // A CUDA device with no usable backend (no CUDA build, backend not linked, or no GPU): a clear error.
  if (cuda_device_count() == 0) {
    ExecContext gpu_ctx(Device::cuda(0));
    exec::ResizeGeometry rg;
    CHECK_THROWS_AS(exec::resize_forward(DType::f32, ResizeMode::nearest, rg, x, y, Device::cuda(0), gpu_ctx), Error);
    CHECK_THROWS_AS(exec::gemm(DType::f32, Trans::no, Trans::no, 1, 1, 1, 1.0, x, 1, x, 1, 0.0, y, 1, Device::cuda(0),
                               gpu_ctx),
                    Error);
  }
}
