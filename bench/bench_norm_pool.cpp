// CPU benchmarks of the norm / pool / resize / linear ops through their public fronts, forward +
// backward on a 1-rank mesh (the local kernels plus the op's bookkeeping), fp32. Used to check
// that moving the kernels behind the kernel-family interfaces did not cost CPU speed:
//   ./bench_norm_pool --benchmark_repetitions=5   (OMP_NUM_THREADS sets the CPU threads)
#include <benchmark/benchmark.h>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

namespace {

using shard::index_t;
namespace F = shard::nn::functional;
using VarF4 = shard::autograd::Var<float, 4>;
using VarF1 = shard::autograd::Var<float, 1>;

const shard::DeviceMesh& mesh1() {
  static shard::DeviceMesh m(std::make_shared<shard::SelfComm>(), {1});
  return m;
}
VarF4 act(index_t n, index_t c, index_t h, index_t w, std::uint64_t seed) {
  return VarF4(shard::DistTensor<float, 4>::random({n, c, h, w}, mesh1(), {shard::Replicate()}, seed), true);
}
VarF1 param(index_t c, std::uint64_t seed) {
  return VarF1(shard::DistTensor<float, 1>::random({c}, mesh1(), {shard::Replicate()}, seed), true);
}
template <class Fn>
void fwd_bwd(benchmark::State& state, const VarF4& x, Fn f) {
  for (auto _ : state) {
    auto y = f(x);
    auto loss = F::sum(y);
    loss.backward();
    benchmark::DoNotOptimize(x.grad().local().data());
  }
  state.SetItemsProcessed(state.iterations() * x.value().local().numel());
}

// kind: 0 batch, 1 group (8 groups), 2 layer (over C). [2, 32, n, n].
void BM_norm(benchmark::State& state) {
  const index_t n = state.range(1);
  auto x = act(2, 32, n, n, 1);
  auto w = param(32, 2), b = param(32, 3);
  const int kind = static_cast<int>(state.range(0));
  fwd_bwd(state, x, [&](const VarF4& v) {
    if (kind == 0) return F::batch_norm(v, nullptr, nullptr, w, b, true);
    if (kind == 1) return F::group_norm(v, 8, w, b);
    return F::layer_norm(v, w, b);
  });
}
BENCHMARK(BM_norm)->ArgsProduct({{0, 1, 2}, {64, 256}})->Unit(benchmark::kMicrosecond);

// layer_norm over the last dim of transformer tokens [4, n, n, d] (the ViT's LayerNorm: one
// statistic per token, its d channels contiguous), forward + backward.
void BM_layer_norm_tokens(benchmark::State& state) {
  const index_t n = state.range(0), d = state.range(1);
  auto x = act(4, n, n, d, 1);
  auto w = param(d, 2), b = param(d, 3);
  fwd_bwd(state, x, [&](const VarF4& v) { return F::layer_norm(v, w, b, 1e-5, -1); });
}
BENCHMARK(BM_layer_norm_tokens)->Args({16, 16})->Args({32, 64})->Args({32, 256})->Unit(benchmark::kMicrosecond);

// kind: 0 avg 2x2, 1 max 2x2, 2 avg 3x3 stride 1 pad 1. [2, 16, n, n].
void BM_pool(benchmark::State& state) {
  const index_t n = state.range(1);
  auto x = act(2, 16, n, n, 4);
  const int kind = static_cast<int>(state.range(0));
  shard::PoolParams<2> p;
  p.kernel = {2, 2};
  if (kind == 2) {
    p.kernel = {3, 3};
    p.stride = {1, 1};
    p.pad_lo = {1, 1};
    p.pad_hi = {1, 1};
  }
  fwd_bwd(state, x, [&](const VarF4& v) { return kind == 1 ? F::max_pool(v, p) : F::avg_pool(v, p); });
}
BENCHMARK(BM_pool)->ArgsProduct({{0, 1, 2}, {64, 256}})->Unit(benchmark::kMicrosecond);

// kind: 0 nearest x2, 1 bilinear x2. [2, 16, n, n].
void BM_upsample(benchmark::State& state) {
  const index_t n = state.range(1);
  auto x = act(2, 16, n, n, 5);
  const auto mode = state.range(0) == 0 ? shard::ResizeMode::nearest : shard::ResizeMode::linear;
  fwd_bwd(state, x, [&](const VarF4& v) { return F::upsample(v, mode, shard::Shape<2>{2, 2}); });
}
BENCHMARK(BM_upsample)->ArgsProduct({{0, 1}, {64, 128}})->Unit(benchmark::kMicrosecond);

// channel_linear 32 -> 32 on [2, 32, n, n] (GEMM per sample).
void BM_channel_linear(benchmark::State& state) {
  const index_t n = state.range(0);
  auto x = act(2, 32, n, n, 6);
  auto w = shard::autograd::Var<float, 2>(
      shard::DistTensor<float, 2>::random({32, 32}, mesh1(), {shard::Replicate()}, 7), true);
  auto b = param(32, 8);
  fwd_bwd(state, x, [&](const VarF4& v) { return F::channel_linear(v, w, b); });
}
BENCHMARK(BM_channel_linear)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

// linear on tokens [2, 4, n*n/4... ] -> viewed as [2, n, n, 32]: 32 -> 64 -> sum.
void BM_linear_tokens(benchmark::State& state) {
  const index_t n = state.range(0);
  auto x = act(2, n, n, 32, 9);
  auto w = shard::autograd::Var<float, 2>(
      shard::DistTensor<float, 2>::random({64, 32}, mesh1(), {shard::Replicate()}, 10), true);
  fwd_bwd(state, x, [&](const VarF4& v) { return F::linear(v, w); });
}
BENCHMARK(BM_linear_tokens)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
