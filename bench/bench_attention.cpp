// Local attention kernel (exec::attention_forward / attention_backward, the blocked CPU kernels of
// src/exec/attention_cpu.cpp) against the machine's sgemm peak; compare with
// bench/torch_attention_ref.py (issue 7, benchmark 1; bench/run_attention.sh runs both, interleaved).
//
//   OMP_NUM_THREADS=2 build/bench/bench_attention [--n 4096] [--heads 8] [--dim 64] [--reps 3]
//                                                 [--causal 0|1] [--dtype f32|f64] [--peak 1|0]
//                                                 [--warmup 1|0]
//
// One case per process (so that the peak-RSS delta belongs to it): B = 1, H heads, N tokens,
// head dim D, operands token-major [1, N, H, D] (the local block of a DistTensor), forward then
// backward (dq, dk, dv). Prints the median / minimum of each phase over --reps repetitions (after
// one warm-up unless --warmup 0), GFLOP/s, the fraction of the sgemm peak (one large sgemm on 2 BLAS threads), and
// the peak resident memory growth from before the operands were allocated (getrusage max RSS).
// FLOPs counted: forward 4 N^2 D H (Q K^T and P V), backward 10 N^2 D H (S recomputed, dV, dP,
// dQ, dK) -- the GEMM work actually executed; "model" FLOPs (no recompute) are 12 N^2 D H.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include <shardtensor/exec/attention.hpp>
#include <shardtensor/exec/context.hpp>
#include <shardtensor/exec/blas.hpp>

#include "bench_util.hpp"

using namespace shard;

using shard::bench::median;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
/// Process CPU seconds (all threads): steadier than wall time on a shared, oversubscribed machine.
double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double max_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // kB on Linux
}


/// GFLOP/s of one n x n x n sgemm on the current BLAS threads, best of reps; also GFLOP per
/// CPU-second (best).
double sgemm_gflops(index_t n, int reps, double* per_cpu_second) {
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
  *per_cpu_second = 2.0 * n * n * n / best_cpu * 1e-9;
  return 2.0 * n * n * n / best * 1e-9;
}

