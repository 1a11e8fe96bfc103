// gpusim lane, MPI (every rank on the one simulated device cuda:0; on a real GPU the same, ranks
// sharing it): domain-parallel neighbourhood attention of device DistTensors, forward and dq / dk /
// dv, equal the host run at the same rank count and layout (which tests/nn/mpi_neighborhood_attention.cpp
// holds to the unsharded computation). The k / v halos of device blocks travel through the MPI
// fallback of device collectives (staged through the host here), the kernels read the
// halo-extended device blocks, and the backward returns the halo parts of dk / dv to their owners.
//  - a 2-D domain sharded on one dim (uneven) and, at 2 ranks, on a 1 x 2 mesh (the other dim),
//    window 3 x 5, dilation 1 x 2, the second dim periodic;
//  - a 1-D domain with zero boundary, window 5 and dilation 3: a halo of 6 each side, wider than
//    the shards (4 and 3 at 2 ranks), so it gathers over several ranks;
//  - f32: the warp-per-row kernels (kernels/neighborhood.cu), within 1e-5 of the host's f32;
//  - f16: the tensor-core kernels (kernels/neighborhood_tc.cu, compute capability 7.0+; the
//    profiler shows they ran), against the host's f16 run (f32 working copies): a few units of
//    f16's roundoff, as P and dS are rounded to f16 on the tensor cores;
//  - bf16: the tensor cores from compute capability 8.0, the row kernels below it (the simulator).
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/functional/cast.hpp>
#include <shardtensor/shardtensor.hpp>

#include "mpi_sim_support.hpp"
#include "support/mpi_harness.hpp"

namespace st_gpusim_mpi_cuda_sim_nbhd {

using namespace shard;
using namespace shard::test;
namespace F = shard::nn::functional;
using autograd::Var;
using st_gpusim_mpi_support::flat;
using st_gpusim_mpi_support::rel_diff;

namespace {

/// One geometry: q / k / v of `shape` ([B, S..., H, D]) laid out by `mesh` / `pl`.
template <int R>
struct Case {
  std::string name;
  Shape<R> shape;
  std::vector<int> mesh;
  std::vector<Placement> pl;
  F::NeighborhoodOptions opt;
};

/// {y, dq, dk, dv} of this rank (gradients of sum(y * gy)), flattened.
template <class T, int R>
std::vector<std::vector<double>> run(const DeviceMesh& mesh, const Case<R>& c, Device dev) {
  auto make = [&](std::uint64_t seed) {
    return shard::cast<T>(DistTensor<float, R>::random(c.shape, mesh, c.pl, seed, RandomInit::uniform(-1, 1))).to(dev);
  };
  Var<T, R> q(make(51), true), k(make(52), true), v(make(53), true);
  const Var<T, R> gy(make(54), false);
  auto y = F::neighborhood_attention(q, k, v, c.opt);
  F::sum(F::mul(y, gy)).backward();
  return {flat(y.value()), flat(q.grad()), flat(k.grad()), flat(v.grad())};
}

template <class T, int R>
void check_case(const CommPtr& comm, const Case<R>& c, double tol_out, double tol_grad) {
  INFO("ranks " << comm->size() << ", case " << c.name << ", dtype " << dtype_name(dtype_of<T>));
  const DeviceMesh mesh(comm, c.mesh);
  const auto h = run<T>(mesh, c, Device::cpu());
  Profiler prof;
  const auto g = run<T>(mesh, c, Device::cuda(0));
  bool tc = false, rows = false;
  for (const auto& r : prof.rows()) {
    tc = tc || (r.name == "nbhd_tc" && r.calls > 0);
    rows = rows || (r.name == "nbhd_rows" && r.calls > 0);
  }
  // f32 without allow_tf32 stays off the tensor cores; f16 takes them from compute capability 7.0
  if (std::is_same_v<T, float>) CHECK((rows && !tc));
  if (std::is_same_v<T, f16>) CHECK(tc);
  REQUIRE(g.size() == h.size());
  for (std::size_t i = 0; i < h.size(); ++i) {
    INFO("result " << i << " (y, dq, dk, dv)");
    CHECK(rel_diff(g[i], h[i]) <= (i == 0 ? tol_out : tol_grad));
  }
}

template <class T>
void check(double tol_out, double tol_grad) {
  for_each_comm_size([&](CommPtr comm) {
    if (auto* mpi = dynamic_cast<MpiComm*>(comm.get())) mpi->set_device_transport(MpiDeviceTransport::staged);
    const int P = comm->size();
    F::NeighborhoodOptions o2;
    o2.window = {3, 5};
    o2.dilation = {1, 2};
    o2.periodic = {false, true};
    const Shape<5> s2{1, 2 * P + 3, 11, 2, 16};
    check_case<T, 5>(comm, {"2-D, Shard(1)", s2, {P}, {Shard(1)}, o2}, tol_out, tol_grad);
    if (P == 2) check_case<T, 5>(comm, {"2-D, 1x2 mesh, Shard(1) Shard(2)", s2, {1, 2}, {Shard(1), Shard(2)}, o2},
                                 tol_out, tol_grad);
    F::NeighborhoodOptions o1;  // halo 6 each side: wider than the shards at 2 ranks (4 and 3)
    o1.window = {5};
    o1.dilation = {3};
    const Shape<4> s1{2, 2 * P + 3, 2, 16};
    check_case<T, 4>(comm, {"1-D, window 5, dilation 3", s1, {P}, {Shard(1)}, o1}, tol_out, tol_grad);
  });
}

}  // namespace

TEST_CASE("gpusim MPI: neighbourhood attention of device tensors equals the host run", "[gpusim][mpi][nbhd]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible (real or simulated): skipped");
  check<float>(1e-5, 1e-5);
  check<f16>(4e-3, 1e-2);   // u = 2^-11: P and dS rounded to f16 on the tensor cores
  check<bf16>(3e-2, 6e-2);  // u = 2^-9
}

}  // namespace st_gpusim_mpi_cuda_sim_nbhd
