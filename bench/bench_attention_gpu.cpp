// Local attention kernel on the GPU (kernels/attention.cu through exec::attention_forward /
// attention_backward) for comparison with torch.nn.functional.scaled_dot_product_attention
// (bench/torch_attention_gpu.py; bench/run_gpu_attention.sh runs both). Issue 7, benchmark 5.
//
//   build/bench/bench_attention_gpu [--n 4096] [--heads 8] [--dim 64] [--reps 10] [--dtype f32|bf16]
//
// B = 1, operands token-major [1, N, H, D] on cuda:0, forward then backward (dq, dk, dv). Prints
// "RESULT attn_<dtype>_N<n> fwd_ms <f> bwd_ms <b> total_ms <t> peak_mib <m>" (medians after one
// warm-up; peak = the allocator's device high-water mark over the timed steps). Without a CUDA
// device it prints SKIP and exits 0.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <shardtensor/shardtensor.hpp>
#include <shardtensor/exec/attention.hpp>

using namespace shard;

namespace {

double now_ms() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <class T>
Tensor<T, 1> device_random(index_t n, unsigned seed, Device dev) {
  auto f = Tensor<float, 1>::empty({n});
  f.fill_random(seed);
  if constexpr (std::is_same_v<T, float>) {
    return f.to(dev);
  } else {
    auto h = Tensor<T, 1>::empty({n});
    for (index_t i = 0; i < n; ++i) h.data()[i] = T(f.data()[i]);
    return h.to(dev);
  }
}

template <class T>
void run(index_t N, index_t H, index_t D, int reps, ExecContext& ctx) {
  const Device dev = ctx.device();
  const index_t n = N * H * D;
  auto q = device_random<T>(n, 1, dev), k = device_random<T>(n, 2, dev), v = device_random<T>(n, 3, dev),
       dout = device_random<T>(n, 4, dev);
  auto out = Tensor<T, 1>::empty({n}, dev), dq = Tensor<T, 1>::empty({n}, dev), dk = Tensor<T, 1>::empty({n}, dev),
       dv = Tensor<T, 1>::empty({n}, dev);
  auto lse = Tensor<float, 1>::empty({H * N}, dev);
  const exec::AttnGeom g{1, H, N, N, D, D};
  // token-major [1, N, H, D] operands viewed as [1, H, N, D]
  auto in = [&](const Tensor<T, 1>& t) {
    return exec::attention_view(dtype_of<T>, dev, t.data(), 1, H, N, D, N * H * D, D, H * D);
  };
  const Block lse_b = as_block(lse), bdq = in(dq), bdk = in(dk), bdv = in(dv);
  exec::AttnMask m;
  m.scale = 1.0 / std::sqrt(static_cast<double>(D));
  ctx.synchronize();
  reset_peak_memory(DeviceKind::cuda);
  std::vector<double> fwd, bwd, tot;
  for (int r = 0; r < reps + 1; ++r) {
    ctx.synchronize();
    const double t0 = now_ms();
    exec::attention_forward(g, m, in(q), in(k), in(v), nullptr, in(out), lse_b, ctx);
    ctx.synchronize();
    const double t1 = now_ms();
    exec::attention_backward(g, m, in(q), in(k), in(v), nullptr, in(out), in(dout), lse_b, &bdq, &bdk, &bdv, ctx);
    ctx.synchronize();
    const double t2 = now_ms();
    if (r > 0) {
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
      tot.push_back(t2 - t0);
    }
  }
  const double peak = static_cast<double>(memory_stats(DeviceKind::cuda).peak_bytes) / (1024.0 * 1024.0);
  const char* name = std::is_same_v<T, float> ? "f32" : "bf16";
  const double flops = 12.0 * static_cast<double>(N) * static_cast<double>(N) * static_cast<double>(D * H);
  std::printf("ours %s N=%ld H=%ld D=%ld: fwd %.3f ms  bwd %.3f ms  total %.3f ms  (%.1f TFLOP/s, 12 N^2 D H)  "
              "device peak %.0f MiB\n",
              name, static_cast<long>(N), static_cast<long>(H), static_cast<long>(D), median(fwd), median(bwd),
              median(tot), flops / median(tot) * 1e-9, peak);
  std::printf("RESULT attn_%s_N%ld fwd_ms %.3f bwd_ms %.3f total_ms %.3f peak_mib %.0f\n", name, static_cast<long>(N),
              median(fwd), median(bwd), median(tot), peak);
}

}  // namespace

int main(int argc, char** argv) {
  index_t N = 4096, H = 8, D = 64;
  int reps = 10;
  std::string dt = "f32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--n") N = std::stol(v);
    else if (a == "--heads") H = std::stol(v);
    else if (a == "--dim") D = std::stol(v);
    else if (a == "--reps") reps = std::stoi(v);
    else if (a == "--dtype") dt = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (cuda_device_count() == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  ExecContext ctx(Device::cuda(0));
  ContextGuard guard(ctx);
  if (dt == "bf16")
    run<bf16>(N, H, D, reps, ctx);
  else
    run<float>(N, H, D, reps, ctx);
  return 0;
}
