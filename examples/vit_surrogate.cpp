// requires: mpi
// ViT example: train a vision-transformer surrogate of the 2-D heat equation, domain-parallel,
// with ring, all-to-all (Ulysses) or neighbourhood attention.
//
//   mpiexec -n 4 ./vit_surrogate --steps 200 --grid 64 --seed 1 --mesh 2x2 --attention ring --patch 4
//
// 1. Training pairs (u0, u(T)) come from a built-in explicit heat solver that runs domain-parallel
//    on the same mesh (examples/heat_data.hpp): nothing is ever gathered on one rank.
// 2. A ViT (nn/vit.hpp) is trained with AdamW + cosine warm-up on the sharded fields: patch tokens
//    stay sharded by spatial domain from input to output (its positional embedding is sharded
//    like the tokens); with --data D the ranks form a D x (mesh) grid and each data group trains
//    on its own samples.
// 3. Progress lines print step, loss, throughput and per-rank peak memory; the last line is
//    final_loss=<loss on a fixed validation batch>, which agrees across rank counts for one seed.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/vit.hpp>
#include <shardtensor/shardtensor.hpp>

#include "heat_data.hpp"

using namespace shard;
namespace F = shard::nn::functional;
using T = float;
using autograd::Var;

namespace {

struct Args {
  int steps = 200;
  index_t grid = 64;
  std::uint64_t seed = 1;
  std::vector<int> mesh;  // spatial mesh (H x W); default: all ranks on H
  int data = 1;           // data-parallel groups
  index_t batch = 4;      // global batch (split over data groups)
  index_t train_samples = 32;
  double lr = 3e-3;
  std::string attention = "ring";  // ring | ulysses | neighborhood
  index_t patch = 4;
  index_t heads = 2;
  index_t dim = 16;
  int layers = 2;
  index_t window = 3;  // neighbourhood window per spatial dim (tokens)
  int log_every = 10;
  std::string save;
  std::string device = "cpu";  // cpu | cuda (one GPU per rank: local rank modulo the visible GPUs)
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "error: %s\nusage: vit_surrogate [--steps N] [--grid G] [--seed S] [--mesh AxB] [--data D]\n"
               "       [--batch B] [--samples N] [--lr LR] [--log-every K] [--save FILE] [--device cpu|cuda]\n"
               "       [--attention ring|ulysses|neighborhood] [--patch P] [--heads H] [--dim D] [--layers L]\n"
               "       [--window K]   (--width / --depth are accepted as aliases of --dim / --layers)\n",
               msg);
  std::exit(2);
}

Args parse_flags(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + k).c_str());
      return argv[++i];
    };
    if (k == "--steps") a.steps = std::stoi(val());
    else if (k == "--grid") a.grid = std::stol(val());
    else if (k == "--seed") a.seed = std::stoull(val());
    else if (k == "--data") a.data = std::stoi(val());
    else if (k == "--batch") a.batch = std::stol(val());
    else if (k == "--samples") a.train_samples = std::stol(val());
    else if (k == "--dim" || k == "--width") a.dim = std::stol(val());
    else if (k == "--layers" || k == "--depth") a.layers = std::stoi(val());
    else if (k == "--heads") a.heads = std::stol(val());
    else if (k == "--patch") a.patch = std::stol(val());
    else if (k == "--window") a.window = std::stol(val());
    else if (k == "--attention") {
      a.attention = val();
      if (a.attention != "ring" && a.attention != "ulysses" && a.attention != "neighborhood")
        usage("--attention takes ring, ulysses or neighborhood");
    }
    else if (k == "--lr") a.lr = std::stod(val());
    else if (k == "--log-every") a.log_every = std::stoi(val());
    else if (k == "--save") a.save = val();
    else if (k == "--device") {
      a.device = val();
      if (a.device != "cpu" && a.device != "cuda") usage("--device takes cpu or cuda");
    }
    else if (k == "--mesh") {
      std::string s = val();
      a.mesh.clear();
      std::size_t pos = 0;
      while (pos <= s.size()) {
        const auto x = s.find('x', pos);
        a.mesh.push_back(std::stoi(s.substr(pos, x == std::string::npos ? std::string::npos : x - pos)));
        if (x == std::string::npos) break;
        pos = x + 1;
      }
      if (a.mesh.size() != 2) usage("--mesh takes AxB (ranks along H x ranks along W)");
    } else usage(("unknown flag " + k).c_str());
  }
  if (a.steps < 1 || a.grid < 4 || a.batch < 1 || a.data < 1 || a.train_samples < a.batch || a.log_every < 1 ||
      !(a.lr > 0))
    usage("bad sizes");
  if (a.patch < 1 || a.grid % a.patch != 0) usage("--patch must be >= 1 and divide --grid");
  if (a.dim < 1 || a.heads < 1 || a.dim % a.heads != 0) usage("--dim must be a positive multiple of --heads");
  if (a.layers < 1 || a.layers > 64) usage("--layers must be in 1..64");
  if (a.window < 1 || a.window > a.grid / a.patch) usage("--window must be in 1..grid/patch (tokens per side)");
  return a;
}

/// parse_flags with malformed numbers (--steps abc) reported as a usage error, not an abort.
Args parse(int argc, char** argv) {
  try {
    return parse_flags(argc, argv);
  } catch (const std::logic_error& e) {  // std::invalid_argument / std::out_of_range from stoi & co.
    usage((std::string("malformed number (") + e.what() + ")").c_str());
  }
}

