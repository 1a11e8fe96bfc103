// GPU conv benchmark (issue 6, item 9): fp32 forward + backward (input, weight and bias
// gradients) of conv2d 64->64 3x3 pad 1 on 1x64x2048^2 and conv3d 32->32 3^3 pad 1 on 1x32x256^3
// through the conv kernel family on CUDA (cuDNN, TF32 off), with the device memory high-water
// mark of shardtensor's allocator. bench/torch_conv_gpu.py runs the same problems in PyTorch;
// bench/run_gpu_conv.sh prints the ratio table.
//
//   build/bench/bench_conv_gpu [--reps 10] [--case all|conv2d|conv3d] [--deterministic 0|1]
//
// Prints one "RESULT <case> fwd_ms <f> bwd_ms <b> total_ms <t> peak_mib <m> first_peak_mib <m0>"
// line per case: medians over the timed steps (after 2 warm-up steps, which also run cuDNN's
// algorithm search); peak_mib is the allocator's device high-water mark over the timed steps,
// first_peak_mib the one over the warm-up (including the algorithm search's trial workspace).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include <shardtensor/exec/context.hpp>
#include <shardtensor/nn/functional/conv_local.hpp>
#include <shardtensor/tensor/memory.hpp>

#include "bench_util.hpp"

using namespace shard;
using shard::nn::functional::ConvOptions;

using shard::bench::now_ms;
using shard::bench::median;

namespace {

double mib(std::size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

/// One conv layer step: y = conv(x, w) + b; then gx, gw, gb from gy.
template <int R>
void run_case(const char* name, const Shape<R>& xs, index_t cout, index_t k, int reps, ExecContext& ctx) {
  constexpr int S = R - 2;
  const Device dev = ctx.device();
  Shape<R> ws{};
  ws[0] = cout;
  ws[1] = xs[1];
  for (int d = 0; d < S; ++d) ws[2 + d] = k;
  Shape<S> in{}, kern{};
  for (int d = 0; d < S; ++d) {
    in[d] = xs[2 + d];
    kern[d] = k;
  }
  const auto p = ConvOptions<S>::symmetric(1);
  // Operands generated on the host once, then moved (a few GiB of host memory at most).
  auto x = Tensor<float, R>::empty(xs);
  x.fill_random(1);
  auto w = Tensor<float, R>::empty(ws);
  w.fill_random(2);
  auto b = Tensor<float, 1>::empty({cout});
  b.fill_random(3);
  const auto dx = x.to(dev), dw = w.to(dev);
  const auto db = b.to(dev);
  x = {};
  Shape<R> ys = xs;
  ys[1] = cout;
  auto gyh = Tensor<float, R>::empty(ys);
  gyh.fill_random(4);
  const auto dgy = gyh.to(dev);
  gyh = {};
  ctx.synchronize();

  reset_peak_memory(DeviceKind::cuda);
  std::vector<double> fwd, bwd, tot;
  std::size_t first_peak = 0;
  for (int r = 0; r < reps + 2; ++r) {
    ctx.synchronize();
    const double t0 = now_ms();
    auto y = conv_forward(dx, dw, db, p);
    ctx.synchronize();
    const double t1 = now_ms();
    auto gx = conv_backward_input(dgy, dw, in, p);
    auto gw = conv_backward_weight(dx, dgy, kern, p);
    auto gb = conv_backward_bias(dgy);
    ctx.synchronize();
    const double t2 = now_ms();
    if (r == 1) {  // warm-up (algorithm search) done
      first_peak = memory_stats(DeviceKind::cuda).peak_bytes;
      reset_peak_memory(DeviceKind::cuda);
    }
    if (r >= 2) {
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
      tot.push_back(t2 - t0);
    }
  }
  const double peak = mib(memory_stats(DeviceKind::cuda).peak_bytes);
  fmt::print("{}: fwd {:.2f} ms  bwd {:.2f} ms  total {:.2f} ms (min {:.2f})  device peak {:.0f} MiB (warm-up {:.0f} MiB)\n",
             name, median(fwd), median(bwd), median(tot), *std::min_element(tot.begin(), tot.end()), peak,
             mib(first_peak));
  fmt::print("RESULT {} fwd_ms {:.3f} bwd_ms {:.3f} total_ms {:.3f} peak_mib {:.0f} first_peak_mib {:.0f}\n", name,
             median(fwd), median(bwd), median(tot), peak, mib(first_peak));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  std::string which = "all";
  bool deterministic = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--reps") reps = std::max(1, std::stoi(v));
    else if (a == "--case") which = v;
    else if (a == "--deterministic") deterministic = v != "0";
    else {
      fmt::print(stderr, "unknown option {}\n", a);
      return 2;
    }
  }
  if (!cuda_compiled() || cuda_device_count() == 0) {
    fmt::print("bench_conv_gpu: no CUDA device visible (or built without CUDA); nothing to measure\n");
    return 0;
  }
  ExecContext ctx(Device::cuda(0));
  ctx.settings().allow_tf32 = false;  // compare fp32 with fp32 (PyTorch side: TF32 off too)
  ctx.settings().deterministic = deterministic;
  ContextGuard guard(ctx);
  fmt::print("bench_conv_gpu: fp32, TF32 off, deterministic {}, {} timed steps after 2 warm-up steps\n",
             deterministic, reps);
  if (which == "all" || which == "conv2d")
    run_case<4>("conv2d_64x64_3x3_1x64x2048^2", Shape<4>{1, 64, 2048, 2048}, 64, 3, reps, ctx);
  if (which == "all" || which == "conv3d")
    run_case<5>("conv3d_32x32_3^3_1x32x256^3", Shape<5>{1, 32, 256, 256, 256}, 32, 3, reps, ctx);
  return 0;
}
