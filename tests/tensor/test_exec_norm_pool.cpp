// Serial tests of the norm / pool / resize / GEMM kernel-family fronts (exec/*.hpp) on the host:
// the strided-batched GEMM and the bias epilogues against plain loops, and the bad-input errors
// (operands on different devices, a CUDA device without a usable CUDA backend, a bad dtype).
#include <cmath>
#include <vector>

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

namespace {
/// Two-pass reference moments (long double) of statistic k's elements under `kind`'s index map.
struct RefMoments {
  std::vector<long double> sum, mean, m2;
};
RefMoments ref_moments(const exec::NormGeom& g, const std::vector<double>& x) {
  const index_t K = g.stats();
  RefMoments r{std::vector<long double>(K, 0), std::vector<long double>(K, 0), std::vector<long double>(K, 0)};
  std::vector<index_t> n(K, 0);
  auto stat = [&](index_t a, index_t c, index_t s) {
    switch (g.kind) {
      case exec::NormKind::batch: return c;
      case exec::NormKind::group: return a * g.G + c / (g.C / g.G);
      default: return a * g.S + s;
    }
  };
  auto each = [&](auto f) {
    for (index_t a = 0; a < g.A; ++a)
      for (index_t c = 0; c < g.C; ++c)
        for (index_t s = 0; s < g.S; ++s) f(stat(a, c, s), x[static_cast<std::size_t>((a * g.C + c) * g.S + s)]);
  };
  each([&](index_t k, double v) { r.sum[k] += v, ++n[k]; });
  for (index_t k = 0; k < K; ++k) r.mean[k] = n[k] ? r.sum[k] / n[k] : 0;
  each([&](index_t k, double v) { r.m2[k] += (v - r.mean[k]) * (v - r.mean[k]); });
  return r;
}
}  // namespace

TEST_CASE("exec::norm_moments: one pass gives the two-pass sum, mean and M2, on ill-conditioned data too",
          "[exec][norm]") {
  ExecContext& ctx = current_context();
  const exec::NormKind kinds[3] = {exec::NormKind::batch, exec::NormKind::group, exec::NormKind::layer};
  for (exec::NormKind kind : kinds)
    for (double offset : {0.0, 1e6}) {
      // offset 1e6, spread 1e-3: sum x^2 - n mean^2 in double would lose every digit of M2.
      exec::NormGeom g{kind, 3, 4, 7, 2};
      const index_t n = g.A * g.C * g.S, K = g.stats();
      std::vector<double> x(static_cast<std::size_t>(n));
      for (index_t i = 0; i < n; ++i)
        x[static_cast<std::size_t>(i)] = offset + (offset ? 1e-3 : 1.0) * std::sin(0.7 * static_cast<double>(i) + 0.3);
      const index_t shape[1] = {n};
      std::vector<double> sum(K), m2(K), lmean(K);
      exec::norm_moments(g, Block::view(DType::f64, Device::cpu(), x.data(), shape, 1), sum.data(), m2.data(),
                         lmean.data(), ctx);
      const RefMoments r = ref_moments(g, x);
      for (index_t k = 0; k < K; ++k) {
        INFO("kind " << static_cast<int>(kind) << " offset " << offset << " k " << k);
        CHECK(std::abs(sum[k] - static_cast<double>(r.sum[k])) <= 1e-14 * std::abs(static_cast<double>(r.sum[k])) + 1e-12);
        CHECK(std::abs(lmean[k] - static_cast<double>(r.mean[k])) <= 1e-15 * (offset + 1));
        CHECK(m2[k] >= 0);
        CHECK(std::abs(m2[k] - static_cast<double>(r.m2[k])) <= 1e-9 * static_cast<double>(r.m2[k]));
      }
      // The same statistics from a strided view (the interior of a padded [A, C + 2, S + 3] array):
      // the CPU table reads it in place, in the same order, so the results are the same bits.
      std::vector<double> pad(static_cast<std::size_t>(g.A * (g.C + 2) * (g.S + 3)), -7.0);
      for (index_t a = 0; a < g.A; ++a)
        for (index_t c = 0; c < g.C; ++c)
          for (index_t s = 0; s < g.S; ++s)
            pad[static_cast<std::size_t>((a * (g.C + 2) + c + 1) * (g.S + 3) + s + 2)] =
                x[static_cast<std::size_t>((a * g.C + c) * g.S + s)];
      const index_t vshape[3] = {g.A, g.C, g.S}, vstrides[3] = {(g.C + 2) * (g.S + 3), g.S + 3, 1};
      const Block xv = Block::view(DType::f64, Device::cpu(), pad.data() + (g.S + 3) + 2, vshape, 3, vstrides);
      std::vector<double> sum2(K), m22(K), lmean2(K);
      exec::norm_moments(g, xv, sum2.data(), m22.data(), lmean2.data(), ctx);
      CHECK(sum2 == sum);
      CHECK(m22 == m2);
      CHECK(lmean2 == lmean);
    }
}

