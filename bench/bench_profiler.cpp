// The profiler's cost (runtime/profiler.hpp): a profiled scope while profiling is off (one relaxed
// atomic load and a branch), while it collects (two steady_clock reads and four relaxed atomic
// adds), and a real front (box_zero of 64 floats) off and on. docs/performance.md, "Profiling".
#include <benchmark/benchmark.h>

#include <shardtensor/exec/box.hpp>
#include <shardtensor/exec/profiler.hpp>
#include <shardtensor/shardtensor.hpp>

namespace {

[[gnu::noinline]] int plain(int x) {
  benchmark::DoNotOptimize(x);
  return x + 1;
}

[[gnu::noinline]] int scoped(int x) {
  SHARD_PROFILE_SCOPE("bench", "scope", "", nullptr);
  benchmark::DoNotOptimize(x);
  return x + 1;
}

void BM_function_no_scope(benchmark::State& st) {
  int x = 0;
  for (auto _ : st) x = plain(x);
  benchmark::DoNotOptimize(x);
}
BENCHMARK(BM_function_no_scope);

void BM_scope_off(benchmark::State& st) {
  if (shard::profile::collecting()) st.SkipWithError("SHARDTENSOR_PROFILE is set");
  int x = 0;
  for (auto _ : st) x = scoped(x);
  benchmark::DoNotOptimize(x);
}
BENCHMARK(BM_scope_off);

void BM_scope_collecting(benchmark::State& st) {
  shard::Profiler prof;
  int x = 0;
  for (auto _ : st) x = scoped(x);
  benchmark::DoNotOptimize(x);
}
BENCHMARK(BM_scope_collecting);

void box_zero_bench(benchmark::State& st, bool on) {
  auto b = shard::Block::allocate(shard::DType::f32, shard::Device::cpu(), std::vector<shard::index_t>{64});
  auto& ctx = shard::current_context(shard::Device::cpu());
  std::unique_ptr<shard::Profiler> prof;
  if (on) prof = std::make_unique<shard::Profiler>();
  for (auto _ : st) {
    shard::exec::box_zero(b, ctx);
    benchmark::ClobberMemory();
  }
}
void BM_box_zero_64_off(benchmark::State& st) { box_zero_bench(st, false); }
void BM_box_zero_64_collecting(benchmark::State& st) { box_zero_bench(st, true); }
BENCHMARK(BM_box_zero_64_off);
BENCHMARK(BM_box_zero_64_collecting);

}  // namespace

BENCHMARK_MAIN();
