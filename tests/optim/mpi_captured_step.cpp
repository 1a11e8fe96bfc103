// CapturedStep's communicator check at 1-4 ranks (fake device runtime with graph support, no
// GPU): a step whose collectives run over MPI with more than one rank (the host-staged device
// path, which a CUDA graph cannot capture) is refused at construction with the same shard::Error
// on every rank, before anything is captured; with fallback_eager it runs eagerly on every rank;
// a one-rank communicator is accepted and captured.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <shardtensor/optim/captured_step.hpp>

#include "comm/fake_device_runtime.hpp"
#include "support/mpi_harness.hpp"

namespace st_optim_mpi_captured_step {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("CapturedStep refuses a host-staged communicator on every rank, before capturing", "[optim][graph][mpi]") {
  test::FakeCudaScope fake;
  test::fake_runtime().graphs = true;
  const Device dev = Device::cuda(0);
  test::for_each_comm_size([&](CommPtr c) {
    const int P = c->size();
    INFO("ranks " << P);
    CapturedStep::Options o;
    o.warmup = 1;
    o.comms.push_back(c);
    int calls = 0;
    auto step = [&] {
      ++calls;
      c->barrier();  // a collective in the step
    };
    const int captures_before = fake.counts().captures;
    if (P > 1) {
      CHECK_THROWS_WITH(CapturedStep(dev, step, o), ContainsSubstring("through the host") &&
                                                      ContainsSubstring(std::to_string(P) + " ranks"));
      o.fallback_eager = true;
      CapturedStep cs(dev, step, o);
      for (int i = 0; i < 3; ++i) cs.run();
      CHECK(calls == 3);
      CHECK_FALSE(cs.captured());
      CHECK_THAT(cs.eager_reason(), ContainsSubstring("NCCL"));
      CHECK(fake.counts().captures == captures_before);
    } else {
      CapturedStep cs(dev, step, o);
      for (int i = 0; i < 3; ++i) cs.run();
      CHECK(calls == 2);  // one warm-up run, the capture (the fake runs it), then replays
      CHECK(cs.captured());
      CHECK(cs.replays() == 2);
      CHECK(fake.counts().captures == captures_before + 1);
    }
  });
}

}  // namespace st_optim_mpi_captured_step
