// requires: mpi
// bench_precision_comm: the communication of a bf16 model against fp32 (issue 18 item 8), in one
// run, interleaved rounds, medians of the per-round maximum over ranks:
//   - halo exchange (forward) and its adjoint of an N x C x H x W activation sharded along H on a
//     1-D mesh, width 1 (a 3x3 conv's halo);
//   - one ring pass (ring_shift) of a B x heads x tokens x dim attention block;
//   - redistribute Shard(H) -> Shard(W) of the same activation.
// Prints the bytes each rank sends per call (from the shapes) beside the times and the ratio
// fp32 / bf16 (> 1: bf16 faster).
//   mpiexec -n 2 ./bench_precision_comm [--n 4] [--c 32] [--hw 512] [--rounds 15]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <shardtensor/shardtensor.hpp>
#include <shardtensor/comm/mpi_comm.hpp>
#include <shardtensor/core/cpu_isa.hpp>
#include <shardtensor/dist/halo.hpp>
#include <shardtensor/dist/ring.hpp>

#include "bench_util.hpp"

using namespace shard;

namespace {

double timed_max(MPI_Comm comm, const std::function<void()>& f) {
  MPI_Barrier(comm);
  const auto t0 = std::chrono::steady_clock::now();
  f();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &ms, 1, MPI_DOUBLE, MPI_MAX, comm);
  return ms;
}

struct Case {
  std::string name;
  double bytes32 = 0;  // bytes sent per rank per call in fp32 (bf16: half)
  std::function<void()> f32, b16;
  std::vector<double> t32, t16;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    const index_t n = bench::arg_int(argc, argv, "--n", 4), c = bench::arg_int(argc, argv, "--c", 32);
    const index_t hw = bench::arg_int(argc, argv, "--hw", 512);
    const int rounds = static_cast<int>(bench::arg_int(argc, argv, "--rounds", 15));
    auto comm = std::make_shared<MpiComm>(MPI_COMM_WORLD);
    const int P = comm->size(), rank = comm->rank();
    DeviceMesh mesh(comm, {P});
    const Shape<4> xs{n, c, hw, hw};
    const auto x32 = DistTensor<float, 4>::random(xs, mesh, {Shard(2)}, 1);
    const auto x16 = shard::cast<bf16>(x32);
    const HaloSpec halo = HaloSpec::symmetric({0, 0, 1, 1}, Boundary::zero);
    const auto g32 = halo_exchange(x32, halo);
    const auto g16 = halo_exchange(x16, halo);
    // attention block: B x heads x tokens x dim, tokens sharded
    const Shape<4> qs{n, 4, hw * 8, 64};
    const auto q32 = DistTensor<float, 4>::random(qs, mesh, {Shard(2)}, 2);
    const auto q16 = shard::cast<bf16>(q32);
    std::vector<Case> cases;
    const double face = static_cast<double>(n * c * hw) * 4;  // one face of width 1, fp32
    const double faces = P > 1 ? std::min(2, P - 1) * face : 0;  // an interior rank sends two faces
    cases.push_back({"halo exchange (width 1, Shard H)", faces,
                     [&] { (void)halo_exchange(x32, halo); }, [&] { (void)halo_exchange(x16, halo); }});
    cases.push_back({"halo adjoint", faces,
                     [&] { (void)halo_exchange_adjoint(x32.spec(), g32, halo); },
                     [&] { (void)halo_exchange_adjoint(x16.spec(), g16, halo); }});
    cases.push_back({"ring pass (attention block)", static_cast<double>(q32.local().numel()) * 4,
                     [&] { (void)ring_shift(q32, {0}); }, [&] { (void)ring_shift(q16, {0}); }});
    cases.push_back({"redistribute Shard(H) -> Shard(W)",
                     static_cast<double>(x32.local().numel()) * 4 * (P - 1) / std::max(1, P),
                     [&] { (void)x32.redistribute({Shard(3)}); }, [&] { (void)x16.redistribute({Shard(3)}); }});
    for (int r = -1; r < rounds; ++r)
      for (auto& cs : cases) {
        const double a = timed_max(MPI_COMM_WORLD, cs.f32), b = timed_max(MPI_COMM_WORLD, cs.b16);
        if (r >= 0) cs.t32.push_back(a), cs.t16.push_back(b);
      }
    if (rank == 0) {
      std::printf("bench_precision_comm: CPU %s, ISA %s, %d ranks (1-D mesh), load %.2f, %d rounds (medians of the max "
                  "over ranks); x %lldx%lldx%lldx%lld sharded on H, q %lldx4x%lldx64 sharded on tokens\n",
                  cpu_model_name().c_str(), to_string(cpu_isa()), P, bench::load_average(), rounds,
                  static_cast<long long>(n), static_cast<long long>(c), static_cast<long long>(hw),
                  static_cast<long long>(hw), static_cast<long long>(n), static_cast<long long>(hw * 8));
      std::printf("| op | MiB sent/rank fp32 | bf16 | fp32 ms | bf16 ms | fp32 / bf16 |\n|---|---:|---:|---:|---:|---:|\n");
      for (auto& cs : cases) {
        const double a = bench::median(cs.t32), b = bench::median(cs.t16);
        std::printf("| %s | %.2f | %.2f | %.3f | %.3f | %.2f |\n", cs.name.c_str(), cs.bytes32 / 1048576.0,
                    cs.bytes32 / 2097152.0, a, b, a / b);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
