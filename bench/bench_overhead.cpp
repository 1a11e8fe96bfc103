// Small-op overhead (issue 6 item 5): what one tiny recorded op costs beyond its arithmetic.
// F::add of two 8x8 fp32 Vars on a 1-rank mesh (SelfComm): recorded on the tape (both inputs
// require grad), not recorded (no grad), and forward + backward through a sum-free seed.
// Reference: PyTorch 1.13 Python eager `a + b` on two 8x8 fp32 tensors, 1.5 us on the build
// machine (bench/torch_overhead_ref.py measures it where torch is installed).
//   ./bench_overhead                       (wall time per op)
//   ./bench_overhead --count=recorded:2000 (runs one case 2000 times outside the framework)
// Instructions per op (load-independent): run the --count mode under callgrind at two counts and
// take the difference, e.g. bench/count_overhead.sh build/bench/bench_overhead.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <shardtensor/shardtensor.hpp>

namespace {

using shard::DistTensor;
using shard::autograd::Var;

shard::DeviceMesh self_mesh() { return shard::DeviceMesh(std::make_shared<shard::SelfComm>()); }

Var<float, 2> leaf(const shard::DeviceMesh& mesh, std::uint64_t seed, bool requires_grad) {
  auto v = DistTensor<float, 2>::random({8, 8}, mesh, {shard::Replicate()}, seed);
  return Var<float, 2>(v, requires_grad);
}

// One forward op (the result and its graph are dropped on return).
[[gnu::noinline]] void add_once(const Var<float, 2>& a, const Var<float, 2>& b) {
  auto c = shard::F::add(a, b);
  benchmark::DoNotOptimize(c.local().data());
}

// One forward + backward: c = a + b, a seed of ones accumulated into c, the tape run from c's
// node (leaf gradients finalised), then the leaves' gradients zeroed.
[[gnu::noinline]] void add_forward_backward_once(const Var<float, 2>& a, const Var<float, 2>& b,
                                                 const DistTensor<float, 2>& seed) {
  auto c = shard::F::add(a, b);
  c.accumulate_grad(seed);
  shard::autograd::run_backward(c.node());
  benchmark::DoNotOptimize(a.grad().local().data());
  a.zero_grad();
  b.zero_grad();
}

DistTensor<float, 2> ones_like(const Var<float, 2>& a) {
  return DistTensor<float, 2>(a.value().spec(), shard::Tensor<float, 2>::full({8, 8}, 1.0f));
}

// F::add recorded on the tape (both inputs require grad); the graph is dropped each iteration.
void BM_add_8x8_recorded(benchmark::State& state) {
  const auto mesh = self_mesh();
  const auto a = leaf(mesh, 1, true), b = leaf(mesh, 2, true);
  for (auto _ : state) add_once(a, b);
}
BENCHMARK(BM_add_8x8_recorded);

// F::add with inputs that do not require grad (nothing is recorded).
void BM_add_8x8_no_grad(benchmark::State& state) {
  const auto mesh = self_mesh();
  const auto a = leaf(mesh, 1, false), b = leaf(mesh, 2, false);
  for (auto _ : state) add_once(a, b);
}
BENCHMARK(BM_add_8x8_no_grad);

// F::add under NoGradGuard with inputs that require grad (the guard's fast path).
void BM_add_8x8_no_grad_guard(benchmark::State& state) {
  const auto mesh = self_mesh();
  const auto a = leaf(mesh, 1, true), b = leaf(mesh, 2, true);
  shard::autograd::NoGradGuard guard;
  for (auto _ : state) add_once(a, b);
}
BENCHMARK(BM_add_8x8_no_grad_guard);

// Forward + backward (see add_forward_backward_once).
void BM_add_8x8_forward_backward(benchmark::State& state) {
  const auto mesh = self_mesh();
  const auto a = leaf(mesh, 1, true), b = leaf(mesh, 2, true);
  const auto seed = ones_like(a);
  for (auto _ : state) add_forward_backward_once(a, b, seed);
}
BENCHMARK(BM_add_8x8_forward_backward);

// The raw arithmetic alone: 64 float adds into a preallocated tensor (the floor).
void BM_add_8x8_raw_loop(benchmark::State& state) {
  auto a = shard::Tensor<float, 2>::full({8, 8}, 1.0f), b = shard::Tensor<float, 2>::full({8, 8}, 2.0f);
  auto c = shard::Tensor<float, 2>::zeros({8, 8});
  for (auto _ : state) {
    const float* pa = a.data();
    const float* pb = b.data();
    float* pc = c.data();
    for (int i = 0; i < 64; ++i) pc[i] = pa[i] + pb[i];
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_add_8x8_raw_loop);

// --count=CASE:N runs CASE (recorded, no_grad, no_grad_guard, forward_backward) N times after
// the same setup as its benchmark, for instruction counting under callgrind.
int run_count(const std::string& arg) {
  const auto colon = arg.find(':');
  const std::string what = arg.substr(0, colon);
  const long n = colon == std::string::npos ? 1000 : std::atol(arg.c_str() + colon + 1);
  const auto mesh = self_mesh();
  const bool grad = what != "no_grad";
  const auto a = leaf(mesh, 1, grad), b = leaf(mesh, 2, grad);
  const auto seed = ones_like(a);
  if (what == "forward_backward") {
    for (long i = 0; i < n; ++i) add_forward_backward_once(a, b, seed);
  } else if (what == "recorded" || what == "no_grad") {
    for (long i = 0; i < n; ++i) add_once(a, b);
  } else if (what == "no_grad_guard") {
    shard::autograd::NoGradGuard guard;
    for (long i = 0; i < n; ++i) add_once(a, b);
  } else {
    std::fprintf(stderr, "unknown case '%s'\n", what.c_str());
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--count=", 8) == 0) return run_count(argv[i] + 8);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
