// Communicators on device buffers, one process (shardtensor_cuda_tests; needs a GPU, else every
// case SKIPs): SelfComm's device copies and NcclComm at 1 rank (bootstrapped over a SelfComm)
// against the host result of the same calls, NcclComm's split, and make_device_comm's choices.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <shardtensor/comm/device_comm.hpp>
#include <shardtensor/comm/nccl_comm.hpp>

#include "comm/collective_suite.hpp"

namespace st_comm_cuda_comm {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;

namespace {
bool no_gpu() { return cuda_device_count() == 0; }

// NCCL's avg scales before summing, so it may differ from the host's sum-then-divide in the
// last bit (fp32 values in the suite are converted to double: 1e-6 relative).
void check_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::abs(got[i] - want[i]) <= 1e-6 * std::max(1.0, std::abs(want[i])));
  }
}
}  // namespace

TEST_CASE("SelfComm on device buffers equals the host path", "[comm][cuda]") {
  if (no_gpu()) SKIP("no GPU visible: device communication tests not run");
  SelfComm c;
  const auto host = run_all(c, nullptr);
  ExecContext ctx(Device::cuda(0));
  CHECK(run_all(c, &ctx, Device::cuda(0)) == host);
}

TEST_CASE("NcclComm at one rank: every collective on device buffers equals the host path", "[comm][cuda][nccl]") {
  if (no_gpu()) SKIP("no GPU visible: NCCL tests not run");
  auto base = std::make_shared<SelfComm>();
  auto nc = make_nccl_comm(base, Device::cuda(0));
  REQUIRE(nc);
  CHECK(nc->backend() == "nccl");
  CHECK(nc->size() == 1);
  const auto host = run_all(*base, nullptr);
  ExecContext ctx(Device::cuda(0));
  check_close(run_all(*nc, &ctx, Device::cuda(0)), host);
  CHECK(run_all(*nc, nullptr) == host);  // host buffers: delegated to the base communicator

  auto sub = nc->split(0, 0);  // ncclCommSplit
  REQUIRE(sub);
  CHECK(sub->backend() == "nccl");
  check_close(run_all(*sub, &ctx, Device::cuda(0)), host);
  CHECK(nc->split(-1, 0) == nullptr);

  // Buffers on another device than the communicator's: a clear error.
  if (cuda_device_count() > 1) {
    ExecContext other(Device::cuda(1));
    double v = 0;
    CHECK_THROWS_WITH(nc->allreduce(&v, &v, 1, DType::f64, ReduceOp::sum, &other), ContainsSubstring("cuda:1"));
  }
}

TEST_CASE("make_device_comm at one rank: NCCL, and errors for a bad device", "[comm][cuda][nccl]") {
  if (no_gpu()) SKIP("no GPU visible: make_device_comm tests not run");
  auto base = std::make_shared<SelfComm>();
  CHECK(ranks_sharing_gpu(*base, Device::cuda(0)).empty());
  auto dc = make_device_comm(base, Device::cuda(0), false);
  CHECK(dc->backend() == "nccl");
  DeviceMesh mesh(dc);  // the mesh's dim communicators are NCCL splits
  CHECK(mesh.dim_comm(0)->backend() == "nccl");
  const int bad = cuda_device_count();
  CHECK_THROWS_WITH(make_device_comm(base, Device::cuda(bad)), ContainsSubstring("make_device_comm"));
  CHECK(make_device_comm(base, Device::cpu()) == base);
}

}  // namespace st_comm_cuda_comm