TEST_CASE("exec::norm_moments + spread: blocks of a split statistic combine to the whole's variance", "[exec][norm]") {
  // Batch norm over [A, C, S] split along A into blocks of 2, 0 (an empty shard) and 3 samples:
  // the schedule of two ranks' allreduces done by hand (sums added, mean finished, each block's M2
  // spread to the global mean, M2s added, invstd finished).
  ExecContext& ctx = current_context();
  const index_t C = 3, S = 5, parts[3] = {2, 0, 3}, A = 5;
  std::vector<double> x(static_cast<std::size_t>(A * C * S));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 50.0 + std::cos(1.3 * static_cast<double>(i)) * (1 + i % 4);
  std::vector<double> total(C, 0), mean(C), m2sum(C, 0);
  std::vector<std::vector<double>> lm(3, std::vector<double>(C)), m2(3, std::vector<double>(C));
  index_t a0 = 0;
  for (int p = 0; p < 3; ++p) {
    exec::NormGeom g{exec::NormKind::batch, parts[p], C, S, 1};
    const index_t shape[1] = {parts[p] * C * S};
    std::vector<double> sum(C);
    exec::norm_moments(g, Block::view(DType::f64, Device::cpu(), x.data() + a0 * C * S, shape, 1), sum.data(),
                       m2[p].data(), lm[p].data(), ctx);
    for (index_t c = 0; c < C; ++c) total[c] += sum[c];
    a0 += parts[p];
  }
  mean = total;
  exec::NormFinishArgs fm;
  fm.mode = exec::NormFinish::mean;
  fm.K = C;
  fm.count = A * S;
  fm.v = mean.data();
  exec::norm_finish(fm, ctx);
  for (int p = 0; p < 3; ++p) {
    exec::NormFinishArgs sp;
    sp.mode = exec::NormFinish::spread;
    sp.K = C;
    sp.count = A * S;
    sp.v = m2[p].data();
    sp.mean = mean.data();
    sp.local_mean = lm[p].data();
    sp.local_count = parts[p] * S;
    exec::norm_finish(sp, ctx);
    for (index_t c = 0; c < C; ++c) m2sum[c] += m2[p][c];
  }
  const RefMoments r = ref_moments(exec::NormGeom{exec::NormKind::batch, A, C, S, 1}, x);
  for (index_t c = 0; c < C; ++c) {
    CHECK(std::abs(mean[c] - static_cast<double>(r.mean[c])) <= 1e-14 * 50);
    CHECK(std::abs(m2sum[c] - static_cast<double>(r.m2[c])) <= 1e-12 * static_cast<double>(r.m2[c]));
  }
  // The spread mode refuses a missing local mean.
  exec::NormFinishArgs bad;
  bad.mode = exec::NormFinish::spread;
  bad.K = C;
  bad.v = m2sum.data();
  bad.mean = mean.data();
  CHECK_THROWS_WITH(exec::norm_finish(bad, ctx), ContainsSubstring("spread"));
}

TEMPLATE_TEST_CASE("exec::norm_moments reads bf16 / f16 storage exactly (as its widened f64 values)", "[exec][norm]",
                   bf16, f16) {
  ExecContext& ctx = current_context();
  exec::NormGeom g{exec::NormKind::group, 2, 4, 9, 2};
  const index_t n = g.A * g.C * g.S, K = g.stats(), shape[1] = {n};
  std::vector<TestType> x(static_cast<std::size_t>(n));
  std::vector<double> xd(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) {
    x[static_cast<std::size_t>(i)] = TestType(static_cast<float>(3 + std::sin(static_cast<double>(i))));
    xd[static_cast<std::size_t>(i)] = static_cast<double>(x[static_cast<std::size_t>(i)]);
  }
  std::vector<double> s1(K), m1(K), l1(K), s2(K), m2(K), l2(K);
  exec::norm_moments(g, Block::view(dtype_of<TestType>, Device::cpu(), x.data(), shape, 1), s1.data(), m1.data(),
                     l1.data(), ctx);
  exec::norm_moments(g, Block::view(DType::f64, Device::cpu(), xd.data(), shape, 1), s2.data(), m2.data(), l2.data(),
                     ctx);
  CHECK(s1 == s2);
  CHECK(m1 == m2);
  CHECK(l1 == l2);
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
