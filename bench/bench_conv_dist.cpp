// requires: mpi
// bench_conv_dist: forward + backward of the domain-parallel conv (F::conv) at the launch's rank
// count, fp32, the spatial dim 2 (H, or D for 3-D) sharded over a 1-D mesh:
//   conv2d: 16 -> 16 channels, 3x3, 'same', on 1 x 16 x 1024 x 1024;
//   conv3d:  8 ->  8 channels, 3x3x3, 'same', on 1 x 8 x 128^3.
// One iteration = y = F::conv(x, w, b); backward from a fixed dy (input, weight and bias
// gradients; the parameter gradients are allreduced by the tape's leaf finalisation). Prints,
// per case, the median / min time of the per-iteration maximum over ranks (forward and backward
// also separately), the median CPU time of an iteration summed over ranks (all threads; robust
// to other load on a shared machine, unlike wall time) and per-rank peaks: shardtensor's allocation high-water mark
// (memory_stats(cpu).peak_bytes, max over ranks) and the process peak RSS (max over ranks).
// With --csv FILE, appends one line per case for bench/run_conv_dist.sh, which runs 1 and 2
// ranks and prints the strong-scaling table.
//
//   OMP_NUM_THREADS=2 mpiexec -n 1 ./bench_conv_dist [--case conv2d|conv3d|all] [--iters 5]
//   OMP_NUM_THREADS=1 mpiexec -n 2 ./bench_conv_dist ... [--no-overlap] [--chunk-bytes B] [--shard-dim D] [--halve-dim D] [--csv out.csv]
#include <mpi.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>
#include <string>
#include <vector>

