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
//           [--device cpu|cuda] [--precision fp32|bf16]
// --device cuda: each rank on GPU (node-local rank mod the visible GPUs), the mesh over
// make_device_comm (NCCL, or MPI staging when ranks share a GPU); every timed iteration ends with a
// device synchronisation; gpu_peak_MiB = the caching allocator's device high-water mark (max over
// ranks). --precision bf16: the model's activations in bf16 (f32 master parameters), input and
// target cast once outside the timed loop, the loss in f32 (examples/surrogate_common.hpp's policy).
// Prints one line per launch: "RESULT mode=... key=value ...".
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/vit.hpp>
#include <shardtensor/shardtensor.hpp>

#include "bench_util.hpp"

#include <cstdlib>

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
    const std::string device = arg_str(argc, argv, "--device", "cpu");
    const std::string precision = arg_str(argc, argv, "--precision", "fp32");
    if (device != "cpu" && device != "cuda") throw Error("bench_vit: --device must be cpu or cuda");
    if (precision != "fp32" && precision != "bf16") throw Error("bench_vit: --precision must be fp32 or bf16");
    Device dev = Device::cpu();
    auto world = MpiComm::world();
    if (device == "cuda") {
      const int n = cuda_device_count();
      world->check_all(n > 0, "bench_vit", "--device cuda but no GPU is visible");
      const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
      dev = Device::cuda((lr ? std::atoi(lr) : world->rank()) % n);
    }
    auto mesh = dev.is_cuda() ? DeviceMesh(make_device_comm(world, dev), ms, {"h", "w"}) : DeviceMesh::world(ms, {"h", "w"});
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
    auto body = [&](auto tag) {
      using V = decltype(tag);  // the model's activation dtype (f32 master parameters)
      auto xd = DistTensor<float, 4>::random({1, 1, res, res}, mesh, pl, 11, RandomInit::uniform(-1, 1)).to(dev);
      auto yd = DistTensor<float, 4>::random({1, 1, res, res}, mesh, pl, 12, RandomInit::uniform(-1, 1)).to(dev);
      const DistTensor<V, 4> xv = shard::cast<V>(xd);
      nn::ViT<V, 2> model(mesh, vopt, pl, 7);
      model.to(dev);  // before the optimiser, whose state lives on the parameters' device
      optim::AdamW<float> opt(model.parameters(), {.lr = 1e-4, .weight_decay = 1e-4});
      ExecContext& ctx = current_context(dev);
      ctx.synchronize();
      const double base = static_cast<double>(memory_stats().current_bytes);  // data + parameters
      double repl = 0, shrd = 0;  // parameter bytes on this rank: replicated, sharded (pos embedding)
      for (const auto& prm : model.parameters())
        (prm->sharded() ? shrd : repl) += 4.0 * static_cast<double>(prm->numel());
      if (dev.is_cuda()) reset_peak_memory(DeviceKind::cuda);

      std::vector<double> wall, cpu;
      double loss_v = 0;
      for (int it = 0; it < warmup + iters; ++it) {
        mesh.comm()->barrier();
        const double t0 = now_ms(), c0 = cpu_ms();
        if (mode == "train") {
          model.train();
          opt.zero_grad();
          autograd::Var<V, 4> x(xv, false);
          autograd::Var<float, 4> y(yd, false);
          auto loss = F::mse_loss(F::cast<float>(model.forward(x)), y);
          loss.backward();
          opt.step();
          loss_v = static_cast<double>(loss.value().full_tensor().to(Device::cpu()).data()[0]);
        } else {
          model.eval();
          autograd::NoGradGuard ng;
          autograd::Var<V, 4> x(xv, false);
          auto out = model.forward(x);
          loss_v = static_cast<double>(out.value().local().numel());
        }
        ctx.synchronize();
        mesh.comm()->barrier();
        const double t1 = now_ms(), c1 = cpu_ms();
        if (it >= warmup) {
          wall.push_back(t1 - t0);
          cpu.push_back(c1 - c0);
        }
      }
      const MemoryStats st = memory_stats();
      const double gpu_peak = dev.is_cuda() ? static_cast<double>(memory_stats(DeviceKind::cuda).peak_bytes) : 0.0;
      // max over ranks: peak, base, VmHWM, CPU per step, sharded parameters, GPU peak; sum over ranks: CPU
      double mx[6] = {static_cast<double>(st.peak_bytes), base, proc_status_kib("VmHWM") * 1024.0, median(cpu), shrd,
                      gpu_peak};
      mesh.comm()->allreduce(mx, mx, 6, DType::f64, ReduceOp::max);
      double csum = median(cpu);
      mesh.comm()->allreduce(&csum, &csum, 1, DType::f64, ReduceOp::sum);
      double mn = static_cast<double>(st.peak_bytes);  // min over ranks: how even the shards are
      mesh.comm()->allreduce(&mn, &mn, 1, DType::f64, ReduceOp::min);
      if (mesh.rank() == 0) {
        const index_t tok = res / vopt.patch;
        std::printf("RESULT mode=%s attention=%s ranks=%d mesh=%dx%d threads=%s device=%s precision=%s res=%lld "
                    "tokens=%lld patch=%lld dim=%lld heads=%lld layers=%d iters=%d wall_ms=%.1f cpu_ms_max=%.1f "
                    "cpu_ms_sum=%.1f peak_MiB=%.3f peak_min_MiB=%.3f base_MiB=%.3f repl_param_MiB=%.3f "
                    "shard_param_MiB=%.3f hwm_MiB=%.1f gpu_peak_MiB=%.1f check=%.6g\n",
                    mode.c_str(), form.c_str(), P, ms[0], ms[1],
                    std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "?", device.c_str(),
                    precision.c_str(), static_cast<long long>(res), static_cast<long long>(tok * tok),
                    static_cast<long long>(vopt.patch), static_cast<long long>(vopt.dim),
                    static_cast<long long>(vopt.heads), vopt.layers, iters, median(wall), mx[3], csum, mib(mx[0]),
                    mib(mn), mib(mx[1]), mib(repl), mib(mx[4]), mib(mx[2]), mib(mx[5]), loss_v);
        std::fflush(stdout);
      }
    };
    if (precision == "bf16")
      body(bf16{});
    else
      body(float{});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_vit: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
