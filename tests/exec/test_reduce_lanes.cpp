// The CPU reduce_sum (src/exec/reduce_cpu.cpp): rows whose trailing dims are all reduced are summed
// in 8 interleaved double lanes (sum_rows_in_lanes), other layouts element by element. Checked here,
// for f32 and f64, over keepdim patterns that take each branch (full sum, last dim, trailing dims,
// first + last dims, middle dim only, rows under 16 elements):
//  * a strided view (the interior of a larger array, as a halo-padded field is) gives the
//    contiguous copy's result bit for bit (the lane of an element depends only on its index);
//  * the result is within n 2^-52 |x|-sum of a long double reference (sums are in double);
//  * repeated calls and OpenMP thread counts give the same bits.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstring>
#include <omp.h>
#include <random>
#include <vector>

#include "shardtensor/exec/reduce.hpp"
#include "shardtensor/shardtensor.hpp"

namespace st_exec_test_reduce_lanes {

using namespace shard;

namespace {

struct Pattern {
  const char* name;
  std::vector<index_t> shape;
  std::vector<int> reduced;  ///< dims reduced (extent 1 in out)
};

std::vector<index_t> out_shape(const Pattern& p) {
  std::vector<index_t> o = p.shape;
  for (int d : p.reduced) o[static_cast<std::size_t>(d)] = 1;
  return o;
}

index_t numel(const std::vector<index_t>& s) {
  index_t n = 1;
  for (index_t e : s) n *= e;
  return n;
}

/// Reference: long double sums of x (contiguous) over the reduced dims, and the sums of |x|.
template <class T>
void reference(const Pattern& p, const std::vector<T>& x, std::vector<long double>& sum, std::vector<long double>& mag) {
  const auto o = out_shape(p);
  sum.assign(static_cast<std::size_t>(numel(o)), 0.0L);
  mag.assign(sum.size(), 0.0L);
  const int R = static_cast<int>(p.shape.size());
  std::vector<index_t> idx(static_cast<std::size_t>(R), 0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    index_t rem = static_cast<index_t>(i), j = 0, st = 1;
    for (int d = R - 1; d >= 0; --d) idx[static_cast<std::size_t>(d)] = rem % p.shape[static_cast<std::size_t>(d)], rem /= p.shape[static_cast<std::size_t>(d)];
    for (int d = R - 1; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      j += (o[u] == 1 ? 0 : idx[u]) * st;
      st *= o[u];
    }
    sum[static_cast<std::size_t>(j)] += static_cast<long double>(x[i]);
    mag[static_cast<std::size_t>(j)] += std::fabs(static_cast<long double>(x[i]));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("reduce_sum in double lanes: strided equals contiguous bitwise, accurate, repeatable",
                   "[exec][reduce]", float, double) {
  using T = TestType;
  const std::vector<Pattern> patterns = {
      {"full sum of [2,3,37,29]", {2, 3, 37, 29}, {0, 1, 2, 3}},
      {"last dim of [5,7,300]", {5, 7, 300}, {2}},
      {"trailing dims of [4,16,48,48]", {4, 16, 48, 48}, {2, 3}},
      {"first and last dims of [3,6,5,40]", {3, 6, 5, 40}, {0, 3}},
      {"middle dim of [4,33,20] (element by element)", {4, 33, 20}, {1}},
      {"rows under 16: last dim of [50,7]", {50, 7}, {1}},
      {"full sum of [1,1,1000003]", {1, 1, 1000003}, {0, 1, 2}},
  };
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (const Pattern& p : patterns) {
    INFO(p.name);
    const int R = static_cast<int>(p.shape.size());
    const index_t n = numel(p.shape);
    std::vector<T> x(static_cast<std::size_t>(n));
    for (auto& v : x) v = static_cast<T>(u(rng) * 1000.0);
    // the same values as the interior of a parent padded by 1 on each side of every dim
    std::vector<index_t> pshape(p.shape), strides(static_cast<std::size_t>(R));
    for (auto& e : pshape) e += 2;
    index_t st = 1, off = 0;
    for (int d = R - 1; d >= 0; --d) strides[static_cast<std::size_t>(d)] = st, off += st, st *= pshape[static_cast<std::size_t>(d)];
    std::vector<T> parent(static_cast<std::size_t>(numel(pshape)), std::numeric_limits<T>::quiet_NaN());
    {
      std::vector<index_t> idx(static_cast<std::size_t>(R));
      for (index_t i = 0; i < n; ++i) {
        index_t rem = i, o = off;
        for (int d = R - 1; d >= 0; --d) {
          const auto ud = static_cast<std::size_t>(d);
          o += (rem % p.shape[ud]) * strides[ud];
          rem /= p.shape[ud];
        }
        parent[static_cast<std::size_t>(o)] = x[static_cast<std::size_t>(i)];
      }
    }
    const auto os = out_shape(p);
    const Block xc = Block::view(dtype_of<T>, Device::cpu(), x.data(), p.shape.data(), R);
    const Block xs = Block::view(dtype_of<T>, Device::cpu(), parent.data() + off, p.shape.data(), R, strides.data());
    std::vector<T> a(static_cast<std::size_t>(numel(os))), b(a.size()), c(a.size()), d(a.size());
    auto out = [&](std::vector<T>& v) { return Block::view(dtype_of<T>, Device::cpu(), v.data(), os.data(), R); };
    auto& ctx = current_context(Device::cpu());
    exec::reduce_sum(xc, out(a), 1.0, ctx);
    exec::reduce_sum(xs, out(b), 1.0, ctx);
    exec::reduce_sum(xc, out(c), 1.0, ctx);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(threads > 1 ? 1 : 2);
    exec::reduce_sum(xs, out(d), 1.0, ctx);
    omp_set_num_threads(threads);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
    CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(T)) == 0);
    CHECK(std::memcmp(a.data(), d.data(), a.size() * sizeof(T)) == 0);
    std::vector<long double> ref, mag;
    reference(p, x, ref, mag);
    const index_t per = n / static_cast<index_t>(a.size());
    double worst = 0;
    for (std::size_t j = 0; j < a.size(); ++j) {
      // double accumulation error, then one rounding to T
      const long double tol = static_cast<long double>(per) * std::ldexp(1.0L, -52) * mag[j] +
                              std::fabs(ref[j]) * std::numeric_limits<T>::epsilon() + 1e-300L;
      worst = std::max(worst, static_cast<double>(std::fabs(static_cast<long double>(a[j]) - ref[j]) / tol));
    }
    CHECK(worst <= 1.0);
  }
}

}  // namespace st_exec_test_reduce_lanes
