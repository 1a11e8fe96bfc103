// What a program that does NOT link shardtensor::cuda sees of CUDA (this binary never links it):
// no devices, and every way of making or touching a CUDA tensor is refused with a shard::Error
// that names the op and the device and says how to fix it.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <shardtensor/exec/context.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_tensor_test_device_backend {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

namespace {
/// The fix the error must name: link the backend (CUDA build) or enable CUDA (CPU-only build).
const char* remedy() { return cuda_compiled() ? "link shardtensor::cuda" : "built without CUDA"; }
}  // namespace

TEST_CASE("without shardtensor::cuda: no CUDA devices are visible", "[tensor][device]") {
  CHECK(cuda_device_count() == 0);
  CHECK(memory_stats(DeviceKind::cuda).current_bytes == 0);
}

TEST_CASE("without shardtensor::cuda: a CUDA tensor is refused, naming op, device and the fix", "[tensor][device]") {
  CHECK_THROWS_AS((Tensor<float, 1>::empty({4}, Device::cuda(0))), Error);
  CHECK_THROWS_WITH((Tensor<float, 1>::empty({4}, Device::cuda(0))),
                    ContainsSubstring("allocate") && ContainsSubstring("cuda:0") && ContainsSubstring(remedy()));
  CHECK_THROWS_WITH((Tensor<double, 2>::zeros({2, 3}, Device::cuda(1))),
                    ContainsSubstring("cuda:1") && ContainsSubstring(remedy()));

  // Moving a host tensor to the device, and asking for a device context, fail the same way.
  auto h = Tensor<double, 1>::empty({3});
  h.fill(1.0);
  CHECK_THROWS_WITH(h.to(Device::cuda(0)), ContainsSubstring("cuda:0") && ContainsSubstring(remedy()));
  CHECK_THROWS_WITH(current_context(Device::cuda(0)), ContainsSubstring("current_context") &&
                                                          ContainsSubstring("cuda:0") && ContainsSubstring(remedy()));
  // Nothing was counted as device memory by the failed attempts.
  CHECK(memory_stats(DeviceKind::cuda).current_bytes == 0);
}

}  // namespace st_tensor_test_device_backend
