// GPU GroupNorm benchmark (issue 30, scope 3: "norm at memory bandwidth, each family's GB/s"):
// forward and backward of group_norm (G groups, affine) on a 1-rank device mesh, and of
// layer_norm over the last dim of transformer tokens (the ln_tok_* cases), through the norm
// schedule (the same calls F::group_norm makes: statistics on the device, chunked sums, row
// kernels), fp32. bench/torch_norm_gpu.py times torch.nn.functional.group_norm on the same shapes;
// bench/run_gpu_norm.sh prints the ratio table.
//
//   build/bench/bench_norm_gpu [--reps 20] [--device cuda|cpu] [--shrink 1]
// (--device cpu --shrink 16: the same schedule on the CPU at 1/16 of the extents, a smoke test of
// this program where no GPU is present.)
//
// Prints one "RESULT <case> fwd_ms <f> bwd_ms <b> fwd_gbs <x> bwd_gbs <y>" line per case: medians
// over the timed reps (after 3 warm-up reps), each rep timed between device synchronisations.
// GB/s counts the bytes the op must move at least: forward reads x and writes y (2 x bytes(x)),
// backward reads x and gy and writes dx (3 x bytes(x)); the statistics pass over x (one since stop
// 45: exec::norm_moments) is extra traffic on top, so the forward at full bandwidth shows as ~2/3
// of the HBM peak.
// The gn_silu_* cases are group_norm with the SiLU fused (F::group_norm(..., NormAct::silu), what
// the U-Net's ResidualBlock runs after its first conv); the torch twin times silu(group_norm(x)) as
// two ops. The gn_res_silu_* cases add a residual before the SiLU (the block's second norm:
// F::group_norm(..., NormAct::silu, r), with the residual's gradient); torch: silu(group_norm(x) +
// r), three ops. Their GB/s count x and r read, y written (3 x bytes(x)) forward and x, gy, r read,
// dx and dr written (5 x) backward.
#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <shardtensor/exec/context.hpp>
#include <shardtensor/nn/functional/norm.hpp>
#include <shardtensor/shardtensor.hpp>

#include "bench_util.hpp"

using namespace shard;
namespace F = shard::nn::functional;

