// Neighbourhood-attention kernel family front: geometry and operand checks (device, dtype, shapes)
// and dispatch on the execution context's device (see include/shardtensor/exec/neighborhood.hpp).
#include "shardtensor/exec/neighborhood.hpp"

#include <vector>

#include "exec/front_util.hpp"
#include "shardtensor/exec/precision.hpp"
#include "exec/neighborhood_kernels.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

SHARD_KEEP_CPU_TABLE(nbhd_attention);

namespace {

void check_geom(const char* op, const NbhdGeom& g) {
  SHARD_CHECK(g.B >= 0 && g.H >= 0 && g.D >= 0 && g.Dv >= 0, op, "negative size B={} H={} D={} Dv={}", g.B, g.H, g.D,
              g.Dv);
  for (int d = 0; d < 3; ++d) {
    SHARD_CHECK(g.nq[d] >= 0 && g.nk[d] >= 0, op, "negative block extent in spatial dim {}: nq={} nk={}", d, g.nq[d],
                g.nk[d]);
    SHARD_CHECK(g.window[d] >= 1 && g.dilation[d] >= 1, op, "window {} and dilation {} of spatial dim {} must be >= 1",
                g.window[d], g.dilation[d], d);
    SHARD_CHECK(0 <= g.valid_lo[d] && g.valid_lo[d] <= g.valid_hi[d] && g.valid_hi[d] <= g.nk[d], op,
                "valid key range [{}, {}) of spatial dim {} is not inside the key block [0, {})", g.valid_lo[d],
                g.valid_hi[d], d, g.nk[d]);
    SHARD_CHECK(!g.wrap[d] || (g.qoff[d] == 0 && g.nq[d] == g.nk[d]), op,
                "wrapped spatial dim {} needs the whole dim in both blocks (qoff {} nq {} nk {})", d, g.qoff[d],
                g.nq[d], g.nk[d]);
  }
}

/// `b` is on ctx's device, of dtype `dt`, a [B, S..., H, d] block with 1-3 spatial dims whose
/// extents are `n` right-aligned (the leading geometry extents 1), with a unit d stride.
void check_operand(const char* op, const char* name, const Block& b, DType dt, const ExecContext& ctx,
                   const NbhdGeom& g, const index_t* n, index_t d) {
  SHARD_CHECK(b.device == ctx.device(), op, "operands on different devices: {} on {} but the execution context on {}",
              name, b.device, ctx.device());
  SHARD_CHECK(b.dtype == dt, op, "{} has dtype {} but q has {}", name, b.dtype, dt);
  const int S = b.rank - 3;
  bool ok = S >= 1 && S <= 3;
  for (int e = 0; ok && e < 3 - S; ++e) ok = n[e] == 1;
  std::vector<index_t> want{g.B};
  for (int e = 3 - (ok ? S : 3); e < 3; ++e) want.push_back(n[e]);
  want.push_back(g.H);
  want.push_back(d);
  ok = ok && b.shape_vec() == want;
  SHARD_CHECK(ok, op, "{} has shape {} but the geometry needs [B, S..., H, D] = {} (1-3 spatial dims)", name,
              b.shape_vec(), want);
  const auto last = static_cast<std::size_t>(b.rank - 1);
  SHARD_CHECK(b.shape[last] <= 1 || b.strides[last] == 1, op,
              "{} (shape {}, strides {}) needs a unit stride along its head-feature dim", name, b.shape_vec(),
              b.strides_vec());
}

/// The log-sum-exps: contiguous [B, nq..., H] in the accumulation type of `dt`.
void check_lse(const char* op, const Block& b, DType dt, const ExecContext& ctx, const NbhdGeom& g) {
  const DType acc = dt == DType::f64 ? DType::f64 : DType::f32;
  SHARD_CHECK(b.device == ctx.device(), op, "operands on different devices: lse on {} but the execution context on {}",
              b.device, ctx.device());
  SHARD_CHECK(b.dtype == acc, op, "lse has dtype {}; {} operands need {}", b.dtype, dt, acc);
  const index_t n = g.B * g.nq[0] * g.nq[1] * g.nq[2] * g.H;
  SHARD_CHECK(b.is_contiguous() && b.numel() == n, op, "lse (shape {}) must be contiguous with B * nq... * H = {} elements",
              b.shape_vec(), n);
}

/// The kernel tables' view of a checked operand (spatial dims right-aligned to three).
NbhdIn nbhd_in_of(const Block& b) {
  NbhdIn a;
  a.data = b.data;
  a.sb = b.strides[0];
  const int S = b.rank - 3;
  for (int d = 0; d < S; ++d) a.ss[3 - S + d] = b.strides[static_cast<std::size_t>(1 + d)];
  a.sh = b.strides[static_cast<std::size_t>(b.rank - 2)];
  return a;
}
NbhdOut nbhd_out_of(const Block* b) {
  if (!b) return {};
  const NbhdIn a = nbhd_in_of(*b);
  NbhdOut o;
  o.data = b->data;
  o.sb = a.sb;
  for (int d = 0; d < 3; ++d) o.ss[d] = a.ss[d];
  o.sh = a.sh;
  return o;
}

}  // namespace

