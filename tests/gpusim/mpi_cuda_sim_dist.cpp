// gpusim lane, MPI (np 1-4, every rank on the one simulated device cuda:0): the MPI fallback of
// device collectives on real device buffers: halo exchange (+ adjoint), redistribute and full
// tensor, and ring shift of DistTensors on cuda:0 equal the host results. MpiComm stages device
// buffers through pinned host memory (a simulated device's memory is not host-addressable, so
// the direct transport cannot be used here).
#include <catch2/catch_test_macros.hpp>

#include <shardtensor/dist/halo.hpp>
#include <shardtensor/dist/ring.hpp>
#include <shardtensor/shardtensor.hpp>

#include "support/mpi_harness.hpp"

namespace st_gpusim_mpi_cuda_sim_dist {

using namespace shard;
using namespace shard::test;

namespace {
const Device kDev = Device::cuda(0);

template <class T, int R>
bool same(const Tensor<T, R>& dev, const Tensor<T, R>& host, double allowed = 0.0) {
  if (!(dev.device() == kDev) || dev.shape() != host.shape()) return false;
  return max_rel_diff(dev.to(Device::cpu()), host) <= allowed;
}

void staged(const CommPtr& comm) {
  if (auto* mpi = dynamic_cast<MpiComm*>(comm.get())) mpi->set_device_transport(MpiDeviceTransport::staged);
}

template <class T>
void dist_case(const CommPtr& comm) {
  using D3 = DistTensor<T, 3>;
  DeviceMesh mesh(comm, {comm->size()});
  const auto x = D3::random({2, 7, 9}, mesh, {Shard(1)}, 17);
  const auto dx = x.to(kDev);
  // halo exchange and its adjoint, zero / periodic / reflect boundaries
  for (const HaloSpec& h : {HaloSpec{{0, 1, 1}, {0, 1, 1}, {Boundary::zero, Boundary::zero, Boundary::zero}},
                            HaloSpec{{0, 2, 0}, {0, 1, 2}, {Boundary::zero, Boundary::periodic, Boundary::reflect}}}) {
    INFO(fmt::format("halo {} {} rank {}", h, dtype_of<T>, comm->rank()));
    const auto ext = halo_exchange(x, h);
    auto g = Tensor<T, 3>::empty(ext.shape());
    g.fill_random(99 + static_cast<std::uint64_t>(comm->rank()));
    const auto gx = halo_exchange_adjoint(x.spec(), g, h);
    const auto dext = halo_exchange(dx, h);
    const auto dgx = halo_exchange_adjoint(dx.spec(), g.to(kDev), h);
    CHECK(same(dext, ext));
    CHECK(same(dgx, gx));
  }
  // redistribute Shard(1) -> Shard(2) -> Replicate, and full_tensor
  const auto hb = x.redistribute({Shard(2)});
  const auto db = dx.redistribute({Shard(2)});
  CHECK(same(db.local(), hb.local()));
  CHECK(same(dx.redistribute({Replicate()}).local(), x.redistribute({Replicate()}).local()));
  CHECK(same(dx.full_tensor(), x.full_tensor()));
  // ring shift forward and backward
  for (auto dir : {RingDirection::forward, RingDirection::backward}) {
    CHECK(same(ring_shift(dx, {0}, dir), ring_shift(x, {0}, dir)));
  }
}
}  // namespace

TEST_CASE("gpusim MPI: halo exchange, redistribute, ring shift of device tensors on a shared simulated device",
          "[gpusim][mpi][dist]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible (real or simulated): skipped");
  for_each_comm_size([](CommPtr comm) {
    staged(comm);
    dist_case<double>(comm);
    dist_case<float>(comm);
  });
}

}  // namespace st_gpusim_mpi_cuda_sim_dist
