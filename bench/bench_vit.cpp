// requires: mpi
// bench_vit: a 2-D ViT (nn/vit.hpp) on one [1, 1, R, R] fp32 field whose spatial dims are sharded
// over an h x w mesh of all the launch's ranks (issue 7, benchmarks 7.3 and 7.4). Run by
// bench/run_vit.sh; one configuration per launch.
//   --mode train: `--warmup + --iters` training steps (zero_grad, forward, mse_loss, backward,
//                 AdamW step); reports per-rank peak memory: shardtensor's host high-water mark of
//                 live bytes (memory_stats().peak_bytes, since the start of the process: data,
//                 parameters, optimiser state, activations, gradients, communication buffers and
//                 kernel scratch) and the process VmHWM; both maxima over ranks.
//   --mode infer: forward under NoGradGuard (model.eval()); median wall time per forward, and the
//                 CPU time per forward of the busiest rank and summed over ranks.
//   mpiexec -n 4 bench_vit --mode train --res 512 --patch 8 --dim 32 --heads 2 --layers 2
//           [--attention ring|neighborhood --window 7] [--mesh 2x2] [--iters 1 --warmup 1]
// Prints one line per launch: "RESULT mode=... key=value ...".
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/vit.hpp>
#include <shardtensor/shardtensor.hpp>

#include "bench_util.hpp"

using namespace shard;
using namespace shard::bench;

namespace {

/// Near-square h x w with h >= w (1x1, 2x1, 3x1, 2x2), or "HxW" from --mesh.
std::vector<int> mesh_shape(const char* arg, int P) {
  if (arg) {
    int h = 0, w = 0;
    if (std::sscanf(arg, "%dx%d", &h, &w) == 2) return {h, w};
  }
  int w = 1;
  for (int c = 1; c * c <= P; ++c)
    if (P % c == 0) w = c;
  return {P / w, w};
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  try {
    int P = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    const auto ms = mesh_shape(arg_str(argc, argv, "--mesh", nullptr), P);
    auto mesh = DeviceMesh::world(ms, {"h", "w"});
    const std::string mode = arg_str(argc, argv, "--mode", "train");
    const std::string form = arg_str(argc, argv, "--attention", "ring");
    const index_t res = arg_int(argc, argv, "--res", 256);
    const int iters = static_cast<int>(arg_int(argc, argv, "--iters", mode == "train" ? 1 : 3));
    const int warmup = static_cast<int>(arg_int(argc, argv, "--warmup", 1));
    nn::ViTOptions vopt;
    vopt.field = {res, res};
    vopt.patch = arg_int(argc, argv, "--patch", 8);
    vopt.dim = arg_int(argc, argv, "--dim", 32);
    vopt.heads = arg_int(argc, argv, "--heads", 2);
    vopt.layers = static_cast<int>(arg_int(argc, argv, "--layers", 2));
    const index_t window = arg_int(argc, argv, "--window", 7);
    if (form == "ring") {
      vopt.attention.form = nn::AttentionForm::ring;
    } else if (form == "neighborhood") {
      vopt.attention.form = nn::AttentionForm::neighborhood;
      vopt.attention.window = {window};
    } else if (form == "ulysses") {
      vopt.attention.form = nn::AttentionForm::ulysses;
    } else {
      throw Error("bench_vit: --attention must be ring, neighborhood or ulysses");
    }
    const std::vector<Placement> pl{Shard(2), Shard(3)};
    auto xd = DistTensor<float, 4>::random({1, 1, res, res}, mesh, pl, 11, RandomInit::uniform(-1, 1));
    auto yd = DistTensor<float, 4>::random({1, 1, res, res}, mesh, pl, 12, RandomInit::uniform(-1, 1));
    nn::ViT<float, 2> model(mesh, vopt, pl, 7);
    optim::AdamW<float> opt(model.parameters(), {.lr = 1e-4, .weight_decay = 1e-4});
    const double base = static_cast<double>(memory_stats().current_bytes);  // data + parameters
    double repl = 0, shrd = 0;  // parameter bytes on this rank: replicated, sharded (pos embedding)
    for (const auto& prm : model.parameters()) (prm->sharded() ? shrd : repl) += 4.0 * static_cast<double>(prm->numel());

    std::vector<double> wall, cpu;
    double loss_v = 0;
    for (int it = 0; it < warmup + iters; ++it) {
      mesh.comm()->barrier();
      const double t0 = now_ms(), c0 = cpu_ms();
      if (mode == "train") {
        model.train();
        opt.zero_grad();
        autograd::Var<float, 4> x(xd, false), y(yd, false);
        auto loss = F::mse_loss(model.forward(x), y);
        loss.backward();
        opt.step();
        loss_v = static_cast<double>(loss.value().full_tensor().data()[0]);
      } else {
        model.eval();
        autograd::NoGradGuard ng;
        autograd::Var<float, 4> x(xd, false);
        auto out = model.forward(x);
        loss_v = static_cast<double>(out.value().local().numel());
      }
      mesh.comm()->barrier();
      const double t1 = now_ms(), c1 = cpu_ms();
      if (it >= warmup) {
        wall.push_back(t1 - t0);
        cpu.push_back(c1 - c0);
      }
    }
    const MemoryStats st = memory_stats();
    // max over ranks: peak, base, VmHWM, CPU per step; sum over ranks: CPU per step
    double mx[5] = {static_cast<double>(st.peak_bytes), base, proc_status_kib("VmHWM") * 1024.0, median(cpu), shrd};
    mesh.comm()->allreduce(mx, mx, 5, DType::f64, ReduceOp::max);
    double csum = median(cpu);
    mesh.comm()->allreduce(&csum, &csum, 1, DType::f64, ReduceOp::sum);
    double mn = static_cast<double>(st.peak_bytes);  // min over ranks: how even the shards are
    mesh.comm()->allreduce(&mn, &mn, 1, DType::f64, ReduceOp::min);
    if (mesh.rank() == 0) {
      const index_t tok = res / vopt.patch;
      std::printf("RESULT mode=%s attention=%s ranks=%d mesh=%dx%d threads=%s res=%lld tokens=%lld patch=%lld dim=%lld "
                  "heads=%lld layers=%d iters=%d wall_ms=%.1f cpu_ms_max=%.1f cpu_ms_sum=%.1f peak_MiB=%.3f "
                  "peak_min_MiB=%.3f base_MiB=%.3f repl_param_MiB=%.3f shard_param_MiB=%.3f hwm_MiB=%.1f check=%.6g\n",
                  mode.c_str(), form.c_str(), P, ms[0], ms[1], std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "?",
                  static_cast<long long>(res), static_cast<long long>(tok * tok), static_cast<long long>(vopt.patch),
                  static_cast<long long>(vopt.dim), static_cast<long long>(vopt.heads), vopt.layers, iters,
                  median(wall), mx[3], csum, mib(mx[0]), mib(mn), mib(mx[1]), mib(repl), mib(mx[4]), mib(mx[2]), loss_v);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_vit: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
