// requires: mpi
// bench_ghost_reuse: the domain-parallel conv3x3 (periodic, 'same', fp64) on a simulation's
// halo-padded array (ghost width 1, filled by shard::fill_ghosts as the simulation's exchange),
// with the ghosts declared to the library (ghost reuse: the conv reads them, no exchange) and
// without (the conv runs its own halo exchange). Both read the same stable zero-copy interior
// view; the modes alternate iteration by iteration, so machine load hits both alike. Prints, per
// mode, the median over iterations of the per-iteration maximum over ranks of the forward alone
// (inference, NoGradGuard) and of forward + backward (training), and the ratios.
//
//   mpiexec -n 2 ./bench_ghost_reuse [--ny 256] [--nx 256] [--channels 4] [--iters 200] [--grid PYxPX]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <shardtensor/dist/halo.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

namespace {

using namespace shard;
using Clock = std::chrono::steady_clock;
using T = double;

const char* arg_str(int argc, char** argv, const char* name, const char* def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return def;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double max_all(const CommPtr& comm, double v) {
  comm->allreduce(&v, &v, 1, DType::f64, ReduceOp::max);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    auto comm = MpiComm::world();
    const int P = comm->size();
    const index_t ny = std::atol(arg_str(argc, argv, "--ny", "256")), nx = std::atol(arg_str(argc, argv, "--nx", "256"));
    const index_t C = std::atol(arg_str(argc, argv, "--channels", "4"));
    const int iters = std::atoi(arg_str(argc, argv, "--iters", "200"));
    int py = P, px = 1;
    if (std::sscanf(arg_str(argc, argv, "--grid", ""), "%dx%d", &py, &px) != 2 || py * px != P) {
      py = P;
      px = 1;
    }
    DeviceMesh mesh(comm, {py, px});
    const std::vector<Placement> pl{Shard(2), Shard(3)};
    const Shape<4> G{1, C, ny, nx};
    const DistSpec spec(mesh, pl, {1, C, ny, nx});
    const Box b = spec.local_box();
    const index_t ly = b.len[2], lx = b.len[3], pitch = lx + 2;
    // The simulation's array: (ly + 2) x (lx + 2) per channel, ghost width 1.
    std::vector<T> mem(static_cast<std::size_t>(C * (ly + 2) * pitch), T(0));
    const Shape<4> pstride{C * (ly + 2) * pitch, (ly + 2) * pitch, pitch, 1};
    auto padded = Tensor<T, 4>::view(mem.data(), {1, C, ly + 2, lx + 2}, pstride).declare_stable();
    auto interior = Tensor<T, 4>::view(mem.data() + pitch + 1, {1, C, ly, lx}, pstride).declare_stable();
    interior.fill_random(1, {0, 0, b.lo[2], b.lo[3]}, G);
    auto x_plain = DistTensor<T, 4>::from_local(interior, mesh, pl);
    fill_ghosts(x_plain, padded, HaloSpec::symmetric({0, 0, 1, 1}, Boundary::periodic));
    auto x_ghost =
        DistTensor<T, 4>::from_local(interior, mesh, pl, {}, GhostLayers::uniform(4, 1, {2, 3}, Boundary::periodic));
    const std::vector<Placement> rep{Replicate(), Replicate()};
    autograd::Var<T, 4> w(DistTensor<T, 4>::random({C, C, 3, 3}, mesh, rep, 2, RandomInit::uniform(-0.1, 0.1)), true);
    autograd::Var<T, 1> bias(DistTensor<T, 1>::random({C}, mesh, rep, 3), true);
    const auto opt = nn::functional::ConvOptions<2>::same({3, 3}, 1, Boundary::periodic);
    DistTensor<T, 4> dy;
    {
      autograd::NoGradGuard ng;
      auto y0 = nn::functional::conv(autograd::Var<T, 4>(x_plain), w, bias, opt);
      dy = DistTensor<T, 4>::random(y0.value().global_shape(), mesh, y0.value().placements(), 4, RandomInit{},
                                    y0.value().spec().sizes());
    }
    std::vector<double> fwd[2], step[2];
    const int warmup = 5;
    for (int it = 0; it < warmup + iters; ++it)
      for (int m = 0; m < 2; ++m) {
        const DistTensor<T, 4>& x = m ? x_ghost : x_plain;
        comm->barrier();
        auto t0 = Clock::now();
        {
          autograd::NoGradGuard ng;
          auto y = nn::functional::conv(autograd::Var<T, 4>(x), w, bias, opt);
        }
        const double f = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        comm->barrier();
        t0 = Clock::now();
        autograd::Var<T, 4> xv(x, true);
        auto y = nn::functional::conv(xv, w, bias, opt);
        y.accumulate_grad(dy);
        autograd::run_backward(y.node());
        const double s = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        w.zero_grad();
        bias.zero_grad();
        const double mf = max_all(comm, f), ms = max_all(comm, s);
        if (it >= warmup) {
          fwd[m].push_back(mf);
          step[m].push_back(ms);
        }
      }
    if (comm->rank() == 0) {
      std::printf("# bench_ghost_reuse: %d ranks (%dx%d mesh), field 1x%ldx%ldx%ld fp64, conv3x3 periodic %ld->%ld, "
                  "ghost width 1, %d iterations (median of the max over ranks)\n",
                  P, py, px, static_cast<long>(C), static_cast<long>(ny), static_cast<long>(nx), static_cast<long>(C),
                  static_cast<long>(C), iters);
      std::printf("%-16s %14s %18s\n", "mode", "forward_ms", "fwd+bwd_ms");
      std::printf("%-16s %14.4f %18.4f\n", "exchange", median(fwd[0]), median(step[0]));
      std::printf("%-16s %14.4f %18.4f\n", "ghost_reuse", median(fwd[1]), median(step[1]));
      std::printf("ratio ghost_reuse/exchange: forward %.3f, fwd+bwd %.3f\n", median(fwd[1]) / median(fwd[0]),
                  median(step[1]) / median(step[0]));
    }
  }
  MPI_Finalize();
  return 0;
}