namespace {

using shard::bench::median;
using shard::bench::now_ms;

/// tokens: layer_norm over the last dim of [N, H, W, C] (one statistic per token: the ViT's
/// LayerNorm, kernels/norm.cu's token kernels); else group_norm of [N, C, H, W] with G groups.
void run_case(const std::string& name, index_t N, index_t C, index_t H, index_t W, index_t G, exec::NormAct act,
              bool residual, int reps, ExecContext& ctx, bool tokens = false) {
  const Device dev = ctx.device();
  const DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  const auto x = DistTensor<float, 4>::random({N, C, H, W}, mesh, {Replicate()}, 1).to(dev).local();
  const auto gy = DistTensor<float, 4>::random({N, C, H, W}, mesh, {Replicate()}, 2).to(dev).local();
  const auto w = DistTensor<float, 1>::random({C}, mesh, {Replicate()}, 3).to(dev).local();
  const auto b = DistTensor<float, 1>::random({C}, mesh, {Replicate()}, 4).to(dev).local();
  auto y = Tensor<float, 4>::empty(x.shape(), dev), dx = Tensor<float, 4>::empty(x.shape(), dev);
  auto dw = Tensor<float, 1>::empty({C}, dev), db = Tensor<float, 1>::empty({C}, dev);
  const auto r = DistTensor<float, 4>::random({N, C, H, W}, mesh, {Replicate()}, 5).to(dev).local();
  auto dr = Tensor<float, 4>::empty(x.shape(), dev);
  const Block br = as_block(r), bdr = as_block(dr);
  exec::NormGeom geo = tokens ? exec::NormGeom{exec::NormKind::layer, N * H * W, C, 1, 1}
                              : exec::NormGeom{exec::NormKind::group, N, C, H * W, G};
  geo.act = act;
  const char* op = tokens ? "layer_norm" : "group_norm";
  const Block bx = as_block(x), bgy = as_block(gy), bw = as_block(w), bb = as_block(b), by = as_block(y),
              bdx = as_block(dx), bdw = as_block(dw), bdb = as_block(db);
  const index_t count = tokens ? C : (C / G) * H * W;
  std::vector<double> fwd, bwd;
  for (int r = 0; r < reps + 3; ++r) {
    F::detail::NormStats st;
    ctx.synchronize();
    const double t0 = now_ms();
    F::detail::norm_forward(geo, bx, &bw, &bb, residual ? &br : nullptr, nullptr, nullptr, 0.1, 1e-5, false, count, nullptr, 0, op, st,
                            by, ctx);
    ctx.synchronize();
    const double t1 = now_ms();
    F::detail::norm_backward(geo, bx, bgy, &bw, &bb, residual ? &br : nullptr, st, count, true, false, nullptr, 0,
                             op, &bdx, &bdw, &bdb, residual ? &bdr : nullptr, ctx);
    ctx.synchronize();
    const double t2 = now_ms();
    if (r >= 3) fwd.push_back(t1 - t0), bwd.push_back(t2 - t1);
  }
  const double bytes = static_cast<double>(x.numel()) * sizeof(float);
  const double f = median(fwd), g = median(bwd);
  const double fb = residual ? 3 : 2, bb2 = residual ? 5 : 3;
  fmt::print("RESULT {} fwd_ms {:.4f} bwd_ms {:.4f} fwd_gbs {:.1f} bwd_gbs {:.1f}\n", name, f, g, fb * bytes / f / 1e6,
             bb2 * bytes / g / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  index_t shrink = 1;
  bool cpu = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--reps") reps = std::max(1, std::stoi(v));
    else if (a == "--shrink") shrink = std::max(1, std::stoi(v));
    else if (a == "--device") cpu = v == "cpu";
    else {
      fmt::print(stderr, "unknown option {}\n", a);
      return 2;
    }
  }
  if (!cpu && (!cuda_compiled() || cuda_device_count() == 0)) {
    fmt::print("SKIP bench_norm_gpu: no CUDA device visible (or built without CUDA); nothing to measure\n");
    return 0;
  }
  ExecContext ctx(cpu ? Device::cpu() : Device::cuda(0));
  ContextGuard guard(ctx);
  fmt::print("bench_norm_gpu: group_norm and layer_norm (tokens) fp32, affine, on {}, {} timed reps after 3 warm-up reps{}\n", ctx.device(),
             reps, shrink > 1 ? fmt::format(", extents / {}", shrink) : "");
  // The U-Net of bench/run_gpu_unet.sh: batch 4, width 32 at 1024^2, 64 at 512^2; 8 groups.
  for (const auto& [prefix, act, res] : {std::tuple{"gn", exec::NormAct::none, false},
                                         std::tuple{"gn_silu", exec::NormAct::silu, false},
                                         std::tuple{"gn_res_silu", exec::NormAct::silu, true}}) {
    const std::string p = prefix;
    run_case(p + "_4x32x1024^2_G8", 4, 32, 1024 / shrink, 1024 / shrink, 8, act, res, reps, ctx);
    run_case(p + "_4x64x512^2_G8", 4, 64, 512 / shrink, 512 / shrink, 8, act, res, reps, ctx);
    run_case(p + "_4x128x256^2_G8", 4, 128, 256 / shrink, 256 / shrink, 8, act, res, reps, ctx);
  }
  // layer_norm over tokens: the ViT at 1024^2 with patch 4 (256^2 tokens), widths 384 and 768,
  // and a narrow one (dim 64); tensors [N, H, W, C]
  run_case("ln_tok_1x256^2x384", 1, 384, 256 / shrink, 256 / shrink, 1, exec::NormAct::none, false, reps, ctx, true);
  run_case("ln_tok_1x256^2x768", 1, 768, 256 / shrink, 256 / shrink, 1, exec::NormAct::none, false, reps, ctx, true);
  run_case("ln_tok_4x256^2x64", 4, 64, 256 / shrink, 256 / shrink, 1, exec::NormAct::none, false, reps, ctx, true);
  return 0;
}
