// Local (1-process) conv kernels vs the machine's sgemm peak; compare with bench/torch_conv_ref.py.
//
//   OMP_NUM_THREADS=2 build/bench/bench_conv_local [--reps 5] [--case all|2d|3d|gemm]
//                                                  [--policy tiles|blas] [--budget-kb 1024]
//                                                  [--kernel auto|im2col|avx2] [--peak 1|0]
//                                                  [--ratio ROUNDS]
//
// Cases (fp32, forward + backward = input, weight and bias gradients):
//   conv2d 16->16 3x3 pad 1 on 1x16x1024x1024,  conv3d 8->8 3x3x3 pad 1 on 1x8x128^3.
// Prints the median and minimum of each phase over --reps repetitions (after one warm-up),
// GFLOP/s (3 x 2 x Cout x Cin x kvol x positions flops per step) and the fraction of the
// measured sgemm peak (a large square sgemm on all BLAS threads).
//
// --ratio ROUNDS (issue 14: each ISA path against its own sgemm, on a shared machine): one
// thread, thread CPU time. Each round times a 1536^3 sgemm, the sgemm of each case's GEMM shape
// (M = Cout, N = 4096 positions, K = Cin x kvol; the shape the direct kernels compute) and the
// case's forward, input gradient and weight gradient; prints per pass the median GFLOP per
// CPU-second and the median of the per-round ratios to both sgemms. Run it once per ISA
// (SHARDTENSOR_CPU_ISA=avx2 also puts OpenBLAS on its Haswell kernels):
//   SHARDTENSOR_CPU_ISA=avx2 OMP_NUM_THREADS=1 build/bench/bench_conv_local --ratio 7
// --case small (with --ratio) times conv2d 16->16 3x3 on 1x16x64x128 instead, 100 calls per
// pass: x, y and the tiles stay in L2, which separates the micro-kernels' speed from the
// memory traffic of copying tiles in and out of 64 MiB tensors.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <shardtensor/core/cpu_isa.hpp>
#include <shardtensor/nn/functional/conv_local.hpp>
#include <shardtensor/exec/blas.hpp>
#include <shardtensor/tensor/memory.hpp>

using namespace shard;
using shard::nn::functional::ConvOptions;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
/// Process CPU seconds (all threads): on a shared, oversubscribed machine CPU time per step is a
/// steadier measure of the work done than wall time.
double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Stats {
  double median = 0, min = 0;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front()};
}

double thread_cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// GFLOP/s of one large sgemm (n x n x n), best of `reps`; also GFLOP per CPU-second.
double sgemm_gflops(index_t n, int reps, double* per_cpu_second = nullptr) {
  std::vector<float> a(static_cast<std::size_t>(n * n), 1.0f), b(a), c(a);
  double best = 1e30, best_cpu = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    const double t0 = now(), c0 = cpu_now();
    gemm<float>(Trans::no, Trans::no, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (r > 0) {
      best = std::min(best, now() - t0);
      best_cpu = std::min(best_cpu, cpu_now() - c0);
    }
  }
  if (per_cpu_second) *per_cpu_second = 2.0 * n * n * n / best_cpu * 1e-9;
  return 2.0 * n * n * n / best * 1e-9;
}

