// requires: mpi
// ViT example: train a vision-transformer surrogate of the 2-D heat equation, domain-parallel,
// with ring, all-to-all (Ulysses) or neighbourhood attention.
//
//   mpiexec -n 4 ./vit_surrogate --steps 200 --grid 64 --seed 1 --mesh 2x2 --attention ring --patch 4
//   mpiexec -n 4 ./vit_surrogate --steps 200 --checkpoint ck.h5 --checkpoint-every 50   # then, any rank count:
//   mpiexec -n 2 ./vit_surrogate --steps 200 --checkpoint ck.h5 --resume
//
// 1. Training pairs (u0, u(T)) come from a built-in explicit heat solver that runs domain-parallel
//    on the same mesh (examples/heat_data.hpp): nothing is ever gathered on one rank.
// 2. A ViT (nn/vit.hpp) is trained with AdamW + cosine warm-up on the sharded fields: patch tokens
//    stay sharded by spatial domain from input to output (its positional embedding is sharded
//    like the tokens); with --data D the ranks form a D x (mesh) grid and each data group trains
//    on its own samples.
// 3. Progress lines print step, loss, throughput and per-rank peak memory; the last line is
//    final_loss=<loss on a fixed validation batch>, which agrees across rank counts for one seed.
// 4. --checkpoint FILE writes parameters (the sharded positional embedding as one global
//    dataset), optimiser state, step and data order (parallel HDF5, atomic) every
//    --checkpoint-every K steps and at the end; --resume continues from it up to --steps, on any
//    rank count and mesh (surrogate_common.hpp).
// Flags are parsed with CLI11 (cli_common.hpp): --help exits 0, bad flags exit 2 with a message.
#include <string>

#include <shardtensor/nn/vit.hpp>

#include "surrogate_common.hpp"

using namespace shard;
namespace cli = examples::cli;
namespace sur = examples::surrogate;
using T = sur::T;

namespace {

struct Args {
  sur::TrainArgs train;  // --steps --grid --seed --mesh --device --data --batch --samples --lr --log-every --save
                         // --checkpoint --checkpoint-every --resume --stop-after
  std::string attention = "ring";  // ring | ulysses | neighborhood
  index_t patch = 4;
  index_t heads = 2;
  index_t dim = 16;
  int layers = 2;
  index_t window = 3;  // neighbourhood window per spatial dim (tokens)
};

/// The flags (CLI11): typed values with ranges; combinations are checked by validate().
void add_flags(CLI::App& app, Args& a) {
  sur::add_train_flags(app, a.train, {.min_grid = 1});
  app.add_option("--attention", a.attention, "attention form: ring, ulysses (all-to-all) or neighborhood")
      ->check(CLI::IsMember({"ring", "ulysses", "neighborhood"}))
      ->capture_default_str();
  app.add_option("--patch", a.patch, "patch size (divides --grid; tokens per side = grid / patch)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{1} << 20))
      ->capture_default_str();
  app.add_option("--heads", a.heads, "attention heads (divide --dim)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{4096}))
      ->capture_default_str();
  app.add_option("--dim,--width", a.dim, "token width D (a multiple of --heads)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{1} << 16))
      ->capture_default_str();
  app.add_option("--layers,--depth", a.layers, "transformer blocks")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--window", a.window, "neighborhood attention window per spatial dim, in tokens (1..grid/patch; other forms ignore it)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{1} << 20))
      ->capture_default_str();
}

/// Checks the combinations against the rank count P (cli::UsageError, exit code 2).
void validate(Args& a, int P) {
  sur::validate_train(a.train, P);
  const index_t grid = a.train.common.grid;
  if (grid % a.patch != 0)
    throw cli::UsageError("--patch " + std::to_string(a.patch) + " does not divide --grid " + std::to_string(grid));
  if (a.dim % a.heads != 0)
    throw cli::UsageError("--heads " + std::to_string(a.heads) + " does not divide --dim " + std::to_string(a.dim));
  const index_t tokens = grid / a.patch;
  if (a.attention == "neighborhood" && a.window > tokens)
    throw cli::UsageError("--window " + std::to_string(a.window) + " is larger than the " + std::to_string(tokens) +
                          " tokens per side (--grid / --patch)");
  // Tokens stay sharded by spatial domain: every rank needs at least one token row and column
  // (and hence field cells).
  cli::check_no_empty_parts(tokens, a.train.mesh[0], 0, "--grid / --patch (tokens along H, over --mesh's first extent)");
  cli::check_no_empty_parts(tokens, a.train.mesh[1], 0, "--grid / --patch (tokens along W, over --mesh's second extent)");
}

}  // namespace

/// The example; `print` is set once this rank is known (usage messages from rank 0 only).
int run(int argc, char** argv, bool& print) {
  mpi_init_if_needed(&argc, &argv);
  auto world = MpiComm::world();
  print = world->rank() == 0;
  Args args;
  CLI::App app{"Trains a ViT surrogate of the 2-D heat equation, domain-parallel, with ring, all-to-all or "
               "neighborhood attention (run under mpiexec).",
               "vit_surrogate"};
  add_flags(app, args);
  if (const int rc = cli::parse(app, argc, argv, print); rc >= 0) return rc;
  const int P = world->size();
  validate(args, P);
  const auto& ta = args.train;
  const Device dev = sur::pick_device(ta.common.device, world, "vit_surrogate");
  const sur::Domain dom = sur::make_domain(ta, world, dev);
  const sur::HeatData data = sur::make_data(dom, ta, dev);

  nn::ViTOptions vopt;
  vopt.in_channels = 1;
  vopt.out_channels = 1;
  vopt.field = {ta.common.grid, ta.common.grid};
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
  // --precision: the model's activation dtype (f32 master parameters either way).
  sur::with_precision(ta.precision, [&](auto tag) {
  using V = decltype(tag);
  nn::ViT<V, 2> model(dom.mesh, vopt, dom.placements, ta.common.seed);
  model.to(dev);  // before the optimiser, whose state lives on the parameters' device

  if (world->rank() == 0) {
    const index_t tokens = ta.common.grid / args.patch;
    std::printf("vit_surrogate: device %s, %d ranks, mesh data=%d x h=%d x w=%d, grid %ldx%ld, batch %ld, %ld training "
                "pairs (generated in %.2f s by the domain-parallel heat solver), precision %s\n"
                "  ViT: %s attention, patch %ld (%ldx%ld tokens), dim %ld, %ld heads, %d layers%s, %ld parameters\n",
                fmt::format("{}", dev).c_str(), P, ta.data, ta.mesh[0], ta.mesh[1], static_cast<long>(ta.common.grid),
                static_cast<long>(ta.common.grid), static_cast<long>(ta.batch), static_cast<long>(ta.train_samples),
                data.gen_seconds, ta.precision.c_str(), args.attention.c_str(), static_cast<long>(args.patch), static_cast<long>(tokens),
                static_cast<long>(tokens), static_cast<long>(args.dim), static_cast<long>(args.heads), args.layers,
                args.attention == "neighborhood" ? fmt::format(", window {}", args.window).c_str() : "",
                static_cast<long>(model.num_parameters()));
    std::fflush(stdout);
  }
  sur::train(model, data, ta, world, dev);
  });
  return 0;
}

int main(int argc, char** argv) {
  bool print = true;
  return cli::run_main("vit_surrogate", print, [&] { return run(argc, argv, print); });
}
