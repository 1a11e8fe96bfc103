// Micro benchmarks (Google Benchmark) of the local building blocks that redistribute and the ops
// stand on: packing a box out of a local block (the box engine, exec::box_copy) against a plain memcpy of the same bytes,
// strided tensor copies, deterministic random fill and elementwise arithmetic.
//   ./bench_micro --benchmark_filter=copy_box     (OMP_NUM_THREADS sets the CPU threads)
#include <benchmark/benchmark.h>

#include <cstring>
#include <shardtensor/exec/box.hpp>
#include <shardtensor/exec/tensor_block.hpp>
#include <shardtensor/shardtensor.hpp>
#include <shardtensor/nn/functional.hpp>

namespace {

using shard::index_t;

shard::Block block_of(const shard::Tensor<float, 2>& t) { return shard::as_block(t); }

// Baseline: one memcpy of n*n/2 floats (the bytes a column half of an n x n block holds).
void BM_memcpy_half(benchmark::State& state) {
  const index_t n = state.range(0);
  auto a = shard::Tensor<float, 2>::full({n, n}, 1.0f);
  auto b = shard::Tensor<float, 2>::zeros({n, n / 2});
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), sizeof(float) * static_cast<std::size_t>(n * (n / 2)));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * (n / 2) * static_cast<index_t>(sizeof(float)));
}
BENCHMARK(BM_memcpy_half)->Arg(1024)->Arg(4096)->Unit(benchmark::kMicrosecond);

// Packing the right column half of an n x n block into a contiguous buffer: what a
// Shard(0) -> Shard(1) redistribution does for each peer.
void BM_copy_box_pack_columns(benchmark::State& state) {
  const index_t n = state.range(0);
  auto a = shard::Tensor<float, 2>::full({n, n}, 1.0f);
  auto b = shard::Tensor<float, 2>::zeros({n, n / 2});
  const auto src = block_of(a), dst = block_of(b);
  for (auto _ : state) {
    shard::exec::box_copy(dst, src.slice({0, n / 2}, {n, n / 2}));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * (n / 2) * static_cast<index_t>(sizeof(float)));
}
BENCHMARK(BM_copy_box_pack_columns)->Arg(1024)->Arg(4096)->Unit(benchmark::kMicrosecond);

// Unpacking into the interior of a ghosted 3-D block (strided destination rows).
void BM_copy_box_into_ghosted_3d(benchmark::State& state) {
  const index_t n = state.range(0);
  auto src = shard::Tensor<float, 3>::full({n, n, n}, 1.0f);
  auto dst = shard::Tensor<float, 3>::zeros({n + 2, n + 2, n + 2});
  const auto s = shard::as_block(src), d = shard::as_block(dst).slice({1, 1, 1}, {n, n, n});
  for (auto _ : state) {
    shard::exec::box_copy(d, s);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * n * n * static_cast<index_t>(sizeof(float)));
}
BENCHMARK(BM_copy_box_into_ghosted_3d)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

// Tensor::copy_from of a transposed (unit-stride-free) view: the slow element-wise path.
void BM_tensor_copy_transposed(benchmark::State& state) {
  const index_t n = state.range(0);
  auto a = shard::Tensor<float, 2>::full({n, n}, 1.0f);
  auto t = shard::Tensor<float, 2>::view(a.data(), {n, n}, {1, n});
  auto b = shard::Tensor<float, 2>::zeros({n, n});
  for (auto _ : state) {
    b.copy_from(t);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * n * static_cast<index_t>(sizeof(float)));
}
BENCHMARK(BM_tensor_copy_transposed)->Arg(1024)->Unit(benchmark::kMicrosecond);

// Deterministic random fill (counter-based hash of the global index).
void BM_fill_random(benchmark::State& state) {
  const index_t n = state.range(0);
  auto a = shard::Tensor<float, 2>::zeros({n, n});
  for (auto _ : state) {
    a.fill_random(42, {0, 0}, {n, n});
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n * n);
}
BENCHMARK(BM_fill_random)->Arg(1024)->Unit(benchmark::kMicrosecond);

// y += alpha * x and sum(x): memory-bound elementwise kernels.
void BM_axpy(benchmark::State& state) {
  const index_t n = state.range(0);
  auto x = shard::Tensor<float, 2>::full({n, n}, 1.0f), y = shard::Tensor<float, 2>::zeros({n, n});
  for (auto _ : state) {
    shard::axpy(0.5f, x, y);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * n * n * static_cast<index_t>(sizeof(float)));
}
BENCHMARK(BM_axpy)->Arg(1024)->Arg(4096)->Unit(benchmark::kMicrosecond);