/// GFLOP/s of the per-tile conv GEMM shape (m x n x k, single thread per call, one call per thread).
double tile_gemm_gflops(index_t m, index_t n, index_t k, int reps) {
  const int nth = omp_get_max_threads();
  BlasThreadsScope one(1);
  std::vector<double> best(static_cast<std::size_t>(nth), 1e30);
  const int inner = 200;
#pragma omp parallel num_threads(nth)
  {
    std::vector<float> a(static_cast<std::size_t>(m * k), 1.0f), b(static_cast<std::size_t>(k * n), 1.0f),
        c(static_cast<std::size_t>(m * n));
    for (int r = 0; r < reps + 1; ++r) {
#pragma omp barrier
      const double t0 = now();
      for (int i = 0; i < inner; ++i)
        gemm<float>(Trans::no, Trans::no, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
      if (r > 0) best[static_cast<std::size_t>(omp_get_thread_num())] = std::min(best[omp_get_thread_num()], now() - t0);
    }
  }
  double total = 0;
  for (double t : best) total += 2.0 * m * n * k * inner / t * 1e-9;
  return total;
}

template <int R>
void run_case(const char* name, const Shape<R>& xs, index_t cout, index_t k, int reps, double peak) {
  constexpr int S = R - 2;
  Shape<R> ws{};
  ws[0] = cout;
  ws[1] = xs[1];
  for (int d = 0; d < S; ++d) ws[2 + d] = k;
  auto x = Tensor<float, R>::empty(xs);
  x.fill_random(1);
  auto w = Tensor<float, R>::empty(ws);
  w.fill_random(2);
  auto b = Tensor<float, 1>::empty({cout});
  b.fill_random(3);
  const auto p = ConvOptions<S>::symmetric(k / 2);
  Shape<S> in{}, kern{};
  for (int d = 0; d < S; ++d) {
    in[d] = xs[2 + d];
    kern[d] = k;
  }
  std::vector<double> tf, tbi, tbw, tbb, tt, cf, cbi, cbw, ct;
  Tensor<float, R> gy;
  for (int r = 0; r < reps + 1; ++r) {
    const double c0 = cpu_now(), t0 = now();
    auto y = conv_forward(x, w, b, p);
    const double t1 = now(), c1 = cpu_now();
    if (r == 0) {
      gy = Tensor<float, R>::empty(y.shape());
      gy.fill_random(4);
    }
    const double c2 = cpu_now(), t2 = now();
    auto gx = conv_backward_input(gy, w, in, p);
    const double t3 = now(), c3 = cpu_now();
    auto gw = conv_backward_weight(x, gy, kern, p);
    const double t4 = now(), c4 = cpu_now();
    auto gb = conv_backward_bias(gy);
    const double t5 = now(), c5 = cpu_now();
    if (r > 0) {
      tf.push_back(t1 - t0);
      tbi.push_back(t3 - t2);
      tbw.push_back(t4 - t3);
      tbb.push_back(t5 - t4);
      tt.push_back((t1 - t0) + (t5 - t2));
      cf.push_back(c1 - c0);
      cbi.push_back(c3 - c2);
      cbw.push_back(c4 - c3);
      ct.push_back((c1 - c0) + (c5 - c2));
    }
  }
  double kvol = 1, pos = 1;
  for (int d = 0; d < S; ++d) {
    kvol *= static_cast<double>(k);
    pos *= static_cast<double>(xs[2 + d]);
  }
  const double gf_pass = 2.0 * static_cast<double>(cout * xs[1]) * kvol * pos * static_cast<double>(xs[0]) * 1e-9;
  const auto f = stats(tf), bi = stats(tbi), bw = stats(tbw), bb = stats(tbb), t = stats(tt);
  fmt::print("{}: fwd {:.1f} ms ({:.0f} GFLOP/s)  bwd_input {:.1f} ms ({:.0f})  bwd_weight {:.1f} ms ({:.0f})  "
             "bwd_bias {:.1f} ms\n",
             name, f.median * 1e3, gf_pass / f.median, bi.median * 1e3, gf_pass / bi.median, bw.median * 1e3,
             gf_pass / bw.median, bb.median * 1e3);
  fmt::print("{}: total median {:.1f} ms min {:.1f} ms  {:.1f} GFLOP/s", name, t.median * 1e3, t.min * 1e3,
             3 * gf_pass / t.min);
  if (peak > 0) fmt::print(" = {:.0f}% of sgemm peak {:.0f} GFLOP/s", 100.0 * 3 * gf_pass / t.min / peak, peak);
  fmt::print("\n");
  const auto cf_ = stats(cf), cbi_ = stats(cbi), cbw_ = stats(cbw), ct_ = stats(ct);
  fmt::print("{}: CPU time (all threads): fwd {:.1f} ms  bwd_input {:.1f} ms  bwd_weight {:.1f} ms  step {:.1f} ms -> "
             "{:.1f} GFLOP per CPU-second\n",
             name, cf_.median * 1e3, cbi_.median * 1e3, cbw_.median * 1e3, ct_.median * 1e3,
             3 * gf_pass / ct_.median);
}


/// Thread-CPU seconds of one m x n x k sgemm (the calling thread, 1 BLAS thread), best of 3.
double sgemm_cpu_seconds(index_t m, index_t n, index_t k, int inner) {
  std::vector<float> a(static_cast<std::size_t>(m * k), 1.0f), b(static_cast<std::size_t>(k * n), 1.0f),
      c(static_cast<std::size_t>(m * n));
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const double t0 = thread_cpu_now();
    for (int i = 0; i < inner; ++i)
      gemm<float>(Trans::no, Trans::no, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    best = std::min(best, (thread_cpu_now() - t0) / inner);
  }
  return best;
}

/// --ratio: one thread, thread CPU time, `rounds` rounds of (sgemm 1536^3, sgemm of the case's
/// GEMM shape, fwd, input gradient, weight gradient) per case.
int run_ratio(int rounds, const std::string& which) {
  BlasThreadsScope one(1);
  struct Case {
    const char* name;
    index_t cout, cin, kvol;
    double pos;
    std::function<void(double&, double&, double&)> step;
  };
  auto make = [](auto xs, index_t cout, index_t k, int rep) {
    constexpr int R = std::tuple_size_v<std::decay_t<decltype(xs)>>;
    constexpr int S = R - 2;
    Shape<R> ws{};
    ws[0] = cout;
    ws[1] = xs[1];
    for (int d = 0; d < S; ++d) ws[2 + d] = k;
    auto x = Tensor<float, R>::empty(xs);
    x.fill_random(1);
    auto w = Tensor<float, R>::empty(ws);
    w.fill_random(2);
    auto b = Tensor<float, 1>::empty({cout});
    b.fill_random(3);
    const auto p = ConvOptions<S>::symmetric(k / 2);
    Shape<S> in{}, kern{};
    for (int d = 0; d < S; ++d) {
      in[d] = xs[2 + d];
      kern[d] = k;
    }
    auto gy = Tensor<float, R>::empty(conv_forward(x, w, b, p).shape());
    gy.fill_random(4);
    return [=](double& f, double& bi, double& bw) {
      double t0 = thread_cpu_now();
      for (int i = 0; i < rep; ++i) auto y = conv_forward(x, w, b, p);
      f = (thread_cpu_now() - t0) / rep;
      t0 = thread_cpu_now();
      for (int i = 0; i < rep; ++i) auto gx = conv_backward_input(gy, w, in, p);
      bi = (thread_cpu_now() - t0) / rep;
      t0 = thread_cpu_now();
      for (int i = 0; i < rep; ++i) auto gw = conv_backward_weight(x, gy, kern, p);
      bw = (thread_cpu_now() - t0) / rep;
    };
  };
  std::vector<Case> cases;
  if (which == "small") {
    cases.push_back({"conv2d 16->16 3x3 1x16x64x128 (in L2)", 16, 16, 9, 64.0 * 128,
                     make(Shape<4>{1, 16, 64, 128}, 16, 3, 100)});
  } else {
    if (which != "3d")
      cases.push_back({"conv2d 16->16 3x3 1x16x1024^2", 16, 16, 9, 1024.0 * 1024, make(Shape<4>{1, 16, 1024, 1024}, 16, 3, 1)});
    if (which != "2d")
      cases.push_back({"conv3d 8->8 3x3x3 1x8x128^3", 8, 8, 27, 128.0 * 128 * 128, make(Shape<5>{1, 8, 128, 128, 128}, 8, 3, 1)});
  }
  const index_t nbig = 1536;
  const double big_gf = 2.0 * nbig * nbig * nbig * 1e-9;
  std::vector<double> big;
  struct Acc {
    std::vector<double> gemm, pass[3], vs_big[3], vs_shape[3];
  };
  std::vector<Acc> acc(cases.size());
  for (int r = 0; r < rounds + 1; ++r) {
    const double tb = sgemm_cpu_seconds(nbig, nbig, nbig, 1);
    for (std::size_t c = 0; c < cases.size(); ++c) {
      const Case& cs = cases[c];
      const index_t n = 4096, kk = cs.cin * cs.kvol;
      const double ts = sgemm_cpu_seconds(cs.cout, n, kk, 50);
      const double shape_gf = 2.0 * cs.cout * n * kk * 1e-9 / ts;
      double t[3];
      cs.step(t[0], t[1], t[2]);
      if (r == 0) continue;  // warm-up
      const double gf = 2.0 * cs.cout * cs.cin * cs.kvol * cs.pos * 1e-9;
      acc[c].gemm.push_back(shape_gf);
      for (int i = 0; i < 3; ++i) {
        acc[c].pass[i].push_back(gf / t[i]);
        acc[c].vs_big[i].push_back(gf / t[i] / (big_gf / tb));
        acc[c].vs_shape[i].push_back(gf / t[i] / shape_gf);
      }
    }
    if (r > 0) big.push_back(big_gf / tb);
  }
  const auto med = [](const std::vector<double>& v) { return stats(v).median; };
  fmt::print("ratio mode: 1 thread, thread CPU time, {} rounds (medians); CPU {}, ISA {}, kernel {}, OpenBLAS core {}\n",
             rounds, cpu_model_name(), cpu_isa(), conv_kernel_isa(current_context().settings().conv_kernel),
             blas_core_name());
  fmt::print("sgemm 1536^3: {:.1f} GFLOP/s (min {:.1f}, max {:.1f})\n", med(big), stats(big).min,
             *std::max_element(big.begin(), big.end()));
  const char* names[3] = {"fwd", "bwd_input", "bwd_weight"};
  for (std::size_t c = 0; c < cases.size(); ++c) {
    fmt::print("{}: sgemm {}x4096x{} {:.1f} GFLOP/s\n", cases[c].name, cases[c].cout, cases[c].cin * cases[c].kvol,
               med(acc[c].gemm));
    for (int i = 0; i < 3; ++i)
      fmt::print("  {:<10} {:6.1f} GFLOP/s  {:5.1f}% of sgemm 1536^3 (rounds {:.0f}-{:.0f}%)  {:5.1f}% of the shape's sgemm\n",
                 names[i], med(acc[c].pass[i]), 100 * med(acc[c].vs_big[i]), 100 * stats(acc[c].vs_big[i]).min,
                 100 * *std::max_element(acc[c].vs_big[i].begin(), acc[c].vs_big[i].end()),
                 100 * med(acc[c].vs_shape[i]));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  bool measure_peak = true;
  int ratio_rounds = 0;
  std::string which = "all";
  ExecContext ctx(Device::cpu());  // the conv engine's settings for this run
  ExecSettings& cfg = ctx.settings();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--reps") reps = std::stoi(v);
    else if (a == "--case") which = v;
    else if (a == "--peak") measure_peak = v != "0";
    else if (a == "--ratio") ratio_rounds = std::stoi(v);
    else if (a == "--kernel")
      cfg.conv_kernel = v == "im2col" ? ConvKernel::im2col_blas
                        : v == "avx2" ? ConvKernel::direct_avx2
                                      : ConvKernel::automatic;
    else if (a == "--policy") cfg.conv_threading = v == "blas" ? ConvThreading::blas : ConvThreading::tiles;
    else if (a == "--budget-kb") cfg.conv_column_budget = static_cast<std::size_t>(std::stol(v)) * 1024;
    else {
      fmt::print(stderr, "unknown option {}\n", a);
      return 2;
    }
  }
  ContextGuard guard(ctx);
  if (ratio_rounds > 0) return run_ratio(ratio_rounds, which);
  fmt::print("threads: omp {} blas {} ({}), policy {}, kernel {}, budget {} KiB/thread\n", omp_get_max_threads(),
             blas_num_threads(), blas_core_name(), cfg.conv_threading == ConvThreading::tiles ? "tiles" : "blas",
             conv_kernel_isa(cfg.conv_kernel), cfg.conv_column_budget / 1024);
  double peak_cpu = 0;
  const double peak = measure_peak ? sgemm_gflops(3072, 3, &peak_cpu) : 0.0;
  if (measure_peak)
    fmt::print("sgemm 3072^3 ({} BLAS threads): {:.0f} GFLOP/s, {:.0f} GFLOP per CPU-second\n", blas_num_threads(),
               peak, peak_cpu);
  if (which == "all" || which == "gemm") {
    fmt::print("tile sgemm 16x2048x144 (1 BLAS thread per OMP thread, {} threads): {:.0f} GFLOP/s\n",
               omp_get_max_threads(), tile_gemm_gflops(16, 2048, 144, 3));
    fmt::print("tile sgemm 8x2048x216: {:.0f} GFLOP/s\n", tile_gemm_gflops(8, 2048, 216, 3));
  }
  if (which == "all" || which == "2d") run_case<4>("conv2d 16->16 3x3 1x16x1024^2", {1, 16, 1024, 1024}, 16, 3, reps, peak);
  if (which == "all" || which == "3d") run_case<5>("conv3d 8->8 3x3x3 1x8x128^3", {1, 8, 128, 128, 128}, 8, 3, reps, peak);
  fmt::print("peak RSS {:.0f} MiB\n", static_cast<double>(process_peak_rss_bytes()) / (1 << 20));
  return 0;
}