namespace {

using namespace shard;
using Clock = std::chrono::steady_clock;

const char* arg_str(int argc, char** argv, const char* name, const char* def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return def;
}
bool has_flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// CPU time of this process (all threads) in ms.
double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

struct Result {
  std::string name;
  double total_med = 0, total_min = 0, fwd_med = 0, bwd_med = 0, cpu_med = 0;
  double peak_mib = 0, rss_mib = 0, halo_mib = 0;
};

/// Max over ranks.
double max_all(const CommPtr& comm, double v) {
  comm->allreduce(&v, &v, 1, DType::f64, ReduceOp::max);
  return v;
}

template <int R>
Shape<R> halve(Shape<R> s, int d) {
  if (d >= 2 && d < R) s[d] /= 2;
  return s;
}

template <int R>
Result run_case(const std::string& name, const DeviceMesh& mesh, const Shape<R>& xs, const Shape<R>& ws, int sd,
                int iters, int warmup) {
  constexpr int S = R - 2;
  using V = autograd::Var<float, R>;
  const auto& comm = mesh.comm();
  release_cached_memory();
  reset_peak_memory();
  V x(DistTensor<float, R>::random(xs, mesh, {Shard(sd)}, 1), true);
  V w(DistTensor<float, R>::random(ws, mesh, {Replicate()}, 2, RandomInit::uniform(-0.1, 0.1)), true);
  autograd::Var<float, 1> b(DistTensor<float, 1>::random({ws[0]}, mesh, {Replicate()}, 3), true);
  Shape<S> k{};
  for (int d = 0; d < S; ++d) k[d] = ws[2 + d];
  const auto opt = F::ConvOptions<S>::same(k);
  DistTensor<float, R> dy;
  {
    autograd::NoGradGuard ng;
    auto y0 = F::conv(x, w, b, opt);
    dy = DistTensor<float, R>::random(y0.value().global_shape(), mesh, y0.value().placements(), 4, RandomInit{},
                                      y0.value().spec().sizes());
  }
  std::vector<double> tot, fwd, bwd, cpu;
  for (int it = 0; it < warmup + iters; ++it) {
    comm->barrier();
    const double c0 = cpu_ms();
    const auto t0 = Clock::now();
    auto y = F::conv(x, w, b, opt);
    const auto t1 = Clock::now();
    y.accumulate_grad(dy);
    autograd::run_backward(y.node());
    const auto t2 = Clock::now();
    double c = cpu_ms() - c0;
    comm->allreduce(&c, &c, 1, DType::f64, ReduceOp::sum);
    const double f = std::chrono::duration<double, std::milli>(t1 - t0).count();
    const double g = std::chrono::duration<double, std::milli>(t2 - t1).count();
    const double mf = max_all(comm, f), mb = max_all(comm, g), mt = max_all(comm, f + g);
    if (it >= warmup) {
      fwd.push_back(mf);
      bwd.push_back(mb);
      tot.push_back(mt);
      cpu.push_back(c);
    }
    x.zero_grad();
    w.zero_grad();
    b.zero_grad();
  }
  Result r;
  r.name = name;
  r.total_med = median(tot);
  r.total_min = *std::min_element(tot.begin(), tot.end());
  r.fwd_med = median(fwd);
  r.bwd_med = median(bwd);
  r.cpu_med = median(cpu);
  r.peak_mib = max_all(comm, static_cast<double>(memory_stats(DeviceKind::cpu).peak_bytes) / (1 << 20));
  r.rss_mib = max_all(comm, static_cast<double>(process_peak_rss_bytes()) / (1 << 20));
  // Halo bytes of one rank (both sides of the sharded dim, every other dim whole).
  double halo = 4.0 * 2 * static_cast<double>(xs[0] * xs[1]) * (ws[sd] - 1) / 2;
  for (int d = 2; d < R; ++d)
    if (d != sd) halo *= static_cast<double>(xs[d]);
  r.halo_mib = mesh.size() > 1 ? halo / (1 << 20) : 0;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  try {
    auto mesh = DeviceMesh::world();
    const std::string which = arg_str(argc, argv, "--case", "all");
    const int iters = std::atoi(arg_str(argc, argv, "--iters", "5"));
    const int warmup = std::atoi(arg_str(argc, argv, "--warmup", "1"));
    const char* csv = arg_str(argc, argv, "--csv", nullptr);
    const bool overlap = !has_flag(argc, argv, "--no-overlap");
    // --shard-dim D: the tensor dim the mesh shards (default 2: H or D). --halve-dim D: halve the
    // global extent of tensor dim D (to time one rank's share of a 2-rank run at 1 rank).
    const int sd = std::atoi(arg_str(argc, argv, "--shard-dim", "2"));
    const int hd = std::atoi(arg_str(argc, argv, "--halve-dim", "-1"));
    ExecContext ctx(Device::cpu());  // the conv's halo settings for this run
    ctx.settings().overlap_halo = overlap;
    if (const char* cb = arg_str(argc, argv, "--chunk-bytes", nullptr))
      ctx.settings().halo_chunk_bytes = std::strtoull(cb, nullptr, 10);
    ContextGuard guard(ctx);
    const int P = mesh.size(), threads = omp_get_max_threads();
    std::vector<Result> res;
    if (which == "all" || which == "conv2d")
      res.push_back(run_case<4>("conv2d", mesh, halve<4>({1, 16, 1024, 1024}, hd), {16, 16, 3, 3}, sd, iters, warmup));
    if (which == "all" || which == "conv3d")
      res.push_back(run_case<5>("conv3d", mesh, halve<5>({1, 8, 128, 128, 128}, hd), {8, 8, 3, 3, 3}, sd, iters, warmup));
    if (mesh.rank() == 0) {
      std::printf("# bench_conv_dist: %d rank(s) x %d thread(s), fp32, forward+backward, overlap %s, median of %d\n", P,
                  threads, overlap ? "on" : "off", iters);
      std::printf("%-7s %5s %8s %10s %10s %10s %10s %10s %12s %12s %10s\n", "case", "ranks", "threads", "total_ms",
                  "min_ms", "fwd_ms", "bwd_ms", "cpu_ms", "peak_MiB", "rss_MiB", "halo_MiB");
      for (const auto& r : res)
        std::printf("%-7s %5d %8d %10.1f %10.1f %10.1f %10.1f %10.1f %12.1f %12.1f %10.2f\n", r.name.c_str(), P,
                    threads, r.total_med, r.total_min, r.fwd_med, r.bwd_med, r.cpu_med, r.peak_mib, r.rss_mib,
                    r.halo_mib);
      if (csv) {
        if (FILE* f = std::fopen(csv, "a")) {
          for (const auto& r : res)
            std::fprintf(f, "%s,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.2f,%.2f,%.3f,%.3f\n", r.name.c_str(), P, threads,
                         overlap ? 1 : 0, r.total_med, r.total_min, r.fwd_med, r.bwd_med, r.peak_mib, r.rss_mib,
                         r.halo_mib, r.cpu_med);
          std::fclose(f);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_conv_dist: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
