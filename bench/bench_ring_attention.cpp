// requires: mpi
// bench_ring_attention: forward + backward of F::ring_attention on q, k, v [1, N, H, D] fp32,
// tokens sharded over all ranks of the launch (1-D mesh), median over --iters repetitions (after
// --warmup). Run at 1 and 2 ranks by bench/run_ring_attention.sh for the strong-scaling table
// (issue 7, benchmark 7.2).
//   mpiexec -n 2 bench_ring_attention --seq 8192 --heads 8 --dim 64 --iters 3 [--causal] [--csv f]
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

#include "bench_util.hpp"

using namespace shard;
using namespace shard::bench;

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  try {
    auto mesh = DeviceMesh::world();
    const index_t N = std::atoll(arg_str(argc, argv, "--seq", "4096"));
    const index_t H = std::atoll(arg_str(argc, argv, "--heads", "8"));
    const index_t D = std::atoll(arg_str(argc, argv, "--dim", "64"));
    const int iters = std::atoi(arg_str(argc, argv, "--iters", "3"));
    const int warmup = std::atoi(arg_str(argc, argv, "--warmup", "1"));
    const bool causal = has_flag(argc, argv, "--causal");
    const char* csv = arg_str(argc, argv, "--csv", nullptr);
    const int P = mesh.size();
    const std::vector<Placement> pl{Shard(1)};
    ShardSizes sizes;
    if (causal) {  // zigzag layout: balanced causal work
      sizes.resize(4);
      sizes[1] = F::zigzag_sizes(N, P);
    }
    auto qv = DistTensor<float, 4>::random({1, N, H, D}, mesh, pl, 1, RandomInit::uniform(-1, 1), sizes);
    auto kv = DistTensor<float, 4>::random({1, N, H, D}, mesh, pl, 2, RandomInit::uniform(-1, 1), sizes);
    auto vv = DistTensor<float, 4>::random({1, N, H, D}, mesh, pl, 3, RandomInit::uniform(-1, 1), sizes);
    std::vector<double> fwd, tot, cpu;
    reset_peak_memory();
    for (int it = 0; it < warmup + iters; ++it) {
      autograd::Var<float, 4> q(qv, true), k(kv, true), v(vv, true);
      mesh.comm()->barrier();
      const double t0 = now_ms(), c0 = cpu_ms();
      auto y = F::ring_attention(q, k, v, {.causal = causal, .zigzag = causal});
      mesh.comm()->barrier();
      const double t1 = now_ms();
      F::resolve(F::sum(y)).backward();
      mesh.comm()->barrier();
      const double t2 = now_ms(), c2 = cpu_ms();
      if (it >= warmup) {
        fwd.push_back(t1 - t0);
        tot.push_back(t2 - t0);
        cpu.push_back(c2 - c0);
      }
    }
    double peak = static_cast<double>(memory_stats().peak_bytes) / (1 << 20);
    mesh.comm()->allreduce(&peak, &peak, 1, DType::f64, ReduceOp::max);
    double c = median(cpu);  // this rank's CPU time per step (includes MPI polling); max over ranks
    mesh.comm()->allreduce(&c, &c, 1, DType::f64, ReduceOp::max);
    if (mesh.rank() == 0) {
      const double f = median(fwd), t = median(tot);
      std::printf("ranks=%d seq=%lld heads=%lld dim=%lld causal=%d fwd_ms=%.1f bwd_ms=%.1f total_ms=%.1f cpu_ms=%.1f peak_MiB=%.1f\n",
                  P, static_cast<long long>(N), static_cast<long long>(H), static_cast<long long>(D), causal ? 1 : 0,
                  f, t - f, t, c, peak);
      if (csv)
        if (FILE* fp = std::fopen(csv, "a")) {
          std::fprintf(fp, "%d,%lld,%lld,%lld,%d,%.3f,%.3f,%.1f,%.3f\n", P, static_cast<long long>(N),
                       static_cast<long long>(H), static_cast<long long>(D), causal ? 1 : 0, f, t, peak, c);
          std::fclose(fp);
        }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ring_attention: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
