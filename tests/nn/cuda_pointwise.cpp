// GPU tests of the pointwise, reduce and optim kernel families through nn/functional and optim:
// every op's CUDA forward and every gradient against the same computation on the CPU (fp32 <=
// 1e-5, fp64 <= 1e-10, relative to the largest CPU value), at one rank. They SKIP with a message
// when no GPU is visible or the build has no CUDA.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <functional>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_nn_cuda_pointwise {

using namespace shard;
using autograd::Var;

namespace {

bool have_gpu() { return SHARDTENSOR_HAS_CUDA && cuda_device_count() > 0; }
#define REQUIRE_GPU()                                                                             \
  do {                                                                                            \
    if (!SHARDTENSOR_HAS_CUDA) SKIP("shardtensor was built without CUDA: GPU tests skipped");     \
    if (!have_gpu()) SKIP("no CUDA device visible: GPU tests skipped");                           \
  } while (0)

const DeviceMesh& mesh1() {
  static DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  return mesh;
}
template <class T> double tol() { return sizeof(T) == 4 ? 1e-5 : 1e-10; }

/// The same random global tensor as a CPU Var and a GPU Var.
template <class T, int R>
struct Pair {
  Var<T, R> cpu, gpu;
};
template <class T, int R>
Pair<T, R> pair(const Shape<R>& s, std::uint64_t seed, bool rg = true, RandomInit init = {}) {
  auto h = DistTensor<T, R>::random(s, mesh1(), {Replicate()}, seed, init);
  auto d = DistTensor<T, R>::random(s, mesh1(), {Replicate()}, seed, init, {}, Device::cuda(0));
  return {Var<T, R>(h, rg), Var<T, R>(d, rg)};
}

template <class T, int R>
void check_close(const Var<T, R>& cpu, const Var<T, R>& gpu, const char* what) {
  INFO(what);
  REQUIRE(gpu.value().device().is_cuda());
  const double e = max_rel_diff(gpu.local(), cpu.local());
  CHECK(e <= tol<T>());
}
template <class T, int R>
void check_grad(const Var<T, R>& cpu, const Var<T, R>& gpu, const char* what) {
  INFO(what << " (gradient)");
  REQUIRE(cpu.has_grad());
  REQUIRE(gpu.has_grad());
  REQUIRE(gpu.grad().device().is_cuda());
  const double e = max_rel_diff(gpu.grad().local(), cpu.grad().local());
  CHECK(e <= tol<T>());
}

/// loss = sum(y * r) with a fixed random r (on y's device), so every gradient element differs.
template <class T, int R>
Var<T, 1> weighted_sum(const Var<T, R>& y, std::uint64_t seed) {
  auto r = DistTensor<T, R>::random(y.value().global_shape(), mesh1(), {Replicate()}, seed, {}, {}, y.value().device());
  return F::sum(F::mul(y, Var<T, R>(r, false)));
}

/// Runs f on both devices, compares the outputs, backpropagates and compares the gradients.
template <class T, int R, int Ry, class Fn>
void compare_unary(const char* what, Pair<T, R> x, Fn f) {
  auto yc = f(x.cpu);
  auto yg = f(x.gpu);
  check_close<T, Ry>(yc, yg, what);
  weighted_sum<T, Ry>(yc, 99).backward();
  weighted_sum<T, Ry>(yg, 99).backward();
  check_grad<T, R>(x.cpu, x.gpu, what);
}

}  // namespace

