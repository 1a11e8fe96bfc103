// Neighbourhood attention on the GPU (issue 32 item 3): exec::nbhd_attention_forward / _backward
// (kernels/neighborhood.cu) on one 2-D field of n x n tokens, window w x w, keys outside the field
// excluded (the library's boundary rule), against torch's flex_attention with the same window as a
// block mask (bench/torch_nbhd_gpu.py; bench/run_gpu_nbhd.sh runs both and prints the ratios).
//
//   build/bench/bench_nbhd_gpu [--n 64,128] [--window 7[,13]] [--heads 4] [--dim 32] [--reps 10]
//                              [--dtype f32|bf16|f16] [--tf32 0|1] [--tag t] [--device cuda|cpu]
//
// B = 1, operands [1, n, n, H, D] contiguous (token-major, the layout F::neighborhood_attention
// hands the kernel), scale 1 / sqrt(D), forward then backward (dq, dk, dv) for every (n, w) pair.
// Prints per case "RESULT nbhd_<dtype><tag>_n<n>_w<w> fwd_ms <f> bwd_ms <b> total_ms <t> peak_mib <m> tc <0|1>"
// (tc: the warm-up step ran on the tensor-core kernels, kernels/neighborhood_tc.cu, read from the
// profiler's kernel/nbhd_tc rows; --tf32 1 sets allow_tf32, which puts f32 on them;
// SHARDTENSOR_NBHD_TC=0 keeps the warp-per-row kernels)
// (medians after one warm-up, each pass between device synchronisations; peak = the allocator's
// device high-water mark over the case). --device cpu runs the same calls on the CPU table (a
// smoke test of this program where no GPU is present; not a figure to compare). Without a CUDA
// device and --device cuda it prints SKIP and exits 0.
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <shardtensor/exec/neighborhood.hpp>
#include <shardtensor/shardtensor.hpp>

#include "bench_util.hpp"

using namespace shard;
using shard::bench::median;
using shard::bench::now_ms;

