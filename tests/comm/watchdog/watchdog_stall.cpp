// Collective watchdog (issue 8, item 9), run by tests/comm/watchdog/expect_abort.cmake under mpiexec.
// The last rank stalls (sleeps `stall` seconds, far past the timeout) instead of entering a
// collective; with the watchdog on, the other ranks must abort the job with a message naming the
// op, the communicator and their rank. Modes:
//   allreduce  MpiComm::world() allreduce; timeout from SHARDTENSOR_COMM_TIMEOUT
//   wait       irecv from the stalled rank, then Request::wait(); timeout from the environment
//   context    allreduce with the timeout given only by ExecSettings::comm_timeout (no env)
//   mesh       allreduce on dim_comm(1) of a 1 x P mesh; timeout from Communicator::set_timeout
//   ok         no stall: every collective completes under the watchdog with the right values;
//              prints "watchdog ok" and exits 0
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include <shardtensor/comm/mpi_comm.hpp>
#include <shardtensor/shardtensor.hpp>

using namespace shard;

int main(int argc, char** argv) {
  mpi_init_if_needed(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  const double stall = argc > 2 ? std::atof(argv[2]) : 120.0;
  auto world = MpiComm::world();
  const int r = world->rank(), p = world->size();
  const bool staller = p > 1 && r == p - 1;
  auto nap = [&] { std::this_thread::sleep_for(std::chrono::duration<double>(stall)); };
  double v = 1.0;
  try {
    if (mode == "allreduce") {
      if (staller) nap();
      world->allreduce(&v, &v, 1, DType::f64, ReduceOp::sum);
    } else if (mode == "wait") {
      // Every other rank waits on a receive from the stalled rank (none leaves early: a rank that
      // finalises before the abort can keep Open MPI from ending the job promptly).
      if (staller) {
        nap();
        for (int q = 0; q + 1 < p; ++q) world->isend(&v, 1, DType::f64, q, 5).wait();
      } else {
        world->irecv(&v, 1, DType::f64, p - 1, 5).wait();
      }
    } else if (mode == "context") {
      ExecContext ctx;
      ctx.settings().comm_timeout = 1.0;
      if (staller) nap();
      world->allreduce(&v, &v, 1, DType::f64, ReduceOp::sum, &ctx);
    } else if (mode == "mesh") {
      world->set_timeout(1.0);
      DeviceMesh mesh(world, {1, p});
      if (staller) nap();
      mesh.dim_comm(1)->allreduce(&v, &v, 1, DType::f64, ReduceOp::sum);
    } else if (mode == "ok") {
      world->set_timeout(30.0);
      world->allreduce(&v, &v, 1, DType::f64, ReduceOp::sum);
      if (v != p) throw std::runtime_error("allreduce gave " + std::to_string(v));
      world->barrier();
      std::printf("watchdog ok\n");
    } else {
      std::fprintf(stderr, "usage: %s allreduce|wait|context|mesh|ok [stall seconds]\n", argv[0]);
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", r, e.what());
    return 1;
  }
  if (mode != "ok") std::printf("rank %d: collective returned (no watchdog abort)\n", r);
  return 0;
}
