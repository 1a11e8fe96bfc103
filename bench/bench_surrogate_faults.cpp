// Page faults and time per step of an unet_surrogate-like loop at steady state (issue 8, allocator).
// One process (SelfComm mesh): a 2-D U-Net (width 8, depth 2, like examples/unet_surrogate's
// defaults) on a batch of 4 fields of GRID x GRID, fp32. After --warmup steps it measures
//   train: zero_grad, forward, mse_loss, backward, AdamW step;
//   infer: the surrogate call alone (forward under NoGradGuard), as an in-situ code would call it;
// and prints minor/major page faults per step (getrusage ru_minflt/ru_majflt before/after),
// the median time of one step, and (with this branch's allocator) the OS mappings made.
//   bench_surrogate_faults [--grid 64] [--steps 50] [--warmup 5] [--width 8] [--depth 2]
// Compile against another build (e.g. main) with -DSURROGATE_FAULTS_BASELINE (no allocator stats).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/unet.hpp>
#include <shardtensor/shardtensor.hpp>

using namespace shard;

namespace {
long minflt() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}
long majflt() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_majflt;
}
std::uint64_t os_maps() {
#ifdef SURROGATE_FAULTS_BASELINE
  return 0;
#else
  return host_allocator_stats().os_maps;
#endif
}

template <class F>
void measure(const char* what, int warmup, int steps, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> ms;
  const long f0 = minflt(), j0 = majflt();
  const auto m0 = os_maps();
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  const long f1 = minflt(), j1 = majflt();
  const auto m1 = os_maps();
  std::sort(ms.begin(), ms.end());
  std::printf("%-6s minor faults/step %9.1f  major faults/step %5.2f  OS mappings/step %6.2f  median %8.3f ms  "
              "(min %.3f, max %.3f, %d steps)\n",
              what, double(f1 - f0) / steps, double(j1 - j0) / steps, double(m1 - m0) / steps, ms[ms.size() / 2],
              ms.front(), ms.back(), steps);
}
}  // namespace

int main(int argc, char** argv) {
  index_t grid = 64, width = 8;
  int steps = 50, warmup = 5, depth = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (v <= 0) {
      std::fprintf(stderr, "bad value for %s\n", k.c_str());
      return 2;
    }
    if (k == "--grid") grid = v;
    else if (k == "--steps") steps = static_cast<int>(v);
    else if (k == "--warmup") warmup = static_cast<int>(v);
    else if (k == "--width") width = v;
    else if (k == "--depth") depth = static_cast<int>(v);
    else {
      std::fprintf(stderr, "usage: bench_surrogate_faults [--grid G] [--steps N] [--warmup W] [--width C] [--depth D]\n");
      return 2;
    }
  }
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  nn::UNetOptions o;
  o.in_channels = 1;
  o.out_channels = 1;
  o.base_width = width;
  o.depth = depth;
  nn::UNet<float, 2> model(mesh, o, 1);
  optim::AdamW<float> opt(model.parameters(), {.lr = 1e-3, .weight_decay = 1e-4});
  const auto x = DistTensor<float, 4>::random({4, 1, grid, grid}, mesh, {Replicate()}, 1);
  const auto y = DistTensor<float, 4>::random({4, 1, grid, grid}, mesh, {Replicate()}, 2);
  std::printf("bench_surrogate_faults: U-Net width %ld depth %d, batch 4 x %ldx%ld fp32, 1 process\n",
              static_cast<long>(width), depth, static_cast<long>(grid), static_cast<long>(grid));
  measure("train", warmup, steps, [&] {
    opt.zero_grad();
    auto loss = F::mse_loss(model.forward(autograd::Var<float, 4>(x)), autograd::Var<float, 4>(y));
    loss.backward();
    opt.step();
  });
  measure("infer", warmup, steps, [&] {
    autograd::NoGradGuard ng;
    auto out = model.forward(autograd::Var<float, 4>(x));
    (void)out;
  });
  return 0;
}
