// Device-buffer paths of the communicators, run without a GPU: a fake CUDA runtime that treats
// host memory as device memory (fake_device_runtime.hpp) is registered, so an ExecContext on
// cuda:0 drives MpiComm's staged path (pinned staging buffers) and direct path (CUDA-aware MPI),
// and SelfComm's device copies. Every collective must give exactly the host path's result, the
// staged path must make the expected copies and reuse its pinned buffers, and gaps between the
// segments of a receive buffer must keep their contents.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <shardtensor/comm/device_comm.hpp>

#include "comm/collective_suite.hpp"
#include "comm/fake_device_runtime.hpp"
#include "support/mpi_harness.hpp"

namespace st_comm_mpi_device_staging {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;


TEST_CASE("device buffers (fake runtime): every collective equals the host path, staged and direct",
          "[comm][mpi][device]") {
  for_each_comm([](CommPtr c) {
    const auto host = run_all(*c, nullptr);
    REQUIRE(!host.empty());
    ExecContext cpu_ctx(Device::cpu());
    CHECK(run_all(*c, &cpu_ctx) == host);  // a host context is the host path

    FakeCudaScope fake;
    ExecContext ctx(Device::cuda(0));
    auto* mpi = dynamic_cast<MpiComm*>(c.get());
    if (!mpi) {  // SelfComm: device-to-device copies, no staging
      CHECK(run_all(*c, &ctx) == host);
      CHECK(fake.counts().d2d > 0);
      CHECK(fake.counts().pinned_allocs == 0);
      return;
    }
    for (auto t : {MpiDeviceTransport::staged, MpiDeviceTransport::direct}) {
      INFO("transport " << (t == MpiDeviceTransport::staged ? "staged" : "direct"));
      mpi->set_device_transport(t);
      fake_runtime().reset();
      CHECK(run_all(*c, &ctx) == host);
      const auto& n = fake.counts();
      if (t == MpiDeviceTransport::staged) {
        CHECK(n.d2h > 0);
        CHECK(n.h2d > 0);
        CHECK(n.pinned_allocs >= 1);
        CHECK(mpi->staging_bytes() > 0);
      } else {  // device pointers straight to MPI; avg reductions still stage (host division)
        CHECK(n.syncs > 0);
        // (one rank: allreduce copies send -> recv on the device instead of calling MPI)
        if (c->size() > 1) CHECK(n.d2d == 0);
      }
    }
    mpi->set_device_transport(MpiDeviceTransport::automatic);
    CHECK(mpi->passes_device_pointers() == mpi_cuda_aware());
  });
}

TEST_CASE("staged MpiComm: one copy each way per call, pinned buffers reused and grown on demand",
          "[comm][mpi][device]") {
  for_each_comm_size([](CommPtr world_sub) {
    // A fresh communicator, so that its staging pool starts empty.
    auto c = std::dynamic_pointer_cast<MpiComm>(world_sub->split(0, world_sub->rank()));
    REQUIRE(c);
    c->set_device_transport(MpiDeviceTransport::staged);
    FakeCudaScope fake;
    ExecContext ctx(Device::cuda(0));
    const auto& n = fake.counts();
    const int p = c->size();
    CHECK(c->staging_bytes() == 0);

    std::vector<double> x(1000, 1.0), y(1000);
    if (p == 1) {
      // One rank: allreduce (any op, avg included) is a device copy and broadcast does nothing: no
      // staging, no host copy, no stream synchronisation (a 1-rank device step stays asynchronous).
      for (int rep = 0; rep < 3; ++rep) c->allreduce(x.data(), y.data(), 1000, DType::f64, ReduceOp::sum, &ctx);
      std::vector<double> z(1000, 3.0);
      c->allreduce(z.data(), z.data(), 1000, DType::f64, ReduceOp::avg, &ctx);  // in place: nothing to copy
      c->broadcast(z.data(), 1000, DType::f64, 0, &ctx);
      CHECK(y == x);
      CHECK(z == std::vector<double>(1000, 3.0));
      CHECK(n.d2h == 0);
      CHECK(n.h2d == 0);
      CHECK(n.d2d == 3);
      CHECK(n.syncs == 0);
      CHECK(n.pinned_allocs == 0);
      CHECK(c->staging_bytes() == 0);
      return;
    }
    for (int rep = 0; rep < 3; ++rep) c->allreduce(x.data(), y.data(), 1000, DType::f64, ReduceOp::sum, &ctx);
    CHECK(y == std::vector<double>(1000, p));
    CHECK(n.d2h == 3);
    CHECK(n.h2d == 3);
    CHECK(n.d2h_bytes == 3 * 8000);
    CHECK(n.h2d_bytes == 3 * 8000);
    CHECK(n.pinned_allocs == 1);  // reused
    CHECK(c->staging_bytes() == std::size_t{64} << 10);

    // A larger message grows the pool: the too-small buffer is replaced.
    std::vector<double> big(100000, 2.0), bigr(100000);
    c->allreduce(big.data(), bigr.data(), 100000, DType::f64, ReduceOp::avg, &ctx);
    CHECK(bigr == big);
    CHECK(n.pinned_allocs == 2);
    CHECK(n.pinned_frees == 1);
    CHECK(c->staging_bytes() == std::size_t{1} << 20);

    // allgatherv into a gapped buffer: one copy back per segment, gaps untouched.
    fake_runtime().reset();
    std::vector<index_t> counts(static_cast<std::size_t>(p), 2);
    const auto dg = gapped(counts, 1);
    std::vector<double> g(static_cast<std::size_t>(end_of(counts, dg)), kGap);
    c->allgatherv(x.data(), 2, g.data(), counts, dg, DType::f64, &ctx);
    CHECK(n.d2h == 1);
    CHECK(n.h2d == p);
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == (i % 3 == 2 ? kGap : 1.0));

    // Adjacent segments merge into one copy.
    fake_runtime().reset();
    std::vector<index_t> packed(static_cast<std::size_t>(p), 0);
    for (std::size_t q = 0; q < packed.size(); ++q) packed[q] = static_cast<index_t>(2 * q);
    std::vector<double> h(static_cast<std::size_t>(2 * p));
    c->allgatherv(x.data(), 2, h.data(), counts, packed, DType::f64, &ctx);
    CHECK(n.h2d == 1);

    // Outstanding requests hold their own buffers; all return to the pool after wait().
    fake_runtime().reset();
    const int r = c->rank();
    std::vector<double> a(4, kGap), b(4, kGap);
    auto q1 = c->irecv(a.data(), 4, DType::f64, (r + p - 1) % p, 1, &ctx);
    auto q2 = c->irecv(b.data(), 4, DType::f64, (r + 1) % p, 2, &ctx);
    auto s1 = c->isend(x.data(), 4, DType::f64, (r + 1) % p, 1, &ctx);
    auto s2 = c->isend(x.data(), 4, DType::f64, (r + p - 1) % p, 2, &ctx);
    CHECK(n.h2d == 0);  // receives copy back on wait()
    q1.wait(), q2.wait(), s1.wait(), s2.wait();
    CHECK(n.h2d == 2);
    CHECK(a == std::vector<double>(4, 1.0));
    CHECK(b == std::vector<double>(4, 1.0));
    const auto held = c->staging_bytes();
    c->allreduce(x.data(), y.data(), 1000, DType::f64, ReduceOp::sum, &ctx);
    CHECK(c->staging_bytes() == held);  // no new allocation: pooled buffers came back
  });
}

