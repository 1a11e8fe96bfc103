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
#include <shardtensor/exec/tensor_block.hpp>
#include <shardtensor/exec/blas.hpp>
#include <shardtensor/tensor/ops.hpp>

namespace st_tensor_test_exec_norm_pool {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

TEMPLATE_TEST_CASE("exec::gemm on rank-3 blocks (strided batched) matches one shard::gemm per matrix", "[exec][gemm]", float, double) {
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
      // Stored matrices as rank-3 blocks [batch, rows, cols] with row strides lda/ldb/ldc.
      auto mat = [&](auto& t, index_t rows, index_t cols, index_t ld, index_t stride) {
        const index_t shape[3] = {batch, rows, cols}, strides[3] = {stride, ld, 1};
        return Block::view(dtype_of<T>, Device::cpu(), t.data(), shape, 3, strides);
      };
      exec::gemm({ta, tb, 0.5, 2.0}, mat(a, ta == Trans::no ? m : k, ta == Trans::no ? k : m, lda, sa),
                 mat(b, tb == Trans::no ? k : n, tb == Trans::no ? n : k, ldb, sb), mat(c, m, n, ldc, sc),
                 current_context());
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
    exec::add_bias({A, C, S}, as_block(b), as_block(y), current_context());
    CHECK(max_rel_diff(y, want) == 0.0);
    auto db = Tensor<T, 1>::empty({C});
    exec::bias_grad({A, C, S}, as_block(y), as_block(db), current_context());
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
  const index_t n4[1] = {4}, n1[2] = {1, 1};
  auto blk = [&](float* p, DType dt, Device dev) { return Block::view(dt, dev, p, n4, 1); };
  exec::NormGeom g{exec::NormKind::batch, 1, 2, 2, 1};
  // Data said to be on a GPU, context on the host.
  CHECK_THROWS_WITH(exec::norm_sums(g, blk(x, DType::f32, Device::cuda(0)), nullptr, stats, cpu_ctx),
                    ContainsSubstring("different devices") && ContainsSubstring("norm_sums"));
  exec::PoolGeometry pg;
  pg.in = {1, 2, 2};
  pg.out = {1, 2, 2};
  CHECK_THROWS_WITH(exec::avg_pool_forward(pg, blk(x, DType::f32, Device::cuda(0)), blk(y, DType::f32, Device::cuda(0)),
                                           cpu_ctx),
                    ContainsSubstring("different devices"));
  // Operands of different dtypes, a bad dtype, a shape that does not match the geometry.
  CHECK_THROWS_WITH(exec::avg_pool_forward(pg, blk(x, DType::f32, Device::cpu()), blk(y, DType::f64, Device::cpu()),
                                           cpu_ctx),
                    ContainsSubstring("dtype"));
  CHECK_THROWS_WITH(exec::avg_pool_forward(pg, blk(x, DType::i32, Device::cpu()), blk(y, DType::i32, Device::cpu()),
                                           cpu_ctx),
                    ContainsSubstring("i32"));
  pg.out = {1, 1, 1};
  CHECK_THROWS_WITH(exec::avg_pool_forward(pg, blk(x, DType::f32, Device::cpu()), blk(y, DType::f32, Device::cpu()),
                                           cpu_ctx),
                    ContainsSubstring("avg_pool_forward") && ContainsSubstring("1 elements"));
  const Block xm = Block::view(DType::u8, Device::cpu(), x, n1, 2), ym = Block::view(DType::u8, Device::cpu(), y, n1, 2);
  CHECK_THROWS_WITH(exec::gemm({}, xm, xm, ym, cpu_ctx), ContainsSubstring("gemm"));
  const Block xf = Block::view(DType::f32, Device::cpu(), x, n1, 2);
  CHECK_THROWS_WITH(exec::gemm({}, blk(x, DType::f32, Device::cpu()), xf, xf, cpu_ctx), ContainsSubstring("rank-2"));
  // A CUDA device with no usable backend (no CUDA build, backend not linked, or no GPU): a clear error.
  if (cuda_device_count() == 0) {
    ExecContext gpu_ctx(Device::cuda(0));
    exec::ResizeGeometry rg;
    const Block xg = Block::view(DType::f32, Device::cuda(0), x, n1, 2);
    CHECK_THROWS_AS(exec::resize_forward(rg, xg, xg, gpu_ctx), Error);
    CHECK_THROWS_AS(exec::gemm({}, xg, xg, xg, gpu_ctx), Error);
  }
}

}  // namespace st_tensor_test_exec_norm_pool
