// CapturedStep (optim/captured_step.hpp) without a GPU: the optimisers' live values (how a
// captured graph reads each replay's learning rate and step count) equal the plain updates bit
// for bit; on the CPU a CapturedStep is the step itself (same training, bit for bit); and the
// warm-up / capture / replay / fallback orchestration against the fake device runtime with graph
// support (tests/comm/fake_device_runtime.hpp; its "capture" runs the work at once, so only the
// orchestration is checked there; real capture and replay: tests/nn/cuda_captured_step.cpp).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/layers.hpp>
#include <shardtensor/optim/captured_step.hpp>
#include <shardtensor/shardtensor.hpp>

#include "comm/fake_device_runtime.hpp"

namespace st_optim_test_captured_step {

using namespace shard;
using Catch::Matchers::ContainsSubstring;
namespace F = shard::nn::functional;
using autograd::Var;

namespace {

DeviceMesh self_mesh() { return DeviceMesh(std::make_shared<SelfComm>(), {1}); }

template <class T>
std::vector<T> ramp(index_t n, double a, double b) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<T>(a + b * std::sin(0.37 * double(i) + a));
  return v;
}
template <class T>
Block host_block(std::vector<T>& v) {
  const index_t n = static_cast<index_t>(v.size());
  return Block::view(dtype_of<T>, Device::cpu(), v.data(), &n, 1);
}

template <class T>
void check_live_values_bitwise() {
  const index_t n = 37;
  ExecContext ctx(Device::cpu());
  // SGD with momentum and Nesterov: lr from `live`.
  for (bool nesterov : {false, true}) {
    auto w0 = ramp<T>(n, 0.3, 1.0), g = ramp<T>(n, -0.2, 0.7), b0 = ramp<T>(n, 0.1, 0.2);
    auto w1 = w0, b1 = b0;
    exec::SgdParams p{0.05, 0.9, 1e-3, nesterov};
    exec::sgd_update(host_block(w0), host_block(g), host_block(b0), p, ctx);
    const double live[1] = {0.05};
    p.lr = 123.0;  // ignored when live is set
    p.live = live;
    exec::sgd_update(host_block(w1), host_block(g), host_block(b1), p, ctx);
    CHECK(std::memcmp(w0.data(), w1.data(), sizeof(T) * w0.size()) == 0);
    CHECK(std::memcmp(b0.data(), b1.data(), sizeof(T) * b0.size()) == 0);
  }
  // Adam / AdamW: lr, bc1, bc2 from `live`.
  for (bool decoupled : {false, true}) {
    auto w0 = ramp<T>(n, 0.3, 1.0), g = ramp<T>(n, -0.2, 0.7);
    auto m0 = ramp<double>(n, 0.01, 0.02), v0 = ramp<double>(n, 0.5, 0.1);
    auto w1 = w0;
    auto m1 = m0, v1 = v0;
    const double bc1 = 1 - std::pow(0.9, 3), bc2 = 1 - std::pow(0.999, 3);
    exec::AdamParams p{1e-2, 0.9, 0.999, 1e-8, 1e-2, bc1, bc2, decoupled};
    exec::adam_update(host_block(w0), host_block(g), host_block(m0), host_block(v0), p, ctx);
    const double live[3] = {1e-2, bc1, bc2};
    p.lr = p.bc1 = p.bc2 = 7.0;  // ignored
    p.live = live;
    exec::adam_update(host_block(w1), host_block(g), host_block(m1), host_block(v1), p, ctx);
    CHECK(std::memcmp(w0.data(), w1.data(), sizeof(T) * w0.size()) == 0);
    CHECK(std::memcmp(m0.data(), m1.data(), sizeof(double) * m0.size()) == 0);
    CHECK(std::memcmp(v0.data(), v1.data(), sizeof(double) * v0.size()) == 0);
  }
}

/// A small conv / norm / SiLU model and its training, plain or through a CapturedStep.
struct Trained {
  std::vector<double> losses;
  std::vector<std::vector<double>> params;
  long adam_steps = 0;
};

std::shared_ptr<nn::Sequential<double, 4>> toy_model(const DeviceMesh& mesh) {
  auto q = std::make_shared<nn::Sequential<double, 4>>();
  q->add("conv1", std::make_shared<nn::Conv2d<double>>(mesh, 1, 4, Shape<2>{3, 3},
                                                       F::ConvOptions<2>::symmetric(1, 1, 1, 1), true, 11));
  q->add("norm", std::make_shared<nn::GroupNorm<double, 4>>(mesh, 2, 4));
  q->add("act", std::make_shared<nn::SiLU<double, 4>>());
  q->add("conv2", std::make_shared<nn::Conv2d<double>>(mesh, 4, 1, Shape<2>{3, 3},
                                                       F::ConvOptions<2>::symmetric(1, 1, 1, 1), true, 12));
  return q;
}

Trained train_toy(bool captured, int steps) {
  const auto mesh = self_mesh();
  auto model = toy_model(mesh);
  optim::AdamW<double> opt(model->parameters(), {.lr = 1e-2, .weight_decay = 1e-3});
  std::vector<DistTensor<double, 4>> xs, ys;
  for (int s = 0; s < 3; ++s) {
    xs.push_back(DistTensor<double, 4>::random({2, 1, 8, 6}, mesh, {Replicate()}, 100 + s, RandomInit::uniform(-1, 1)));
    ys.push_back(DistTensor<double, 4>::random({2, 1, 8, 6}, mesh, {Replicate()}, 200 + s, RandomInit::uniform(-1, 1)));
  }
  // Static input and output of the step (what a graph needs; the plain loop uses them too).
  DistTensor<double, 4> x(xs[0].spec(), xs[0].local().clone()), y(ys[0].spec(), ys[0].local().clone());
  DistTensor<double, 1> loss;
  auto step = [&] {
    opt.zero_grad();
    auto l = F::mse_loss(model->forward(Var<double, 4>(x, false)), Var<double, 4>(y, false));
    l.backward();
    opt.step();
    loss = l.value();
  };
  Trained t;
  std::unique_ptr<CapturedStep> cs;
  if (captured) cs = std::make_unique<CapturedStep>(Device::cpu(), step, CapturedStep::Options{.warmup = 2});
  for (int s = 0; s < steps; ++s) {
    x.local().copy_from(xs[static_cast<std::size_t>(s % 3)].local());
    y.local().copy_from(ys[static_cast<std::size_t>(s % 3)].local());
    opt.set_lr(1e-2 * (1.0 + 0.1 * s));
    if (cs) cs->run();
    else step();
    t.losses.push_back(loss.local().data()[0]);
  }
  if (cs) {
    CHECK_FALSE(cs->captured());
    CHECK(cs->runs() == steps);
    CHECK(cs->replays() == 0);
    CHECK_THAT(cs->eager_reason(), ContainsSubstring("CPU"));
  }
  for (const auto& p : model->parameters()) t.params.emplace_back(p->data(), p->data() + p->numel());
  t.adam_steps = opt.steps();
  return t;
}

}  // namespace

