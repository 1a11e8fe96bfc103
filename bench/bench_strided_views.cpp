// Issue 8, compute from user memory: one in-situ surrogate training step, loss = mse(conv(x), x_next)
// with a 16 -> 16 3x3 conv (+ bias) on a 1 x 16 x n x n fp32 field, forward + backward (weight and
// bias gradients; the simulation's state needs none), on one rank. The two fields are
//   strided:     stable zero-copy views of the interior of halo-padded arrays [1, 16, n + 4, n + 4]
//                (ghost width 2), read in place by the kernels (this branch);
//   copy:        the same views copied to contiguous tensors first, every step: what main did
//                inside F::conv and F::mse_loss (x.local().contiguous() on a strided view);
//   contiguous:  contiguous library tensors (the lower bound: no view, no copy).
// Counters (both step kinds): peak_MiB = rise of shardtensor's host allocation high-water mark over the step (the
// bytes the step allocates at its peak), MiB_field = one field's size.
// BM_heads_step_*: the ops converted after conv (channel_linear, sum, max, mean, upsample), see
// run_heads below.
// Run: OMP_NUM_THREADS=2 build/bench/bench_strided_views --benchmark_repetitions=5
//      --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <vector>

#include <shardtensor/nn/functional.hpp>

using namespace shard;
using autograd::Var;

namespace {

constexpr index_t kC = 16, kG = 2;

struct Field {
  std::vector<float> mem;
  Tensor<float, 4> interior;
  Field(index_t n, std::uint64_t seed) {
    const index_t p = n + 2 * kG;
    mem.assign(static_cast<std::size_t>(kC * p * p), 0.f);
    interior = Tensor<float, 4>::view(mem.data() + kG * p + kG, {1, kC, n, n}, {kC * p * p, p * p, p, 1})
                   .declare_stable();
    interior.fill_random(seed);
  }
};

enum class Mode { strided, copy, contiguous };

void run(benchmark::State& state, Mode mode) {
  const index_t n = state.range(0);
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  Field xf(n, 1), nf(n, 2);
  const auto xc = xf.interior.contiguous(), nc = nf.interior.contiguous();
  Var<float, 4> w(DistTensor<float, 4>::random({kC, kC, 3, 3}, mesh, {Replicate()}, 3, RandomInit::uniform(-0.1, 0.1)),
                  true);
  Var<float, 1> b(DistTensor<float, 1>::random({kC}, mesh, {Replicate()}, 4), true);
  const auto opt = F::ConvOptions<2>::symmetric(1);
  auto step = [&] {
    Tensor<float, 4> x, t;
    switch (mode) {
      case Mode::strided: x = xf.interior, t = nf.interior; break;
      case Mode::copy: x = xf.interior.contiguous(), t = nf.interior.contiguous(); break;
      case Mode::contiguous: x = xc, t = nc; break;
    }
    Var<float, 4> xv(DistTensor<float, 4>::from_local(x, mesh, {Replicate()}), false);
    Var<float, 4> tv(DistTensor<float, 4>::from_local(t, mesh, {Replicate()}), false);
    auto loss = F::mse_loss(F::conv(xv, w, b, opt), tv);
    loss.backward();
    w.zero_grad();
    b.zero_grad();
  };
  step();  // warm the caches and the allocator
  std::size_t peak = 0;
  for (auto _ : state) {
    const std::size_t before = memory_stats().current_bytes;
    reset_peak_memory();
    step();
    peak = std::max(peak, memory_stats().peak_bytes - before);
  }
  state.counters["peak_MiB"] = static_cast<double>(peak) / (1 << 20);
  state.counters["MiB_field"] = static_cast<double>(xc.numel() * 4) / (1 << 20);
}

void BM_surrogate_step_strided(benchmark::State& s) { run(s, Mode::strided); }
void BM_surrogate_step_copy(benchmark::State& s) { run(s, Mode::copy); }
void BM_surrogate_step_contiguous(benchmark::State& s) { run(s, Mode::contiguous); }

}  // namespace

// ---- The remaining ops (strided2): one step of channel_linear (16 -> 16, + bias; mse against the
// next state, weight / bias gradients), sum over C, max over the spatial dims, mean of all and a
// nearest 2x upsampling, all on the field x (as a diagnostics / coarse-to-fine head would).
//   strided: x and t are the stable interior views (read in place);
//   copy:    main's behaviour for these ops: channel_linear, sum, max, upsample and mean each
//            copied the view first (5 copies of x per step; mse already read t in place);
//   contiguous: library tensors.
void run_heads(benchmark::State& state, Mode mode) {
  const index_t n = state.range(0);
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  Field xf(n, 1), nf(n, 2);
  const auto xc = xf.interior.contiguous(), nc = nf.interior.contiguous();
  Var<float, 2> w(DistTensor<float, 2>::random({kC, kC}, mesh, {Replicate()}, 3, RandomInit::uniform(-0.2, 0.2)), true);
  Var<float, 1> b(DistTensor<float, 1>::random({kC}, mesh, {Replicate()}, 4), true);
  auto var = [&](const Tensor<float, 4>& t) {
    return Var<float, 4>(DistTensor<float, 4>::from_local(t, mesh, {Replicate()}), false);
  };
  auto step = [&] {
    auto x_for = [&]() {  // the block an op reads
      return var(mode == Mode::strided ? xf.interior : mode == Mode::copy ? xf.interior.contiguous() : xc);
    };
    const auto t = var(mode == Mode::contiguous ? nc : nf.interior);
    auto loss = F::mse_loss(F::channel_linear(x_for(), w, b), t);
    auto s = F::sum(x_for(), {1});
    auto m = F::max(x_for(), {2, 3});
    auto u = F::upsample_nearest(x_for(), Shape<2>{2, 2});
    auto mu = F::mean(x_for());
    benchmark::DoNotOptimize(s.value().local().data());
    benchmark::DoNotOptimize(m.value().local().data());
    benchmark::DoNotOptimize(u.value().local().data());
    benchmark::DoNotOptimize(mu.value().local().data());
    loss.backward();
    w.zero_grad();
    b.zero_grad();
  };
  step();
  std::size_t peak = 0;
  const std::uint64_t large0 = host_allocator_stats().large_allocs;
  for (auto _ : state) {
    const std::size_t before = memory_stats().current_bytes;
    reset_peak_memory();
    step();
    peak = std::max(peak, memory_stats().peak_bytes - before);
  }
  state.counters["peak_MiB"] = static_cast<double>(peak) / (1 << 20);
  state.counters["MiB_field"] = static_cast<double>(xc.numel() * 4) / (1 << 20);
  // Host block requests >= 1 MiB per step (outputs, gradients and, for copy, the copies of x).
  state.counters["big_allocs"] =
      static_cast<double>(host_allocator_stats().large_allocs - large0) / static_cast<double>(state.iterations());
}

void BM_heads_step_strided(benchmark::State& s) { run_heads(s, Mode::strided); }
void BM_heads_step_copy(benchmark::State& s) { run_heads(s, Mode::copy); }
void BM_heads_step_contiguous(benchmark::State& s) { run_heads(s, Mode::contiguous); }

BENCHMARK(BM_surrogate_step_strided)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_surrogate_step_copy)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_surrogate_step_contiguous)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK(BM_heads_step_strided)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_heads_step_copy)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_heads_step_contiguous)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