namespace {

template <class T>
Tensor<T, 1> random_on(index_t n, unsigned seed, Device dev) {
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

bool saw(const Profiler& prof, const char* name) {
  for (const auto& row : prof.rows())
    if (row.name == name && row.calls > 0) return true;
  return false;
}

template <class T>
void run(index_t n, index_t w, index_t H, index_t D, int reps, const std::string& tag, ExecContext& ctx) {
  const Device dev = ctx.device();
  const index_t N = n * n, numel = N * H * D;
  auto q = random_on<T>(numel, 1, dev), k = random_on<T>(numel, 2, dev), v = random_on<T>(numel, 3, dev),
       dout = random_on<T>(numel, 4, dev);
  auto out = Tensor<T, 1>::empty({numel}, dev), dq = Tensor<T, 1>::empty({numel}, dev),
       dk = Tensor<T, 1>::empty({numel}, dev), dv = Tensor<T, 1>::empty({numel}, dev);
  auto lse = Tensor<float, 1>::empty({N * H}, dev);
  const std::vector<index_t> shape{1, n, n, H, D}, lshape{1, n, n, H};
  auto view = [&](const auto& t, const std::vector<index_t>& s) {
    const Block b = as_block(t);
    return Block::view(b.dtype, b.device, b.data, s.data(), static_cast<int>(s.size()), nullptr, b.owner);
  };
  exec::NbhdGeom g;
  g.B = 1;
  g.H = H;
  g.D = g.Dv = D;
  g.nq[1] = g.nk[1] = g.valid_hi[1] = n;
  g.nq[2] = g.nk[2] = g.valid_hi[2] = n;
  g.window[1] = g.window[2] = w;
  g.scale = 1.0 / std::sqrt(static_cast<double>(D));
  const Block bq = view(q, shape), bk = view(k, shape), bv = view(v, shape), bo = view(out, shape),
              bd = view(dout, shape), bl = view(lse, lshape), bdq = view(dq, shape), bdk = view(dk, shape),
              bdv = view(dv, shape);
  ctx.synchronize();
  if (dev.is_cuda()) reset_peak_memory(DeviceKind::cuda);
  std::vector<double> fwd, bwd, tot;
  bool tc = false;
  for (int r = 0; r < reps + 1; ++r) {
    std::optional<Profiler> prof;  // the warm-up step only: which kernels ran
    if (r == 0) prof.emplace();
    ctx.synchronize();
    const double t0 = now_ms();
    exec::nbhd_attention_forward(g, bq, bk, bv, bo, bl, ctx);
    ctx.synchronize();
    const double t1 = now_ms();
    exec::nbhd_attention_backward(g, bq, bk, bv, bo, bd, bl, &bdq, &bdk, &bdv, ctx);
    ctx.synchronize();
    const double t2 = now_ms();
    if (prof) {
      tc = saw(*prof, "nbhd_tc");
      prof.reset();
    }
    if (r > 0) {
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
      tot.push_back(t2 - t0);
    }
  }
  const double peak =
      dev.is_cuda() ? static_cast<double>(memory_stats(DeviceKind::cuda).peak_bytes) / (1024.0 * 1024.0) : 0.0;
  const std::string name =
      std::string(std::is_same_v<T, float> ? "f32" : std::is_same_v<T, bf16> ? "bf16" : "f16") + tag;
  // forward 2 and backward 5 window products of D multiply-adds per (query, offset, head)
  const double flops = 14.0 * static_cast<double>(N * w * w * D * H);
  std::printf("ours nbhd %s n=%ld (N=%ld) w=%ld H=%ld D=%ld on %s: fwd %.3f ms  bwd %.3f ms  total %.3f ms  "
              "(%.2f TFLOP/s of window products)  device peak %.0f MiB  [%s]\n",
              name.c_str(), static_cast<long>(n), static_cast<long>(N), static_cast<long>(w), static_cast<long>(H),
              static_cast<long>(D), dev.is_cuda() ? "cuda" : "cpu", median(fwd), median(bwd), median(tot),
              flops / median(tot) * 1e-9, peak, !dev.is_cuda() ? "CPU table" : tc ? "tensor-core kernels" : "warp-per-row kernels");
  std::printf("RESULT nbhd_%s_n%ld_w%ld fwd_ms %.3f bwd_ms %.3f total_ms %.3f peak_mib %.0f tc %d\n", name.c_str(),
              static_cast<long>(n), static_cast<long>(w), median(fwd), median(bwd), median(tot), peak, tc ? 1 : 0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<index_t> ns{64, 128}, ws{7};
  index_t H = 4, D = 32;
  int reps = 10;
  std::string dt = "f32", device = "cuda", tag;
  bool tf32 = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--n") ns = list_of(v);
    else if (a == "--window") ws = list_of(v);
    else if (a == "--heads") H = std::stol(v);
    else if (a == "--dim") D = std::stol(v);
    else if (a == "--reps") reps = std::stoi(v);
    else if (a == "--dtype") dt = v;
    else if (a == "--device") device = v;
    else if (a == "--tf32") tf32 = v == "1";
    else if (a == "--tag") tag = v;
    else {
      std::fprintf(stderr, "bench_nbhd_gpu: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (dt != "f32" && dt != "bf16" && dt != "f16") {
    std::fprintf(stderr, "bench_nbhd_gpu: --dtype must be f32, bf16 or f16\n");
    return 2;
  }
  if (device == "cuda" && cuda_device_count() == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  try {
    ExecContext ctx(device == "cpu" ? Device::cpu() : Device::cuda(0));
    ContextGuard guard(ctx);
    ctx.settings().allow_tf32 = tf32;
    for (const index_t n : ns)
      for (const index_t w : ws) {
        if (w > n) continue;
        if (dt == "bf16")
          run<bf16>(n, w, H, D, reps, tag, ctx);
        else if (dt == "f16")
          run<f16>(n, w, H, D, reps, tag, ctx);
        else
          run<float>(n, w, H, D, reps, tag, ctx);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_nbhd_gpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
