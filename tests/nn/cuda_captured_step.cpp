// CapturedStep on a GPU (issue 30 scope 4): a U-Net training step (forward, MSE, backward,
// AdamW with a learning rate changed every step) captured into a CUDA graph and replayed gives
// the eager loop's losses and parameters (deterministic algorithms, TF32 off: the same kernels
// in the same order, so the same bits are expected; checked to 1e-6 relative), the replays
// allocate nothing, and a step that reads a device value on the host is refused with
// shard::Error (or left eager with fallback_eager). Skips with a message without a GPU.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <algorithm>
#include <cmath>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/unet.hpp>
#include <shardtensor/optim/captured_step.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_nn_cuda_captured_step {

using namespace shard;
using Catch::Matchers::ContainsSubstring;
namespace F = shard::nn::functional;
using autograd::Var;

namespace {

struct Run {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;
  std::size_t cache_growth = 0;  // bytes the allocator cache grew by over the replays
  long replays = 0;
};

/// Device bytes shardtensor holds (live + cached).
std::size_t reserved() {
  const MemoryStats m = memory_stats(DeviceKind::cuda);
  return m.current_bytes + m.cached_bytes;
}

Run train(bool captured, int steps, int warmup) {
  const Device gpu = Device::cuda(0);
  ExecContext ctx(gpu);
  ctx.settings().allow_tf32 = false;
  ctx.settings().deterministic = true;
  ContextGuard guard(ctx);
  const DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  nn::UNetOptions o{.in_channels = 1, .out_channels = 1, .depth = 2, .base_width = 8, .norm_groups = 4};
  nn::UNet<float, 2> model(mesh, o, 77);
  model.to(gpu);
  optim::AdamW<float> opt(model.parameters(), {.lr = 2e-3, .weight_decay = 1e-4});
  std::vector<DistTensor<float, 4>> xs, ys;
  for (int s = 0; s < 3; ++s) {
    xs.push_back(DistTensor<float, 4>::random({2, 1, 32, 32}, mesh, {Replicate()}, 10 + s, RandomInit::uniform(-1, 1))
                     .to(gpu));
    ys.push_back(DistTensor<float, 4>::random({2, 1, 32, 32}, mesh, {Replicate()}, 20 + s, RandomInit::uniform(-1, 1))
                     .to(gpu));
  }
  DistTensor<float, 4> x(xs[0].spec(), xs[0].local().clone()), y(ys[0].spec(), ys[0].local().clone());
  DistTensor<float, 1> loss;
  auto step = [&] {
    opt.zero_grad();
    auto l = F::mse_loss(model.forward(Var<float, 4>(x, false)), Var<float, 4>(y, false));
    l.backward();
    opt.step();
    loss = l.value();
  };
  CapturedStep::Options co;
  co.warmup = warmup;
  co.comms.push_back(mesh.comm());
  std::unique_ptr<CapturedStep> cs;
  if (captured) cs = std::make_unique<CapturedStep>(gpu, step, co);
  Run r;
  std::size_t cached_after_first_replay = 0;
  for (int s = 0; s < steps; ++s) {
    x.local().copy_from(xs[static_cast<std::size_t>(s % 3)].local());
    y.local().copy_from(ys[static_cast<std::size_t>(s % 3)].local());
    opt.set_lr(2e-3 * (1.0 + 0.25 * std::sin(0.7 * s)));
    if (cs) cs->run();
    else step();
    r.losses.push_back(static_cast<double>(loss.local().to(Device::cpu()).data()[0]));
    if (cs && cs->replays() == 1) cached_after_first_replay = reserved();
  }
  if (cs) {
    CHECK(cs->captured());
    CHECK(cs->eager_reason().empty());
    r.replays = cs->replays();
    const std::size_t now = reserved();
    r.cache_growth = now > cached_after_first_replay ? now - cached_after_first_replay : 0;
  }
  for (const auto& p : model.parameters()) {
    const auto h = p->full_value_host();
    r.params.emplace_back(h.data(), h.data() + h.numel());
  }
  return r;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

}  // namespace

TEST_CASE("CUDA graph: a captured U-Net training step equals the eager loop", "[cuda][graph]") {
  if (!cuda_compiled()) SKIP("shardtensor was built without CUDA (SHARDTENSOR_ENABLE_CUDA=OFF)");
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: CUDA graph capture test skipped");
  const int steps = 9, warmup = 2;
  const Run eager = train(false, steps, warmup), graph = train(true, steps, warmup);
  CHECK(graph.replays == steps - warmup);
  REQUIRE(eager.losses.size() == graph.losses.size());
  for (std::size_t s = 0; s < eager.losses.size(); ++s) {
    INFO("step " << s << ": eager " << eager.losses[s] << ", graph " << graph.losses[s]);
    CHECK(std::abs(eager.losses[s] - graph.losses[s]) <= 1e-6 * std::abs(eager.losses[s]));
  }
  REQUIRE(eager.params.size() == graph.params.size());
  for (std::size_t i = 0; i < eager.params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(rel(graph.params[i], eager.params[i]) <= 1e-6);
  }
  CHECK(graph.cache_growth == 0);  // replays allocate nothing
}

TEST_CASE("CUDA graph: a step that reads a device value on the host cannot be captured", "[cuda][graph][errors]") {
  if (!cuda_compiled()) SKIP("shardtensor was built without CUDA (SHARDTENSOR_ENABLE_CUDA=OFF)");
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: CUDA graph capture test skipped");
  const Device gpu = Device::cuda(0);
  auto t = Tensor<float, 1>::full({16}, 1.5f).to(gpu);
  double seen = 0;
  auto step = [&] {
    scale(t, 1.0f);
    seen = static_cast<double>(t.to(Device::cpu()).data()[0]);  // a device -> host read
  };
  {
    CapturedStep cs(gpu, step, CapturedStep::Options{.warmup = 1});
    cs.run();
    CHECK(seen == 1.5);
    CHECK_THROWS_WITH(cs.run(), ContainsSubstring("cannot be captured"));
    CHECK_FALSE(cs.captured());
  }
  CapturedStep cs(gpu, step, CapturedStep::Options{.warmup = 1, .fallback_eager = true});
  for (int i = 0; i < 3; ++i) cs.run();
  CHECK_FALSE(cs.captured());
  CHECK_FALSE(cs.eager_reason().empty());
  CHECK(seen == 1.5);
  // The device is usable after the failed captures.
  CHECK(static_cast<double>(t.to(Device::cpu()).data()[0]) == 1.5);
}

}  // namespace st_nn_cuda_captured_step