TEST_CASE("device buffers without a CUDA backend: shard::Error on every rank, no hang", "[comm][mpi][device]") {
  if (exec::find_family(DeviceKind::cuda, exec::KernelFamily::runtime) != nullptr) {
    SKIP("a CUDA runtime is linked into this binary");
  }
  for_each_comm([](CommPtr c) {
    ExecContext ctx(Device::cuda(0));
    std::vector<double> x(3, 1.0), y(3);
    CHECK_THAT(error_of([&] { c->allreduce(x.data(), y.data(), 3, DType::f64, ReduceOp::sum, &ctx); }),
               ContainsSubstring("cuda:0"));
    CHECK_THAT(error_of([&] { c->sendrecv(x.data(), 3, 0, y.data(), 3, 0, DType::f64, 0, &ctx); }),
               ContainsSubstring("cuda:0"));
    c->barrier();  // still usable afterwards
  });
}

TEST_CASE("make_device_comm: ranks sharing a GPU fall back to the host communicator or fail on every rank",
          "[comm][mpi][device]") {
  for_each_comm([](CommPtr c) {
    FakeCudaScope fake;
    const Device gpu = Device::cuda(0);
    const int r = c->rank(), p = c->size();
    CHECK(make_device_comm(c, Device::cpu()) == c);

    // Every rank on the same GPU.
    auto groups = ranks_sharing_gpu(*c, gpu);
    if (p == 1) {
      CHECK(groups.empty());
    } else {
      std::vector<int> all(static_cast<std::size_t>(p));
      std::iota(all.begin(), all.end(), 0);
      CHECK(groups == std::vector<std::vector<int>>{all});
      CHECK(make_device_comm(c, gpu) == c);  // the fallback: the host communicator itself
      const auto msg = error_of([&] { make_device_comm(c, gpu, false); });
      CHECK_THAT(msg, ContainsSubstring("make_device_comm") && ContainsSubstring("ranks 0, 1") &&
                          ContainsSubstring("share GPU fake-gpu-0") && ContainsSubstring("fallback") &&
                          ContainsSubstring("disabled"));
    }

    // Ranks 0, 2 share one GPU, ranks 1, 3 another.
    fake_runtime().uuid = "fake-gpu-" + std::to_string(r % 2);
    groups = ranks_sharing_gpu(*c, gpu);
    std::vector<std::vector<int>> expect;
    if (p >= 3) expect.push_back({0, 2});
    if (p >= 4) expect.push_back({1, 3});
    CHECK(groups == expect);
    if (p >= 4) {
      const auto msg = error_of([&] { make_device_comm(c, gpu, false); });
      CHECK_THAT(msg, ContainsSubstring("ranks 0, 2 share GPU fake-gpu-0") &&
                          ContainsSubstring("ranks 1, 3 share GPU fake-gpu-1"));
    }

    // Every rank on its own GPU and no NCCL backend linked: the host communicator, or an error.
    fake_runtime().uuid = "fake-gpu-" + std::to_string(r);
    CHECK(ranks_sharing_gpu(*c, gpu).empty());
    if (exec::find_family(DeviceKind::cuda, exec::KernelFamily::comm) == nullptr) {
      CHECK(make_device_comm(c, gpu) == c);
      CHECK_THAT(error_of([&] { make_device_comm(c, gpu, false); }), ContainsSubstring("no NCCL backend"));
    }

    // A device index beyond the visible GPUs: an error on every rank naming the op.
    CHECK_THAT(error_of([&] { make_device_comm(c, Device::cuda(3)); }),
               ContainsSubstring("make_device_comm") && ContainsSubstring("device 3"));
    c->barrier();
  });
}

}  // namespace st_comm_mpi_device_staging
