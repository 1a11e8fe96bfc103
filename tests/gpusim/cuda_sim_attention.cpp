// gpusim lane: the attention family (kernels/attention.cu, src/cuda/attention_cuda.cpp: forward,
// backward dq and dk/dv, the lse merge; warp shuffles) against the CPU table on shapes small
// enough for a simulator: partial tiles, Nq != Nk, D != Dv, causal with offsets (fully masked
// rows), an additive bias with -inf, absent gradients; f32 (the tiled kernels for head dims <= 128,
// the row kernels above) and f64 (the row kernels). (tests/exec/cuda_attention.cpp
// covers long sequences and bf16 on a real GPU; in the simulator it runs for hours.)
#include "exec/attention_kernels.hpp"
#include "gpusim_support.hpp"

namespace st_gpusim_cuda_sim_attention {

using namespace gpusim;
using exec::AttentionKernels;

namespace {
const AttentionKernels& cu() { return exec::kernels_for<AttentionKernels>(gpu(), "test"); }
const AttentionKernels& cpu() { return exec::kernels_for<AttentionKernels>(Device::cpu(), "test"); }

/// [B, N, H, D] token-major strides.
exec::AttnIn in(const Block& b, const exec::AttnGeom& g, index_t n, index_t d) { return {b.data, n * g.H * d, d, g.H * d}; }
exec::AttnOut out(const Block& b, const exec::AttnGeom& g, index_t n, index_t d) {
  return {b.data, n * g.H * d, d, g.H * d};
}

struct Case {
  exec::AttnGeom g;
  bool causal = false;
  index_t qp0 = 0, kp0 = 0;
  bool bias = false, want_dk = true;
};

template <class T>
void attn_case(const Case& c, unsigned seed) {
  const auto& g = c.g;
  CAPTURE(g.B, g.H, g.Nq, g.Nk, g.D, g.Dv, c.causal, c.qp0, c.kp0, c.bias, c.want_dk);
  Pair<T> q({g.B, g.Nq, g.H, g.D}, seed), k({g.B, g.Nk, g.H, g.D}, seed + 1), v({g.B, g.Nk, g.H, g.Dv}, seed + 2),
      dout({g.B, g.Nq, g.H, g.Dv}, seed + 3), o({g.B, g.Nq, g.H, g.Dv}), lse({g.B, g.H, g.Nq}),
      dq({g.B, g.Nq, g.H, g.D}, seed + 4), dk({g.B, g.Nk, g.H, g.D}, seed + 5), dv({g.B, g.Nk, g.H, g.Dv}, seed + 6);
  std::vector<double> bv = rand_vals(static_cast<std::size_t>(g.B * g.H * g.Nq * g.Nk), seed + 7);
  for (std::size_t i = 0; i < bv.size(); i += 5) bv[i] = -INFINITY;
  for (index_t j = 0; j < g.Nk; ++j) bv[static_cast<std::size_t>(g.Nk + j)] = -INFINITY;  // a fully masked row
  Pair<T> bias({g.B, g.H, g.Nq, g.Nk}, bv);
  auto mask = [&](const Block& b) {
    exec::AttnMask m;
    m.scale = 0.9 / std::sqrt(static_cast<double>(g.D));
    m.causal = c.causal;
    m.q_pos0 = c.qp0;
    m.k_pos0 = c.kp0;
    if (c.bias) {
      m.bias = b.data;
      m.bias_sb = g.H * g.Nq * g.Nk, m.bias_sh = g.Nq * g.Nk, m.bias_sq = g.Nk, m.bias_sk = 1;
    }
    return m;
  };
  const auto mh = mask(bias.h), md = mask(bias.d);
  cpu().forward(dtype_of<T>, g, in(q.h, g, g.Nq, g.D), in(k.h, g, g.Nk, g.D), in(v.h, g, g.Nk, g.Dv), mh,
                out(o.h, g, g.Nq, g.Dv), lse.h.data, hctx());
  cu().forward(dtype_of<T>, g, in(q.d, g, g.Nq, g.D), in(k.d, g, g.Nk, g.D), in(v.d, g, g.Nk, g.Dv), md,
               out(o.d, g, g.Nq, g.Dv), lse.d.data, gctx());
  GPUSIM_CHECK_CLOSE(o, T, "forward out");
  GPUSIM_CHECK_CLOSE(lse, T, "forward lse");
  o.upload();  // both backward passes from the CPU's forward
  lse.upload();
  auto dk_h = c.want_dk ? out(dk.h, g, g.Nk, g.D) : exec::AttnOut{};
  auto dk_d = c.want_dk ? out(dk.d, g, g.Nk, g.D) : exec::AttnOut{};
  cpu().backward(dtype_of<T>, g, in(q.h, g, g.Nq, g.D), in(k.h, g, g.Nk, g.D), in(v.h, g, g.Nk, g.Dv),
                 in(o.h, g, g.Nq, g.Dv), in(dout.h, g, g.Nq, g.Dv), lse.h.data, mh, out(dq.h, g, g.Nq, g.D), dk_h,
                 out(dv.h, g, g.Nk, g.Dv), hctx());
  cu().backward(dtype_of<T>, g, in(q.d, g, g.Nq, g.D), in(k.d, g, g.Nk, g.D), in(v.d, g, g.Nk, g.Dv),
                in(o.d, g, g.Nq, g.Dv), in(dout.d, g, g.Nq, g.Dv), lse.d.data, md, out(dq.d, g, g.Nq, g.D), dk_d,
                out(dv.d, g, g.Nk, g.Dv), gctx());
  GPUSIM_CHECK_CLOSE(dq, T, "backward dq");
  GPUSIM_CHECK_CLOSE(dk, T, "backward dk");
  GPUSIM_CHECK_CLOSE(dv, T, "backward dv");
  // merge (out, lse) with a second partial result (out_b, lse_b)
  Pair<T> ob({g.B, g.Nq, g.H, g.Dv}, seed + 8), lb({g.B, g.H, g.Nq}, seed + 9, -2.0, 2.0);
  cpu().merge(dtype_of<T>, g, out(o.h, g, g.Nq, g.Dv), lse.h.data, in(ob.h, g, g.Nq, g.Dv), lb.h.data, hctx());
  cu().merge(dtype_of<T>, g, out(o.d, g, g.Nq, g.Dv), lse.d.data, in(ob.d, g, g.Nq, g.Dv), lb.d.data, gctx());
  GPUSIM_CHECK_CLOSE(o, T, "merge out");
  GPUSIM_CHECK_CLOSE(lse, T, "merge lse");
}

const Case kCases[] = {
    {{1, 2, 37, 45, 16, 16}},                        // partial tiles, Nq != Nk
    {{2, 1, 20, 33, 8, 12}, false, 0, 0, true},      // D != Dv, bias with -inf, a fully masked row
    {{1, 1, 24, 40, 32, 32}, true, 16, 0},           // causal, queries = the last keys
    {{1, 1, 16, 16, 40, 24}, true, 0, 9, false, false},  // keys after queries: masked rows; no dk
    // f32 takes the tiled kernels (64 own rows, tiles of 32) for head dims <= 128 (padded to 64
    // or 128): two own blocks on both sides, partial tiles, the bias; causal over several key
    // tiles; D, Dv in 65..128; D > 128 keeps the row kernels in f32 too
    {{1, 2, 70, 66, 24, 20}, false, 0, 0, true},
    {{1, 1, 80, 96, 16, 16}, true, 16, 0},
    {{1, 1, 20, 24, 72, 8}},
    {{1, 2, 70, 40, 96, 128}, true, 30, 0, true},
    {{1, 1, 12, 14, 136, 8}},
};
}  // namespace

TEST_CASE("gpusim attention: forward, backward (dq, dk, dv), lse merge", "[gpusim][attention]") {
  GPUSIM_REQUIRE_GPU();
  unsigned seed = 200;
  for (const auto& c : kCases) {
    attn_case<double>(c, seed += 10);
    attn_case<float>(c, seed += 10);
  }
}

}  // namespace st_gpusim_cuda_sim_attention
