// requires: mpi
// bench_dist_neighbors: the distributed neighbour queries (dist/points.hpp: shard::knn,
// shard::radius_neighbors) with the ring and the spatial-halo strategies, on the same data, in
// one run (issue 17). N points in [0,1)^3, uniform or clustered (32 Gaussian blobs, sigma 0.02;
// bench/nanoflann_direct.hpp), every point querying its kNN (k = --k) or its neighbours within
// --radius (capped at --max) among all N.
//
//   ring:  rows split evenly in global order (rank r holds rows [rN/P, (r+1)N/P)), no partition;
//          the support shards travel around the ring of all ranks.
//   halo:  the same points laid out by a box partition of their bounding box (2-D mesh px x py
//          cutting x and y; P = 2: 2 x 1, P = 4: 2 x 2), rows in global order within a rank;
//          each rank receives only the support points near its box.
//   direct (--direct, 1 rank only): nanoflann called directly on all N points, one thread.
//
// Per variant: median (over --reps, after --warmup untimed runs, default 1) of the wall time, max over ranks; the
// elements of point data every rank sent (sum over ranks, and the max), x 4 bytes (f32); the
// peak of shardtensor's tensor memory per rank (max over ranks; reset before each variant) and
// the process peak RSS. The two strategies number the points differently (global order of
// different layouts), so they are cross-checked by the sum over queries of the k-th (radius: the
// last kept) distance and of the neighbour counts, printed as `check`.
//
//   OMP_NUM_THREADS=1 mpiexec -n 4 build/bench/bench_dist_neighbors [--n 1000000] [--k 16]
//       [--radius 0.01] [--max 32] [--reps 3] [--dist uniform|clustered|both] [--query knn|radius|both]
//       [--only ring|halo] [--direct] [--warmup 1] [--dump points.f32] [--csv out.csv] [--device cpu|cuda]
// --device cuda (issue 31; bench/run_gpu_knn.sh): the point sets live on GPU rank % ngpu, the clock
// stops after the device context synchronizes, and peak_MiB is shardtensor's GPU memory (rss_MiB
// stays the host process). Prints SKIP and exits 0 where a rank sees no GPU.
// --dump writes the (first distribution's) points as raw little-endian float32 [N, 3] for
// bench/torch_knn.py (PyTorch brute force on the same data).
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <shardtensor/dist/points.hpp>
#include <shardtensor/shardtensor.hpp>

#include "bench_util.hpp"
#include "nanoflann_direct.hpp"

