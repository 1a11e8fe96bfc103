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
#include "support/point_cloud_pipeline.hpp"

namespace st_nn_mpi_cuda_point_cloud {

using namespace shard;
using namespace shard::test;
namespace F = shard::nn::functional;
using autograd::Var;
using namespace shard::test::point_cloud;

namespace {

Device my_gpu() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return Device::cuda(r % cuda_device_count());
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
    for (const auto& [shape, pl] : point_cloud::layouts(P))
      for (const auto& opts : point_cloud::grid_options()) {
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
