// gpusim lane, MPI (every rank on the one simulated device cuda:0): the distributed neighbour
// queries (dist/points.hpp knn / radius_neighbors, ring and spatial_halo) of point sets on cuda:0
// equal the same queries on host blocks BIT FOR BIT (indices, squared distances, counts) with the
// same traffic (elements_sent, queries_received). The spatial_halo path runs the halo-selection
// kernels of the points family (near-box counts and rows, list filter, remap), the box-owner
// checks, the neighbors search and merge kernels and the row exchange on device blocks. The
// host results are checked against the unsharded search by tests/dist/mpi_points.cpp.
#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include <shardtensor/dist/points.hpp>
#include <shardtensor/shardtensor.hpp>

#include "support/mpi_harness.hpp"

namespace st_gpusim_mpi_cuda_sim_points {

using namespace shard;
using namespace shard::test;

namespace {
const Device kDev = Device::cuda(0);

void staged(const CommPtr& comm) {
  if (auto* mpi = dynamic_cast<MpiComm*>(comm.get())) mpi->set_device_transport(MpiDeviceTransport::staged);
}

template <class X, int R>
bool same_bits(const Tensor<X, R>& dev, const Tensor<X, R>& host) {
  if (!(dev.device() == kDev)) return false;
  const auto d = dev.to(Device::cpu()), h = host.contiguous();
  return d.shape() == h.shape() &&
         std::memcmp(d.data(), h.data(), static_cast<std::size_t>(d.numel()) * sizeof(X)) == 0;
}

template <class T>
void check_same(const Neighbors<T>& d, const Neighbors<T>& h) {
  CHECK(same_bits(d.indices.local(), h.indices.local()));
  CHECK(same_bits(d.dist2.local(), h.dist2.local()));
  CHECK(same_bits(d.counts.local(), h.counts.local()));
  CHECK(d.elements_sent == h.elements_sent);
  CHECK(d.queries_received == h.queries_received);
}

/// N points of [0, 1]^3 (a function of i only), this rank's share: the points its box owns.
template <class T>
DistTensor<T, 2> owned_points(const BoxPartition& part, index_t N) {
  const DeviceMesh& mesh = part.mesh();
  std::vector<std::vector<double>> per(static_cast<std::size_t>(mesh.size()));
  for (index_t i = 0; i < N; ++i) {
    std::uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(i + 1);
    double p[3];
    for (double& x : p) {
      s ^= s >> 29;
      s *= 0xBF58476D1CE4E5B9ull;
      s ^= s >> 32;
      x = static_cast<double>(static_cast<T>(static_cast<double>(s >> 11) * 0x1.0p-53));
    }
    auto& v = per[static_cast<std::size_t>(part.owner(p))];
    v.insert(v.end(), p, p + 3);
  }
  std::vector<index_t> counts;
  for (const auto& v : per) counts.push_back(static_cast<index_t>(v.size() / 3));
  const auto& mine = per[static_cast<std::size_t>(mesh.rank())];
  auto t = Tensor<T, 2>::empty({static_cast<index_t>(mine.size() / 3), 3});
  for (std::size_t i = 0; i < mine.size(); ++i) t.data()[i] = static_cast<T>(mine[i]);
  return DistTensor<T, 2>(point_spec(mesh, counts, 3), t);
}

template <class T>
void points_case(const CommPtr& comm) {
  DeviceMesh mesh(comm, {comm->size()});
  const BoxPartition part = BoxPartition::uniform(mesh, {0.0, 0.0, 0.0}, {1.0, 1.0, 1.0}, {0, -1, -1});
  const auto x = owned_points<T>(part, 40);
  const auto dx = x.to(kDev);
  for (NeighborStrategy strat : {NeighborStrategy::ring, NeighborStrategy::spatial_halo}) {
    NeighborQueryOptions o;
    o.strategy = strat;
    o.partition = &part;
    INFO(fmt::format("{} strategy {} rank {} of {}", dtype_of<T>, static_cast<int>(strat), comm->rank(), comm->size()));
    check_same(knn(dx, dx, 3, o), knn(x, x, 3, o));
    check_same(radius_neighbors(dx, dx, 0.3, 6, o), radius_neighbors(x, x, 0.3, 6, o));
  }
}
}  // namespace

TEST_CASE("gpusim MPI: knn / radius_neighbors (ring, spatial_halo) of device point sets equal the host bit for bit",
          "[gpusim][mpi][points]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible (real or simulated): skipped");
  for_each_comm_size([](CommPtr comm) {
    staged(comm);
    points_case<float>(comm);
    points_case<double>(comm);
  });
}

}  // namespace st_gpusim_mpi_cuda_sim_points