namespace {

using namespace shard;
using namespace shard::bench;

struct Stats {
  double median_ms = 0, p_lo = 0, p_hi = 0;
  double elements_sum = 0, elements_max = 0;
  double tensor_peak_mib = 0, rss_mib = 0;
  double check_dist = 0, check_count = 0;
};

/// Sum over all queries of the last valid entry's distance (sqrt d2) and of the valid counts.
void checksum(const Neighbors<float>& nb, const CommPtr& comm, double& dist, double& count) {
  const auto idx = nb.dist2.local().to(Device::cpu());
  const auto cnt = nb.counts.local().to(Device::cpu());
  const index_t rows = idx.shape()[0], w = idx.shape()[1];
  double s[2] = {0, 0};
  for (index_t i = 0; i < rows; ++i) {
    const index_t c = cnt.data()[i];
    s[1] += static_cast<double>(c);
    if (c > 0) s[0] += std::sqrt(static_cast<double>(idx.data()[i * w + c - 1]));
  }
  comm->allreduce(s, s, 2, DType::f64, ReduceOp::sum);
  dist = s[0];
  count = s[1];
}

template <class Fn>
Stats run_variant(const CommPtr& comm, int reps, int warmup, Device dev, Fn&& fn) {
  Stats st;
  std::vector<double> times;
  for (int r = 1 - warmup; r <= reps; ++r) {
    current_context(dev).synchronize();
    comm->barrier();
    reset_peak_memory(dev.kind);
    const double t0 = now_ms();
    Neighbors<float> nb = fn();
    current_context(dev).synchronize();
    double t = now_ms() - t0;
    comm->allreduce(&t, &t, 1, DType::f64, ReduceOp::max);
    if (r <= 0) continue;  // warm-up
    times.push_back(t);
    if (r == reps) {
      double e[2] = {static_cast<double>(nb.elements_sent), static_cast<double>(nb.elements_sent)};
      comm->allreduce(&e[0], &e[0], 1, DType::f64, ReduceOp::sum);
      comm->allreduce(&e[1], &e[1], 1, DType::f64, ReduceOp::max);
      st.elements_sum = e[0];
      st.elements_max = e[1];
      double m[2] = {mib(static_cast<double>(memory_stats(dev.kind).peak_bytes)),
                     mib(static_cast<double>(process_peak_rss_bytes()))};
      comm->allreduce(m, m, 2, DType::f64, ReduceOp::max);
      st.tensor_peak_mib = m[0];
      st.rss_mib = m[1];
      checksum(nb, comm, st.check_dist, st.check_count);
    }
  }
  std::sort(times.begin(), times.end());
  st.median_ms = median(times);
  st.p_lo = times.front();
  st.p_hi = times.back();
  return st;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    auto world = MpiComm::world();
    const int P = world->size(), me = world->rank();
    const index_t n = arg_int(argc, argv, "--n", 1000000);
    const index_t k = arg_int(argc, argv, "--k", 16);
    const double radius = arg_double(argc, argv, "--radius", 0.01);
    const index_t maxn = arg_int(argc, argv, "--max", 32);
    const int reps = static_cast<int>(arg_int(argc, argv, "--reps", 3));
    const int warmup = static_cast<int>(arg_int(argc, argv, "--warmup", 1));
    const std::string dists = arg_str(argc, argv, "--dist", "both");
    const std::string queries = arg_str(argc, argv, "--query", "both");
    const std::string only = arg_str(argc, argv, "--only", "");
    const std::string dump = arg_str(argc, argv, "--dump", "");
    const std::string csv = arg_str(argc, argv, "--csv", "");
    const bool direct_too = has_flag(argc, argv, "--direct") && P == 1;
    const std::string device = arg_str(argc, argv, "--device", "cpu");
    if (device != "cpu" && device != "cuda") throw std::runtime_error("--device must be cpu or cuda, got " + device);
    Device dev = Device::cpu();
    if (device == "cuda") {
      int ngpu = cuda_device_count(), min_gpu = 0;
      MPI_Allreduce(&ngpu, &min_gpu, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      if (min_gpu == 0) {
        if (me == 0) std::printf("SKIP bench_dist_neighbors --device cuda: no GPU visible (or no CUDA backend)\n");
        MPI_Finalize();
        return 0;
      }
      dev = Device::cuda(me % ngpu);
    }
    int px = P, py = 1;
    for (int a = 1; a * a <= P; ++a)
      if (P % a == 0) py = a, px = P / a;
    DeviceMesh mesh(world, {px, py}, {"x", "y"});
    FILE* out = (!csv.empty() && me == 0) ? std::fopen(csv.c_str(), "a") : nullptr;
    if (me == 0) {
      std::printf("# bench_dist_neighbors: N=%lld, %d ranks (mesh %dx%d), k=%lld, radius=%g (max %lld), reps=%d, "
                  "device %s, OMP_NUM_THREADS=%s, load %.2f\n",
                  static_cast<long long>(n), P, px, py, static_cast<long long>(k), radius,
                  static_cast<long long>(maxn), reps, device.c_str(), std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "-",
                  load_average());
      std::printf("%-9s %-6s %-6s %10s %10s %10s %14s %14s %10s %10s %16s %12s\n", "dist", "query", "strat",
                  "median_ms", "min_ms", "max_ms", "sent_MB_sum", "sent_MB_max", "peak_MiB", "rss_MiB", "check_dist",
                  "check_cnt");
    }
    bool dumped = false;
    for (const bool clustered : {false, true}) {
      if (dists != "both" && dists != (clustered ? "clustered" : "uniform")) continue;
      std::vector<float> all = make_points(n, clustered, 12345);
      if (!dump.empty() && !dumped && me == 0) {
        FILE* f = std::fopen(dump.c_str(), "wb");
        std::fwrite(all.data(), sizeof(float), all.size(), f);
        std::fclose(f);
        dumped = true;
      }
      // ring layout: even contiguous rows
      std::vector<index_t> counts(static_cast<std::size_t>(P));
      for (int r = 0; r < P; ++r) counts[static_cast<std::size_t>(r)] = (n * (r + 1)) / P - (n * r) / P;
      const DistSpec ring_spec = point_spec(mesh, counts, 3);
      const index_t off = (n * me) / P;
      auto ring_local = Tensor<float, 2>::empty({counts[static_cast<std::size_t>(me)], 3});
      std::copy(all.begin() + off * 3, all.begin() + (off + counts[static_cast<std::size_t>(me)]) * 3, ring_local.data());
      DistTensor<float, 2> ring_pts = DistTensor<float, 2>(ring_spec, ring_local).to(dev);
      // halo layout: box partition of the bounding box
      std::vector<double> lo(3, 1e30), hi(3, -1e30);
      for (index_t i = 0; i < n; ++i)
        for (int d = 0; d < 3; ++d) {
          lo[d] = std::min(lo[d], static_cast<double>(all[i * 3 + d]));
          hi[d] = std::max(hi[d], static_cast<double>(all[i * 3 + d]));
        }
      const BoxPartition part = BoxPartition::uniform(mesh, lo, hi, {0, 1, -1});
      std::vector<index_t> hcounts(static_cast<std::size_t>(P), 0);
      std::vector<float> mine;
      for (index_t i = 0; i < n; ++i) {
        const double p[3] = {all[i * 3], all[i * 3 + 1], all[i * 3 + 2]};
        const int o = part.owner(p);
        ++hcounts[static_cast<std::size_t>(o)];
        if (o == me) mine.insert(mine.end(), all.begin() + i * 3, all.begin() + i * 3 + 3);
      }
      auto halo_local = Tensor<float, 2>::empty({hcounts[static_cast<std::size_t>(me)], 3});
      std::copy(mine.begin(), mine.end(), halo_local.data());
      DistTensor<float, 2> halo_pts = DistTensor<float, 2>(point_spec(mesh, hcounts, 3), halo_local).to(dev);
      std::vector<float>().swap(mine);
      if (!direct_too) std::vector<float>().swap(all);

      for (const bool knn_q : {true, false}) {
        if (queries != "both" && queries != (knn_q ? "knn" : "radius")) continue;
        auto report = [&](const char* strat, const Stats& s) {
          if (me != 0) return;
          const char* dn = clustered ? "clustered" : "uniform";
          const char* qn = knn_q ? "knn" : "radius";
          std::printf("%-9s %-6s %-6s %10.1f %10.1f %10.1f %14.2f %14.2f %10.1f %10.1f %16.6f %12.0f\n", dn, qn, strat,
                      s.median_ms, s.p_lo, s.p_hi, s.elements_sum * 4 / 1e6, s.elements_max * 4 / 1e6,
                      s.tensor_peak_mib, s.rss_mib, s.check_dist, s.check_count);
          std::fflush(stdout);
          if (out)
            std::fprintf(out, "%lld,%d,%s,%s,%s,%.3f,%.3f,%.3f,%.0f,%.0f,%.2f,%.2f,%.9g,%.0f,%.2f\n",
                         static_cast<long long>(n), P, dn, qn, strat, s.median_ms, s.p_lo, s.p_hi, s.elements_sum,
                         s.elements_max, s.tensor_peak_mib, s.rss_mib, s.check_dist, s.check_count, load_average());
        };
        if (only.empty() || only == "ring") {
          NeighborQueryOptions o;
          o.strategy = NeighborStrategy::ring;
          report("ring", run_variant(world, reps, warmup, dev, [&] {
                   return knn_q ? knn(ring_pts, ring_pts, k, o) : radius_neighbors(ring_pts, ring_pts, radius, maxn, o);
                 }));
        }
        if (only.empty() || only == "halo") {
          NeighborQueryOptions o;
          o.strategy = NeighborStrategy::spatial_halo;
          o.partition = &part;
          report("halo", run_variant(world, reps, warmup, dev, [&] {
                   return knn_q ? knn(halo_pts, halo_pts, k, o) : radius_neighbors(halo_pts, halo_pts, radius, maxn, o);
                 }));
        }
        if (direct_too) {
          std::vector<double> t;
          std::vector<float> kth;
          for (int r = 1 - warmup; r <= reps; ++r) {
            const double ms = direct(all, n, knn_q, k, static_cast<float>(radius * radius), maxn, kth);
            if (r > 0) t.push_back(ms);
          }
          double cd = 0;
          for (float v : kth)
            if (std::isfinite(v)) cd += std::sqrt(static_cast<double>(v));
          Stats s;
          std::sort(t.begin(), t.end());
          s.median_ms = median(t);
          s.p_lo = t.front();
          s.p_hi = t.back();
          s.rss_mib = mib(static_cast<double>(process_peak_rss_bytes()));
          s.check_dist = cd;
          report("direct", s);
        }
      }
    }
    if (out) std::fclose(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dist_neighbors: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
