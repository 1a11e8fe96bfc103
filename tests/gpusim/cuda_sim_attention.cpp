// gpusim lane: the attention family (kernels/attention.cu, src/cuda/attention_cuda.cpp: forward,
// backward dq and dk/dv, the lse merge; warp shuffles) against the CPU table on shapes small
// enough for a simulator: partial tiles, Nq != Nk, D != Dv, causal with offsets (fully masked
// rows), an additive bias with -inf, absent gradients; f32 (the tiled kernels for head dims <= 128,
// the row kernels above) and f64 (the row kernels); f16 (the tensor-core kernels of
// kernels/attention_tc.cu, wmma m16n16k16, on the simulator's compute capability 7.0) against the
// CPU table in f64 on the same f16 values. (tests/exec/cuda_attention.cpp covers long sequences,
// bf16 and TF32 on a real GPU; in the simulator it runs for hours.)
#include "exec/attention_kernels.hpp"
#include "gpusim_support.hpp"

namespace st_gpusim_cuda_sim_attention {

using namespace gpusim;
using exec::AttentionKernels;

namespace {
/// The largest error / bound ratio seen by the tensor-core cases (reported: the margin).
double g_worst_ratio = 0;
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

/// f16 storage on the CUDA table against the CPU table in f64 on the same (f16-rounded) values.
/// The tensor-core kernels round P and dS to f16 (as FlashAttention does) and the results once
/// more, so the bound is a few units of f16's 2^-11 relative to max(1, max |reference|).
/// Returns whether the tensor-core kernels (or cuDNN's fused attention) ran forward and backward
/// (the profiler's kernel/attention_tc and kernel/attention_cudnn rows).
bool attn_case_f16(const Case& c, unsigned seed) {
  const auto& g = c.g;
  CAPTURE(g.B, g.H, g.Nq, g.Nk, g.D, g.Dv, c.causal, c.qp0, c.kp0, c.bias, c.want_dk);
  auto vals = [](const std::vector<index_t>& shape, unsigned sd) {
    auto v = rand_vals(Pair<double>::count(shape), sd, -2.0, 2.0);
    for (auto& x : v) x = static_cast<double>(f16(static_cast<float>(x)));
    return v;
  };
  const std::vector<index_t> sq{g.B, g.Nq, g.H, g.D}, sk{g.B, g.Nk, g.H, g.D}, sv{g.B, g.Nk, g.H, g.Dv},
      so{g.B, g.Nq, g.H, g.Dv}, sl{g.B, g.H, g.Nq}, sb{g.B, g.H, g.Nq, g.Nk};
  const auto vq = vals(sq, seed), vk = vals(sk, seed + 1), vv = vals(sv, seed + 2), vd = vals(so, seed + 3),
             vgq = vals(sq, seed + 4), vgk = vals(sk, seed + 5), vgv = vals(sv, seed + 6);
  auto vb = vals(sb, seed + 7);
  for (std::size_t i = 0; i < vb.size(); i += 5) vb[i] = -INFINITY;
  for (index_t j = 0; j < g.Nk; ++j) vb[static_cast<std::size_t>(g.Nk + j)] = -INFINITY;  // a fully masked row
  Pair<double> q(sq, vq), k(sk, vk), v(sv, vv), dout(so, vd), o(so), lse(sl), dq(sq, vgq), dk(sk, vgk), dv(sv, vgv),
      bias(sb, vb);
  Pair<f16> hq(sq, vq), hk(sk, vk), hv(sv, vv), hdout(so, vd), ho(so), hdq(sq, vgq), hdk(sk, vgk), hdv(sv, vgv),
      hbias(sb, vb);
  Pair<float> hlse(sl);
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
  const auto mh = mask(bias.h), md = mask(hbias.d);
  auto close = [](const std::vector<double>& got, const std::vector<double>& want, double bound, const char* what) {
    const double e = rel_err(got, want);
    INFO(what << ": relative error " << e << " (bound " << bound << "); worst " << worst(got, want));
    CHECK(e <= bound);
    g_worst_ratio = std::max(g_worst_ratio, e / bound);
  };
  Profiler prof;
  cpu().forward(DType::f64, g, in(q.h, g, g.Nq, g.D), in(k.h, g, g.Nk, g.D), in(v.h, g, g.Nk, g.Dv), mh,
                out(o.h, g, g.Nq, g.Dv), lse.h.data, hctx());
  cu().forward(DType::f16, g, in(hq.d, g, g.Nq, g.D), in(hk.d, g, g.Nk, g.D), in(hv.d, g, g.Nk, g.Dv), md,
               out(ho.d, g, g.Nq, g.Dv), hlse.d.data, gctx());
  close(ho.device(), o.host(), 3e-3, "f16 forward out");
  close(hlse.device(), lse.host(), 1e-4, "f16 forward lse");
  // both backward passes from the CPU's forward (out rounded to f16, lse to float)
  for (std::size_t i = 0; i < o.n; ++i) {
    auto& x = static_cast<double*>(o.h.data)[i];
    x = static_cast<double>(f16(static_cast<float>(x)));
    static_cast<f16*>(ho.h.data)[i] = f16(static_cast<float>(x));
  }
  for (std::size_t i = 0; i < lse.n; ++i) {
    auto& x = static_cast<double*>(lse.h.data)[i];
    x = static_cast<double>(static_cast<float>(x));
    static_cast<float*>(hlse.h.data)[i] = static_cast<float>(x);
  }
  ho.upload();
  hlse.upload();
  auto dk_h = c.want_dk ? out(dk.h, g, g.Nk, g.D) : exec::AttnOut{};
  auto dk_d = c.want_dk ? out(hdk.d, g, g.Nk, g.D) : exec::AttnOut{};
  cpu().backward(DType::f64, g, in(q.h, g, g.Nq, g.D), in(k.h, g, g.Nk, g.D), in(v.h, g, g.Nk, g.Dv),
                 in(o.h, g, g.Nq, g.Dv), in(dout.h, g, g.Nq, g.Dv), lse.h.data, mh, out(dq.h, g, g.Nq, g.D), dk_h,
                 out(dv.h, g, g.Nk, g.Dv), hctx());
  cu().backward(DType::f16, g, in(hq.d, g, g.Nq, g.D), in(hk.d, g, g.Nk, g.D), in(hv.d, g, g.Nk, g.Dv),
                in(ho.d, g, g.Nq, g.Dv), in(hdout.d, g, g.Nq, g.Dv), hlse.d.data, md, out(hdq.d, g, g.Nq, g.D), dk_d,
                out(hdv.d, g, g.Nk, g.Dv), gctx());
  close(hdq.device(), dq.host(), 5e-3, "f16 backward dq");
  close(hdk.device(), dk.host(), 5e-3, "f16 backward dk");
  close(hdv.device(), dv.host(), 5e-3, "f16 backward dv");
  // on a real GPU with cudnn-frontend, cuDNN's fused attention takes what it can first
  bool fwd = false, bwd = false;
  for (const auto& r : prof.rows())
    if (r.category == "kernel" && (r.name == "attention_tc" || r.name == "attention_cudnn") && r.calls > 0)
      (r.pass == "forward" ? fwd : bwd) = true;
  return fwd && bwd;
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

TEST_CASE("gpusim attention: f16 on the tensor-core kernels against the CPU in f64", "[gpusim][attention][tc]") {
  GPUSIM_REQUIRE_GPU();
  unsigned seed = 700;
  int tc = 0, n = 0;
  for (const auto& c : kCases) {
    if (c.g.D > 128 || c.g.Dv > 128) continue;  // the tensor-core kernels take head dims <= 128
    const bool ran = attn_case_f16(c, seed += 10);
    // padded head dim 64 (55-89 KiB of shared memory) fits every device from compute capability
    // 7.0 on, the simulator's too: those must have run on the tensor cores; 128 may be declined
    if (c.g.D <= 64 && c.g.Dv <= 64) CHECK(ran);
    tc += ran ? 1 : 0;
    ++n;
  }
  WARN("f16 attention cases on the tensor-core kernels: " << tc << " of " << n << "; worst error / bound "
                                                          << g_worst_ratio);
}

}  // namespace st_gpusim_cuda_sim_attention
