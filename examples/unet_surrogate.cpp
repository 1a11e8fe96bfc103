// requires: mpi
// Main example: train a U-Net surrogate of the 2-D heat equation, domain-parallel.
//
//   mpiexec -n 4 ./unet_surrogate --steps 200 --grid 64 --seed 1 --mesh 2x2
//
// 1. Training pairs (u0, u(T)) come from a built-in explicit heat solver that runs domain-parallel
//    on the same mesh (examples/heat_data.hpp): nothing is ever gathered on one rank.
// 2. A U-Net (nn/unet.hpp) is trained with AdamW + cosine warm-up on the sharded fields; with
//    --data D the ranks form a D x (mesh) grid and each data group trains on its own samples.
// 3. Progress lines print step, loss, throughput and per-rank peak memory; the last line is
//    final_loss=<loss on a fixed validation batch>, which agrees across rank counts for one seed.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/unet.hpp>
#include <shardtensor/shardtensor.hpp>

#include "cli_common.hpp"
#include "heat_data.hpp"

using namespace shard;
namespace F = shard::nn::functional;
using T = float;
using autograd::Var;
namespace cli = examples::cli;

namespace {

struct Args {
  cli::CommonArgs common;  // --steps --grid --seed --mesh --device
  std::vector<int> mesh;   // spatial mesh (H x W); default: all ranks on H
  int data = 1;            // data-parallel groups
  index_t batch = 4;       // global batch (split over data groups)
  index_t train_samples = 32;
  index_t width = 8;
  int depth = 2;
  double lr = 3e-3;
  int log_every = 10;
  std::string save;
};

/// The flags (CLI11): typed values with ranges; combinations are checked by validate().
void add_flags(CLI::App& app, Args& a) {
  cli::add_common(app, a.common, {.min_grid = 4});
  app.add_option("--data", a.data, "data-parallel groups (ranks = data x mesh)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--batch", a.batch, "global batch (a multiple of --data)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{1} << 20))
      ->capture_default_str();
  app.add_option("--samples", a.train_samples, "training pairs (at least --batch)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{1} << 24))
      ->capture_default_str();
  app.add_option("--width", a.width, "U-Net base width (channels at full resolution)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{4096}))
      ->capture_default_str();
  app.add_option("--depth", a.depth, "U-Net down/up steps")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  app.add_option("--lr", a.lr, "peak learning rate (AdamW, cosine warm-up)")
      ->check(CLI::Range(1e-12, 10.0))
      ->capture_default_str();
  app.add_option("--log-every", a.log_every, "print a progress line every K steps")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--save", a.save, "write the trained parameters to FILE");
}

/// Checks the combinations against the rank count P (cli::UsageError, exit code 2): the mesh
/// holds P ranks, the batch splits over the data groups, and the grid survives --depth halvings.
void validate(Args& a, int P) {
  if (!a.common.mesh.empty()) a.mesh = cli::parse_mesh(a.common.mesh, 2, 2);
  if (a.mesh.empty()) {
    if (P % a.data != 0)
      throw cli::UsageError("--data " + std::to_string(a.data) + " does not divide the " + std::to_string(P) +
                            " ranks started");
    a.mesh = {P / a.data, 1};
  }
  cli::check_mesh_ranks(a.mesh, a.data, P, "--mesh");
  if (a.batch % a.data != 0)
    throw cli::UsageError("--batch " + std::to_string(a.batch) + " is not a multiple of --data " + std::to_string(a.data));
  if (a.train_samples < a.batch)
    throw cli::UsageError("--samples " + std::to_string(a.train_samples) + " is smaller than --batch " +
                          std::to_string(a.batch));
  // Ranks left without cells (grid < ranks along a dim, or after the halvings) are fine: the
  // U-Net and the heat solver take empty shards (checked: --grid 4 on an 8x1 mesh trains, and
  // final_loss agrees across rank counts). What the model cannot take is a grid too small for
  // its depth.
  cli::check_halvings(a.common.grid, a.depth, "--grid", "--depth");
}

/// This rank's device: the CPU, or GPU (node-local rank modulo the visible GPUs) for --device cuda.
Device pick_device(const std::string& kind, const CommPtr& world) {
  if (kind == "cpu") return Device::cpu();
  const int n = cuda_device_count();
  // Every rank must agree that CUDA is usable, or every rank stops with the same message.
  world->check_all(n > 0, "unet_surrogate",
                   fmt::format("--device cuda but {} (cuda_compiled={})",
                               n == 0 ? "no GPU is visible" : "GPUs are visible", cuda_compiled()));
  const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int local = lr ? std::atoi(lr) : world->rank();
  return Device::cuda(local % n);
}

double mib(std::size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

}  // namespace

/// The example; `print` is set once this rank is known (usage messages from rank 0 only).
int run(int argc, char** argv, bool& print) {
  mpi_init_if_needed(&argc, &argv);
  auto world = MpiComm::world();
  print = world->rank() == 0;
  Args args;
  CLI::App app{"Trains a U-Net surrogate of the 2-D heat equation, domain-parallel (run under mpiexec).",
               "unet_surrogate"};
  add_flags(app, args);
  if (const int rc = cli::parse(app, argc, argv, print); rc >= 0) return rc;
  const int P = world->size();
  validate(args, P);
  const std::vector<int>& spatial = args.mesh;
  {
    const Device dev = pick_device(args.common.device, world);
    // Mesh data x H x W; activations [N, C, H, W] with N over data, H and W over the spatial dims.
    // On GPUs the mesh communicates through NCCL, or through MPI (staged in pinned buffers) when
    // ranks share a GPU, which NCCL refuses (make_device_comm decides, the same on every rank).
    CommPtr comm = dev.is_cuda() ? make_device_comm(world, dev) : CommPtr(world);
    DeviceMesh mesh(comm, {args.data, spatial[0], spatial[1]}, {"data", "h", "w"});
    const std::vector<Placement> placements{Shard(0), Shard(2), Shard(3)};
    heat::Config hc;
    hc.grid = args.common.grid;

    auto t0 = std::chrono::steady_clock::now();
    const index_t nbatches = args.train_samples / args.batch;
    std::vector<std::pair<DistTensor<T, 4>, DistTensor<T, 4>>> train;
    for (index_t b = 0; b < nbatches; ++b) {
      auto [x, y] = heat::make_batch<T>(mesh, placements, args.common.seed, b * args.batch, args.batch, hc);
      train.emplace_back(x.to(dev), y.to(dev));
    }
    auto val = heat::make_batch<T>(mesh, placements, args.common.seed + 7919, 0, args.batch, hc);
    val = {val.first.to(dev), val.second.to(dev)};
    const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    nn::UNetOptions uopt;
    uopt.in_channels = 1;
    uopt.out_channels = 1;
    uopt.base_width = args.width;
    uopt.depth = args.depth;
    nn::UNet<T, 2> model(mesh, uopt, args.common.seed);
    model.to(dev);  // before the optimiser, whose state lives on the parameters' device
    optim::AdamW<T> opt(model.parameters(), {.lr = args.lr, .weight_decay = 1e-4});
    optim::CosineWarmup sched(args.lr, std::max(1, args.common.steps / 20), args.common.steps, args.lr * 0.05);

    if (world->rank() == 0) {
      std::printf("unet_surrogate: device %s, %d ranks, mesh data=%d x h=%d x w=%d, grid %ldx%ld, batch %ld, %ld training "
                  "pairs (generated in %.2f s by the domain-parallel heat solver), %ld parameters\n",
                  fmt::format("{}", dev).c_str(), P, args.data, spatial[0], spatial[1], static_cast<long>(args.common.grid), static_cast<long>(args.common.grid),
                  static_cast<long>(args.batch), static_cast<long>(args.train_samples), gen_s,
                  static_cast<long>(model.num_parameters()));
      std::fflush(stdout);
    }

    auto mse_of = [&](const DistTensor<T, 4>& x, const DistTensor<T, 4>& y, bool record) {
      Var<T, 4> xv(x, false), yv(y, false);
      if (!record) {
        autograd::NoGradGuard ng;
        return F::mse_loss(model.forward(xv), yv);
      }
      return F::mse_loss(model.forward(xv), yv);
    };

    auto t_start = std::chrono::steady_clock::now();
    auto t_last = t_start;
    double loss_sum = 0;
    int loss_n = 0;
    for (int step = 0; step < args.common.steps; ++step) {
      opt.set_lr(sched(step));
      const auto& [x, y] = train[static_cast<std::size_t>(step % nbatches)];
      opt.zero_grad();
      auto loss = mse_of(x, y, true);
      loss.backward();
      opt.step();
      loss_sum += static_cast<double>(loss.value().full_tensor().to(Device::cpu()).data()[0]);
      ++loss_n;
      if ((step + 1) % args.log_every == 0 || step + 1 == args.common.steps) {
        const auto now = std::chrono::steady_clock::now();
        const double dt = std::chrono::duration<double>(now - t_last).count();
        t_last = now;
        const double samples_s = static_cast<double>(loss_n * args.batch) / dt;
        // Per-rank peaks: max over ranks of shardtensor's host high-water mark and of the RSS.
        double mem[3] = {mib(memory_stats(DeviceKind::cpu).peak_bytes), mib(process_peak_rss_bytes()),
                         mib(memory_stats(DeviceKind::cuda).peak_bytes)};
        world->allreduce(mem, mem, 3, DType::f64, ReduceOp::max);
        if (world->rank() == 0) {
          std::printf("step %5d  loss %.6e  lr %.2e  %.2f samples/s  %.2f Mpoints/s  peak/rank: tensors %.1f MiB, "
                      "rss %.1f MiB%s\n",
                      step + 1, loss_sum / loss_n, opt.lr(), samples_s,
                      samples_s * static_cast<double>(args.common.grid * args.common.grid) / 1e6, mem[0], mem[1],
                      dev.is_cuda() ? fmt::format(", gpu {:.1f} MiB", mem[2]).c_str() : "");
          std::fflush(stdout);
        }
        loss_sum = 0;
        loss_n = 0;
      }
    }
    const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    model.eval();
    auto vloss = mse_of(val.first, val.second, false);
    const double final_loss = static_cast<double>(vloss.value().full_tensor().to(Device::cpu()).data()[0]);
    if (!args.save.empty()) model.save(args.save);
    if (world->rank() == 0) {
      std::printf("trained %d steps in %.2f s (%.3f s/step)\n", args.common.steps, train_s, train_s / args.common.steps);
      std::printf("final_loss=%.8e\n", final_loss);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  bool print = true;
  return cli::run_main("unet_surrogate", print, [&] { return run(argc, argv, print); });
}
