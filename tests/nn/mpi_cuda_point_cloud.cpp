// MPI tests of the point-cloud ops on device blocks (issue 31 step 4): partition_by_box,
// points_to_grid (every reduce / weight option) and grid_to_points, forward and every gradient,
// and the distributed knn / radius_neighbors (ring and spatial_halo) on CUDA blocks, against the
// same ops on host blocks over the same ranks (the host results are themselves checked against
// the unsharded computation by tests/nn/mpi_point_grid.cpp and tests/dist/mpi_points.cpp).
// 1..4 ranks, 1-D meshes and a 2x2 mesh, f32 and f64. Skips without a GPU.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <shardtensor/comm/device_comm.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

#include "support/mpi_harness.hpp"

namespace st_nn_mpi_cuda_point_cloud {

using namespace shard;
using namespace shard::test;
namespace F = shard::nn::functional;
using autograd::Var;

namespace {

Device my_gpu() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return Device::cuda(r % cuda_device_count());
}

std::uint64_t splitmix(std::uint64_t& s) {
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

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rtol, const char* what) {
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

}  // namespace

TEMPLATE_TEST_CASE("point clouds on device blocks equal the host result at 1-4 ranks", "[points][cuda][mpi]", float,
                   double) {
  if (cuda_device_count() == 0) SKIP("no GPU visible: point clouds on device blocks not run");
  using T = TestType;
  const double rtol = std::is_same_v<T, float> ? 2e-4 : 1e-10;  // the grid scatters use atomics
  for_each_comm_size([&](CommPtr c) {
    const int P = c->size();
    const Device gpu = my_gpu();
    auto dc = make_device_comm(c, gpu);
    std::vector<std::pair<std::vector<int>, std::vector<Placement>>> layouts{{{P}, {Shard(2)}}};
    if (P == 4) layouts.push_back({{2, 2}, {Shard(2), Shard(4)}});
    for (const auto& [shape, pl] : layouts)
      for (const auto& opts : {F::PointGridOptions{F::PointReduce::sum, F::PointWeight::none},
                               F::PointGridOptions{F::PointReduce::mean, F::PointWeight::linear}}) {
        INFO("ranks " << P << ", mesh dims " << shape.size() << ", reduce " << int(opts.reduce) << ", weight "
                      << int(opts.weight));
        const DeviceMesh hm(c, shape), dm(dc, shape);
        const Run h = pipeline<T>(hm, pl, Device::cpu(), 60, opts);
        const Run d = pipeline<T>(dm, pl, gpu, 60, opts);
        REQUIRE(h.values.size() == d.values.size());
        for (std::size_t i = 0; i < h.values.size(); ++i) check_close(d.values[i], h.values[i], rtol, "values");
        REQUIRE(h.indices == d.indices);  // kNN / radius lists: the CUDA table promises the CPU's bits
      }
  });
}

}  // namespace st_nn_mpi_cuda_point_cloud