template <class T>
int run(index_t N, index_t H, index_t D, int reps, bool causal, bool peak, int warmup) {
  const double rss0 = max_rss_mb();
  const index_t n = N * H * D;
  std::vector<T> q(static_cast<std::size_t>(n)), k(q.size()), v(q.size()), out(q.size()), dout(q.size()),
      dq(q.size()), dk(q.size()), dv(q.size());
  std::vector<T> lse(static_cast<std::size_t>(H * N));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto* x : {&q, &k, &v, &dout})
    for (auto& e : *x) e = static_cast<T>(nd(rng));
  const double operands_mb = static_cast<double>((8 * n + H * N) * sizeof(T)) / (1024.0 * 1024.0);
  const exec::AttnGeom g{1, H, N, N, D, D};
  // token-major [1, N, H, D] operands viewed as [1, H, N, D]
  auto view = [&](const std::vector<T>& x) {
    return exec::attention_view(dtype_of<T>, Device::cpu(), x.data(), 1, H, N, D, N * H * D, D, H * D);
  };
  const Block in_q = view(q), in_k = view(k), in_v = view(v), o = view(out), in_do = view(dout), gq = view(dq),
              gk = view(dk), gv = view(dv);
  const index_t nl = H * N;
  const Block lse_b = Block::view(dtype_of<T>, Device::cpu(), lse.data(), &nl, 1);
  exec::AttnMask m;
  m.scale = 1.0 / std::sqrt(static_cast<double>(D));
  m.causal = causal;
  auto& ctx = current_context(Device::cpu());
  std::vector<double> fwd, bwd, tot, cpu;
  for (int r = 1 - warmup; r < reps + 1; ++r) {
    std::fill(dq.begin(), dq.end(), T(0));
    std::fill(dk.begin(), dk.end(), T(0));
    std::fill(dv.begin(), dv.end(), T(0));
    const double c0 = cpu_now(), t0 = now();
    exec::attention_forward(g, m, in_q, in_k, in_v, nullptr, o, lse_b, ctx);
    const double t1 = now();
    exec::attention_backward(g, m, in_q, in_k, in_v, nullptr, o, in_do, lse_b, &gq, &gk, &gv, ctx);
    const double t2 = now(), c2 = cpu_now();
    if (r > 0) {
      cpu.push_back(c2 - c0);
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
      tot.push_back(t2 - t0);
    }
  }
  const double rss_mb = max_rss_mb() - rss0;
  const double frac = causal ? 0.5 : 1.0;  // causal: about half the tiles
  const double nn = static_cast<double>(N) * static_cast<double>(N) * static_cast<double>(D * H) * frac;
  const double f_fwd = 4 * nn, f_bwd = 10 * nn;
  std::printf("ours N=%ld H=%ld D=%ld %s%s threads=%d: fwd %.1f ms  bwd %.1f ms  total median %.1f ms  min %.1f ms\n",
              static_cast<long>(N), static_cast<long>(H), static_cast<long>(D), sizeof(T) == 4 ? "f32" : "f64",
              causal ? " causal" : "", omp_get_max_threads(), median(fwd) * 1e3, median(bwd) * 1e3,
              median(tot) * 1e3, *std::min_element(tot.begin(), tot.end()) * 1e3);
  const double gf_fwd = f_fwd / median(fwd) * 1e-9, gf_bwd = f_bwd / median(bwd) * 1e-9,
               gf_tot = (f_fwd + f_bwd) / median(tot) * 1e-9;
  std::printf("ours N=%ld: GFLOP/s (executed GEMM flops, median) fwd %.1f  bwd %.1f  total %.1f\n",
              static_cast<long>(N), gf_fwd, gf_bwd, gf_tot);
  std::printf("ours N=%ld: CPU time (all threads) per step %.1f ms -> %.1f GFLOP per CPU-second\n",
              static_cast<long>(N), median(cpu) * 1e3, (f_fwd + f_bwd) / median(cpu) * 1e-9);
  std::printf("ours N=%ld: peak RSS growth %.1f MB (operands q,k,v,out,dout,dq,dk,dv,lse: %.1f MB)\n",
              static_cast<long>(N), rss_mb, operands_mb);
  if (peak) {
    double pc = 0;
    const double p = sgemm_gflops(2048, 3, &pc);
    std::printf("sgemm 2048^3 on %d BLAS threads (%s): %.1f GFLOP/s (%.1f GFLOP per CPU-second); attention total "
                "= %.0f%% of it (fwd %.0f%%, bwd %.0f%%); per CPU-second %.0f%%\n",
                blas_num_threads(), blas_core_name(), p, pc, 100 * gf_tot / p, 100 * gf_fwd / p, 100 * gf_bwd / p,
                100 * (f_fwd + f_bwd) / median(cpu) * 1e-9 / pc);
  }
  std::printf("RESULT ours N=%ld total_ms=%.2f fwd_ms=%.2f bwd_ms=%.2f cpu_ms=%.2f rss_mb=%.1f\n",
              static_cast<long>(N), median(tot) * 1e3, median(fwd) * 1e3, median(bwd) * 1e3, median(cpu) * 1e3, rss_mb);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  index_t N = 4096, H = 8, D = 64;
  int reps = 3, warmup = 1;
  bool causal = false, peak = true;
  std::string dt = "f32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--n") N = std::stol(v);
    else if (a == "--heads") H = std::stol(v);
    else if (a == "--dim") D = std::stol(v);
    else if (a == "--reps") reps = std::stoi(v);
    else if (a == "--causal") causal = v == "1";
    else if (a == "--dtype") dt = v;
    else if (a == "--peak") peak = v == "1";
    else if (a == "--warmup") warmup = v == "0" ? 0 : 1;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  return dt == "f64" ? run<double>(N, H, D, reps, causal, peak, warmup) : run<float>(N, H, D, reps, causal, peak, warmup);
}
