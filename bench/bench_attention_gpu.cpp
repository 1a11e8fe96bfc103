// Local attention kernel on the GPU (exec::attention_forward / attention_backward: cuDNN's fused
// attention for bf16 / f16 where src/cuda/attention_cudnn_select.hpp admits the call, our own
// kernels/attention.cu otherwise) for comparison with torch.nn.functional.scaled_dot_product_attention
// (bench/torch_attention_gpu.py; bench/run_gpu_attention.sh runs both). Issues 7 (benchmark 5) and 32.
//
//   build/bench/bench_attention_gpu [--n 4096[,16384...]] [--heads 8] [--dim 64[,128...]] [--reps 10]
//                                   [--dtype f32|bf16|f16] [--tf32 0|1] [--tag own]
//
// B = 1, operands token-major [1, N, H, D] on cuda:0, forward then backward (dq, dk, dv), for every
// (n, dim) pair of the lists. Prints per case "RESULT attn_<dtype><tag>_N<n>_D<d> fwd_ms <f> bwd_ms <b>
// total_ms <t> peak_mib <m> cudnn <0|1> tiled <0|1> tc <0|1>" (medians after one warm-up; peak = the
// allocator's device high-water mark over the timed steps; cudnn / tiled / tc: the warm-up step ran
// on cuDNN / on our SIMT tiled kernels / on our tensor-core (wmma) kernels, read from the
// profiler's kernel/attention_cudnn, kernel/attention_tiled and kernel/attention_tc rows; none: our
// row kernels). --tf32 1 sets ExecSettings::allow_tf32 (f32 on the TF32 tensor-core kernels).
// SHARDTENSOR_CUDNN_ATTENTION=0 with --tag own gives the own-kernel row of the same case
// (SHARDTENSOR_ATTENTION_TC=0 as well: the SIMT kernels). Without a CUDA device it prints SKIP and exits 0.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <shardtensor/shardtensor.hpp>
#include <shardtensor/exec/attention.hpp>
#include <shardtensor/exec/profiler.hpp>

#include "bench_util.hpp"

using namespace shard;

using shard::bench::now_ms;
using shard::bench::median;

namespace {

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

std::vector<index_t> list_of(const std::string& s) {
  const auto v = shard::bench::int_list(s);
  return std::vector<index_t>(v.begin(), v.end());
}

/// True when the profiler saw the kernel row `name` (attention_cudnn, attention_tiled) run.
bool saw(const Profiler& prof, const char* name) {
  for (const auto& row : prof.rows())
    if (row.name == name && row.calls > 0) return true;
  return false;
}

template <class T>
void run(index_t N, index_t H, index_t D, int reps, const std::string& tag, ExecContext& ctx) {
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
  bool cudnn = false, tiled = false, tc = false;
  for (int r = 0; r < reps + 1; ++r) {
    std::optional<Profiler> prof;  // the warm-up step only: which kernel ran
    if (r == 0) prof.emplace();
    ctx.synchronize();
    const double t0 = now_ms();
    exec::attention_forward(g, m, in(q), in(k), in(v), nullptr, in(out), lse_b, ctx);
    ctx.synchronize();
    const double t1 = now_ms();
    exec::attention_backward(g, m, in(q), in(k), in(v), nullptr, in(out), in(dout), lse_b, &bdq, &bdk, &bdv, ctx);
    ctx.synchronize();
    const double t2 = now_ms();
    if (prof) {
      cudnn = saw(*prof, "attention_cudnn");
      tiled = saw(*prof, "attention_tiled");
      tc = saw(*prof, "attention_tc");
      prof.reset();
    }
    if (r > 0) {
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
      tot.push_back(t2 - t0);
    }
  }
  const double peak = static_cast<double>(memory_stats(DeviceKind::cuda).peak_bytes) / (1024.0 * 1024.0);
  const std::string name =
      std::string(std::is_same_v<T, float> ? "f32" : std::is_same_v<T, bf16> ? "bf16" : "f16") + tag;
  const double flops = 12.0 * static_cast<double>(N) * static_cast<double>(N) * static_cast<double>(D * H);
  std::printf("ours %s N=%ld H=%ld D=%ld (%s): fwd %.3f ms  bwd %.3f ms  total %.3f ms  (%.1f TFLOP/s, 12 N^2 D H)  "
              "device peak %.0f MiB\n",
              name.c_str(), static_cast<long>(N), static_cast<long>(H), static_cast<long>(D),
              cudnn ? "cuDNN SDPA" : tc ? "own tensor-core kernels" : tiled ? "own tiled kernels" : "own row kernels",
              median(fwd), median(bwd),
              median(tot), flops / median(tot) * 1e-9, peak);
  std::printf("RESULT attn_%s_N%ld_D%ld fwd_ms %.3f bwd_ms %.3f total_ms %.3f peak_mib %.0f cudnn %d tiled %d tc %d\n",
              name.c_str(), static_cast<long>(N), static_cast<long>(D), median(fwd), median(bwd), median(tot), peak,
              cudnn ? 1 : 0, tiled ? 1 : 0, tc ? 1 : 0);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<index_t> Ns{4096}, Ds{64};
  index_t H = 8;
  int reps = 10;
  std::string dt = "f32", tag;
  bool tf32 = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--n") Ns = list_of(v);
    else if (a == "--heads") H = std::stol(v);
    else if (a == "--dim") Ds = list_of(v);
    else if (a == "--tag") tag = v;
    else if (a == "--reps") reps = std::stoi(v);
    else if (a == "--dtype") dt = v;
    else if (a == "--tf32") tf32 = v == "1";
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
  ctx.settings().allow_tf32 = tf32;
  for (const index_t N : Ns)
    for (const index_t D : Ds) {
      if (dt == "bf16")
        run<bf16>(N, H, D, reps, tag, ctx);
      else if (dt == "f16")
        run<f16>(N, H, D, reps, tag, ctx);
      else
        run<float>(N, H, D, reps, tag, ctx);
    }
  return 0;
}
