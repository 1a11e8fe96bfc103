// requires: mpi
// Output paths of a sharded field: full_tensor() (everyone gets everything) vs gather_to(0)
// (root only), and parallel-HDF5 write/read of the same field (io/hdf5.hpp). Prints, per path,
// the median time over --reps runs and the per-rank peak of shardtensor's allocations during
// the call (memory_stats): root and the largest non-root rank.
//   mpiexec -n 4 build/bench/bench_io [--n 96] [--reps 5] [--dir /tmp]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <shardtensor/shardtensor.hpp>
#include <string>
#include <vector>

using namespace shard;

namespace {
struct Row {
  std::string name;
  double median_ms = 0;
  double root_peak_mb = 0, other_peak_mb = 0;
};

Row measure(const std::string& name, Communicator& comm, int reps, const std::function<void()>& f) {
  std::vector<double> ts;
  std::size_t peak = 0;
  for (int r = 0; r < reps; ++r) {
    comm.barrier();
    release_cached_memory();
    reset_peak_memory();
    const std::size_t before = memory_stats().current_bytes;
    const auto t0 = std::chrono::steady_clock::now();
    f();
    comm.barrier();
    ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    peak = std::max(peak, memory_stats().peak_bytes - before);
  }
  std::sort(ts.begin(), ts.end());
  auto peaks = comm.allgather_value(static_cast<std::int64_t>(peak));
  Row row{name, ts[ts.size() / 2], peaks[0] / 1048576.0, 0};
  for (std::size_t r = 1; r < peaks.size(); ++r) row.other_peak_mb = std::max(row.other_peak_mb, peaks[r] / 1048576.0);
  return row;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int ret = 0;
  {
    index_t n = 96;
    int reps = 5;
    std::string dir = "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string a = argv[i];
      if (a == "--n") n = std::stoll(argv[i + 1]);
      else if (a == "--reps") reps = std::stoi(argv[i + 1]);
      else if (a == "--dir") dir = argv[i + 1];
    }
    auto comm = MpiComm::world();
    DeviceMesh mesh(comm, {comm->size()});
    auto u = DistTensor<double, 3>::random({n, n, n}, mesh, {Shard(0)}, 1);
    const std::string path = fmt::format("{}/bench_io_{}.h5", dir, comm->size());
    std::vector<Row> rows;
    rows.push_back(measure("full_tensor()", *comm, reps, [&] { (void)u.full_tensor(); }));
    rows.push_back(measure("gather_to(0)", *comm, reps, [&] { (void)u.gather_to(0); }));
    const auto full = u.gather_to(0);
    rows.push_back(measure("scatter_from(0)", *comm, reps, [&] {
      (void)DistTensor<double, 3>::scatter_from(full, 0, mesh, {Shard(0)});
    }));
    if (io::hdf5_available()) {
      rows.push_back(measure("io::write_hdf5", *comm, reps, [&] { io::write_hdf5(path, "u", u); }));
      rows.push_back(measure("io::read_hdf5", *comm, reps, [&] { (void)io::read_hdf5<double, 3>(path, "u", mesh, {Shard(0)}); }));
    }
    if (comm->rank() == 0) {
      std::printf("bench_io: %d ranks, field %lldx%lldx%lld f64 (%.1f MiB global, %.1f MiB per rank), %d reps\n",
                  comm->size(), static_cast<long long>(n), static_cast<long long>(n), static_cast<long long>(n),
                  n * n * n * 8 / 1048576.0, n * n * n * 8 / 1048576.0 / comm->size(), reps);
      std::printf("%-18s %12s %16s %20s\n", "path", "median ms", "root peak MiB", "non-root peak MiB");
      for (auto& r : rows) std::printf("%-18s %12.2f %16.1f %20.1f\n", r.name.c_str(), r.median_ms, r.root_peak_mb, r.other_peak_mb);
      std::filesystem::remove(path);
    }
  }
  MPI_Finalize();
  return ret;
}