TEST_CASE("optimiser updates reading live values equal the plain updates bit for bit", "[optim][graph]") {
  check_live_values_bitwise<float>();
  check_live_values_bitwise<double>();
}

TEST_CASE("CapturedStep on the CPU is the step itself: the same training bit for bit", "[optim][graph]") {
  const Trained plain = train_toy(false, 6), cap = train_toy(true, 6);
  CHECK(plain.losses == cap.losses);
  CHECK(plain.params == cap.params);
  CHECK(cap.adam_steps == 6);
  CHECK(plain.losses.back() < plain.losses.front());  // it trains
}

TEST_CASE("CapturedStep rejects bad options with shard::Error", "[optim][graph][errors]") {
  CHECK_THROWS_WITH(CapturedStep(Device::cpu(), [] {}, CapturedStep::Options{.warmup = 0}),
                    ContainsSubstring("warmup must be at least 1"));
  CHECK_THROWS_WITH(CapturedStep(Device::cpu(), std::function<void()>{}), ContainsSubstring("empty step function"));
  CapturedStep::Options o;
  o.comms.push_back(nullptr);
  CHECK_THROWS_WITH(CapturedStep(Device::cpu(), [] {}, o), ContainsSubstring("null communicator"));
  CHECK(replay_scalars(Device::cpu(), 2, [](double*) {}) == nullptr);  // no capture in progress
}