void nbhd_attention_forward(const NbhdGeom& g, const Block& q, const Block& k, const Block& v, const Block& out,
                            const Block& lse, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "nbhd_attention", "forward", &ctx);
  if (!detail::native_storage(kernels_for<NbhdAttentionKernels>(ctx.device(), "nbhd_attention_forward"), q.dtype,
                              KernelPass::forward, ctx)) {  // bf16 / f16 the table widens: f32 working copies
    detail::F32Work::check_same("nbhd_attention_forward", {q.dtype, k.dtype, v.dtype, out.dtype});
    detail::F32Work f(ctx);
    nbhd_attention_forward(g, f.in(q), f.in(k), f.in(v), f.out(out), lse, ctx);
    return f.finish();
  }
  const char* op = "nbhd_attention_forward";
  check_geom(op, g);
  const DType dt = q.dtype;
  check_operand(op, "q", q, dt, ctx, g, g.nq, g.D);
  check_operand(op, "k", k, dt, ctx, g, g.nk, g.D);
  check_operand(op, "v", v, dt, ctx, g, g.nk, g.Dv);
  check_operand(op, "out", out, dt, ctx, g, g.nq, g.Dv);
  check_lse(op, lse, dt, ctx, g);
  const auto& t = detail::storage_table<NbhdAttentionKernels>(op, dt, KernelPass::forward, ctx.device(), ctx);
  if (g.B * g.H * g.nq[0] * g.nq[1] * g.nq[2] == 0) return;
  t.forward(dt, g, nbhd_in_of(q), nbhd_in_of(k), nbhd_in_of(v), nbhd_out_of(&out), lse.data, ctx);
}

void nbhd_attention_backward(const NbhdGeom& g, const Block& q, const Block& k, const Block& v, const Block& out,
                             const Block& dout, const Block& lse, const Block* dq, const Block* dk, const Block* dv,
                             ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "nbhd_attention", "backward", &ctx);
  if (!detail::native_storage(kernels_for<NbhdAttentionKernels>(ctx.device(), "nbhd_attention_backward"), q.dtype,
                              KernelPass::backward_data, ctx)) {  // f32 working copies
    detail::F32Work::check_same("nbhd_attention_backward", {q.dtype, k.dtype, v.dtype, out.dtype, dout.dtype});
    detail::F32Work f(ctx);
    nbhd_attention_backward(g, f.in(q), f.in(k), f.in(v), f.in(out), f.in(dout), lse, f.out(dq), f.out(dk), f.out(dv),
                            ctx);
    return f.finish();
  }
  const char* op = "nbhd_attention_backward";
  check_geom(op, g);
  const DType dt = q.dtype;
  check_operand(op, "q", q, dt, ctx, g, g.nq, g.D);
  check_operand(op, "k", k, dt, ctx, g, g.nk, g.D);
  check_operand(op, "v", v, dt, ctx, g, g.nk, g.Dv);
  check_operand(op, "out", out, dt, ctx, g, g.nq, g.Dv);
  check_operand(op, "dout", dout, dt, ctx, g, g.nq, g.Dv);
  check_lse(op, lse, dt, ctx, g);
  if (dq) check_operand(op, "dq", *dq, dt, ctx, g, g.nq, g.D);
  if (dk) check_operand(op, "dk", *dk, dt, ctx, g, g.nk, g.D);
  if (dv) check_operand(op, "dv", *dv, dt, ctx, g, g.nk, g.Dv);
  const auto& t = detail::storage_table<NbhdAttentionKernels>(op, dt, KernelPass::backward_data, ctx.device(), ctx);
  // No early return on an empty query block: dk and dv (the key block) are still overwritten.
  t.backward(dt, g, nbhd_in_of(q), nbhd_in_of(k), nbhd_in_of(v), nbhd_in_of(out), nbhd_in_of(dout), lse.data, nbhd_out_of(dq), nbhd_out_of(dk),
             nbhd_out_of(dv), ctx);
}

}  // namespace shard::exec
