#pragma once
// Every point <-> grid kernel of the points family (exec/points.hpp) on one device, for the tests
// that compare a device's table with the CPU table (tests/exec/cuda_points.cpp on a GPU,
// tests/gpusim/cuda_sim_points.cpp in the simulator lane): interpolation and its point gradient,
// the grid-gradient scatter, the splat with and without the weight channel, the splat's backward,
// the cell mean and its backward.
#include <vector>

#include <shardtensor/shardtensor.hpp>

#include "shardtensor/exec/points.hpp"
#include "shardtensor/tensor/tensor_block.hpp"

namespace shard::test {

/// The outputs of run_grid_kernels, in the order of `point_names` / `grid_names`.
template <class T>
struct GridKernelOutputs {
  std::vector<Tensor<T, 2>> points;      ///< per-point outputs
  std::vector<Tensor<double, 1>> grids;  ///< extended-grid outputs (f64)
  static constexpr const char* point_names[] = {"interp", "interp grad points", "splat backward (features)",
                                                "splat backward (points)"};
  static constexpr const char* grid_names[] = {"interp scatter", "splat (with weight)", "splat", "mean",
                                               "mean backward"};
};

/// Runs every grid kernel of `geo` on `dev`: points P [np, D], features F [np, C], point
/// gradients G [np, C], an extended grid E [C * cells] (the points' dtype) and a cell gradient
/// CG [(C + 1) * cells] (f64); all host tensors, copied to dev.
template <class T>
GridKernelOutputs<T> run_grid_kernels(const exec::PointGridGeometry& geo, const Tensor<T, 2>& P,
                                      const Tensor<T, 2>& F, const Tensor<T, 2>& G, const Tensor<T, 1>& E,
                                      const Tensor<double, 1>& CG, Device dev) {
  const index_t C = geo.channels, np = geo.points;
  const int D = geo.dims;
  std::vector<index_t> es{1, C}, es1{1, C + 1};
  index_t ecells = 1;
  for (int d = 0; d < D; ++d) {
    es.push_back(geo.ext(d));
    es1.push_back(geo.ext(d));
    ecells *= geo.ext(d);
  }
  ExecContext& cx = current_context(dev);
  auto view = [&](const auto& t, const std::vector<index_t>& s) {
    const Block b = as_block(t);
    return Block::view(b.dtype, b.device, b.data, s.data(), static_cast<int>(s.size()), nullptr, b.owner);
  };
  const auto p = P.to(dev), f = F.to(dev), gy = G.to(dev), e = E.to(dev), cg = CG.to(dev);
  auto out = Tensor<T, 2>::empty({np, C}, dev), gp = Tensor<T, 2>::empty({np, D}, dev);
  exec::points_grid_interp(geo, view(e, es), as_block(p), as_block(out), cx);
  exec::points_grid_interp_grad_points(geo, view(e, es), as_block(p), as_block(gy), as_block(gp), cx);
  auto gext = Tensor<double, 1>::zeros({C * ecells}, dev);
  exec::points_grid_interp_scatter(geo, as_block(p), as_block(gy), view(gext, es), cx);
  auto ext = Tensor<double, 1>::zeros({(C + 1) * ecells}, dev);
  exec::points_grid_splat(geo, as_block(p), as_block(f), true, view(ext, es1), cx);
  auto ext0 = Tensor<double, 1>::zeros({C * ecells}, dev);
  exec::points_grid_splat(geo, as_block(p), as_block(f), false, view(ext0, es), cx);
  auto gf = Tensor<T, 2>::empty({np, C}, dev), gp2 = Tensor<T, 2>::empty({np, D}, dev);
  const Block bgf = as_block(gf), bgp2 = as_block(gp2);
  exec::points_grid_splat_backward(geo, view(cg, es1), as_block(p), as_block(f), true, &bgf, &bgp2, cx);
  auto sums = ext.clone();
  exec::points_grid_mean(C, ecells, as_block(sums), cx);
  auto cg2 = cg.clone();
  exec::points_grid_mean_backward(C, ecells, as_block(sums), true, as_block(cg2), cx);
  return {{out, gp, gf, gp2}, {gext, ext, ext0, sums, cg2}};
}

/// The number of cells of geo's extended block.
inline index_t extended_cells(const exec::PointGridGeometry& geo) {
  index_t n = 1;
  for (int d = 0; d < geo.dims; ++d) n *= geo.ext(d);
  return n;
}

}  // namespace shard::test
