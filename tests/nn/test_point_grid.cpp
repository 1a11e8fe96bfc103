// Serial tests of the point <-> grid operators (nn/functional/point_grid.hpp) on one rank, against
// closed forms: multilinear interpolation reproduces a linear field (and its gradient) inside the
// centres' hull and clamps outside it; points_to_grid of points at cell centres.
#include <catch2/catch_test_macros.hpp>

#include <cmath>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_nn_test_point_grid {

using namespace shard;

namespace {

DeviceMesh self_mesh() { return DeviceMesh(std::make_shared<SelfComm>(), {1}); }

autograd::Var<double, 2> point_var(const DeviceMesh& m, const std::vector<double>& xy, index_t w, bool rg = true) {
  const index_t n = static_cast<index_t>(xy.size()) / w;
  auto t = Tensor<double, 2>::empty({n, w});
  for (std::size_t i = 0; i < xy.size(); ++i) t.data()[i] = xy[i];
  const std::vector<index_t> counts{n};
  return autograd::Var<double, 2>(DistTensor<double, 2>(point_spec(m, counts, w), t), rg);
}

}  // namespace

TEST_CASE("grid_to_points is exact on a linear field and clamps at the edges", "[nn][point_grid]") {
  const auto m = self_mesh();
  const F::GridDomain dom{{-1.0, 0.0}, {1.0, 3.0}};  // h = (0.5, 0.5) for a 4 x 6 grid
  auto g = Tensor<double, 4>::empty({1, 2, 4, 6});
  auto field = [](int c, double x, double y) { return c == 0 ? 2 * x - 3 * y + 1 : -x + 0.5 * y; };
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 6; ++j) g.data()[(c * 4 + i) * 6 + j] = field(c, -1 + (i + 0.5) * 0.5, (j + 0.5) * 0.5);
  autograd::Var<double, 4> grid(DistTensor<double, 4>(DistSpec(m, {Replicate()}, {1, 2, 4, 6}), g), true);
  // inside the centres' hull [-0.75, 0.75] x [0.25, 2.75]; a centre; a face; then clamped points
  const std::vector<double> xy{0.1, 1.3, -0.75, 0.25, 0.0, 2.0, 0.3, 2.9, -1.0, 0.0, 1.0, 3.0};
  auto pts = point_var(m, xy, 2);
  auto y = F::grid_to_points(grid, pts, dom);
  const auto& v = y.local();
  for (int i = 0; i < 3; ++i)
    for (int c = 0; c < 2; ++c) CHECK(std::abs(v(i, c) - field(c, xy[2 * i], xy[2 * i + 1])) < 1e-12);
  // (0.3, 2.9): y clamped to the last centre 2.75; (-1, 0) and (1, 3): the corner cells
  for (int c = 0; c < 2; ++c) {
    CHECK(std::abs(v(3, c) - field(c, 0.3, 2.75)) < 1e-12);
    CHECK(std::abs(v(4, c) - field(c, -0.75, 0.25)) < 1e-12);
    CHECK(std::abs(v(5, c) - field(c, 0.75, 2.75)) < 1e-12);
  }
  F::sum(y).backward();  // d/dp of sum_c field: (2 - 1, -3 + 0.5) inside; 0 along clamped dims
  const auto& gp = pts.grad().local();
  CHECK(std::abs(gp(0, 0) - 1) < 1e-12);
  CHECK(std::abs(gp(0, 1) + 2.5) < 1e-12);
  CHECK(std::abs(gp(3, 0) - 1) < 1e-12);
  CHECK(gp(3, 1) == 0);
  CHECK(gp(4, 0) == 0);
  CHECK(gp(4, 1) == 0);
  // the grid gradient: the interpolation weights, summing to 1 per point and channel
  double s = 0;
  const auto& gg = grid.grad().local();
  for (index_t k = 0; k < gg.numel(); ++k) s += gg.data()[k];
  CHECK(std::abs(s - 12) < 1e-12);
}

TEST_CASE("points_to_grid aggregates points near cell centres", "[nn][point_grid]") {
  const auto m = self_mesh();
  const F::GridDomain dom{{0.0, 0.0}, {4.0, 4.0}};  // 4 x 4 cells of width 1, centres at k + 0.5
  const DistSpec gs(m, {Replicate()}, {1, 1, 4, 4});
  // two points at the centre of cell (1, 2), one at the centre of (3, 3), one between (0,0) and (0,1)
  auto pts = point_var(m, {1.5, 2.5, 1.5, 2.5, 3.5, 3.5, 0.5, 1.0}, 2);
  auto f = point_var(m, {1.0, 3.0, 5.0, 7.0}, 1);
  auto at = [](const Tensor<double, 4>& t, int i, int j) { return t(0, 0, i, j); };
  {
    auto z = F::points_to_grid<4>(pts, f, gs, dom, 0.5);
    CHECK(at(z.local(), 1, 2) == 4);
    CHECK(at(z.local(), 3, 3) == 5);
    CHECK(at(z.local(), 0, 0) == 7);
    CHECK(at(z.local(), 0, 1) == 7);
    CHECK(at(z.local(), 2, 2) == 0);
  }
  {
    auto z = F::points_to_grid<4>(pts, f, gs, dom, 0.5, {F::PointReduce::mean, F::PointWeight::none});
    CHECK(at(z.local(), 1, 2) == 2);
    CHECK(at(z.local(), 0, 1) == 7);
    CHECK(at(z.local(), 2, 2) == 0);
  }
  {
    auto z = F::points_to_grid<4>(pts, f, gs, dom, 1.0, {F::PointReduce::sum, F::PointWeight::linear});
    CHECK(at(z.local(), 1, 2) == 4);                      // weight 1 at the centre
    CHECK(std::abs(at(z.local(), 0, 0) - 3.5) < 1e-15);  // distance 0.5 of radius 1
    CHECK(at(z.local(), 2, 2) == 0);                      // neighbours at distance 1: weight 0
    F::sum(z).backward();
    // d/dp of 7 * (w(0,0) + w(0,1)) along y: +-(0.5 / 0.5) / 1 cancel; along x: 0 (centres' x = p_x)
    CHECK(std::abs(pts.grad().local()(3, 1)) < 1e-12);
    CHECK(std::abs(f.grad().local()(3, 0) - 1.0) < 1e-12);  // 0.5 + 0.5
  }
}

}  // namespace st_nn_test_point_grid
