// Whole-model GPU test: the U-Net's forward, MSE loss, backward and one Adam step on CUDA give
// the CPU run's loss, output, input gradient, every parameter gradient and every updated
// parameter (fp32 <= 1e-5 with TF32 off, fp64 <= 1e-10). Skips with a message without a GPU.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include "nn/module_oracle.hpp"

#include <shardtensor/exec/context.hpp>
#include <shardtensor/nn/unet.hpp>

namespace st_nn_cuda_unet_model {

using namespace shard;
using namespace shard::nn;
using namespace shard::test;

namespace {

template <class T> double gpu_tol() { return sizeof(T) == 8 ? 1e-10 : 1e-5; }

template <class T, int S>
void check_unet_on_gpu(const UNetOptions& o, const Shape<S + 2>& shape) {
  if (!cuda_compiled()) SKIP("shardtensor was built without CUDA (SHARDTENSOR_ENABLE_CUDA=OFF)");
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU whole-model test skipped");
  constexpr int R = S + 2;
  const mod::Builder<T, R> build = [o](const DeviceMesh& m) { return std::make_shared<UNet<T, S>>(m, o, 2024); };
  mod::RunOptions cpu{.adam_step = true, .lr = 1e-2};
  const auto ref = mod::reference<T, R>(shape, build, cpu);
  mod::RunOptions gpu = cpu;
  gpu.device = Device::cuda(0);
  ExecContext ctx(Device::cuda(0));
  ctx.settings().allow_tf32 = false;
  ContextGuard guard(ctx);
  DeviceMesh m1(std::make_shared<SelfComm>(), {1});
  mod::require_match(mod::run<T, R>(m1, mod::reference_layout(), shape, build, gpu), ref, gpu_tol<T>());
}

}  // namespace

TEMPLATE_TEST_CASE("CUDA whole model: 2-D U-Net forward, backward and an Adam step equal the CPU", "[cuda][nn][unet]",
                   float, double) {
  UNetOptions o{.in_channels = 2, .out_channels = 1, .depth = 2, .base_width = 4, .channel_mult = 2, .norm_groups = 2};
  SECTION("avg-pool down, nearest + conv up") {
    o.down = Downsample::avg_pool;
    o.up = Upsample::nearest_conv;
    check_unet_on_gpu<TestType, 2>(o, Shape<4>{2, 2, 20, 16});
  }
  SECTION("strided-conv down, transposed-conv up") {
    o.down = Downsample::strided_conv;
    o.up = Upsample::transposed_conv;
    check_unet_on_gpu<TestType, 2>(o, Shape<4>{2, 2, 20, 18});
  }
}

TEMPLATE_TEST_CASE("CUDA whole model: tiny 3-D U-Net equals the CPU", "[cuda][nn][unet]", float, double) {
  UNetOptions o{.in_channels = 1, .out_channels = 2, .depth = 2, .base_width = 2, .norm_groups = 2,
                .activation = Activation::gelu};
  check_unet_on_gpu<TestType, 3>(o, Shape<5>{2, 1, 8, 6, 5});
}

}  // namespace st_nn_cuda_unet_model
