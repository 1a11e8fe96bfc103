// bench_neighbors: the neighbors kernel family's CPU table (exec::neighbors_knn / _radius: exact
// (d2, index) order over a nanoflann k-d tree) against nanoflann called directly (its own
// KNNResultSet / radiusSearch, same leaf size, no tie handling) and against brute force (our
// table forced to NeighborMethod::brute on a subsample of the queries, extrapolated to all).
// kNN (k = 16) and radius (capped) queries on N uniform and N clustered 3-D points, the points
// querying themselves; tree build included in every time (each call builds its tree). Reports
// the median of --reps repetitions (ours and direct interleaved). Single rank; threads from
// OMP_NUM_THREADS (nanoflann direct always runs on one thread).
//
// kth_mismatch counts queries whose k-th (radius: last kept) distance differs from nanoflann's;
// radius can differ legitimately: nanoflann keeps d2 < r2, we keep d2 <= r2.
//
//   OMP_NUM_THREADS=1 build/bench/bench_neighbors [--n 1000000] [--reps 3] [--k 16] [--radius 0.02]
//       [--max 32] [--brute-queries 200] [--crossover]
// --crossover instead times tree vs brute for small support / query counts (the automatic
// method's thresholds in src/exec/neighbors_cpu.cpp).
#include <nanoflann.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <shardtensor/exec/neighbors.hpp>

#include "nanoflann_direct.hpp"

using namespace shard;
using namespace shard::bench;
using exec::KnnGeometry;
using exec::NeighborMethod;
using exec::RadiusGeometry;

namespace {


/// Ours over nq queries (the first nq points) against all n points; returns ms.
double ours(const std::vector<float>& pts, index_t n, index_t nq, bool knn, index_t k, double r, index_t maxn,
            NeighborMethod m, std::vector<float>* kth) {
  const index_t w = knn ? k : maxn;
  const Block q = Block::view(DType::f32, Device::cpu(), const_cast<float*>(pts.data()), std::vector<index_t>{nq, 3}.data(), 2);
  const Block s = Block::view(DType::f32, Device::cpu(), const_cast<float*>(pts.data()), std::vector<index_t>{n, 3}.data(), 2);
  const Block idx = Block::allocate(DType::i64, Device::cpu(), {nq, w});
  const Block d2 = Block::allocate(DType::f32, Device::cpu(), {nq, w});
  const Block cnt = Block::allocate(DType::i64, Device::cpu(), {nq});
  ExecContext ctx(Device::cpu());
  const double t0 = now_ms();
  if (knn)
    exec::neighbors_knn(KnnGeometry{nq, n, 3, k, 0, m}, q, s, idx, d2, ctx);
  else
    exec::neighbors_radius(RadiusGeometry{nq, n, 3, r, maxn, 0, m}, q, s, idx, d2, cnt, ctx);
  const double t = now_ms() - t0;
  if (kth) {
    kth->resize(static_cast<std::size_t>(nq));
    const float* dp = static_cast<const float*>(d2.data);
    const index_t* cp = static_cast<const index_t*>(cnt.data);
    for (index_t i = 0; i < nq; ++i)
      (*kth)[static_cast<std::size_t>(i)] = knn ? dp[i * w + k - 1] : (cp[i] == 0 ? INFINITY : dp[i * w + cp[i] - 1]);
  }
  return t;
}

void crossover() {
  std::printf("# tree vs brute (ms, k = 16 or fewer, uniform 3-D f32; build included)\n");
  std::printf("%8s %8s %10s %10s\n", "Ns", "Nq", "tree", "brute");
  for (index_t ns : {64, 128, 256, 512, 1024, 4096, 16384})
    for (index_t nq : {1, 4, 16, 64, 256}) {
      const auto pts = make_points(std::max(ns, nq), false, 1);
      std::vector<double> tt, tb;
      for (int r = 0; r < 7; ++r) {
        tt.push_back(ours(pts, ns, nq, true, std::min<index_t>(16, ns), 0, 1, NeighborMethod::tree, nullptr));
        tb.push_back(ours(pts, ns, nq, true, std::min<index_t>(16, ns), 0, 1, NeighborMethod::brute, nullptr));
      }
      std::printf("%8lld %8lld %10.4f %10.4f\n", static_cast<long long>(ns), static_cast<long long>(nq), median(tt),
                  median(tb));
    }
}

}  // namespace

int main(int argc, char** argv) {
  index_t n = 1000000, k = 16, maxn = 32, brute_q = 200;
  int reps = 3;
  double radius = 0.02;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : "0"; };
    if (a == "--n") n = std::atoll(next());
    else if (a == "--reps") reps = std::atoi(next());
    else if (a == "--k") k = std::atoll(next());
    else if (a == "--radius") radius = std::atof(next());
    else if (a == "--max") maxn = std::atoll(next());
    else if (a == "--brute-queries") brute_q = std::atoll(next());
    else if (a == "--crossover") {
      crossover();
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::printf("# N = %lld 3-D f32 points querying themselves; k = %lld; radius %.3g capped at %lld; median of %d\n",
              static_cast<long long>(n), static_cast<long long>(k), radius, static_cast<long long>(maxn), reps);
  std::printf("%-10s %-7s %12s %12s %4s %10s %16s %14s\n", "cloud", "query", "ours_ms", "nanoflann_ms", "reps",
              "ours/nf", "brute_ms(extrap)", "kth_mismatch");
  for (bool clustered : {false, true}) {
    const auto pts = make_points(n, clustered, 42);
    for (bool knn : {true, false}) {
      std::vector<double> to, td;
      std::vector<float> ko, kd;
      for (int r = 0; r < reps; ++r) {
        // nanoflann's uncapped radius search on the clustered cloud takes minutes: one rep only
        // once a rep has taken over 20 s (the table says how many).
        const bool more_direct = td.empty() || td.back() < 20000;
        if (r % 2 == 0) {
          to.push_back(ours(pts, n, n, knn, k, radius, maxn, NeighborMethod::automatic, &ko));
          if (more_direct) td.push_back(direct(pts, n, knn, k, static_cast<float>(radius * radius), maxn, kd));
        } else {
          if (more_direct) td.push_back(direct(pts, n, knn, k, static_cast<float>(radius * radius), maxn, kd));
          to.push_back(ours(pts, n, n, knn, k, radius, maxn, NeighborMethod::automatic, &ko));
        }
      }
      index_t mismatch = 0;  // the k-th (last kept) distance must agree; ties may differ in index only
      for (index_t i = 0; i < n; ++i) mismatch += ko[static_cast<std::size_t>(i)] != kd[static_cast<std::size_t>(i)];
      const index_t bq = std::min(brute_q, n);
      const double tb = ours(pts, n, bq, knn, k, radius, maxn, NeighborMethod::brute, nullptr) *
                        static_cast<double>(n) / static_cast<double>(bq);
      std::printf("%-10s %-7s %12.1f %12.1f %4zu %10.2f %16.0f %14lld\n", clustered ? "clustered" : "uniform",
                  knn ? "knn" : "radius", median(to), median(td), td.size(), median(to) / median(td), tb,
                  static_cast<long long>(mismatch));
      std::fflush(stdout);
    }
  }
  return 0;
}
