// The points family on CUDA (src/cuda/points_cuda.cpp, kernels/points.cu) against the CPU table
// through the public front (exec/points.hpp): every neighbour-list op (offsets, norms, weights,
// aggregate sum / mean / max, weighted, forward and backward) and every grid kernel
// (interpolation, its scatter and point gradient, splat, its backward, mean), f32 and f64,
// 2-D and 3-D. The list ops sum in the CPU's order (close to the last bit); the scatters use
// atomics (tolerance). Skips without a GPU.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/shardtensor.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "shardtensor/exec/points.hpp"
#include "shardtensor/tensor/tensor_block.hpp"
#include "support/points_grid_run.hpp"

namespace st_exec_cuda_points {

using namespace shard;
using namespace shard::test;
using exec::PointAggregate;
using exec::PointGridGeometry;
using exec::PointListGeometry;
using exec::PointWeightFn;

namespace {

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped")

const Device kGpu = Device::cuda(0);

template <class T, int R>
Tensor<T, R> random_t(std::array<index_t, R> shape, unsigned seed, double lo = -1, double hi = 1) {
  auto t = Tensor<T, R>::empty(shape);
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (index_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<T>(u(g));
  return t;
}

template <class T, int R>
void require_close(const Tensor<T, R>& cpu, const Tensor<T, R>& gpu, double rtol) {
  const auto h = gpu.to(Device::cpu());
  REQUIRE(h.numel() == cpu.numel());
  for (index_t i = 0; i < h.numel(); ++i) {
    INFO("element " << i << ": cpu " << cpu.data()[i] << ", gpu " << h.data()[i]);
    REQUIRE(std::abs(double(cpu.data()[i]) - double(h.data()[i])) <= rtol * (1 + std::abs(double(cpu.data()[i]))));
  }
}

template <class T>
double tol() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

ExecContext& ctx_of(Device d) { return current_context(d); }

}  // namespace

TEMPLATE_TEST_CASE("cuda points: neighbour-list ops match the CPU table", "[cuda][points]", float, double) {
  REQUIRE_GPU();
  using T = TestType;
  const index_t n = 300, K = 7, D = 3, C = 5;
  auto idx = Tensor<index_t, 2>::empty({n, K});
  auto cnt = Tensor<index_t, 1>::empty({n});
  std::mt19937 g(5);
  for (index_t i = 0; i < n; ++i) {
    const index_t c = static_cast<index_t>(g() % (K + 1));
    cnt.data()[i] = c;
    for (index_t j = 0; j < K; ++j) idx.data()[i * K + j] = j < c ? static_cast<index_t>(g() % 1000) : -1;
  }
  const auto G = random_t<T, 3>({n, K, D}, 1), q = random_t<T, 2>({n, D}, 2), gy3 = random_t<T, 3>({n, K, D}, 3);
  const auto dist = random_t<T, 2>({n, K}, 4, 0, 2), gy2 = random_t<T, 2>({n, K}, 5);
  const auto V = random_t<T, 3>({n, K, C}, 6), W = random_t<T, 2>({n, K}, 7), gyc = random_t<T, 2>({n, C}, 8);
  auto run = [&](Device dev) {
    auto on = [&](const auto& t) { return t.to(dev); };
    ExecContext& cx = ctx_of(dev);
    const PointListGeometry gd{n, K, D}, gk{n, K, 1}, gc{n, K, C};
    std::vector<Tensor<T, 3>> t3;
    std::vector<Tensor<T, 2>> t2;
    auto off = Tensor<T, 3>::empty({n, K, D}, dev);
    exec::points_offsets_forward(gd, as_block(on(G)), as_block(on(q)), as_block(on(idx)), as_block(off), cx);
    auto gG = Tensor<T, 3>::empty({n, K, D}, dev);
    auto gq = Tensor<T, 2>::empty({n, D}, dev);
    const Block bgG = as_block(gG), bgq = as_block(gq);
    exec::points_offsets_backward(gd, as_block(on(gy3)), as_block(on(idx)), &bgG, &bgq, cx);
    auto nrm = Tensor<T, 2>::empty({n, K}, dev);
    exec::points_norm_forward(gd, as_block(off), as_block(nrm), cx);
    auto gno = Tensor<T, 3>::empty({n, K, D}, dev);
    exec::points_norm_backward(gd, as_block(off), as_block(nrm), as_block(on(gy2)), as_block(gno), cx);
    t3 = {off, gG, gno};
    t2 = {gq, nrm};
    for (const auto f : {PointWeightFn::inverse_distance(0.1), PointWeightFn::gaussian(0.5), PointWeightFn::linear(1.5)}) {
      auto w = Tensor<T, 2>::empty({n, K}, dev), gw = Tensor<T, 2>::empty({n, K}, dev);
      exec::points_weights_forward(gk, f, as_block(on(dist)), as_block(on(cnt)), as_block(w), cx);
      exec::points_weights_backward(gk, f, as_block(on(dist)), as_block(on(cnt)), as_block(on(gy2)), as_block(gw), cx);
      t2.push_back(w);
      t2.push_back(gw);
    }
    for (const auto red : {PointAggregate::sum, PointAggregate::mean, PointAggregate::max})
      for (const bool weighted : {false, true}) {
        const auto bw = as_block(on(W));
        auto y = Tensor<T, 2>::empty({n, C}, dev);
        auto am = Tensor<index_t, 2>::empty({n, C}, dev);
        exec::points_aggregate_forward(gc, red, as_block(on(V)), weighted ? &bw : nullptr, as_block(on(cnt)),
                                       as_block(y), as_block(am), cx);
        auto gv = Tensor<T, 3>::empty({n, K, C}, dev);
        auto gw = Tensor<T, 2>::empty({n, K}, dev);
        const Block bgv = as_block(gv), bgw = as_block(gw);
        exec::points_aggregate_backward(gc, red, as_block(on(V)), weighted ? &bw : nullptr, as_block(on(cnt)),
                                        as_block(am), as_block(on(gyc)), &bgv, weighted ? &bgw : nullptr, cx);
        t2.push_back(y);
        t3.push_back(gv);
        if (weighted) t2.push_back(gw);
      }
    return std::make_pair(t3, t2);
  };
  const auto c = run(Device::cpu());
  const auto d = run(kGpu);
  for (std::size_t i = 0; i < c.first.size(); ++i) require_close(c.first[i], d.first[i], tol<T>());
  for (std::size_t i = 0; i < c.second.size(); ++i) require_close(c.second[i], d.second[i], tol<T>());
}

TEMPLATE_TEST_CASE("cuda points: grid kernels match the CPU table", "[cuda][points]", float, double) {
  REQUIRE_GPU();
  using T = TestType;
  for (const int D : {2, 3})
    for (const bool linear : {false, true}) {
      INFO("D " << D << ", linear " << linear);
      const index_t C = 3, np = 500, ghost = 2;
      PointGridGeometry geo;
      geo.dims = D;
      geo.channels = C;
      geo.points = np;
      for (int d = 0; d < D; ++d) {
        const auto u = static_cast<std::size_t>(d);
        geo.global[u] = 6 + d;
        geo.len[u] = geo.global[u];
        geo.ghost[u] = ghost;
        geo.lo[u] = 0;
        geo.h[u] = 1.0 / static_cast<double>(geo.global[u]);
      }
      geo.radius = 0.3;
      geo.linear_weight = linear;
      const index_t ecells = extended_cells(geo);
      const auto P = random_t<T, 2>({np, D}, 11, 0, 1), F = random_t<T, 2>({np, C}, 12), G = random_t<T, 2>({np, C}, 13);
      const auto E = random_t<T, 1>({C * ecells}, 14), CG = random_t<double, 1>({(C + 1) * ecells}, 15);
      const auto c = run_grid_kernels(geo, P, F, G, E, CG, Device::cpu());
      const auto d = run_grid_kernels(geo, P, F, G, E, CG, kGpu);
      for (std::size_t i = 0; i < c.points.size(); ++i) {
        INFO(c.point_names[i]);
        require_close(c.points[i], d.points[i], 10 * tol<T>());
      }
      for (std::size_t i = 0; i < c.grids.size(); ++i) {
        INFO(c.grid_names[i]);
        require_close(c.grids[i], d.grids[i], 1e-11);
      }
    }
}

TEMPLATE_TEST_CASE("cuda points: box owners, counts and bucketed rows match the CPU table", "[cuda][points]", float,
                   double) {
  REQUIRE_GPU();
  using T = TestType;
  // 3 x 2 ranks over [0, 1] x [-1, 1] with an empty middle slab along x, points on the cuts, on
  // the domain's upper face, outside and NaN
  exec::PointBoxPartition part;
  part.ranks = 6;
  part.cuts = {0.0, 0.5, 0.5, 1.0, -1.0, 0.25, 1.0};
  part.offsets = {0, 4, 7};
  part.strides = {2, 1};
  const index_t n = 400;
  auto pts = random_t<T, 2>({n, 2}, 11, -1.1, 1.1);
  pts.data()[0] = T(0.5);
  pts.data()[1] = T(0.25);
  pts.data()[2] = T(1);
  pts.data()[3] = T(1);
  pts.data()[4] = std::numeric_limits<T>::quiet_NaN();
  const auto pg = pts.to(kGpu);
  auto own_c = Tensor<std::int64_t, 1>::empty({n});
  auto cnt_c = Tensor<std::int64_t, 1>::empty({part.ranks + 1});
  auto own_g = Tensor<std::int64_t, 1>::empty({n}, kGpu);
  auto cnt_g = Tensor<std::int64_t, 1>::empty({part.ranks + 1}, kGpu);
  const Block oc = as_block(own_c), og = as_block(own_g);
  exec::points_owner(part, as_block(pts), &oc, as_block(cnt_c), ctx_of(Device::cpu()));
  exec::points_owner(part, as_block(pg), &og, as_block(cnt_g), ctx_of(kGpu));
  require_close(own_c, own_g, 0);
  require_close(cnt_c, cnt_g, 0);
  auto off = Tensor<std::int64_t, 1>::empty({part.ranks + 1});
  off.data()[0] = 0;
  for (int r = 0; r < part.ranks; ++r) off.data()[r + 1] = off.data()[r] + cnt_c.data()[r];
  const index_t m = off.data()[part.ranks];
  auto rows_c = Tensor<std::int64_t, 1>::empty({m});
  auto rows_g = Tensor<std::int64_t, 1>::empty({m}, kGpu);
  exec::points_bucket_rows(part.ranks, as_block(own_c), as_block(off), as_block(rows_c), ctx_of(Device::cpu()));
  exec::points_bucket_rows(part.ranks, as_block(own_g), as_block(off.to(kGpu)), as_block(rows_g), ctx_of(kGpu));
  require_close(rows_c, rows_g, 0);
}

}  // namespace st_exec_cuda_points