TEMPLATE_TEST_CASE("CUDA pointwise: unary ops and activations match the CPU, forward and backward", "[cuda][nn][pointwise]",
                   float, double) {
  REQUIRE_GPU();
  using T = TestType;
  using V = Var<T, 3>;
  const Shape<3> s{3, 5, 67};
  const auto sym = RandomInit::uniform(-3, 3), pos = RandomInit::uniform(0.5, 2.5);
  struct Case {
    const char* name;
    std::function<V(const V&)> f;
    bool positive;
  };
  const std::vector<Case> cases = {
      {"neg", [](const V& v) { return F::neg(v); }, false},
      {"square", [](const V& v) { return F::square(v); }, false},
      {"sqrt", [](const V& v) { return F::sqrt(v); }, true},
      {"exp", [](const V& v) { return F::exp(v); }, false},
      {"log", [](const V& v) { return F::log(v); }, true},
      {"abs", [](const V& v) { return F::abs(v); }, false},
      {"relu", [](const V& v) { return F::relu(v); }, false},
      {"leaky_relu", [](const V& v) { return F::leaky_relu(v, 0.2); }, false},
      {"gelu", [](const V& v) { return F::gelu(v); }, false},
      {"gelu_tanh", [](const V& v) { return F::gelu(v, F::GeluApprox::tanh); }, false},
      {"silu", [](const V& v) { return F::silu(v); }, false},
      {"tanh", [](const V& v) { return F::tanh(v); }, false},
      {"sigmoid", [](const V& v) { return F::sigmoid(v); }, false},
      {"add_scalar", [](const V& v) { return F::add(v, T(1.5)); }, false},
      {"sub_scalar", [](const V& v) { return F::sub(v, T(0.25)); }, false},
      {"rsub_scalar", [](const V& v) { return F::sub(T(2), v); }, false},
      {"mul_scalar", [](const V& v) { return F::mul(v, T(-3)); }, false},
      {"div_scalar", [](const V& v) { return F::div(v, T(7)); }, false},
      {"rdiv_scalar", [](const V& v) { return F::div(T(2), v); }, true},
  };
  std::uint64_t seed = 11;
  for (const auto& c : cases)
    compare_unary<T, 3, 3>(c.name, pair<T, 3>(s, seed++, true, c.positive ? pos : sym), c.f);
}

TEMPLATE_TEST_CASE("CUDA pointwise: broadcasting binary ops match the CPU, both operand gradients", "[cuda][nn][pointwise]",
                   float, double) {
  REQUIRE_GPU();
  using T = TestType;
  const auto pos = RandomInit::uniform(0.5, 1.5);
  for (int op = 0; op < 4; ++op) {
    auto apply = [op](const auto& a, const auto& b) {
      switch (op) {
        case 0: return F::add(a, b);
        case 1: return F::sub(a, b);
        case 2: return F::mul(a, b);
        default: return F::div(a, b);
      }
    };
    const char* names[] = {"add", "sub", "mul", "div"};
    INFO(names[op]);
    // Same shape, per-channel [1,C,1,1], trailing vector [W], and the reversed broadcast.
    auto x = pair<T, 4>({2, 3, 4, 33}, 1), y = pair<T, 4>({2, 3, 4, 33}, 2, true, pos);
    auto b = pair<T, 4>({1, 3, 1, 1}, 3, true, pos);
    auto v = pair<T, 1>({33}, 4, true, pos);
    auto xc = pair<T, 4>({2, 3, 4, 33}, 5, true, pos);
    auto r1c = apply(x.cpu, y.cpu), r1g = apply(x.gpu, y.gpu);
    auto r2c = apply(x.cpu, b.cpu), r2g = apply(x.gpu, b.gpu);
    auto r3c = apply(x.cpu, v.cpu), r3g = apply(x.gpu, v.gpu);
    auto r4c = apply(b.cpu, xc.cpu), r4g = apply(b.gpu, xc.gpu);
    check_close<T, 4>(r1c, r1g, "same shape");
    check_close<T, 4>(r2c, r2g, "per-channel rhs");
    check_close<T, 4>(r3c, r3g, "vector rhs");
    check_close<T, 4>(r4c, r4g, "broadcast lhs");
    auto lc = F::add(F::add(weighted_sum<T, 4>(r1c, 7), weighted_sum<T, 4>(r2c, 8)),
                     F::add(weighted_sum<T, 4>(r3c, 9), weighted_sum<T, 4>(r4c, 10)));
    auto lg = F::add(F::add(weighted_sum<T, 4>(r1g, 7), weighted_sum<T, 4>(r2g, 8)),
                     F::add(weighted_sum<T, 4>(r3g, 9), weighted_sum<T, 4>(r4g, 10)));
    lc.backward();
    lg.backward();
    check_grad<T, 4>(x.cpu, x.gpu, "x");
    check_grad<T, 4>(y.cpu, y.gpu, "y");
    check_grad<T, 4>(b.cpu, b.gpu, "b");
    check_grad<T, 1>(v.cpu, v.gpu, "v");
    check_grad<T, 4>(xc.cpu, xc.gpu, "xc");
  }
  // as_channel of a [C] vector.
  auto x = pair<T, 4>({2, 3, 4, 5}, 21);
  auto c = pair<T, 1>({3}, 22);
  compare_unary<T, 1, 4>("as_channel mul", c, [&](const Var<T, 1>& cv) {
    return F::mul(cv.value().device().is_cuda() ? x.gpu : x.cpu, F::as_channel<4>(cv));
  });
}

