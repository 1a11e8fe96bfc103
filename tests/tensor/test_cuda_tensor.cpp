// CUDA tensors against the CPU reference. Skips (with a message) when the build has no CUDA or
// no GPU is visible, so the suite passes on machines without one.
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/shardtensor.hpp>

using namespace shard;

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

TEST_CASE("CUDA tensors: a build without CUDA refuses device tensors with a clear error", "[cuda]") {
  if (cuda_compiled()) SKIP("this build has CUDA; the refusal path is for CUDA-less builds");
  auto make = [] { return Tensor<float, 1>::empty({4}, Device::cuda(0)); };
  CHECK_THROWS_AS(make(), Error);
}
