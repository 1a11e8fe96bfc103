// Mixed precision on the CPU (issue 18 item 8): conv2d / conv3d forward + backward (input and
// weight gradients) at one rank in f32, bf16 and f16 storage, interleaved rounds in one process,
// medians; prints the CPU model and ISA beside every figure and the speed ratio f32 / low.
//   OMP_NUM_THREADS=2 build/bench/bench_precision [--rounds 7] [--case 2d|3d|all]
// bf16 / f16 go through f32 working copies (src/exec/precision.hpp): the ratio measures the
// conversion overhead against the memory halving; there is no native bf16 conv kernel yet.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <shardtensor/core/cpu_isa.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

#include "bench_util.hpp"

using namespace shard;
namespace F = shard::nn::functional;
using autograd::Var;

namespace {

const DeviceMesh& mesh1() {
  static DeviceMesh m(std::make_shared<SelfComm>(), {1});
  return m;
}

/// One forward + backward of conv(x, w) in dtype T; returns milliseconds.
template <class T, int R>
double conv_step(const DistTensor<T, R>& x, const DistTensor<T, R>& w) {
  Var<T, R> xv(x, true), wv(w, true);
  const double t0 = bench::now_ms();
  auto y = F::conv(xv, wv, std::nullopt, F::ConvOptions<R - 2>::symmetric(1));
  F::sum(y).backward();
  return bench::now_ms() - t0;
}

template <int R>
void run_case(const char* name, const Shape<R>& xs, const Shape<R>& ws, int rounds) {
  const auto x32 = DistTensor<float, R>::random(xs, mesh1(), {Replicate()}, 1);
  const auto w32 = DistTensor<float, R>::random(ws, mesh1(), {Replicate()}, 2, RandomInit::uniform(-0.1, 0.1));
  const auto xb = shard::cast<bf16>(x32), wb = shard::cast<bf16>(w32);
  const auto xh = shard::cast<f16>(x32), wh = shard::cast<f16>(w32);
  conv_step(x32, w32), conv_step(xb, wb), conv_step(xh, wh);  // warm-up (plans, pools)
  std::vector<double> t32, tb, th;
  for (int r = 0; r < rounds; ++r) {
    t32.push_back(conv_step(x32, w32));
    tb.push_back(conv_step(xb, wb));
    th.push_back(conv_step(xh, wh));
  }
  const double m32 = bench::median(t32), mb = bench::median(tb), mh = bench::median(th);
  std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", name, m32, mb, mh, m32 / mb, m32 / mh);
  std::printf("RESULT %s f32_ms %.3f bf16_ms %.3f f16_ms %.3f ratio_bf16 %.3f ratio_f16 %.3f\n", name, m32, mb, mh,
              m32 / mb, m32 / mh);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = static_cast<int>(bench::arg_int(argc, argv, "--rounds", 7));
  const std::string which = bench::arg_str(argc, argv, "--case", "all");
  std::printf("bench_precision: CPU %s, ISA %s, load %.2f, %d rounds (medians)\n", cpu_model_name().c_str(),
              to_string(cpu_isa()), bench::load_average(), rounds);
  std::printf("| case (fwd + bwd) | f32 ms | bf16 ms | f16 ms | f32 / bf16 | f32 / f16 |\n|---|---:|---:|---:|---:|---:|\n");
  if (which == "all" || which == "2d")
    run_case<4>("conv2d 32->32 3x3, 2x32x128x128", {2, 32, 128, 128}, {32, 32, 3, 3}, rounds);
  if (which == "all" || which == "3d")
    run_case<5>("conv3d 16->16 3^3, 1x16x48^3", {1, 16, 48, 48, 48}, {16, 16, 3, 3, 3}, rounds);
  return 0;
}
