// requires: mpi
// bench_collective_check: the cost of collective consistency checking (debug mode,
// dist/consistency.hpp; issue 18 item 8) per small op and per U-Net training step, mode off vs on
// in the same run.
//
// Ops (fp32, 1-D mesh of all ranks):
//   redistribute   a 16x16 tensor Shard(0) -> Shard(1)
//   halo           halo_exchange of a 32x32 tensor Shard(0), width 1 on both dims (zero)
//   conv3x3        F::conv2d forward (no gradients) of x[1, 4, 32, 32] Shard(2), w[4, 4, 3, 3]
//   conv3x3 f+b    the same conv, forward + backward (input, weight grads)
//   unet step      a U-Net training step (width 8, depth 2, batch 2, 64x64, Shard(2); mse loss,
//                  backward, AdamW step), as examples/unet_surrogate runs it
// Timing: `--warmup` untimed rounds, then `--reps` rounds; in every round each op runs `inner`
// times with the mode off and `inner` times with it on, the order of the two alternating from
// round to round (interleaved), each after a barrier; a variant's time is the max over ranks of
// its wall time / inner. Reported: the median over rounds, off and on, their difference and
// ratio, and the checked calls per op (fingerprints agreed on the mesh's communicator).
// Second table: the cheap checks that stay on without the mode (issue 18 item 6), each folded
// collective against the same collective without its fold (the statistics allreduce with its two
// key doubles vs a plain allreduce of the same sums; check_all with a key vs without; the key's
// hashing alone), with a small group_norm forward for scale.
//
//   OMP_NUM_THREADS=1 mpiexec -n 4 build/bench/bench_collective_check [--reps 15] [--warmup 3]
//       [--inner 50] [--unet-inner 2]
// (Open MPI on this machine: --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader.)
#include <mpi.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/unet.hpp>
#include <shardtensor/shardtensor.hpp>

#include "bench_util.hpp"

using namespace shard;
using namespace shard::bench;
using V4 = autograd::Var<float, 4>;

namespace {

struct Op {
  std::string name;
  int inner = 1;
  std::function<void()> run;
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = static_cast<int>(arg_int(argc, argv, "--reps", 15));
  const int warmup = static_cast<int>(arg_int(argc, argv, "--warmup", 3));
  const int inner = static_cast<int>(arg_int(argc, argv, "--inner", 50));
  const int unet_inner = static_cast<int>(arg_int(argc, argv, "--unet-inner", 2));
  CommPtr world = default_comm();
  DeviceMesh mesh(world);
  const int P = world->size(), me = world->rank();

  ExecContext off_ctx(Device::cpu()), on_ctx(Device::cpu());
  off_ctx.settings().check_collectives = false;
  on_ctx.settings().check_collectives = true;

  // Data (made with the mode off).
  auto r16 = DistTensor<float, 2>::random({16, 16}, mesh, {Shard(0)}, 1);
  auto h32 = DistTensor<float, 2>::random({32, 32}, mesh, {Shard(0)}, 2);
  const HaloSpec halo = HaloSpec::symmetric({1, 1}, Boundary::zero);
  V4 cx(DistTensor<float, 4>::random({1, 4, 32, 32}, mesh, {Shard(2)}, 3), true);
  V4 cw(DistTensor<float, 4>::random({4, 4, 3, 3}, mesh, {Replicate()}, 4), true);
  const auto copt = F::ConvOptions<2>::symmetric(1);
  nn::UNetOptions uo;
  uo.in_channels = 1;
  uo.out_channels = 1;
  uo.base_width = 8;
  uo.depth = 2;
  nn::UNet<float, 2> model(mesh, uo, 1);
  optim::AdamW<float> opt(model.parameters(), {.lr = 1e-3, .weight_decay = 1e-4});
  const auto ux = DistTensor<float, 4>::random({2, 1, 64, 64}, mesh, {Shard(2)}, 5);
  const auto uy = DistTensor<float, 4>::random({2, 1, 64, 64}, mesh, {Shard(2)}, 6);

  std::vector<Op> ops = {
      {"redistribute 16x16", inner, [&] { (void)r16.redistribute({Shard(1)}); }},
      {"halo 32x32 w1", inner, [&] { (void)halo_exchange(h32, halo); }},
      {"conv3x3 32x32 fwd", inner,
       [&] {
         autograd::NoGradGuard ng;
         (void)F::conv2d(cx, cw, std::nullopt, copt);
       }},
      {"conv3x3 32x32 f+b", inner,
       [&] {
         auto y = F::conv2d(cx, cw, std::nullopt, copt);
         F::sum(y).backward();
       }},
      {"unet step 64x64", unet_inner,
       [&] {
         opt.zero_grad();
         auto loss = F::mse_loss(model.forward(V4(ux)), V4(uy));
         loss.backward();
         opt.step();
       }},
  };

