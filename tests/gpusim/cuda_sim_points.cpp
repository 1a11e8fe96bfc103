// gpusim lane: the points family (kernels/points.cu via src/cuda/points_cuda.cpp) against the CPU
// table (src/exec/points_cpu.cpp) through the front (exec/points.hpp) on the same small inputs,
// as tests/exec/test_points.cpp and tests/exec/cuda_points.cpp do, at simulator-sized shapes:
//  - neighbour lists: the gather offsets (forward, backward into the gathered rows and the
//    query), norms and their backward, the three weight functions and their backward, aggregate
//    (scatter-add) sum / mean / max, unweighted and weighted, forward and backward; rows with
//    0..K valid entries (empty rows included), distances exactly 0 (norm gradient 0);
//  - point <-> grid, D = 2 and 3: trilinear interpolation and its point gradient, the grid
//    gradient scatter (f64 atomics on the device), the splat (constant and linear weights) and
//    its backward, the cell mean and its backward; a rank's block of a larger grid (offset,
//    len < global) with ghosts, points on the block's faces, on the global domain's faces and
//    outside it (clamped corners).
// The list ops sum in the CPU's order (rel 1e-12 f64, 1e-5 f32); the scatters use atomics
// (order-dependent last bits: rel 1e-11 on the f64 grids).
#include <catch2/catch_template_test_macros.hpp>

#include <array>
#include <tuple>

#include "gpusim_support.hpp"
#include "shardtensor/exec/points.hpp"
#include "shardtensor/tensor/tensor_block.hpp"
#include "support/points_grid_run.hpp"