TEST_CASE("CapturedStep orchestration: warm-up, one capture, replays with live values, fallback", "[optim][graph]") {
  test::FakeCudaScope fake;
  const auto& rt = test::fake_runtime();
  const Device dev = Device::cuda(0);

  SECTION("a runtime without graphs runs the step eagerly") {
    int calls = 0;
    CapturedStep cs(dev, [&] { ++calls; });
    for (int i = 0; i < 5; ++i) cs.run();
    CHECK(calls == 5);
    CHECK_FALSE(cs.captured());
    CHECK_THAT(cs.eager_reason(), ContainsSubstring("cannot capture graphs"));
    CHECK(fake.counts().captures == 0);
  }

  SECTION("warm-up, capture, then replays that refresh the live values") {
    rt.graphs = true;
    int calls = 0, fills = 0, live_seen = 0;
    const double* live = nullptr;
    {
      CapturedStep cs(dev, [&] {
        ++calls;
        CHECK(&current_context(dev) != nullptr);
        const double* p = replay_scalars(dev, 2, [&](double* v) {
          ++fills;
          v[0] = fills;
          v[1] = 10.0 * fills;
        });
        if (p) {
          ++live_seen;
          live = p;
          CHECK(CapturedStep::capturing(dev) != nullptr);
        }
      }, CapturedStep::Options{.warmup = 2});
      cs.run();
      cs.run();
      CHECK(calls == 2);
      CHECK(live_seen == 0);  // eager runs pass their values as usual
      CHECK_FALSE(cs.captured());
      cs.run();  // capture (the fake runs the work), then the first replay
      CHECK(cs.captured());
      CHECK(calls == 3);
      CHECK(live_seen == 1);
      REQUIRE(live != nullptr);
      CHECK(fake.counts().captures == 1);
      CHECK(fake.counts().launches == 1);
      CHECK(fills == 1);
      CHECK(live[0] == 1.0);  // copied to the "device" ahead of the launch
      CHECK(live[1] == 10.0);
      for (int i = 0; i < 6; ++i) cs.run();  // replays only: the step function is not called
      CHECK(calls == 3);
      CHECK(fills == 7);
      CHECK(live[0] == 7.0);
      CHECK(live[1] == 70.0);
      CHECK(fake.counts().launches == 7);
      CHECK(cs.replays() == 7);
      CHECK(cs.runs() == 9);
      CHECK(cs.eager_reason().empty());
    }
    CHECK(fake.counts().destroyed == 1);
    CHECK(fake.counts().pinned_allocs == fake.counts().pinned_frees);
  }

  SECTION("a step that fails inside the capture: shard::Error, or eager for good with fallback_eager") {
    rt.graphs = true;
    int calls = 0;
    auto step = [&] {
      ++calls;
      SHARD_CHECK(!CapturedStep::capturing(dev), "test step", "reads a device value on the host");
    };
    {
      CapturedStep cs(dev, step, CapturedStep::Options{.warmup = 1});
      cs.run();
      CHECK_THROWS_WITH(cs.run(), ContainsSubstring("cannot be captured") &&
                                      ContainsSubstring("reads a device value on the host"));
      CHECK(fake.counts().destroyed == 1);  // the aborted capture's graph and pool are released
      CHECK_FALSE(cs.captured());
    }
    calls = 0;
    {
      CapturedStep cs(dev, step, CapturedStep::Options{.warmup = 1, .fallback_eager = true});
      cs.run();
      cs.run();  // the capture fails; this call's step runs eagerly
      CHECK(calls == 3);
      CHECK_FALSE(cs.captured());
      CHECK_THAT(cs.eager_reason(), ContainsSubstring("reads a device value on the host"));
      cs.run();
      CHECK(calls == 4);
      CHECK(fake.counts().captures == 2);  // never tried again
    }
  }

  SECTION("an invalidated capture is refused the same way") {
    rt.graphs = true;
    rt.invalidate = true;
    int calls = 0;
    CapturedStep cs(dev, [&] { ++calls; }, CapturedStep::Options{.warmup = 1, .fallback_eager = true});
    cs.run();
    cs.run();
    CHECK(calls == 3);
    CHECK_THAT(cs.eager_reason(), ContainsSubstring("invalidated"));
    CHECK(fake.counts().destroyed == 1);
  }
}

}  // namespace st_optim_test_captured_step
