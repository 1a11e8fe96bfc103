// The CUDA DeviceRuntime (src/cuda/runtime_cuda.cpp) through the registry: it is registered when
// shardtensor::cuda is linked; on a GPU, streams, events, pinned memory, async copies, memset
// and the device UUID work. Skips the GPU part (with a message) when no GPU is visible.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <shardtensor/exec/gemm.hpp>
#include <shardtensor/shardtensor.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "shardtensor/runtime/device_runtime.hpp"

namespace st_exec_cuda_device_runtime {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("CUDA runtime: registered when shardtensor::cuda is linked", "[cuda][exec]") {
  CHECK(exec::backend_available(DeviceKind::cuda));
  const auto& rt = exec::cuda_runtime("test");
  CHECK(rt.device_count() == cuda_device_count());
  CHECK(rt.device_count() >= 0);
  CHECK_THROWS_WITH(rt.check_device(rt.device_count(), "my_op"),
                    ContainsSubstring("my_op") && ContainsSubstring(fmt::format("cuda:{}", rt.device_count())));
  CHECK_THROWS_WITH(rt.check_device(-1, "my_op"), ContainsSubstring("my_op") && ContainsSubstring("cuda:-1"));
  CHECK_THROWS_AS(rt.allocate(64, rt.device_count()), Error);
}

TEST_CASE("CUDA runtime: streams, events, pinned memory, async copies, memset, uuid", "[cuda][exec]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped");
  const auto& rt = exec::cuda_runtime("test");
  const int dev = 0;
  const std::size_t n = 1000, bytes = n * sizeof(double);

  Stream s = rt.create_stream(dev);
  CHECK(s.handle != nullptr);
  auto* pinned = static_cast<double*>(rt.allocate_pinned(bytes));
  for (std::size_t i = 0; i < n; ++i) pinned[i] = 0.5 * static_cast<double>(i);
  void* d = rt.allocate(bytes, dev);
  void* d2 = rt.allocate(bytes, dev);
  rt.copy(d, Device::cuda(dev), pinned, Device::cpu(), bytes, s, /*sync=*/false);
  rt.copy(d2, Device::cuda(dev), d, Device::cuda(dev), bytes, s, false);
  void* ev = rt.create_event(dev);
  rt.record_event(ev, s, dev);
  rt.synchronize_event(ev);
  CHECK(rt.query_event(ev));

  std::vector<double> back(n, -1.0);  // pageable: copy returns after completion
  rt.copy(back.data(), Device::cpu(), d2, Device::cuda(dev), bytes, s, false);
  bool same = true;
  for (std::size_t i = 0; i < n; ++i) same = same && back[i] == 0.5 * static_cast<double>(i);
  CHECK(same);

  // A second stream waits for the first through an event, then zeroes the buffer.
  Stream s2 = rt.create_stream(dev);
  rt.record_event(ev, s, dev);
  rt.wait_event(s2, ev, dev);
  rt.memset(d2, 0, bytes, dev, s2);
  rt.copy(back.data(), Device::cpu(), d2, Device::cuda(dev), bytes, s2, true);
  bool zero = true;
  for (double v : back) zero = zero && v == 0.0;
  CHECK(zero);

  char uuid[64] = {};
  rt.device_uuid(dev, uuid);
  CHECK(std::strncmp(uuid, "GPU-", 4) == 0);
  CHECK(std::strlen(uuid) == 40);

  rt.destroy_event(ev);
  rt.deallocate(d, dev);
  rt.deallocate(d2, dev);
  rt.deallocate_pinned(pinned);
  rt.destroy_stream(s, dev);
  rt.destroy_stream(s2, dev);
  rt.synchronize(Stream{}, dev);
}

TEST_CASE("CUDA runtime: tensors use the thread's current context stream", "[cuda][exec]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped");
  const auto& rt = exec::cuda_runtime("test");
  ExecContext ctx(Device::cuda(0), rt.create_stream(0));
  {
    ContextGuard guard(ctx);
    auto a = Tensor<double, 2>::empty({17, 5});
    a.fill_random(7);
    auto g = a.to(Device::cuda(0));
    auto g2 = g.slice({2, 1}, {9, 4}).clone();
    CHECK(max_rel_diff(g2.to(Device::cpu()), a.slice({2, 1}, {9, 4}).clone()) == 0.0);
    CHECK(std::abs(sum(g) - sum(a)) <= 1e-12 * (std::abs(sum(a)) + 1));
  }
  rt.destroy_stream(ctx.stream(), 0);
}

namespace {
/// Whether a file whose path contains `name` is mapped into this process (/proc/self/maps).
bool mapped(const char* name) {
  std::FILE* f = std::fopen("/proc/self/maps", "r");
  if (!f) return false;
  char line[4096];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f)) found = std::strstr(line, name) != nullptr;
  std::fclose(f);
  return found;
}
}  // namespace

TEST_CASE("cuBLAS: loaded on the first GEMM on a GPU and not at start-up", "[cuda][exec][gemm]") {
  // A program linked with shardtensor::cuda must not map cuBLAS (~150 MiB resident) on CPU runs.
  const double a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};  // row-major 2x2
  const double want[4] = {19, 22, 43, 50};
  if (cuda_device_count() == 0) {
    CHECK_FALSE(mapped("libcublas"));
    double c[4] = {};
    ExecContext ctx(Device::cpu());
    const index_t sh[2] = {2, 2};
    exec::gemm({}, Block::view(DType::f64, Device::cpu(), const_cast<double*>(a), sh, 2),
               Block::view(DType::f64, Device::cpu(), const_cast<double*>(b), sh, 2),
               Block::view(DType::f64, Device::cpu(), c, sh, 2), ctx);
    for (int i = 0; i < 4; ++i) CHECK(c[i] == want[i]);
    CHECK_FALSE(mapped("libcublas"));  // a CPU GEMM does not load it either
    return;
  }
  const auto& rt = exec::cuda_runtime("test");
  const Device dev = Device::cuda(0);
  auto* d = static_cast<double*>(rt.allocate(12 * sizeof(double), 0));
  rt.copy(d, dev, a, Device::cpu(), sizeof a, Stream{}, /*sync=*/true);
  rt.copy(d + 4, dev, b, Device::cpu(), sizeof b, Stream{}, /*sync=*/true);
  ExecContext ctx(dev);
  const index_t sh[2] = {2, 2};
  exec::gemm({}, Block::view(DType::f64, dev, d, sh, 2), Block::view(DType::f64, dev, d + 4, sh, 2),
             Block::view(DType::f64, dev, d + 8, sh, 2), ctx);
  double c[4] = {};
  rt.copy(c, Device::cpu(), d + 8, dev, sizeof c, Stream{}, /*sync=*/true);
  rt.deallocate(d, 0);
  for (int i = 0; i < 4; ++i) CHECK(c[i] == want[i]);
  CHECK(mapped("libcublas"));
}

}  // namespace st_exec_cuda_device_runtime
