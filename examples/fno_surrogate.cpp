// requires: mpi
// FNO example: train a Fourier Neural Operator surrogate of the 2-D heat equation, domain-parallel,
// its spectral convolutions running on the distributed FFT.
//
//   mpiexec -n 4 ./fno_surrogate --steps 200 --grid 64 --seed 1 --mesh 2x2 --modes 8 --width 16
//   mpiexec -n 4 ./fno_surrogate --steps 200 --checkpoint ck.h5 --checkpoint-every 50   # then, any rank count:
//   mpiexec -n 2 ./fno_surrogate --steps 200 --checkpoint ck.h5 --resume
//   mpiexec -n 4 ./fno_surrogate --steps 200 --precision bf16    # bf16 activations, f32 spectral convs
//
// 1. Training pairs (u0, u(T)) come from a built-in explicit heat solver that runs domain-parallel
//    on the same mesh (examples/heat_data.hpp): nothing is ever gathered on one rank.
// 2. An FNO (nn/fno.hpp: lift, --layers spectral blocks of --width channels keeping --modes
//    Fourier modes per spatial dim, projection through --proj-width channels) is trained with
//    AdamW + cosine warm-up on the sharded fields. Each spectral convolution is a distributed
//    rfftn whose spectrum is cut to the kept modes before the all-to-all transposes, a per-mode
//    channel mix and the inverse plan back into the fields' layout (slab or pencil, uneven
//    shards); with --data D the ranks form a D x (mesh) grid and each data group trains on its
//    own samples.
// 3. Progress lines print step, loss, throughput and per-rank peak memory; the last line is
//    final_loss=<loss on a fixed validation batch>, which agrees across rank counts and meshes
//    for one seed to fp32 rounding, amplified by training: the FFT sums are ordered differently
//    at each rank count and mesh (each run is deterministic), and the differences grow as the
//    loss falls (--grid 30 --seed 3: 5.6e-7 relative after 100 steps, 1.9e-4 after 200).
// 4. --checkpoint FILE writes parameters, optimiser state, step and data order (parallel HDF5,
//    atomic) every --checkpoint-every K steps and at the end; --resume continues from it up to
//    --steps, on any rank count and mesh (surrogate_common.hpp).
// Flags are parsed with CLI11 (cli_common.hpp): --help exits 0, bad flags exit 2 with a message.
#include <string>

#include <shardtensor/nn/fno.hpp>

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
  int layers = 3;
  index_t modes = 4;
  index_t proj_width = 16;
};

/// The flags (CLI11): typed values with ranges; combinations are checked by validate().
void add_flags(CLI::App& app, Args& a) {
  sur::add_train_flags(app, a.train, {.min_grid = 2});
  app.add_option("--width", a.width, "FNO width (channels of the spectral blocks)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{4096}))
      ->capture_default_str();
  app.add_option("--layers,--depth", a.layers, "spectral blocks")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--modes", a.modes, "Fourier modes kept per spatial dim (2 * modes <= --grid)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{1} << 19))
      ->capture_default_str();
  app.add_option("--proj-width", a.proj_width, "hidden channels of the projection")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{1} << 16))
      ->capture_default_str();
}

/// Checks the combinations against the rank count P (cli::UsageError, exit code 2).
void validate(Args& a, int P) {
  sur::validate_train(a.train, P);
  // The spectrum keeps `modes` frequencies per side along H (2 * modes of its `grid`: the lowest
  // non-negative and negative ones) and `modes` of the grid / 2 + 1 along W (the real FFT's
  // half spectrum); the first bound implies the second. Ranks without cells are fine: the
  // distributed FFT and the heat solver take empty shards (checked: --grid 4 on 4x1 and 2x2
  // meshes, --grid 2 --modes 1 on 3x1, train and agree with 1 rank).
  const index_t grid = a.train.common.grid;
  if (2 * a.modes > grid)
    throw cli::UsageError("--modes " + std::to_string(a.modes) + " is too large for --grid " + std::to_string(grid) +
                          ": the spectral convolution keeps 2 * modes = " + std::to_string(2 * a.modes) +
                          " frequencies along H, at most the grid's " + std::to_string(grid) +
                          " (and modes <= grid / 2 + 1 = " + std::to_string(grid / 2 + 1) +
                          " along W, the real FFT's half spectrum); use --modes <= " + std::to_string(grid / 2));
}

}  // namespace

/// The example; `print` is set once this rank is known (usage messages from rank 0 only).
int run(int argc, char** argv, bool& print) {
  mpi_init_if_needed(&argc, &argv);
  auto world = MpiComm::world();
  print = world->rank() == 0;
  Args args;
  CLI::App app{"Trains a Fourier Neural Operator surrogate of the 2-D heat equation, domain-parallel, on the "
               "distributed FFT (run under mpiexec).",
               "fno_surrogate"};
  add_flags(app, args);
  if (const int rc = cli::parse(app, argc, argv, print); rc >= 0) return rc;
  const int P = world->size();
  validate(args, P);
  const auto& ta = args.train;
  const Device dev = sur::pick_device(ta.common.device, world, "fno_surrogate");
  const sur::Domain dom = sur::make_domain(ta, world, dev);
  const sur::HeatData data = sur::make_data(dom, ta, dev);

  nn::FNOOptions<2> fopt;
  fopt.in_channels = 1;
  fopt.out_channels = 1;
  fopt.width = args.width;
  fopt.layers = args.layers;
  fopt.modes = {args.modes, args.modes};
  fopt.proj_width = args.proj_width;
  // --precision: the model's activation dtype (f32 master parameters either way; the spectral
  // convolutions run in f32, see nn/fno.hpp).
  sur::with_precision(ta.precision, [&](auto tag) {
    using V = decltype(tag);
    nn::FNO<V, 2> model(dom.mesh, fopt, ta.common.seed);
    model.to(dev);  // before the optimiser, whose state lives on the parameters' device
    if (world->rank() == 0) {
      std::printf("fno_surrogate: device %s, %d ranks, mesh data=%d x h=%d x w=%d, grid %ldx%ld, batch %ld, %ld "
                  "training pairs (generated in %.2f s by the domain-parallel heat solver), FNO width %ld, %d layers, "
                  "%ldx%ld modes, projection width %ld, %ld parameters, precision %s\n",
                  fmt::format("{}", dev).c_str(), P, ta.data, ta.mesh[0], ta.mesh[1],
                  static_cast<long>(ta.common.grid), static_cast<long>(ta.common.grid), static_cast<long>(ta.batch),
                  static_cast<long>(ta.train_samples), data.gen_seconds, static_cast<long>(args.width), args.layers,
                  static_cast<long>(args.modes), static_cast<long>(args.modes), static_cast<long>(args.proj_width),
                  static_cast<long>(model.num_parameters()), ta.precision.c_str());
      std::fflush(stdout);
    }
    sur::train(model, data, ta, world, dev);
  });
  return 0;
}

int main(int argc, char** argv) {
  bool print = true;
  return cli::run_main("fno_surrogate", print, [&] { return run(argc, argv, print); });
}