TEMPLATE_TEST_CASE("CUDA reduce: sum, mean, max over dims match the CPU, forward and backward", "[cuda][nn][reduction]",
                   float, double) {
  REQUIRE_GPU();
  using T = TestType;
  const std::vector<std::vector<int>> dim_sets = {{0}, {1}, {2, 3}, {0, 1, 2, 3}, {1, 3}, {3}};
  std::uint64_t seed = 40;
  for (const auto& dims : dim_sets) {
    INFO("dims " << dims.size() << " first " << dims[0]);
    compare_unary<T, 4, 4>("sum", pair<T, 4>({2, 3, 40, 70}, seed++), [&](const Var<T, 4>& v) { return F::sum(v, dims); });
    compare_unary<T, 4, 4>("mean", pair<T, 4>({2, 3, 40, 70}, seed++),
                           [&](const Var<T, 4>& v) { return F::mean(v, dims); });
    compare_unary<T, 4, 4>("max", pair<T, 4>({2, 3, 40, 70}, seed++), [&](const Var<T, 4>& v) { return F::max(v, dims); });
  }
  // Ties: every value appears twice (concat with itself), so each maximum is shared by two
  // positions and the gradient splits equally between them.
  auto coarse = [](const Var<T, 4>& v) { return F::max(F::concat({v, v}, 1), {1, 2}); };
  compare_unary<T, 4, 4>("max with ties", pair<T, 4>({2, 3, 5, 7}, 77), coarse);
  compare_unary<T, 4, 1>("sum all", pair<T, 4>({2, 3, 40, 70}, 78), [](const Var<T, 4>& v) { return F::sum(v); });
  compare_unary<T, 4, 1>("mean all", pair<T, 4>({2, 3, 40, 70}, 79), [](const Var<T, 4>& v) { return F::mean(v); });
  compare_unary<T, 4, 1>("max all", pair<T, 4>({2, 3, 40, 70}, 80), [](const Var<T, 4>& v) { return F::max(v); });
}

TEMPLATE_TEST_CASE("CUDA losses: mse and relative L2 match the CPU, pred and target gradients", "[cuda][nn][loss]",
                   float, double) {
  REQUIRE_GPU();
  using T = TestType;
  for (int mode = 0; mode < 4; ++mode) {
    INFO("mode " << mode);
    auto p = pair<T, 4>({3, 2, 50, 61}, 100 + mode), t = pair<T, 4>({3, 2, 50, 61}, 200 + mode);
    auto loss = [mode](const Var<T, 4>& a, const Var<T, 4>& b) {
      switch (mode) {
        case 0: return F::mse_loss(a, b);
        case 1: return F::mse_loss(a, b, F::Reduction::sum);
        case 2: return F::rel_l2_loss(a, b);
        default: return F::rel_l2_loss(a, b, F::RelL2Mode::global);
      }
    };
    auto lc = loss(p.cpu, t.cpu), lg = loss(p.gpu, t.gpu);
    check_close<T, 1>(lc, lg, "loss");
    lc.backward();
    lg.backward();
    check_grad<T, 4>(p.cpu, p.gpu, "pred");
    check_grad<T, 4>(t.cpu, t.gpu, "target");
  }
}