namespace st_gpusim_cuda_sim_points {

using namespace gpusim;
using namespace shard::test;
using exec::PointAggregate;
using exec::PointGridGeometry;
using exec::PointListGeometry;
using exec::PointWeightFn;

namespace {

template <class T, int R>
Tensor<T, R> random_t(std::array<index_t, R> shape, unsigned seed, double lo = -1, double hi = 1) {
  auto t = Tensor<T, R>::empty(shape);
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (index_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<T>(u(g));
  return t;
}

template <class T, int R>
void require_close(const Tensor<T, R>& cpu, const Tensor<T, R>& gpu, double rtol, const char* what) {
  const auto h = gpu.to(Device::cpu());
  REQUIRE(h.numel() == cpu.numel());
  double worst = 0;
  index_t at = -1;
  for (index_t i = 0; i < h.numel(); ++i) {
    const double e = std::abs(double(cpu.data()[i]) - double(h.data()[i])) / (1 + std::abs(double(cpu.data()[i])));
    if (!(e <= worst)) worst = e, at = i;  // NaN counts as worst
  }
  INFO(what << ": worst relative difference " << worst << " at element " << at);
  CHECK(worst <= rtol);
}

template <class T>
double list_tol() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

}  // namespace

TEMPLATE_TEST_CASE("gpusim points: neighbour-list gather / aggregate kernels == the CPU table", "[gpusim][points]",
                   float, double) {
  GPUSIM_REQUIRE_GPU();
  using T = TestType;
  const index_t n = 37, K = 5, D = 3, C = 4;  // n > 32: several warps; 37: a ragged last block
  auto idx = Tensor<index_t, 2>::empty({n, K});
  auto cnt = Tensor<index_t, 1>::empty({n});
  std::mt19937 g(5);
  for (index_t i = 0; i < n; ++i) {
    const index_t c = i < K + 1 ? i : static_cast<index_t>(g() % (K + 1));  // rows with 0..K entries
    cnt.data()[i] = c;
    for (index_t j = 0; j < K; ++j) idx.data()[i * K + j] = j < c ? static_cast<index_t>(g() % 100) : -1;
  }
  auto G = random_t<T, 3>({n, K, D}, 1);
  const auto q = random_t<T, 2>({n, D}, 2), gy3 = random_t<T, 3>({n, K, D}, 3);
  for (int d = 0; d < D; ++d) G.data()[(2 * K + 0) * D + d] = q.data()[2 * D + d];  // offset 0: dist exactly 0
  auto dist = random_t<T, 2>({n, K}, 4, 0, 2);
  dist.data()[3 * K] = 0;  // weights at distance 0
  const auto gy2 = random_t<T, 2>({n, K}, 5);
  const auto V = random_t<T, 3>({n, K, C}, 6), W = random_t<T, 2>({n, K}, 7), gyc = random_t<T, 2>({n, C}, 8);
  auto run = [&](Device dev) {
    auto on = [&](const auto& t) { return t.to(dev); };
    ExecContext& cx = current_context(dev);
    const PointListGeometry gd{n, K, D}, gk{n, K, 1}, gc{n, K, C};
    std::vector<std::pair<std::string, Tensor<T, 3>>> t3;
    std::vector<std::pair<std::string, Tensor<T, 2>>> t2;
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
    t3 = {{"offsets", off}, {"offsets backward (gathered)", gG}, {"norm backward", gno}};
    t2 = {{"offsets backward (query)", gq}, {"norm", nrm}};
    for (const auto f : {PointWeightFn::inverse_distance(0.1), PointWeightFn::gaussian(0.5), PointWeightFn::linear(1.5)}) {
      auto w = Tensor<T, 2>::empty({n, K}, dev), gw = Tensor<T, 2>::empty({n, K}, dev);
      exec::points_weights_forward(gk, f, as_block(on(dist)), as_block(on(cnt)), as_block(w), cx);
      exec::points_weights_backward(gk, f, as_block(on(dist)), as_block(on(cnt)), as_block(on(gy2)), as_block(gw), cx);
      t2.push_back({"weights", w});
      t2.push_back({"weights backward", gw});
    }
    for (const auto red : {PointAggregate::sum, PointAggregate::mean, PointAggregate::max})
      for (const bool weighted : {false, true}) {
        const auto bw = as_block(on(W));
        auto y = Tensor<T, 2>::empty({n, C}, dev);
        auto am = Tensor<index_t, 2>::zeros({n, C}, dev);
        exec::points_aggregate_forward(gc, red, as_block(on(V)), weighted ? &bw : nullptr, as_block(on(cnt)),
                                       as_block(y), as_block(am), cx);
        auto gv = Tensor<T, 3>::empty({n, K, C}, dev);
        auto gw = Tensor<T, 2>::empty({n, K}, dev);
        const Block bgv = as_block(gv), bgw = as_block(gw);
        exec::points_aggregate_backward(gc, red, as_block(on(V)), weighted ? &bw : nullptr, as_block(on(cnt)),
                                        as_block(am), as_block(on(gyc)), &bgv, weighted ? &bgw : nullptr, cx);
        const std::string tag = std::string(red == PointAggregate::sum ? "sum" : red == PointAggregate::mean ? "mean" : "max") +
                                (weighted ? " weighted" : "");
        t2.push_back({"aggregate " + tag, y});
        t3.push_back({"aggregate backward (values) " + tag, gv});
        if (weighted) t2.push_back({"aggregate backward (weights) " + tag, gw});
        if (red == PointAggregate::max) {
          const auto amh = am.to(Device::cpu());
          auto amt = Tensor<T, 2>::empty({n, C});
          for (index_t i = 0; i < amt.numel(); ++i) amt.data()[i] = static_cast<T>(amh.data()[i]);
          t2.push_back({"aggregate argmax " + tag, amt});
        }
      }
    return std::make_pair(t3, t2);
  };
  const auto c = run(Device::cpu());
  const auto d = run(gpu());
  REQUIRE(c.first.size() == d.first.size());
  REQUIRE(c.second.size() == d.second.size());
  for (std::size_t i = 0; i < c.first.size(); ++i)
    require_close(c.first[i].second, d.first[i].second, list_tol<T>(), c.first[i].first.c_str());
  for (std::size_t i = 0; i < c.second.size(); ++i)
    require_close(c.second[i].second, d.second[i].second, list_tol<T>(), c.second[i].first.c_str());
}

TEMPLATE_TEST_CASE("gpusim points: point <-> grid interpolate / scatter / splat kernels == the CPU table",
                   "[gpusim][points]", float, double) {
  GPUSIM_REQUIRE_GPU();
  using T = TestType;
  for (const int D : {2, 3})
    for (const bool block_of_larger : {false, true})
      for (const bool linear : {false, true}) {
        INFO("D " << D << ", block of a larger grid " << block_of_larger << ", linear weight " << linear);
        const index_t C = 2, np = 40, ghost = block_of_larger ? 1 : 2;
        PointGridGeometry geo;
        geo.dims = D;
        geo.channels = C;
        geo.points = np;
        for (int d = 0; d < D; ++d) {
          const auto u = static_cast<std::size_t>(d);
          geo.global[u] = 5 + d;
          geo.offset[u] = block_of_larger ? 1 + d % 2 : 0;
          geo.len[u] = block_of_larger ? 3 : geo.global[u];
          geo.ghost[u] = ghost;
          geo.lo[u] = -0.5 * d;
          geo.h[u] = 1.0 / static_cast<double>(geo.global[u]);
        }
        geo.radius = 0.3;
        geo.linear_weight = linear;
        const index_t ecells = extended_cells(geo);
        // Points of the rank's block (its cells and ghosts), some on faces and some outside.
        auto P = Tensor<T, 2>::empty({np, D});
        std::mt19937 g(11 + static_cast<unsigned>(D));
        std::uniform_real_distribution<double> u(0, 1);
        for (index_t p = 0; p < np; ++p)
          for (int d = 0; d < D; ++d) {
            const auto k = static_cast<std::size_t>(d);
            const double a = geo.lo[k] + static_cast<double>(geo.offset[k]) * geo.h[k];
            const double b = a + static_cast<double>(geo.len[k]) * geo.h[k];
            double x = a + (b - a) * u(g);
            if (p % 10 == 1) x = a;                                                  // the block's low face
            if (p % 10 == 2) x = b;                                                  // its high face
            if (p % 10 == 3) x = geo.lo[k];                                          // the domain's low face
            if (p % 10 == 4) x = geo.lo[k] + static_cast<double>(geo.global[k]) * geo.h[k] + 0.01;  // just outside
            P.data()[p * D + d] = static_cast<T>(x);
          }
        const auto F = random_t<T, 2>({np, C}, 12), G = random_t<T, 2>({np, C}, 13);
        const auto E = random_t<T, 1>({C * ecells}, 14), CG = random_t<double, 1>({(C + 1) * ecells}, 15);
        const auto c = run_grid_kernels(geo, P, F, G, E, CG, Device::cpu());
        const auto d = run_grid_kernels(geo, P, F, G, E, CG, gpu());
        for (std::size_t i = 0; i < c.points.size(); ++i)
          require_close(c.points[i], d.points[i], 10 * list_tol<T>(), c.point_names[i]);
        for (std::size_t i = 0; i < c.grids.size(); ++i) require_close(c.grids[i], d.grids[i], 1e-11, c.grid_names[i]);
      }
}

}  // namespace st_gpusim_cuda_sim_points
