// CPU benchmark of neighbourhood attention, forward + backward through F::neighborhood_attention
// on a 1-rank mesh (local kernel + bookkeeping), fp32, against dense attention over the same
// tokens through the attention kernel family (exec::attention_forward / attention_backward),
// which is what a window mask on dense attention would cost at least (dense grows as N^2,
// neighbourhood attention as N * window volume):
//   ./bench_nbhd_attention --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// Field [1, n, n, H=4, Dh=32]; window w x w (args: n, w).
#include <benchmark/benchmark.h>

#include <shardtensor/exec/attention.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

namespace {

using shard::index_t;
namespace F = shard::nn::functional;
using Var5 = shard::autograd::Var<float, 5>;
constexpr index_t kH = 4, kD = 32;

const shard::DeviceMesh& mesh1() {
  static shard::DeviceMesh m(std::make_shared<shard::SelfComm>(), {1});
  return m;
}
Var5 field(index_t n, std::uint64_t seed) {
  return Var5(shard::DistTensor<float, 5>::random({1, n, n, kH, kD}, mesh1(), {shard::Replicate()}, seed), true);
}

void BM_nbhd_fwd_bwd(benchmark::State& state) {
  const index_t n = state.range(0), w = state.range(1);
  auto q = field(n, 1), k = field(n, 2), v = field(n, 3);
  for (auto _ : state) {
    auto y = F::neighborhood_attention(q, k, v, {.window = {w, w}});
    F::sum(y).backward();
    benchmark::DoNotOptimize(k.grad().local().data());
  }
  state.SetItemsProcessed(state.iterations() * n * n);
}
BENCHMARK(BM_nbhd_fwd_bwd)->Args({32, 7})->Args({64, 7})->Args({64, 13})->Unit(benchmark::kMillisecond);

void BM_dense_fwd_bwd(benchmark::State& state) {
  const index_t n = state.range(0), N = n * n;
  auto q = field(n, 1).value().local(), k = field(n, 2).value().local(), v = field(n, 3).value().local();
  auto out = shard::Tensor<float, 5>::empty(q.shape()), dq = shard::Tensor<float, 5>::empty(q.shape());
  auto dk = shard::Tensor<float, 5>::empty(q.shape()), dv = shard::Tensor<float, 5>::empty(q.shape());
  auto dout = shard::Tensor<float, 5>::full(q.shape(), 1.0f);
  std::vector<float> lse(static_cast<std::size_t>(kH * N));
  const shard::exec::AttnGeom g{1, kH, N, N, kD, kD};
  // token-major [1, N, H, D] operands viewed as [1, H, N, D]
  auto in = [&](const auto& t) {
    return shard::exec::attention_view(shard::DType::f32, shard::Device::cpu(), t.data(), 1, kH, N, kD, N * kH * kD,
                                       kD, kH * kD);
  };
  const shard::index_t nl = kH * N;
  const shard::Block lse_b = shard::Block::view(shard::DType::f32, shard::Device::cpu(), lse.data(), &nl, 1);
  const shard::Block bdq = in(dq), bdk = in(dk), bdv = in(dv);
  shard::exec::AttnMask m;
  m.scale = 1.0 / std::sqrt(static_cast<double>(kD));
  auto& ctx = shard::current_context(shard::Device::cpu());
  for (auto _ : state) {
    shard::exec::attention_forward(g, m, in(q), in(k), in(v), nullptr, in(out), lse_b, ctx);
    dq.fill(0.0f);
    dk.fill(0.0f);
    dv.fill(0.0f);
    shard::exec::attention_backward(g, m, in(q), in(k), in(v), nullptr, in(out), in(dout), lse_b, &bdq, &bdk, &bdv,
                                    ctx);
    benchmark::DoNotOptimize(dk.data());
  }
  state.SetItemsProcessed(state.iterations() * N);
}
BENCHMARK(BM_dense_fwd_bwd)->Arg(32)->Arg(64)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
