// requires: mpi
// Main example: train a U-Net surrogate of the 2-D heat equation, domain-parallel.
//
//   mpiexec -n 4 ./unet_surrogate --steps 200 --grid 64 --seed 1 --mesh 2x2
//   mpiexec -n 4 ./unet_surrogate --steps 200 --checkpoint ck.h5 --checkpoint-every 50   # then, any rank count:
//   mpiexec -n 2 ./unet_surrogate --steps 400 --checkpoint ck.h5 --resume
//   mpiexec -n 4 ./unet_surrogate --steps 200 --precision bf16    # bf16 activations, f32 masters
//   mpiexec -n 1 ./unet_surrogate --device cuda --grid 1024 --width 32 --depth 3 --steps 23 --warmup 3
//
// 1. Training pairs (u0, u(T)) come from a built-in explicit heat solver that runs domain-parallel
//    on the same mesh (examples/heat_data.hpp): nothing is ever gathered on one rank.
// 2. A U-Net (nn/unet.hpp) is trained with AdamW + cosine warm-up on the sharded fields; with
//    --data D the ranks form a D x (mesh) grid and each data group trains on its own samples.
// 3. Progress lines print step, loss, throughput and per-rank peak memory; then a `steady state:`
//    line gives s/step and throughput after --warmup K steps (default min(3, steps/4)), the first
//    step's time on its own (cuDNN's algorithm search on a GPU) and the per-rank peaks (host RSS,
//    device high-water mark; examples/step_timing.hpp); the last line is
//    final_loss=<loss on a fixed validation batch>, which agrees across rank counts for one seed.
// 4. --checkpoint FILE writes parameters, optimiser state, step and data order (parallel HDF5,
//    atomic) every --checkpoint-every K steps and at the end; --resume continues from it up to
//    --steps, on any rank count and mesh (surrogate_common.hpp).
#include <string>

#include <shardtensor/nn/unet.hpp>

#include "surrogate_common.hpp"

using namespace shard;
namespace cli = examples::cli;
namespace sur = examples::surrogate;
using T = sur::T;

namespace {

struct Args {
  sur::TrainArgs train;  // --steps --grid --seed --mesh --device --data --batch --samples --lr --log-every --save
                         // --checkpoint --checkpoint-every --resume --stop-after
  index_t width = 8;
  int depth = 2;
};

/// The flags (CLI11): typed values with ranges; combinations are checked by validate().
void add_flags(CLI::App& app, Args& a) {
  sur::add_train_flags(app, a.train, {.min_grid = 4});
  app.add_option("--width", a.width, "U-Net base width (channels at full resolution)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{4096}))
      ->capture_default_str();
  app.add_option("--depth", a.depth, "U-Net down/up steps")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
}

/// Checks the combinations against the rank count P (cli::UsageError, exit code 2): the mesh
/// holds P ranks, the batch splits over the data groups, and the grid survives --depth halvings.
void validate(Args& a, int P) {
  sur::validate_train(a.train, P);
  // Ranks left without cells (grid < ranks along a dim, or after the halvings) are fine: the
  // U-Net and the heat solver take empty shards (checked: --grid 4 on an 8x1 mesh trains, and
  // final_loss agrees across rank counts). What the model cannot take is a grid too small for
  // its depth.
  cli::check_halvings(a.train.common.grid, a.depth, "--grid", "--depth");
}

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
  const auto& ta = args.train;
  const Device dev = sur::pick_device(ta.common.device, world, "unet_surrogate");
  const sur::Domain dom = sur::make_domain(ta, world, dev);
  const sur::HeatData data = sur::make_data(dom, ta, dev);

  nn::UNetOptions uopt;
  uopt.in_channels = 1;
  uopt.out_channels = 1;
  uopt.base_width = args.width;
  uopt.depth = args.depth;
  // --precision: the model's activation dtype (f32 master parameters either way).
  sur::with_precision(ta.precision, [&](auto tag) {
    using V = decltype(tag);
    nn::UNet<V, 2> model(dom.mesh, uopt, ta.common.seed);
    model.to(dev);  // before the optimiser, whose state lives on the parameters' device
    if (world->rank() == 0) {
      std::printf("unet_surrogate: device %s, %d ranks, mesh data=%d x h=%d x w=%d, grid %ldx%ld, batch %ld, %ld "
                  "training pairs (generated in %.2f s by the domain-parallel heat solver), %ld parameters, "
                  "precision %s\n",
                  fmt::format("{}", dev).c_str(), P, ta.data, ta.mesh[0], ta.mesh[1],
                  static_cast<long>(ta.common.grid), static_cast<long>(ta.common.grid), static_cast<long>(ta.batch),
                  static_cast<long>(ta.train_samples), data.gen_seconds, static_cast<long>(model.num_parameters()),
                  ta.precision.c_str());
      std::fflush(stdout);
    }
    sur::train(model, data, ta, world, dev);
  });
  return 0;
}

int main(int argc, char** argv) {
  bool print = true;
  return cli::run_main("unet_surrogate", print, [&] { return run(argc, argv, print); });
}
