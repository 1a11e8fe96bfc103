#pragma once
// The point-cloud pipeline of the device-vs-host tests (tests/nn/mpi_cuda_point_cloud.cpp on a
// GPU, tests/nn/mpi_fake_device_model.cpp on the fake device): partition_by_box, points_to_grid ->
// grid_to_points -> mse and its backward, and the distributed knn / radius_neighbors (ring and
// spatial_halo), on host or device blocks; every value and index list it produced, on the host.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

namespace shard::test::point_cloud {

namespace F = shard::nn::functional;
using autograd::Var;

inline std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

template <class T, int R>
std::vector<double> host_values(const Tensor<T, R>& t) {
  const auto h = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu());
  return std::vector<double>(h.data(), h.data() + h.numel());
}

inline void check_close(const std::vector<double>& got, const std::vector<double>& want, double rtol, const char* what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  double scale = 1;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": device " << got[i] << ", host " << want[i]);
    REQUIRE(std::abs(got[i] - want[i]) <= rtol * scale);
  }
}

/// The results of one run of the point-cloud pipeline on `mesh` (host or device blocks).
struct Run {
  std::vector<std::vector<double>> values;
  std::vector<std::vector<std::int64_t>> indices;
};

/// Routes this rank's slice of N global points to their grid boxes, runs points_to_grid ->
/// grid_to_points -> mse against the features (opts), backward, and the neighbour queries.
template <class T>
Run pipeline(const DeviceMesh& mesh, const std::vector<Placement>& pl, Device dev, index_t N,
             const F::PointGridOptions& opts) {
  const int P = mesh.size(), r = mesh.rank();
  const index_t G = 6, C = 2;
  const DistSpec grid(mesh, pl, {1, C, G, G, G});
  const F::GridDomain dom{{-1.0, -1.0, -1.0}, {1.0, 1.0, 1.0}};
  const BoxPartition part = F::grid_partition(grid, dom);
  // every rank generates the same global points and takes rows [N r / P, N (r + 1) / P)
  std::uint64_t s = 17;
  std::vector<double> all(static_cast<std::size_t>(N) * (3 + C));
  for (auto& x : all) x = static_cast<double>(splitmix(s) >> 11) * 0x1.0p-53 * 1.98 - 0.99;
  const index_t lo = N * r / P, hi = N * (r + 1) / P;
  std::vector<index_t> counts(static_cast<std::size_t>(P));
  for (int q = 0; q < P; ++q) counts[static_cast<std::size_t>(q)] = N * (q + 1) / P - N * q / P;
  auto pts = Tensor<T, 2>::empty({hi - lo, 3});
  auto feat = Tensor<T, 2>::empty({hi - lo, C});
  for (index_t i = lo; i < hi; ++i) {
    for (index_t d = 0; d < 3; ++d) pts.data()[(i - lo) * 3 + d] = static_cast<T>(all[static_cast<std::size_t>(i * (3 + C) + d)]);
    for (index_t c = 0; c < C; ++c)
      feat.data()[(i - lo) * C + c] = static_cast<T>(all[static_cast<std::size_t>(i * (3 + C) + 3 + c)]);
  }
  const DistSpec ps = point_spec(mesh, counts, 3);
  const DistTensor<T, 2> p0(ps, pts.to(dev)), f0(point_rows_spec(ps, {C}), feat.to(dev));
  auto routed = F::partition_by_box(p0, part);
  Run out;
  out.values.push_back(host_values(routed.points.local()));

  Var<T, 2> p(routed.points, true), f(routed.routing.apply(f0), true);
  const double radius = 1.5 * 2.0 / static_cast<double>(G);
  auto g = F::points_to_grid<5>(p, f, grid, dom, radius, opts);
  auto z = F::grid_to_points(g, p, dom);
  auto loss = F::mse_loss(z, f);
  loss.backward();
  out.values.push_back(host_values(g.value().local()));
  out.values.push_back(host_values(z.value().local()));
  out.values.push_back(host_values(p.grad().local()));
  out.values.push_back(host_values(f.grad().local()));

  for (NeighborStrategy strat : {NeighborStrategy::ring, NeighborStrategy::spatial_halo}) {
    NeighborQueryOptions qo;
    qo.strategy = strat;
    qo.partition = &part;
    const auto kn = knn(routed.points, routed.points, 5, qo);
    const auto rn = radius_neighbors(routed.points, routed.points, 0.4, 12, qo);
    for (const auto* nb : {&kn, &rn}) {
      const auto idx = nb->indices.local().device().is_cpu() ? nb->indices.local().contiguous()
                                                              : nb->indices.local().to(Device::cpu());
      out.indices.emplace_back(idx.data(), idx.data() + idx.numel());
      const auto cnt = nb->counts.local().device().is_cpu() ? nb->counts.local().contiguous()
                                                             : nb->counts.local().to(Device::cpu());
      out.indices.emplace_back(cnt.data(), cnt.data() + cnt.numel());
      out.values.push_back(host_values(nb->dist2.local()));
    }
  }
  return out;
}

/// The mesh layouts of the pipeline tests at P ranks (grid [1, C, G, G, G]): a 1-D mesh sharding
/// x, and at 4 ranks a 2x2 mesh sharding x and z.
inline std::vector<std::pair<std::vector<int>, std::vector<Placement>>> layouts(int P) {
  std::vector<std::pair<std::vector<int>, std::vector<Placement>>> v{{{P}, {Shard(2)}}};
  if (P == 4) v.push_back({{2, 2}, {Shard(2), Shard(4)}});
  return v;
}

/// The grid options of the pipeline tests: sum without weights, mean with linear weights.
inline std::vector<F::PointGridOptions> grid_options() {
  return {F::PointGridOptions{F::PointReduce::sum, F::PointWeight::none},
          F::PointGridOptions{F::PointReduce::mean, F::PointWeight::linear}};
}

}  // namespace shard::test::point_cloud
