// requires: mpi
// bench_halo_gpu: halo exchange (forward) and its adjoint on device tensors, through NCCL
// against the MPI fallback (issue 6, item 9: "halo exchange time over NCCL against the MPI
// fallback"). GPU-only: without a visible GPU it prints "SKIP ..." and exits 0.
//
//   mpiexec -n P build/bench/bench_halo_gpu [--reps 20] [--shape N,C,H,W] [--width 1] [--dtype f32|f64]
//
// Global tensor N x C x H x W (default 1 x 32 x (1024 P) x 1024, fp32) sharded along H over a 1-D
// mesh of P ranks, ghost width `--width` along H and W (zero boundary), so each rank exchanges
// two faces of C x W x width with its neighbours. Each rank uses GPU (rank % visible GPUs).
// Transports, one after another on the same data:
//   nccl        make_device_comm(world, dev, false): NcclComm (grouped ncclSend/ncclRecv); skipped
//               with a message when ranks share a GPU (NCCL refuses them) or no NCCL backend;
//   mpi         the MPI fallback as make_device_comm picks it (automatic: device pointers to MPI
//               when it is CUDA-aware, else staged through pinned host buffers);
//   mpi-staged  the MPI fallback forced to stage through pinned host buffers.
// Prints one line per transport:
//   RESULT <transport> ranks <P> bytes_per_rank <b> fwd_ms <median> adj_ms <median>
// (medians over the timed reps after 3 warm-up reps; each timed rep ends with a device
// synchronize and a barrier, and the slowest rank's time counts). bench/run_gpu_halo.sh runs it
// and prints the ratios mpi / nccl.
#include <fmt/core.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <shardtensor/comm/device_comm.hpp>
#include <shardtensor/comm/mpi_comm.hpp>
#include <shardtensor/dist/halo.hpp>
#include <shardtensor/exec/context.hpp>

#include "bench_util.hpp"

using namespace shard;

using shard::bench::now_ms;
using shard::bench::median;

namespace {

struct Args {
  int reps = 20;
  std::vector<index_t> shape;  // empty: default for P
  index_t width = 1;
  std::string dtype = "f32";
};

Args parse(int argc, char** argv, int P) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--reps") a.reps = std::max(1, std::atoi(v.c_str()));
    else if (k == "--width") a.width = std::max<index_t>(1, std::atoll(v.c_str()));
    else if (k == "--dtype") a.dtype = v;
    else if (k == "--shape") {
      std::size_t pos = 0;
      while (pos <= v.size()) {
        const std::size_t q = v.find(',', pos);
        a.shape.push_back(std::atoll(v.substr(pos, q - pos).c_str()));
        if (q == std::string::npos) break;
        pos = q + 1;
      }
    }
  }
  if (a.shape.size() != 4) a.shape = {1, 32, 1024 * static_cast<index_t>(P), 1024};
  return a;
}

/// Times forward and adjoint of the halo exchange of x on `comm` (collective over it).
template <class T>
void run(const char* name, const CommPtr& comm, const Args& a, Device dev) {
  DeviceMesh mesh(comm, {comm->size()});
  const Shape<4> gs{a.shape[0], a.shape[1], a.shape[2], a.shape[3]};
  auto x = DistTensor<T, 4>::random(gs, mesh, {Shard(2)}, 1).to(dev);
  const HaloSpec halo{{0, 0, a.width, a.width}, {0, 0, a.width, a.width}, std::vector<Boundary>(4, Boundary::zero)};
  ExecContext& ctx = current_context(dev);
  std::vector<double> fwd, adj;
  for (int r = 0; r < a.reps + 3; ++r) {
    ctx.synchronize();
    comm->barrier();
    const double t0 = now_ms();
    Tensor<T, 4> ext = halo_exchange(x, halo);
    ctx.synchronize();
    comm->barrier();
    const double t1 = now_ms();
    Tensor<T, 4> gx = halo_exchange_adjoint(x.spec(), ext, halo, /*overwrite_grad_ext=*/true);
    ctx.synchronize();
    comm->barrier();
    const double t2 = now_ms();
    if (r >= 3) {
      double t[2] = {t1 - t0, t2 - t1}, m[2] = {0, 0};
      MPI_Allreduce(t, m, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slowest rank counts
      fwd.push_back(m[0]);
      adj.push_back(m[1]);
    }
  }
  // Bytes this rank receives per exchange: two H faces of the extended W (interior ranks).
  const double bytes = 2.0 * static_cast<double>(a.width) * static_cast<double>(gs[0] * gs[1]) *
                       static_cast<double>(gs[3] + 2 * a.width) * sizeof(T);
  if (comm->rank() == 0)
    fmt::print("RESULT {} ranks {} bytes_per_rank {:.0f} fwd_ms {:.4f} adj_ms {:.4f}\n", name, comm->size(), bytes,
               median(fwd), median(adj));
}

template <class T>
void run_all(const Args& a, Device dev) {
  auto world = MpiComm::world();
  // NCCL (or a clear reason why not, on every rank alike).
  CommPtr nccl;
  std::string why;
  try {
    nccl = make_device_comm(world, dev, /*allow_fallback=*/false);
    if (nccl.get() == world.get()) why = "make_device_comm returned the MPI communicator (no NCCL backend linked)";
  } catch (const Error& e) {
    why = e.what();
  }
  if (why.empty()) run<T>("nccl", nccl, a, dev);
  else if (world->rank() == 0) fmt::print("SKIP nccl: {}\n", why);
  run<T>("mpi", world->split(0, world->rank()), a, dev);
  auto staged = world->split(0, world->rank());
  if (auto* m = dynamic_cast<MpiComm*>(staged.get())) m->set_device_transport(MpiDeviceTransport::staged);
  run<T>("mpi-staged", staged, a, dev);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const int ngpu = cuda_device_count();
  int min_gpu = 0;
  MPI_Allreduce(&ngpu, &min_gpu, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  int rc = 0;
  if (min_gpu == 0) {
    if (rank == 0) fmt::print("SKIP bench_halo_gpu: no GPU visible (or no CUDA backend in this build)\n");
  } else {
    const Args a = parse(argc, argv, P);
    const Device dev = Device::cuda(rank % ngpu);
    if (rank == 0)
      fmt::print("# bench_halo_gpu: {} ranks, {} visible GPU(s) per rank, global shape {} {}, H sharded, width {}\n", P,
                 ngpu, a.shape, a.dtype, a.width);
    try {
      if (a.dtype == "f64") run_all<double>(a, dev);
      else run_all<float>(a, dev);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] bench_halo_gpu: %s\n", rank, e.what());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
