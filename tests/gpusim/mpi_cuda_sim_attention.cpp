// gpusim lane, MPI (every rank on the one simulated device cuda:0; on a real GPU the same, ranks
// sharing it): ring attention (plain and causal) and Ulysses attention of device DistTensors,
// forward and every gradient, equal the host run at the same rank count and layout (which the CPU
// MPI tests hold to the unsharded computation). The ring shifts K / V and the travelling dK / dV
// through the MPI fallback of device collectives, the lse merge runs on the device in f32.
//  - f32: the SIMT tiled kernels (kernels/attention.cu), within 1e-5 of the host's f32;
//  - f16 and bf16 storage: the tensor-core kernels of kernels/attention_tc.cu where the device
//    has them (f16 from compute capability 7.0, the simulator's; bf16 from 8.0, else the SIMT
//    kernels; cuDNN's fused attention where it is built in and takes the call), against the host's
//    run in the same storage type (f32 working copies): a few units of the storage type's
//    roundoff, as P and dS are rounded to it on the tensor cores.
// Issue 32's "ring attention over 2 ranks sharing one GPU equals the 1-rank result" on a real GPU.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/functional/cast.hpp>
#include <shardtensor/shardtensor.hpp>

#include "mpi_sim_support.hpp"
#include "support/mpi_harness.hpp"

namespace st_gpusim_mpi_cuda_sim_attention {

using namespace shard;
using namespace shard::test;
namespace F = shard::nn::functional;
using autograd::Var;
using st_gpusim_mpi_support::flat;
using st_gpusim_mpi_support::rel_diff;

namespace {

enum class Form { ring, ring_causal, ulysses };

/// q, k, v [B, S, H, D] sharded on the token dim (uneven: S = 4P + 3), the attention of `form`,
/// and the gradients of sum(y * gy): {y, dq, dk, dv} of this rank, flattened.
template <class T>
std::vector<std::vector<double>> run(const DeviceMesh& mesh, Form form, Device dev) {
  const int P = mesh.size();
  const Shape<4> s{2, 4 * P + 3, 4, 16};
  auto make = [&](std::uint64_t seed) {
    return shard::cast<T>(DistTensor<float, 4>::random(s, mesh, {Shard(1)}, seed, RandomInit::uniform(-1, 1))).to(dev);
  };
  Var<T, 4> q(make(41), true), k(make(42), true), v(make(43), true);
  const Var<T, 4> gy(make(44), false);
  auto y = form == Form::ulysses ? F::ulysses_attention(q, k, v, {})
                                 : F::ring_attention(q, k, v, {.causal = form == Form::ring_causal});
  F::sum(F::mul(y, gy)).backward();
  return {flat(y.value()), flat(q.grad()), flat(k.grad()), flat(v.grad())};
}

template <class T>
void check(double tol_out, double tol_grad) {
  for_each_comm_size([&](CommPtr comm) {
    if (auto* mpi = dynamic_cast<MpiComm*>(comm.get())) mpi->set_device_transport(MpiDeviceTransport::staged);
    const DeviceMesh mesh(comm, {comm->size()});
    for (Form form : {Form::ring, Form::ring_causal, Form::ulysses}) {
      INFO("ranks " << comm->size() << ", form " << static_cast<int>(form) << " (ring, causal ring, ulysses), dtype "
                    << dtype_name(dtype_of<T>));
      const auto h = run<T>(mesh, form, Device::cpu());
      Profiler prof;
      const auto g = run<T>(mesh, form, Device::cuda(0));
      bool tc = false, cudnn = false;
      for (const auto& r : prof.rows()) {
        tc = tc || (r.name == "attention_tc" && r.calls > 0);
        cudnn = cudnn || (r.name == "attention_cudnn" && r.calls > 0);
      }
      // f16 runs on the tensor cores on every device from compute capability 7.0 (or on cuDNN)
      if (std::is_same_v<T, f16>) CHECK((tc || cudnn));
      REQUIRE(g.size() == h.size());
      for (std::size_t i = 0; i < h.size(); ++i) {
        INFO("result " << i << " (y, dq, dk, dv)");
        CHECK(rel_diff(g[i], h[i]) <= (i == 0 ? tol_out : tol_grad));
      }
    }
  });
}

}  // namespace

TEST_CASE("gpusim MPI: ring and Ulysses attention of device tensors equal the host run",
          "[gpusim][mpi][attention]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible (real or simulated): skipped");
  check<float>(1e-5, 1e-5);
  check<f16>(4e-3, 1e-2);   // u = 2^-11: P, dS and each ring step's dK / dV rounded to f16
  check<bf16>(3e-2, 6e-2);  // u = 2^-9
}

}  // namespace st_gpusim_mpi_cuda_sim_attention
