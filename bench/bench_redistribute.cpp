// requires: mpi
// bench_redistribute: DistTensor::redistribute against hand-written MPI moving the same bytes,
// measured in the same run, interleaved (the variants run in a new random order every repetition).
//
//   Shard(0) -> Shard(1) of an n x n fp32 tensor on a 1-D mesh, against
//     hand "pack + MPI_Alltoallv": pack each peer's column block into a send buffer, one
//         MPI_Alltoallv straight into the output (each peer's rows land as one contiguous run
//         of the column-split output, so no unpack is needed);
//     hand "bare MPI_Alltoallv": the same call on buffers packed beforehand (a lower bound).
//   Shard(0) -> Replicate against one MPI_Allgatherv into the output.
// Hand-written buffers are allocated once and reused; ours allocates its result every call.
// Every variant's result is checked against the others (bitwise) before timing.
//
//   mpiexec -n 2 ./bench_redistribute [--n 4096] [--reps 60] [--warmup 5] [--csv medians.csv]
// Prints per-variant median / p10 / p90 of the per-repetition maximum over ranks, the ratios
// ours / hand-written, and per-rank memory (shardtensor peak, process peak RSS).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <shardtensor/shardtensor.hpp>
#include <string>
#include <vector>

namespace {

using namespace shard;
using Clock = std::chrono::steady_clock;

struct Variant {
  std::string name;
  std::function<void()> run;
  std::vector<double> ms;          // per repetition: max over ranks
  std::size_t extra_peak = 0;      // shardtensor bytes allocated beyond the input during one call
};

/// Zero-filled float buffer, 64-byte aligned like shardtensor's own host blocks (a std::vector's
/// 16-byte alignment makes MPI's copies measurably slower, which would flatter our ratios).
class AlignedBuffer {
 public:
  explicit AlignedBuffer(std::size_t n)
      : n_(n), p_(static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64)), &std::free) {
    if (!p_) throw std::bad_alloc();
    std::memset(p_.get(), 0, n * sizeof(float));
  }
  float* data() const { return p_.get(); }
  std::size_t size() const { return n_; }

 private:
  std::size_t n_;
  std::unique_ptr<float, decltype(&std::free)> p_;
};

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto i = static_cast<std::size_t>(pos);
  const double f = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

const char* arg_str(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return nullptr;
}