void BM_sum(benchmark::State& state) {
  const index_t n = state.range(0);
  auto x = shard::Tensor<float, 2>::full({n, n}, 1.0f);
  for (auto _ : state) benchmark::DoNotOptimize(shard::sum(x));
  state.SetBytesProcessed(state.iterations() * n * n * static_cast<index_t>(sizeof(float)));
}
BENCHMARK(BM_sum)->Arg(1024)->Arg(4096)->Unit(benchmark::kMicrosecond);

// Redistribute on a one-rank mesh (SelfComm): the fixed cost of planning + a local slice.
void BM_redistribute_selfcomm_overhead(benchmark::State& state) {
  shard::DeviceMesh mesh(std::make_shared<shard::SelfComm>(), {1, 1});
  auto t = shard::DistTensor<float, 2>::random({64, 64}, mesh, {shard::Shard(0), shard::Shard(1)}, 1);
  for (auto _ : state) {
    auto r = t.redistribute({shard::Shard(1), shard::Replicate()});
    benchmark::DoNotOptimize(r.local().data());
  }
}
BENCHMARK(BM_redistribute_selfcomm_overhead)->Unit(benchmark::kMicrosecond);

// The pointwise / reduction ops of nn/functional on a one-rank mesh: forward + backward of F::add
// and F::gelu on 1x16x256x256 fp32, F::mse_loss + F::sum, and the fixed cost of a recorded F::add
// of two 8x8 tensors (issue 6 item 5).
shard::DeviceMesh& self_mesh1() {
  static shard::DeviceMesh mesh(std::make_shared<shard::SelfComm>(), {1});
  return mesh;
}
template <int R>
shard::autograd::Var<float, R> rnd_var(const shard::Shape<R>& s, std::uint64_t seed, bool rg = true) {
  return shard::autograd::Var<float, R>(shard::DistTensor<float, R>::random(s, self_mesh1(), {shard::Replicate()}, seed), rg);
}

void BM_F_add_small(benchmark::State& state) {
  auto a = rnd_var<2>({8, 8}, 1), b = rnd_var<2>({8, 8}, 2);
  for (auto _ : state) {
    auto c = shard::F::add(a, b);
    benchmark::DoNotOptimize(c.local().data());
  }
}
BENCHMARK(BM_F_add_small)->Unit(benchmark::kMicrosecond);

void BM_F_add_fwd_bwd(benchmark::State& state) {
  auto a = rnd_var<4>({1, 16, 256, 256}, 1), b = rnd_var<4>({1, 16, 256, 256}, 2);
  auto bias = rnd_var<4>({1, 16, 1, 1}, 3);
  for (auto _ : state) {
    auto y = shard::F::add(shard::F::add(a, b), bias);
    shard::F::sum(y).backward();
    benchmark::DoNotOptimize(a.grad().local().data());
    a.zero_grad();
    b.zero_grad();
    bias.zero_grad();
  }
  state.SetItemsProcessed(state.iterations() * 16 * 256 * 256);
}
BENCHMARK(BM_F_add_fwd_bwd)->Unit(benchmark::kMicrosecond);

void BM_F_gelu_fwd_bwd(benchmark::State& state) {
  auto a = rnd_var<4>({1, 16, 256, 256}, 1);
  for (auto _ : state) {
    auto y = shard::F::gelu(a);
    shard::F::sum(y).backward();
    benchmark::DoNotOptimize(a.grad().local().data());
    a.zero_grad();
  }
  state.SetItemsProcessed(state.iterations() * 16 * 256 * 256);
}
BENCHMARK(BM_F_gelu_fwd_bwd)->Unit(benchmark::kMicrosecond);

void BM_F_mse_fwd_bwd(benchmark::State& state) {
  auto a = rnd_var<4>({1, 16, 256, 256}, 1), t = rnd_var<4>({1, 16, 256, 256}, 2, false);
  for (auto _ : state) {
    shard::F::mse_loss(a, t).backward();
    benchmark::DoNotOptimize(a.grad().local().data());
    a.zero_grad();
  }
  state.SetItemsProcessed(state.iterations() * 16 * 256 * 256);
}
BENCHMARK(BM_F_mse_fwd_bwd)->Unit(benchmark::kMicrosecond);

void BM_F_sum_dims(benchmark::State& state) {
  auto a = rnd_var<4>({1, 16, 256, 256}, 1);
  for (auto _ : state) {
    auto y = shard::F::sum(a, {2, 3});
    benchmark::DoNotOptimize(y.local().data());
  }
  state.SetItemsProcessed(state.iterations() * 16 * 256 * 256);
}
BENCHMARK(BM_F_sum_dims)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
