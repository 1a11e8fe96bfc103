// gpusim lane: the tensor-core neighbourhood-attention kernels (kernels/neighborhood_tc.cu, wmma
// m16n16k16 on f16 at the simulator's compute capability 7.0; bf16 and TF32 on a GPU of 8.0 or
// newer) through the CUDA table, against the CPU table in f64 on the same rounded values: forward (out, lse) and backward (dq, dk, dv,
// overwritten) on 1-, 2- and 3-D windows with a query block inside a larger key block (qoff, halo
// keys outside the valid range), periodic dims, dilations with several residue classes, even
// windows, a window wider than its periodic dim (a key counted once per offset), D != Dv and a
// padded head dim of 128. The bound is a few units of f16's 2^-11 relative to
// max(1, max |reference|): P and dS are rounded to f16 before their products, as FlashAttention
// does. Runs on a real GPU too (the same kernels from compute capability 7.0 on).
#include <array>

#include "exec/neighborhood_kernels.hpp"
#include "gpusim_support.hpp"

namespace st_gpusim_cuda_sim_nbhd_tc {

using namespace gpusim;
using exec::NbhdAttentionKernels;

namespace {
/// The largest error / bound ratio seen by the tensor-core cases (reported: the margin).
double g_worst_ratio = 0;
const NbhdAttentionKernels& cu() { return exec::kernels_for<NbhdAttentionKernels>(gpu(), "test"); }
const NbhdAttentionKernels& cpu() { return exec::kernels_for<NbhdAttentionKernels>(Device::cpu(), "test"); }

/// Contiguous [B, n0, n1, n2, H, d] strides.
template <class X>
X operand(const Block& b, const exec::NbhdGeom& g, const index_t (&n)[3], index_t d) {
  X x;
  x.data = b.data;
  x.sh = d;
  x.ss[2] = g.H * d;
  x.ss[1] = n[2] * x.ss[2];
  x.ss[0] = n[1] * x.ss[1];
  x.sb = n[0] * x.ss[0];
  return x;
}

std::vector<index_t> shape(const exec::NbhdGeom& g, const index_t (&n)[3], index_t d) {
  return {g.B, n[0], n[1], n[2], g.H, d};
}

/// Bounds of storage type S on the tensor cores (relative to max(1, max |reference|)): f16 and
/// TF32 (u = 2^-11; TF32 also rounds the f32 operands), bf16 (u = 2^-9).
template <class S>
struct Bound {
  static constexpr double out = std::is_same_v<S, bf16> ? 2e-2 : std::is_same_v<S, float> ? 5e-3 : 3e-3;
  static constexpr double lse = std::is_same_v<S, f16> ? 1e-4 : 2e-3;
  static constexpr double grad = std::is_same_v<S, bf16> ? 4e-2 : std::is_same_v<S, float> ? 1e-2 : 5e-3;
};

/// Runs one geometry in storage type S (float: f32 with allow_tf32); returns whether the
/// tensor-core kernels ran forward and backward.
template <class S>
bool nbhd_case(const exec::NbhdGeom& g, unsigned seed) {
  CAPTURE(g.B, g.H, g.D, g.Dv, g.nq[0], g.nq[1], g.nq[2], g.nk[0], g.nk[1], g.nk[2], g.window[0], g.window[1],
          g.window[2], g.dilation[0], g.dilation[1], g.dilation[2], g.wrap[0], g.wrap[1], g.wrap[2]);
  auto vals = [](const std::vector<index_t>& s, unsigned sd) {
    auto v = rand_vals(Pair<double>::count(s), sd, -2.0, 2.0);
    for (auto& x : v) x = static_cast<double>(S(static_cast<float>(x)));
    return v;
  };
  constexpr DType dt = dtype_of<S>;
  struct Tf32 {  // allow_tf32 while the case runs (f32 only)
    bool was = gctx().settings().allow_tf32;
    Tf32() { gctx().settings().allow_tf32 = std::is_same_v<S, float>; }
    ~Tf32() { gctx().settings().allow_tf32 = was; }
  } tf32_scope;
  const auto sq = shape(g, g.nq, g.D), sk = shape(g, g.nk, g.D), sv = shape(g, g.nk, g.Dv), so = shape(g, g.nq, g.Dv);
  const std::vector<index_t> sl{g.B, g.nq[0], g.nq[1], g.nq[2], g.H};
  const auto vq = vals(sq, seed), vk = vals(sk, seed + 1), vv = vals(sv, seed + 2), vd = vals(so, seed + 3);
  Pair<double> q(sq, vq), k(sk, vk), v(sv, vv), dout(so, vd), o(so), lse(sl), dq(sq), dk(sk), dv(sv);
  Pair<S> hq(sq, vq), hk(sk, vk), hv(sv, vv), hdout(so, vd), ho(so), hdq(sq), hdk(sk), hdv(sv);
  Pair<float> hlse(sl);
  // the gradients are overwritten: start them from garbage
  Pair<S> junk_q(sq, seed + 9), junk_k(sk, seed + 10), junk_v(sv, seed + 11);
  auto close = [](const std::vector<double>& got, const std::vector<double>& want, double bound, const char* what) {
    const double e = rel_err(got, want);
    INFO(what << ": relative error " << e << " (bound " << bound << "); worst " << worst(got, want));
    CHECK(e <= bound);
    g_worst_ratio = std::max(g_worst_ratio, e / bound);
  };
  using In = exec::NbhdIn;
  using Out = exec::NbhdOut;
  Profiler prof;
  cpu().forward(DType::f64, g, operand<In>(q.h, g, g.nq, g.D), operand<In>(k.h, g, g.nk, g.D),
                operand<In>(v.h, g, g.nk, g.Dv), operand<Out>(o.h, g, g.nq, g.Dv), lse.h.data, hctx());
  cu().forward(dt, g, operand<In>(hq.d, g, g.nq, g.D), operand<In>(hk.d, g, g.nk, g.D),
               operand<In>(hv.d, g, g.nk, g.Dv), operand<Out>(ho.d, g, g.nq, g.Dv), hlse.d.data, gctx());
  close(ho.device(), o.host(), Bound<S>::out, "forward out");
  close(hlse.device(), lse.host(), Bound<S>::lse, "forward lse");
  // the backward from the CPU's forward (out rounded to S, lse to float) on both sides
  for (std::size_t i = 0; i < o.n; ++i) {
    auto& x = static_cast<double*>(o.h.data)[i];
    x = static_cast<double>(S(static_cast<float>(x)));
    static_cast<S*>(ho.h.data)[i] = S(static_cast<float>(x));
  }
  for (std::size_t i = 0; i < lse.n; ++i) {
    auto& x = static_cast<double*>(lse.h.data)[i];
    x = static_cast<double>(static_cast<float>(x));
    static_cast<float*>(hlse.h.data)[i] = static_cast<float>(x);
  }
  ho.upload();
  hlse.upload();
  hdq.d = junk_q.d, hdk.d = junk_k.d, hdv.d = junk_v.d;
  cpu().backward(DType::f64, g, operand<In>(q.h, g, g.nq, g.D), operand<In>(k.h, g, g.nk, g.D),
                 operand<In>(v.h, g, g.nk, g.Dv), operand<In>(o.h, g, g.nq, g.Dv), operand<In>(dout.h, g, g.nq, g.Dv),
                 lse.h.data, operand<Out>(dq.h, g, g.nq, g.D), operand<Out>(dk.h, g, g.nk, g.D),
                 operand<Out>(dv.h, g, g.nk, g.Dv), hctx());
  cu().backward(dt, g, operand<In>(hq.d, g, g.nq, g.D), operand<In>(hk.d, g, g.nk, g.D),
                operand<In>(hv.d, g, g.nk, g.Dv), operand<In>(ho.d, g, g.nq, g.Dv),
                operand<In>(hdout.d, g, g.nq, g.Dv), hlse.d.data, operand<Out>(hdq.d, g, g.nq, g.D),
                operand<Out>(hdk.d, g, g.nk, g.D), operand<Out>(hdv.d, g, g.nk, g.Dv), gctx());
  close(hdq.device(), dq.host(), Bound<S>::grad, "backward dq");
  close(hdk.device(), dk.host(), Bound<S>::grad, "backward dk");
  close(hdv.device(), dv.host(), Bound<S>::grad, "backward dv");
  bool fwd = false, bwd = false;
  for (const auto& r : prof.rows())
    if (r.category == "kernel" && r.name == "nbhd_tc" && r.calls > 0) (r.pass == "forward" ? fwd : bwd) = true;
  return fwd && bwd;
}

exec::NbhdGeom geom(index_t B, index_t H, index_t D, index_t Dv, std::array<index_t, 3> nq, std::array<index_t, 3> nk,
                    std::array<index_t, 3> qoff, std::array<index_t, 3> window, std::array<index_t, 3> dil,
                    std::array<index_t, 3> lo, std::array<index_t, 3> hi, std::array<bool, 3> wrap) {
  exec::NbhdGeom g;
  g.B = B, g.H = H, g.D = D, g.Dv = Dv;
  for (int d = 0; d < 3; ++d) {
    g.nq[d] = nq[d], g.nk[d] = nk[d], g.qoff[d] = qoff[d], g.window[d] = window[d], g.dilation[d] = dil[d];
    g.valid_lo[d] = lo[d], g.valid_hi[d] = hi[d], g.wrap[d] = wrap[d];
  }
  g.scale = 0.9 / std::sqrt(static_cast<double>(D));
  return g;
}

}  // namespace

TEST_CASE("gpusim neighbourhood attention: f16 on the tensor-core kernels against the CPU in f64",
          "[gpusim][attention][nbhd][tc]") {
  GPUSIM_REQUIRE_GPU();
  struct C {
    exec::NbhdGeom g;
    bool dm64;
  };
  const C cases[] = {
      // 1-D, window 7: one 64-query patch and a partial one; union of 70 keys
      {geom(1, 2, 16, 16, {1, 1, 90}, {1, 1, 90}, {0, 0, 0}, {1, 1, 7}, {1, 1, 1}, {0, 0, 0}, {1, 1, 90},
            {false, false, false}), true},
      // 2-D query block inside a key block with halos (qoff 2), halo keys outside the domain
      // (valid range), a periodic dim held whole; D != Dv; B = 2
      {geom(2, 1, 24, 20, {1, 9, 10}, {1, 13, 10}, {0, 2, 0}, {1, 5, 3}, {1, 1, 1}, {0, 1, 0}, {1, 12, 10},
            {false, false, true}), true},
      // dilations 2 (two residue classes per dim), an even window, periodic with dilation
      {geom(1, 2, 8, 40, {1, 12, 9}, {1, 12, 9}, {0, 0, 0}, {1, 4, 3}, {1, 2, 2}, {0, 0, 0}, {1, 12, 9},
            {false, false, true}), true},
      // 3-D, dilation in one dim, two periodic dims
      {geom(1, 1, 32, 32, {5, 4, 6}, {5, 4, 6}, {0, 0, 0}, {3, 2, 3}, {1, 2, 1}, {0, 0, 0}, {5, 4, 6},
            {false, true, true}), true},
      // a window wider than its periodic dim: keys counted once per offset
      {geom(1, 1, 16, 16, {1, 1, 5}, {1, 1, 5}, {0, 0, 0}, {1, 1, 7}, {1, 1, 1}, {0, 0, 0}, {1, 1, 5},
            {false, false, true}), true},
      // padded head dim 128
      {geom(1, 1, 72, 96, {1, 8, 8}, {1, 8, 8}, {0, 0, 0}, {1, 3, 3}, {1, 1, 1}, {0, 0, 0}, {1, 8, 8},
            {false, false, false}), false},
  };
  unsigned seed = 900;
  int n = 0, tc = 0, tc_b = 0, tc_t = 0;
  for (const auto& c : cases) {
    const bool ran = nbhd_case<f16>(c.g, seed += 20);
    if (c.dm64) CHECK(ran);  // padded head dim 64 fits every device's shared memory from 7.0 on
    tc += ran ? 1 : 0;
    // bf16 and TF32 take the tensor cores from compute capability 8.0 on (else the warp-per-row
    // kernels, within the same bounds): the count is reported, the values checked either way
    tc_b += nbhd_case<bf16>(c.g, seed + 7) ? 1 : 0;
    tc_t += nbhd_case<float>(c.g, seed + 13) ? 1 : 0;
    ++n;
  }
  WARN("neighbourhood attention cases on the tensor-core kernels: f16 " << tc << ", bf16 " << tc_b << ", TF32 " << tc_t
                                                                        << " of " << n << "; worst error / bound "
                                                                        << g_worst_ratio);
}

}  // namespace st_gpusim_cuda_sim_nbhd_tc