TEMPLATE_TEST_CASE("CUDA concat matches the CPU, forward and backward", "[cuda][nn][concat]", float, double) {
  REQUIRE_GPU();
  using T = TestType;
  auto a = pair<T, 4>({2, 3, 6, 7}, 1), b = pair<T, 4>({2, 5, 6, 7}, 2);
  auto yc = F::concat({a.cpu, b.cpu}), yg = F::concat({a.gpu, b.gpu});
  check_close<T, 4>(yc, yg, "concat");
  weighted_sum<T, 4>(yc, 5).backward();
  weighted_sum<T, 4>(yg, 5).backward();
  check_grad<T, 4>(a.cpu, a.gpu, "a");
  check_grad<T, 4>(b.cpu, b.gpu, "b");
}

TEMPLATE_TEST_CASE("CUDA optimizers: SGD, Adam, AdamW steps match the CPU", "[cuda][optim]", float, double) {
  REQUIRE_GPU();
  using T = TestType;
  for (int kind = 0; kind < 5; ++kind) {
    INFO("optimizer " << kind);
    auto w = pair<T, 1>({1000}, 300 + kind);
    std::vector<std::shared_ptr<nn::ParameterBase<T>>> pc{std::make_shared<nn::Parameter<T, 1>>(w.cpu)};
    std::vector<std::shared_ptr<nn::ParameterBase<T>>> pg{std::make_shared<nn::Parameter<T, 1>>(w.gpu)};
    std::unique_ptr<optim::Optimizer<T>> oc, og;
    using SO = typename optim::SGD<T>::Options;
    using AO = typename optim::Adam<T>::Options;
    switch (kind) {
      case 0: oc = std::make_unique<optim::SGD<T>>(pc, SO{0.1, 0, 0.01, false}); break;
      case 1: oc = std::make_unique<optim::SGD<T>>(pc, SO{0.1, 0.9, 0.01, false}); break;
      case 2: oc = std::make_unique<optim::SGD<T>>(pc, SO{0.1, 0.9, 0, true}); break;
      case 3: oc = std::make_unique<optim::Adam<T>>(pc, AO{1e-2, 0.9, 0.999, 1e-8, 0.01}); break;
      default: oc = std::make_unique<optim::AdamW<T>>(pc, AO{1e-2, 0.9, 0.999, 1e-8, 0.05}); break;
    }
    switch (kind) {
      case 0: og = std::make_unique<optim::SGD<T>>(pg, SO{0.1, 0, 0.01, false}); break;
      case 1: og = std::make_unique<optim::SGD<T>>(pg, SO{0.1, 0.9, 0.01, false}); break;
      case 2: og = std::make_unique<optim::SGD<T>>(pg, SO{0.1, 0.9, 0, true}); break;
      case 3: og = std::make_unique<optim::Adam<T>>(pg, AO{1e-2, 0.9, 0.999, 1e-8, 0.01}); break;
      default: og = std::make_unique<optim::AdamW<T>>(pg, AO{1e-2, 0.9, 0.999, 1e-8, 0.05}); break;
    }
    for (int step = 0; step < 3; ++step) {
      oc->zero_grad();
      og->zero_grad();
      F::sum(F::square(F::sub(w.cpu, T(0.3)))).backward();
      F::sum(F::square(F::sub(w.gpu, T(0.3)))).backward();
      oc->step();
      og->step();
    }
    check_close<T, 1>(w.cpu, w.gpu, "parameter after 3 steps");
  }
}

TEST_CASE("CUDA pointwise: operands on different devices are refused with a clear error", "[cuda][nn][pointwise]") {
  REQUIRE_GPU();
  auto a = pair<float, 2>({4, 4}, 1), b = pair<float, 2>({4, 4}, 2);
  CHECK_THROWS_AS(F::add(a.cpu, b.gpu), Error);
  CHECK_THROWS_AS(F::mse_loss(a.gpu, b.cpu), Error);
  CHECK_THROWS_AS(F::concat({a.cpu, b.gpu}), Error);
}

}  // namespace st_nn_cuda_pointwise
