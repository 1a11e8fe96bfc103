// Communicators on device buffers at 1-4 ranks (shardtensor_cuda_mpi_tests; needs a GPU, else
// every case SKIPs). Rank r uses GPU r % (visible GPUs), so on a one-GPU machine every rank
// shares it: make_device_comm falls back to MpiComm (staged through pinned memory, or CUDA-aware)
// and refuses on every rank when the fallback is disabled; with a GPU per rank it makes an
// NcclComm. Every collective's device result must equal the host result.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <shardtensor/comm/device_comm.hpp>

#include "comm/collective_suite.hpp"
#include "support/mpi_harness.hpp"

namespace st_comm_mpi_cuda_comm {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;

namespace {
Device my_gpu() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return Device::cuda(r % cuda_device_count());
}
void check_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::abs(got[i] - want[i]) <= 1e-6 * std::max(1.0, std::abs(want[i])));
  }
}
}  // namespace

TEST_CASE("device collectives at 1-4 ranks equal the host result (NCCL or the MPI fallback)",
          "[comm][cuda][mpi]") {
  if (cuda_device_count() == 0) SKIP("no GPU visible: multi-rank device communication tests not run");
  for_each_comm_size([](CommPtr c) {
    const Device gpu = my_gpu();
    ExecContext ctx(gpu);
    const auto host = run_all(*c, nullptr);
    auto dc = make_device_comm(c, gpu);
    const bool shared = !ranks_sharing_gpu(*c, gpu).empty();
    CHECK((dc == c) == shared);
    INFO("backend " << dc->backend());
    if (dc == c) CHECK(run_all(*dc, &ctx, gpu) == host);
    else check_close(run_all(*dc, &ctx, gpu), host);

    // MpiComm's staged path explicitly (and the direct path where the MPI is CUDA-aware).
    auto m = std::dynamic_pointer_cast<MpiComm>(c->split(0, c->rank()));
    REQUIRE(m);
    m->set_device_transport(MpiDeviceTransport::staged);
    CHECK(run_all(*m, &ctx, gpu) == host);
    CHECK(m->staging_bytes() > 0);
    if (mpi_cuda_aware()) {
      m->set_device_transport(MpiDeviceTransport::direct);
      CHECK(run_all(*m, &ctx, gpu) == host);
    }
  });
}

TEST_CASE("ranks sharing a GPU: fallback, or shard::Error on every rank when it is disabled", "[comm][cuda][mpi]") {
  if (cuda_device_count() == 0) SKIP("no GPU visible: duplicate-GPU tests not run");
  for_each_comm_size([](CommPtr c) {
    const Device gpu = my_gpu();
    const int gpus = cuda_device_count();
    const bool expect_shared = c->size() > gpus;  // sub-communicator ranks 0..p-1 = world ranks
    const auto groups = ranks_sharing_gpu(*c, gpu);
    CHECK(groups.empty() == !expect_shared);
    if (expect_shared) {
      CHECK(make_device_comm(c, gpu) == c);
      CHECK(make_device_comm(c, gpu)->backend() == "mpi");
      const auto msg = error_of([&] { make_device_comm(c, gpu, false); });  // thrown on EVERY rank
      CHECK_THAT(msg, ContainsSubstring("make_device_comm") && ContainsSubstring("share GPU") &&
                          ContainsSubstring("fallback") && ContainsSubstring("ranks 0, "));
    } else {
      auto dc = make_device_comm(c, gpu, false);
      CHECK(dc->backend() == "nccl");
      if (c->size() == 4) {  // 2x2 mesh: per-dim and per-dim-set communicators are NCCL splits
        DeviceMesh mesh(dc, {2, 2});
        CHECK(mesh.dim_comm(0)->backend() == "nccl");
        CHECK(mesh.dim_comm(1)->backend() == "nccl");
        ExecContext ctx(gpu);
        const auto host = run_all(*c->split(mesh.coord(0), mesh.coord(1)), nullptr);
        check_close(run_all(*mesh.dim_comm(1), &ctx, gpu), host);
      }
    }
    c->barrier();
  });
}

}  // namespace st_comm_mpi_cuda_comm
