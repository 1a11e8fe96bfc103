// gpusim lane, MPI (every rank on the one simulated device cuda:0): the norms and losses with
// their statistics on the device (issue 30: no host work in the step). Batch norm (training with
// running statistics, then eval), group norm and layer norm, mse and rel_l2, forward and backward,
// with the batch or a spatial dim sharded: the statistics are summed by the device allreduce (MPI
// staged here: the simulator has no NCCL) and finished by the CUDA kernels (norm_finish,
// rel_l2_value / coefficients, global_sum_into); every value, gradient and running statistic
// equals the host run within a few ulps of double (the sums are added in another order).
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

#include "support/mpi_harness.hpp"

namespace st_gpusim_mpi_cuda_sim_norm_loss {

using namespace shard;
using namespace shard::test;
namespace F = shard::nn::functional;
using autograd::Var;

namespace {

std::vector<double> flat(const Tensor<double, 4>& t) {
  const auto h = t.contiguous().to(Device::cpu());
  return std::vector<double>(h.data(), h.data() + h.numel());
}
std::vector<double> flat(const Tensor<double, 1>& t) {
  const auto h = t.contiguous().to(Device::cpu());
  return std::vector<double>(h.data(), h.data() + h.numel());
}
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0, s = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(a[i] - b[i]));
    s = std::max(s, std::abs(b[i]));
  }
  return m / s;
}

/// One norm or loss (0 batch train, 1 batch eval, 2 group, 3 layer, 4 mse, 5 rel_l2) on `dev`:
/// its value, the input gradients and the running statistics, flattened.
std::vector<std::vector<double>> run(const DeviceMesh& mesh, int d, int which, Device dev) {
  const int P = mesh.size();
  const Shape<4> gs{P + 1, 4, 2 * P + 1, 3};
  const auto xs = DistTensor<double, 4>::random(gs, mesh, {Shard(d)}, 21).to(dev);
  const auto ts = DistTensor<double, 4>::random(gs, mesh, {Shard(d)}, 22).to(dev);
  const auto gy = DistTensor<double, 4>::random(gs, mesh, {Shard(d)}, 23).to(dev);
  auto rm = DistTensor<double, 1>::random({4}, mesh, {Replicate()}, 24).to(dev);
  auto rv = DistTensor<double, 1>::random({4}, mesh, {Replicate()}, 25, RandomInit::uniform(0.5, 1.5)).to(dev);
  Var<double, 4> x(xs, true), t(ts, true);
  Var<double, 1> w(DistTensor<double, 1>::random({4}, mesh, {Replicate()}, 26).to(dev), true);
  Var<double, 1> b(DistTensor<double, 1>::random({4}, mesh, {Replicate()}, 27).to(dev), true);
  std::vector<std::vector<double>> out;
  if (which <= 3) {
    auto y = which <= 1 ? F::batch_norm(x, &rm, &rv, w, b, which == 0)
             : which == 2 ? F::group_norm(x, 2, w, b)
                          : F::layer_norm(x, w, b);
    F::sum(F::mul(y, Var<double, 4>(gy, false))).backward();
    out = {flat(y.value().local()), flat(x.grad().local()), flat(w.grad().local()), flat(b.grad().local()),
           flat(rm.local()), flat(rv.local())};
  } else {
    auto loss = which == 4 ? F::mse_loss(x, t) : F::rel_l2_loss(x, t);
    loss.backward();
    out = {flat(loss.value().local()), flat(x.grad().local()), flat(t.grad().local())};
  }
  return out;
}

}  // namespace

TEST_CASE("gpusim MPI: norms and losses keep their statistics on the device and equal the host",
          "[gpusim][mpi][norm][loss]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible (real or simulated): skipped");
  for_each_comm_size([](CommPtr comm) {
    if (auto* mpi = dynamic_cast<MpiComm*>(comm.get())) mpi->set_device_transport(MpiDeviceTransport::staged);
    const DeviceMesh mesh(comm, {comm->size()});
    for (int d : {0, 2})
      for (int which = 0; which < 6; ++which) {
        INFO("ranks " << comm->size() << ", sharded dim " << d << ", case " << which
                      << " (batch train, batch eval, group, layer, mse, rel_l2)");
        const auto h = run(mesh, d, which, Device::cpu());
        const auto g = run(mesh, d, which, Device::cuda(0));
        REQUIRE(g.size() == h.size());
        for (std::size_t i = 0; i < h.size(); ++i) {
          INFO("result " << i);
          CHECK(rel_diff(g[i], h[i]) <= 1e-12);
        }
      }
  });
}

}  // namespace st_gpusim_mpi_cuda_sim_norm_loss