int arg_int(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int exit_code = 0;
  try {
    const index_t n = arg_int(argc, argv, "--n", 4096);
    const int reps = arg_int(argc, argv, "--reps", 60), warmup = arg_int(argc, argv, "--warmup", 5);
    auto comm = std::make_shared<MpiComm>(MPI_COMM_WORLD);  // shardtensor works on its own duplicate
    MPI_Comm hand = MPI_COMM_NULL;                            // the hand-written code gets its own too
    MPI_Comm_dup(MPI_COMM_WORLD, &hand);
    const int P = comm->size(), me = comm->rank();
    DeviceMesh mesh(comm);

    using DT = DistTensor<float, 2>;
    const DT a = DT::random({n, n}, mesh, {Shard(0)}, 11);
    const float* in = a.local().data();
    const index_t my_rows = a.local().size(0);
    std::vector<index_t> row_off(P), row_len(P), col_off(P), col_len(P);
    for (int p = 0; p < P; ++p) {
      row_off[p] = balanced_offset(n, P, p);
      row_len[p] = balanced_size(n, P, p);
      col_off[p] = balanced_offset(n, P, p);
      col_len[p] = balanced_size(n, P, p);
    }
    const index_t my_cols = col_len[me];

    // ---- hand-written Shard(0) -> Shard(1): buffers, counts, displacements (set up once)
    AlignedBuffer sendbuf(static_cast<std::size_t>(my_rows * n)), out_cols(static_cast<std::size_t>(n * my_cols));
    std::vector<int> sc(P), sd(P), rc(P), rd(P);
    for (int p = 0, off = 0; p < P; ++p) {
      sc[p] = static_cast<int>(my_rows * col_len[p]);
      sd[p] = off;
      off += sc[p];
      rc[p] = static_cast<int>(row_len[p] * my_cols);
      rd[p] = static_cast<int>(row_off[p] * my_cols);
    }
    auto pack = [&] {
      for (int p = 0; p < P; ++p) {
        float* dst = sendbuf.data() + sd[p];
        for (index_t i = 0; i < my_rows; ++i)
          std::memcpy(dst + i * col_len[p], in + i * n + col_off[p], sizeof(float) * static_cast<std::size_t>(col_len[p]));
      }
    };
    auto alltoallv = [&] {
      MPI_Alltoallv(sendbuf.data(), sc.data(), sd.data(), MPI_FLOAT, out_cols.data(), rc.data(), rd.data(), MPI_FLOAT,
                    hand);
    };
    // ---- hand-written Shard(0) -> Replicate
    AlignedBuffer out_full(static_cast<std::size_t>(n * n));
    std::vector<int> gc(P), gd(P);
    for (int p = 0; p < P; ++p) {
      gc[p] = static_cast<int>(row_len[p] * n);
      gd[p] = static_cast<int>(row_off[p] * n);
    }
    auto allgatherv = [&] {
      MPI_Allgatherv(in, static_cast<int>(my_rows * n), MPI_FLOAT, out_full.data(), gc.data(), gd.data(), MPI_FLOAT,
                     hand);
    };

    // ---- correctness first: every variant produces the same bytes
    pack();
    alltoallv();
    allgatherv();
    const DT ours_cols = a.redistribute({Shard(1)}), ours_full = a.redistribute({Replicate()});
    bool ok = ours_cols.local().is_contiguous() && ours_full.local().is_contiguous() &&
              std::memcmp(ours_cols.local().data(), out_cols.data(), out_cols.size() * sizeof(float)) == 0 &&
              std::memcmp(ours_full.local().data(), out_full.data(), out_full.size() * sizeof(float)) == 0;
    comm->check_all(ok, "bench_redistribute", "ours and the hand-written MPI results differ");

    std::vector<Variant> v;
    v.push_back({"ours Shard(0)->Shard(1)", [&] { auto r = a.redistribute({Shard(1)}); }, {}, 0});
    v.push_back({"hand pack + MPI_Alltoallv", [&] { pack(); alltoallv(); }, {}, 0});
    v.push_back({"hand bare MPI_Alltoallv (pre-packed)", alltoallv, {}, 0});
    v.push_back({"ours Shard(0)->Replicate", [&] { auto r = a.redistribute({Replicate()}); }, {}, 0});
    v.push_back({"hand MPI_Allgatherv", allgatherv, {}, 0});

    const std::size_t base = memory_stats().current_bytes;
    std::vector<std::size_t> order(v.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::mt19937 rng(12345);  // same seed on every rank: the same order everywhere
    for (int r = 0; r < warmup + reps; ++r) {
      std::shuffle(order.begin(), order.end(), rng);  // a new random order every repetition
      for (std::size_t k : order) {
        auto& var = v[k];
        reset_peak_memory();
        MPI_Barrier(hand);
        const auto t0 = Clock::now();
        var.run();
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        var.extra_peak = std::max(var.extra_peak, memory_stats().peak_bytes - base);
        MPI_Allreduce(MPI_IN_PLACE, &ms, 1, MPI_DOUBLE, MPI_MAX, hand);
        if (r >= warmup) var.ms.push_back(ms);
      }
    }

    // ---- report
    std::vector<double> med(v.size());
    for (std::size_t k = 0; k < v.size(); ++k) med[k] = quantile(v[k].ms, 0.5);
    unsigned long long extra[3] = {v[0].extra_peak, v[3].extra_peak, memory_stats().cached_bytes};
    unsigned long long peak_rss = process_peak_rss_bytes();
    std::vector<unsigned long long> all_rss(static_cast<std::size_t>(P)), all_extra(static_cast<std::size_t>(3 * P));
    MPI_Gather(&peak_rss, 1, MPI_UNSIGNED_LONG_LONG, all_rss.data(), 1, MPI_UNSIGNED_LONG_LONG, 0, hand);
    MPI_Gather(extra, 3, MPI_UNSIGNED_LONG_LONG, all_extra.data(), 3, MPI_UNSIGNED_LONG_LONG, 0, hand);
    if (me == 0) {
      char lib[MPI_MAX_LIBRARY_VERSION_STRING];
      int len = 0;
      MPI_Get_library_version(lib, &len);
      std::string libs(lib, static_cast<std::size_t>(len));
      libs = libs.substr(0, libs.find_first_of(",\n"));
      const double mib = static_cast<double>(n * n) * sizeof(float) / (1 << 20);
      std::printf("bench_redistribute: %lld x %lld fp32 (%.0f MiB global), %d ranks, %d reps (+%d warm-up), "
                  "OMP_NUM_THREADS=%s, %s\n",
                  static_cast<long long>(n), static_cast<long long>(n), mib, P, reps, warmup,
                  std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "unset", libs.c_str());
      std::printf("%-40s %10s %10s %10s\n", "variant (max over ranks per rep)", "median ms", "p10 ms", "p90 ms");
      for (std::size_t k = 0; k < v.size(); ++k)
        std::printf("%-40s %10.3f %10.3f %10.3f\n", v[k].name.c_str(), med[k], quantile(v[k].ms, 0.1),
                    quantile(v[k].ms, 0.9));
      auto p10 = [&](std::size_t k) { return quantile(v[k].ms, 0.1); };
      std::printf("ratio of medians (of p10s) Shard(0)->Shard(1)   ours / (pack + MPI_Alltoallv) = %.3f (%.3f)\n",
                  med[0] / med[1], p10(0) / p10(1));
      std::printf("ratio of medians (of p10s) Shard(0)->Shard(1)   ours / bare MPI_Alltoallv     = %.3f (%.3f)\n",
                  med[0] / med[2], p10(0) / p10(2));
      std::printf("ratio of medians (of p10s) Shard(0)->Replicate  ours / MPI_Allgatherv         = %.3f (%.3f)\n",
                  med[3] / med[4], p10(3) / p10(4));
      const double in_mib = static_cast<double>(n / P * n) * sizeof(float) / (1 << 20);
      std::printf("memory per rank: input block %.1f MiB; hand-written buffers %.1f MiB (send %.1f + out %.1f + "
                  "gathered %.1f)\n",
                  in_mib, static_cast<double>((sendbuf.size() + out_cols.size() + out_full.size()) * sizeof(float)) / (1 << 20),
                  static_cast<double>(sendbuf.size() * sizeof(float)) / (1 << 20),
                  static_cast<double>(out_cols.size() * sizeof(float)) / (1 << 20),
                  static_cast<double>(out_full.size() * sizeof(float)) / (1 << 20));
      if (const char* csv = arg_str(argc, argv, "--csv")) {  // for plotting: variant, median, p10, p90
        if (FILE* f = std::fopen(csv, "w")) {
          std::fprintf(f, "variant,median_ms,p10_ms,p90_ms\n");
          for (std::size_t k = 0; k < v.size(); ++k)
            std::fprintf(f, "\"%s\",%.4f,%.4f,%.4f\n", v[k].name.c_str(), med[k], quantile(v[k].ms, 0.1),
                         quantile(v[k].ms, 0.9));
          std::fclose(f);
        }
      }
      for (int p = 0; p < P; ++p)
        std::printf("  rank %d: shardtensor peak beyond input during Shard(0)->Shard(1) %.1f MiB, ->Replicate %.1f MiB; "
                    "host block cache at the end %.1f MiB; process peak RSS %.1f MiB\n",
                    p, static_cast<double>(all_extra[3 * p]) / (1 << 20),
                    static_cast<double>(all_extra[3 * p + 1]) / (1 << 20),
                    static_cast<double>(all_extra[3 * p + 2]) / (1 << 20), static_cast<double>(all_rss[p]) / (1 << 20));
    }
    MPI_Comm_free(&hand);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_redistribute: %s\n", e.what());
    exit_code = 1;
  }
  MPI_Finalize();
  return exit_code;
}
