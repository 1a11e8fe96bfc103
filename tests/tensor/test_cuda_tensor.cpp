// CUDA tensors against the CPU reference (built into shardtensor_cuda_tests, which links
// shardtensor::cuda). Skips (with a message) when no GPU is visible, so the suite passes on
// machines without one; the device-index error is checked either way.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <shardtensor/exec/context.hpp>
#include <shardtensor/shardtensor.hpp>

#include <string>

namespace st_tensor_test_cuda_tensor {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

namespace {
bool have_gpu() { return cuda_compiled() && cuda_device_count() > 0; }
}  // namespace

TEST_CASE("CUDA tensors: copy, strided copy, fill, axpy, scale, mul, sum match the CPU", "[cuda]") {
  if (!cuda_compiled()) SKIP("shardtensor was built without CUDA (SHARDTENSOR_ENABLE_CUDA=OFF)");
  if (!have_gpu()) SKIP("no CUDA device visible: GPU tests skipped");
  const Device gpu = Device::cuda(0);
  auto a = Tensor<double, 3>::empty({5, 7, 9});
  a.fill_random(1);
  auto b = Tensor<double, 3>::empty({5, 7, 9});
  b.fill_random(2);

  auto ga = a.to(gpu), gb = b.to(gpu);
  CHECK(ga.device() == gpu);
  CHECK(max_rel_diff(ga.to(Device::cpu()), a) == 0.0);

  // Strided device-to-device copy (a slice of a device tensor into a fresh one).
  auto gs = ga.slice({1, 2, 3}, {3, 4, 5}).clone();
  CHECK(max_rel_diff(gs.to(Device::cpu()), a.slice({1, 2, 3}, {3, 4, 5}).clone()) == 0.0);

  // Fill of a strided device view leaves the rest alone.
  auto gf = ga.clone();
  gf.narrow(1, 2, 3).fill(4.0);
  auto cf = a.clone();
  cf.narrow(1, 2, 3).fill(4.0);
  CHECK(max_rel_diff(gf.to(Device::cpu()), cf) == 0.0);

  auto gy = gb.clone();
  axpy(0.5, ga, gy);
  auto cy = b.clone();
  axpy(0.5, a, cy);
  CHECK(max_rel_diff(gy.to(Device::cpu()), cy) < 1e-15);

  scale(gy, 3.0);
  scale(cy, 3.0);
  CHECK(max_rel_diff(gy.to(Device::cpu()), cy) < 1e-15);

  CHECK(max_rel_diff(mul(ga, gb).to(Device::cpu()), mul(a, b)) < 1e-15);
  CHECK(std::abs(sum(ga) - sum(a)) < 1e-12 * std::abs(sum(a)) + 1e-12);

  // fp32 too.
  auto af = Tensor<float, 1>::empty({1000});
  af.fill_random(3);
  auto gaf = af.to(gpu);
  CHECK(std::abs(sum(gaf) - sum(af)) < 1e-4);
  CHECK(memory_stats(DeviceKind::cuda).peak_bytes > 0);
}

TEST_CASE("CUDA tensors: a device index beyond the visible GPUs is refused, naming op and device", "[cuda]") {
  // This binary links shardtensor::cuda: the backend is registered, so the error is about the
  // device, not about linking.
  const int n = cuda_device_count();
  const Device beyond = Device::cuda(n);
  // Refused allocations leave nothing behind. Measured as a difference: other cases of this binary
  // may legitimately hold device memory (caches, statics) when this one runs.
  const std::size_t before = memory_stats(DeviceKind::cuda).current_bytes;
  const std::string want = n == 0 ? "no CUDA device is visible" : fmt::format("beyond the {} visible GPU(s)", n);
  CHECK_THROWS_WITH((Tensor<float, 1>::empty({4}, beyond)),
                    ContainsSubstring("allocate") && ContainsSubstring(fmt::format("cuda:{}", n)) && ContainsSubstring(want));
  auto h = Tensor<double, 1>::empty({3});
  h.fill(1.0);
  CHECK_THROWS_WITH(h.to(beyond), ContainsSubstring(fmt::format("cuda:{}", n)) && ContainsSubstring(want));
  CHECK_THROWS_WITH(current_context(beyond), ContainsSubstring("current_context") && ContainsSubstring(want));
  CHECK_THROWS_WITH((Tensor<float, 1>::empty({4}, Device::cuda(-1))), ContainsSubstring("cuda:-1"));
  CHECK(memory_stats(DeviceKind::cuda).current_bytes == before);
}

TEST_CASE("CUDA tensors: device memory counters follow allocations", "[cuda]") {
  if (!have_gpu()) SKIP("no CUDA device visible: GPU tests skipped");
  release_cached_memory();
  const auto before = memory_stats(DeviceKind::cuda);
  {
    auto t = Tensor<float, 1>::empty({1 << 20}, Device::cuda(0));  // 4 MiB
    const auto during = memory_stats(DeviceKind::cuda);
    CHECK(during.current_bytes == before.current_bytes + (std::size_t{4} << 20));
    CHECK(during.peak_bytes >= during.current_bytes);
  }
  const auto after = memory_stats(DeviceKind::cuda);
  CHECK(after.current_bytes == before.current_bytes);
  // Freed device blocks stay cached (unless SHARDTENSOR_CUDA_CACHE=0) until released.
  release_cached_memory();
  CHECK(memory_stats(DeviceKind::cuda).cached_bytes <= after.cached_bytes);
  // A second tensor of the same size reuses memory and computes correctly.
  auto a = Tensor<float, 1>::full({1 << 20}, 2.0f, Device::cuda(0));
  CHECK(sum(a) == 2.0 * (1 << 20));
}

}  // namespace st_tensor_test_cuda_tensor