  auto time_once = [&](const Op& op, ExecContext& ctx) {
    ContextGuard g(ctx);
    world->barrier();
    const double t0 = now_ms();
    for (int i = 0; i < op.inner; ++i) op.run();
    double t = (now_ms() - t0) / op.inner;
    world->allreduce(&t, &t, 1, DType::f64, ReduceOp::max);
    return t;
  };
  // Medians in microseconds of (a in ctx_a, b in ctx_b) over `reps` rounds after `warmup`, the
  // order alternating from round to round.
  auto interleaved = [&](const Op& a, ExecContext& ctx_a, const Op& b, ExecContext& ctx_b) {
    std::vector<double> ta, tb;
    for (int rep = 0; rep < warmup + reps; ++rep) {
      double x = 0, y = 0;
      if (rep % 2 == 0) {
        x = time_once(a, ctx_a);
        y = time_once(b, ctx_b);
      } else {
        y = time_once(b, ctx_b);
        x = time_once(a, ctx_a);
      }
      if (rep >= warmup) {
        ta.push_back(x);
        tb.push_back(y);
      }
    }
    return std::make_pair(median(ta) * 1e3, median(tb) * 1e3);
  };
  if (me == 0)
    std::printf("bench_collective_check: %d ranks, fp32, reps %d (warmup %d), inner %d (U-Net %d), load %.2f\n", P,
                reps, warmup, inner, unet_inner, load_average());
  if (me == 0)
    std::printf("%-20s %5s %12s %12s %12s %8s %14s\n", "op", "ranks", "off [us]", "on [us]", "on-off [us]", "on/off",
                "checks per op");
  for (const Op& op : ops) {
    // checked calls per op: the sequence counter of the mesh's communicator across one checked run
    std::uint64_t before = 0, after = 0;
    {
      ContextGuard g(on_ctx);
      before = mesh.comm()->next_checked_call();
      op.run();
      after = mesh.comm()->next_checked_call();
    }
    const auto [mo, mn] = interleaved(op, off_ctx, op, on_ctx);
    if (me == 0)
      std::printf("%-20s %5d %12.1f %12.1f %12.1f %8.3f %14llu\n", op.name.c_str(), P, mo, mn, mn - mo, mn / mo,
                  static_cast<unsigned long long>(after - before - 1));
  }

  // The folded cheap checks (always on, mode off): each collective with its folded check vs the
  // same collective without it, interleaved the same way.
  struct Pair {
    std::string name;
    std::function<void()> plain, folded;
  };
  const CommPtr comm = mesh.comm();
  std::vector<double> stats(8, 1.0);
  const DistSpec spec = h32.spec();
  auto key_of = [&] {
    return detail::CallKey("group_norm").add(2).add(1).add(1e-5).add(index_t{512}).add(spec).value();
  };
  auto gx = V4(DistTensor<float, 4>::random({2, 8, 32, 32}, mesh, {Shard(2)}, 7), false);
  std::vector<Pair> pairs = {
      {"stats allreduce 8 f64", [&] { comm->allreduce(stats.data(), stats.data(), 8, DType::f64, ReduceOp::sum); },
       [&] { F::detail::allreduce_sum(comm, stats.data(), 8, key_of(), "bench"); }},
      {"check_all", [&] { comm->check_all(true, "bench", ""); },
       [&] { comm->check_all(true, "bench", "", key_of(), [] { return std::string(); }); }},
      {"key of a layout", [] {}, [&] { volatile std::uint64_t k = key_of(); (void)k; }},
  };
  if (me == 0)
    std::printf("\nfolded cheap checks (on without the mode)\n%-22s %5s %12s %12s %12s %8s\n", "collective", "ranks",
                "plain [us]", "folded [us]", "diff [us]", "ratio");
  for (const Pair& pr : pairs) {
    const Op pa{pr.name, inner * 4, pr.plain}, pb{pr.name, inner * 4, pr.folded};
    const auto [ma, mb] = interleaved(pa, off_ctx, pb, off_ctx);
    if (me == 0)
      std::printf("%-22s %5d %12.2f %12.2f %12.2f %8.3f\n", pr.name.c_str(), P, ma, mb, mb - ma, ma > 0 ? mb / ma : 0.0);
  }
  {  // context: a small norm whose forward carries two folded statistics allreduces
    std::vector<double> t;
    const Op g{"group_norm", inner, [&] {
                 autograd::NoGradGuard ng;
                 (void)F::group_norm(gx, 2);
               }};
    for (int rep = 0; rep < warmup + reps; ++rep) {
      const double v = time_once(g, off_ctx);
      if (rep >= warmup) t.push_back(v);
    }
    if (me == 0)
      std::printf("%-22s %5d %12.2f   (forward: 2 statistics allreduces, x[2, 8, 32, 32] fp32)\n", "group_norm fwd", P,
                  median(t) * 1e3);
  }
  if (me == 0) std::printf("load average after: %.2f\n", load_average());
  return 0;
}