/// This rank's device: the CPU, or GPU (node-local rank modulo the visible GPUs) for --device cuda.
Device pick_device(const std::string& kind, const CommPtr& world) {
  if (kind == "cpu") return Device::cpu();
  const int n = cuda_device_count();
  // Every rank must agree that CUDA is usable, or every rank stops with the same message.
  world->check_all(n > 0, "vit_surrogate",
                   fmt::format("--device cuda but {} (cuda_compiled={})",
                               n == 0 ? "no GPU is visible" : "GPUs are visible", cuda_compiled()));
  const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int local = lr ? std::atoi(lr) : world->rank();
  return Device::cuda(local % n);
}

double mib(std::size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  mpi_init_if_needed(&argc, &argv);
  auto world = MpiComm::world();
  const Args args = parse(argc, argv);
  const int P = world->size();
  std::vector<int> spatial = args.mesh.empty() ? std::vector<int>{P / args.data, 1} : args.mesh;
  if (spatial[0] * spatial[1] * args.data != P) {
    if (world->rank() == 0)
      std::fprintf(stderr, "error: --data %d x --mesh %dx%d = %d ranks, but mpiexec started %d\n", args.data,
                   spatial[0], spatial[1], args.data * spatial[0] * spatial[1], P);
    return 2;
  }
  if (args.batch % args.data != 0) {
    if (world->rank() == 0) std::fprintf(stderr, "error: --batch must be a multiple of --data\n");
    return 2;
  }
  try {
    const Device dev = pick_device(args.device, world);
    // Mesh data x H x W; activations [N, C, H, W] with N over data, H and W over the spatial dims.
    // On GPUs the mesh communicates through NCCL, or through MPI (staged in pinned buffers) when
    // ranks share a GPU, which NCCL refuses (make_device_comm decides, the same on every rank).
    CommPtr comm = dev.is_cuda() ? make_device_comm(world, dev) : CommPtr(world);
    DeviceMesh mesh(comm, {args.data, spatial[0], spatial[1]}, {"data", "h", "w"});
    const std::vector<Placement> placements{Shard(0), Shard(2), Shard(3)};
    heat::Config hc;
    hc.grid = args.grid;

    auto t0 = std::chrono::steady_clock::now();
    const index_t nbatches = args.train_samples / args.batch;
    std::vector<std::pair<DistTensor<T, 4>, DistTensor<T, 4>>> train;
    for (index_t b = 0; b < nbatches; ++b) {
      auto [x, y] = heat::make_batch<T>(mesh, placements, args.seed, b * args.batch, args.batch, hc);
      train.emplace_back(x.to(dev), y.to(dev));
    }
    auto val = heat::make_batch<T>(mesh, placements, args.seed + 7919, 0, args.batch, hc);
    val = {val.first.to(dev), val.second.to(dev)};
    const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    nn::ViTOptions vopt;
    vopt.in_channels = 1;
    vopt.out_channels = 1;
    vopt.field = {args.grid, args.grid};
    vopt.patch = args.patch;
    vopt.dim = args.dim;
    vopt.heads = args.heads;
    vopt.layers = args.layers;
    if (args.attention == "ring") {
      vopt.attention.form = nn::AttentionForm::ring;
    } else if (args.attention == "ulysses") {
      vopt.attention.form = nn::AttentionForm::ulysses;
    } else {
      vopt.attention.form = nn::AttentionForm::neighborhood;
      vopt.attention.window = {args.window};
    }
    nn::ViT<T, 2> model(mesh, vopt, placements, args.seed);
    model.to(dev);  // before the optimiser, whose state lives on the parameters' device
    optim::AdamW<T> opt(model.parameters(), {.lr = args.lr, .weight_decay = 1e-4});
    optim::CosineWarmup sched(args.lr, std::max(1, args.steps / 20), args.steps, args.lr * 0.05);

    if (world->rank() == 0) {
      std::printf("vit_surrogate: device %s, %d ranks, mesh data=%d x h=%d x w=%d, grid %ldx%ld, batch %ld, %ld training "
                  "pairs (generated in %.2f s by the domain-parallel heat solver)\n"
                  "  ViT: %s attention, patch %ld (%ldx%ld tokens), dim %ld, %ld heads, %d layers%s\n",
                  fmt::format("{}", dev).c_str(), P, args.data, spatial[0], spatial[1], static_cast<long>(args.grid),
                  static_cast<long>(args.grid), static_cast<long>(args.batch), static_cast<long>(args.train_samples),
                  gen_s, args.attention.c_str(), static_cast<long>(args.patch),
                  static_cast<long>(args.grid / args.patch), static_cast<long>(args.grid / args.patch),
                  static_cast<long>(args.dim), static_cast<long>(args.heads), args.layers,
                  args.attention == "neighborhood" ? fmt::format(", window {}", args.window).c_str() : "");
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
    for (int step = 0; step < args.steps; ++step) {
      opt.set_lr(sched(step));
      const auto& [x, y] = train[static_cast<std::size_t>(step % nbatches)];
      opt.zero_grad();
      auto loss = mse_of(x, y, true);
      loss.backward();
      opt.step();
      loss_sum += static_cast<double>(loss.value().full_tensor().to(Device::cpu()).data()[0]);
      ++loss_n;
      if ((step + 1) % args.log_every == 0 || step + 1 == args.steps) {
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
                      samples_s * static_cast<double>(args.grid * args.grid) / 1e6, mem[0], mem[1],
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
      std::printf("trained %d steps in %.2f s (%.3f s/step)\n", args.steps, train_s, train_s / args.steps);
      std::printf("final_loss=%.8e\n", final_loss);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
