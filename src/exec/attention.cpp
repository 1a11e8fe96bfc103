// Attention kernel family front: operand checks (device, dtype, shapes against the geometry) and
// dispatch on the execution context's device (see include/shardtensor/exec/attention.hpp).
#include "shardtensor/exec/attention.hpp"

#include <algorithm>
#include <initializer_list>

#include "exec/attention_kernels.hpp"
#include "exec/front_util.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/exec/precision.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

SHARD_KEEP_CPU_TABLE(attention);

namespace {

DType acc_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

void check_geom(const char* op, const AttnGeom& g) {
  SHARD_CHECK(g.B >= 0 && g.H >= 0 && g.Nq >= 0 && g.Nk >= 0 && g.D >= 0 && g.Dv >= 0, op,
              "negative size B={} H={} Nq={} Nk={} D={} Dv={}", g.B, g.H, g.Nq, g.Nk, g.D, g.Dv);
}

bool empty_rows(const AttnGeom& g) { return g.B == 0 || g.H == 0 || g.Nq == 0; }

/// `b` is on ctx's device, of dtype `dt` and shape [B, H, n, d] (4 entries of `want`) with a unit
/// stride along its last dim (or an extent <= 1 there).
void check_operand(const char* op, const char* name, const Block& b, DType dt, const ExecContext& ctx,
                   std::initializer_list<index_t> want) {
  SHARD_CHECK(b.device == ctx.device(), op, "operands on different devices: {} on {} but the execution context on {}",
              name, b.device, ctx.device());
  SHARD_CHECK(b.dtype == dt, op, "{} has dtype {} but q has {}", name, b.dtype, dt);
  bool shape_ok = b.rank == static_cast<int>(want.size());
  int d = 0;
  for (index_t e : want) shape_ok = shape_ok && b.shape[static_cast<std::size_t>(d++)] == e;
  SHARD_CHECK(shape_ok, op, "{} has shape {} but the geometry needs {}", name, b.shape_vec(),
              std::vector<index_t>(want));
  const auto last = static_cast<std::size_t>(b.rank - 1);
  SHARD_CHECK(b.rank == 0 || b.shape[last] <= 1 || b.strides[last] == 1, op,
              "{} (shape {}, strides {}) needs a unit stride along its last dim", name, b.shape_vec(), b.strides_vec());
}

/// The per-query log-sum-exp array: contiguous [B, H, Nq] in the accumulation type of `dt`.
void check_lse(const char* op, const char* name, const Block& b, DType dt, const AttnGeom& g, const ExecContext& ctx) {
  SHARD_CHECK(b.device == ctx.device(), op, "operands on different devices: {} on {} but the execution context on {}",
              name, b.device, ctx.device());
  SHARD_CHECK(b.dtype == acc_dtype(dt), op, "{} has dtype {}; {} operands need {}", name, b.dtype, dt, acc_dtype(dt));
  SHARD_CHECK(b.is_contiguous() && b.numel() == g.B * g.H * g.Nq, op,
              "{} (shape {}) must be a contiguous [B, H, Nq] = [{}, {}, {}] array", name, b.shape_vec(), g.B, g.H,
              g.Nq);
}

AttnIn in_of(const Block& b) { return {b.data, b.strides[0], b.strides[1], b.strides[2]}; }
AttnOut out_of(const Block* b) { return b ? AttnOut{b->data, b->strides[0], b->strides[1], b->strides[2]} : AttnOut{}; }

/// The mask the tables read: m with the bias Block's pointer and strides (checked here).
AttnMask with_bias(const char* op, AttnMask m, const Block* bias, DType dt, const AttnGeom& g,
                   const ExecContext& ctx) {
  SHARD_CHECK(m.bias == nullptr, op, "pass the bias as a Block (the mask's bias fields are set by the front)");
  if (!bias) return m;
  check_operand(op, "bias", *bias, dt, ctx, {g.B, g.H, g.Nq, g.Nk});
  m.bias = bias->data;
  m.bias_sb = bias->strides[0];
  m.bias_sh = bias->strides[1];
  m.bias_sq = bias->strides[2];
  m.bias_sk = bias->strides[3];
  return m;
}

}  // namespace

Block attention_view(DType dt, Device dev, const void* data, index_t B, index_t H, index_t N, index_t D, index_t sb,
                     index_t sh, index_t sn) {
  const index_t shape[4] = {B, H, N, D}, strides[4] = {sb, sh, sn, 1};
  return Block::view(dt, dev, const_cast<void*>(data), shape, 4, strides);
}

namespace {

/// Samples [b0, b0 + nb) of a [B, ...] operand (its dim-0 stride kept; stride 0 broadcasts stay).
Block batch_slice(const Block& b, index_t b0, index_t nb) {
  Block r = b;
  r.shape[0] = nb;
  r.data = static_cast<char*>(b.data) + b0 * b.strides[0] * static_cast<index_t>(dtype_size(b.dtype));
  return r;
}
const Block* batch_slice(const Block* b, index_t b0, index_t nb, Block& keep) {
  if (!b) return nullptr;
  keep = batch_slice(*b, b0, nb);
  return &keep;
}
/// Samples [b0, b0 + nb) of the contiguous statistics lse (B * H * Nq elements, any shape), flat.
Block lse_slice(const Block& lse, const AttnGeom& g, index_t b0, index_t nb) {
  SHARD_CHECK(lse.is_contiguous() && lse.numel() == g.B * g.H * g.Nq, "attention",
              "lse of shape {} must be contiguous with B * H * Nq = {} elements", lse.shape_vec(), g.B * g.H * g.Nq);
  return detail::flat_piece(lse, b0 * g.H * g.Nq, nb * g.H * g.Nq);
}
/// Every operand of a chunked call holds g.B samples along dim 0 (checked before any slice is read).
void check_samples(const char* op, const AttnGeom& g, std::initializer_list<const Block*> blocks) {
  for (const Block* b : blocks)
    if (b)
      SHARD_CHECK(b->rank >= 1 && b->shape[0] == g.B, op, "operand of shape {} does not hold the geometry's {} samples",
                  b->shape_vec(), g.B);
}
/// True when ctx's attention table computes `pass` on dt itself (detail::native_storage: the CUDA
/// table for bf16 / f16, not the CPU one); false: the front takes f32 working copies.
bool native(DType dt, KernelPass pass, const ExecContext& ctx, const char* op) {
  return detail::native_storage(kernels_for<AttentionKernels>(ctx.device(), op), dt, pass, ctx);
}
/// Samples per chunk when a bf16 / f16 call's f32 working copies go sample by sample (the largest
/// [H, N, D] operand of one sample near detail::kF32Chunk elements) with
/// ExecSettings::native_low_precision; 0: one call on whole-tensor copies. Each sample's rows are
/// computed on their own, so the chunks give the same results.
index_t attention_chunk(const AttnGeom& g, const ExecContext& ctx) {
  // CPU only: measured there (the CUDA table computes bf16 and f16 natively, so no working copies).
  if (!ctx.device().is_cpu() || !ctx.settings().native_low_precision || g.B <= 1) return 0;
  const index_t per = g.H * std::max(g.Nq, g.Nk) * std::max(g.D, g.Dv);
  const index_t nb = std::max<index_t>(1, detail::kF32Chunk / std::max<index_t>(1, per));
  return nb < g.B ? nb : 0;
}

}  // namespace

void attention_forward(const AttnGeom& g, const AttnMask& m, const Block& q, const Block& k, const Block& v,
                       const Block* bias, const Block& out, const Block& lse, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "attention", "forward", &ctx);
  if (!native(q.dtype, KernelPass::forward, ctx, "attention_forward")) {  // f32 working copies
    detail::F32Work::check_same("attention_forward", {q.dtype, k.dtype, v.dtype, out.dtype, bias ? bias->dtype : q.dtype});
    if (const index_t nb = attention_chunk(g, ctx)) {
      check_geom("attention_forward", g);
      check_samples("attention_forward", g, {&q, &k, &v, bias, &out});
      for (index_t b0 = 0; b0 < g.B; b0 += nb) {
        AttnGeom gc = g;
        gc.B = std::min(nb, g.B - b0);
        Block kb;
        detail::F32Work f(ctx);
        attention_forward(gc, m, f.in(batch_slice(q, b0, gc.B)), f.in(batch_slice(k, b0, gc.B)),
                          f.in(batch_slice(v, b0, gc.B)), f.in(batch_slice(bias, b0, gc.B, kb)),
                          f.out(batch_slice(out, b0, gc.B)), lse_slice(lse, g, b0, gc.B), ctx);
        f.finish();
      }
      return;
    }
    detail::F32Work f(ctx);
    attention_forward(g, m, f.in(q), f.in(k), f.in(v), f.in(bias), f.out(out), lse, ctx);
    return f.finish();
  }
  const char* op = "attention_forward";
  check_geom(op, g);
  const DType dt = q.dtype;
  check_operand(op, "q", q, dt, ctx, {g.B, g.H, g.Nq, g.D});
  check_operand(op, "k", k, dt, ctx, {g.B, g.H, g.Nk, g.D});
  check_operand(op, "v", v, dt, ctx, {g.B, g.H, g.Nk, g.Dv});
  check_operand(op, "out", out, dt, ctx, {g.B, g.H, g.Nq, g.Dv});
  check_lse(op, "lse", lse, dt, g, ctx);
  const auto& t = detail::storage_table<AttentionKernels>(op, dt, KernelPass::forward, ctx.device(), ctx);
  const AttnMask mb = with_bias(op, m, bias, dt, g, ctx);
  if (empty_rows(g)) return;
  t.forward(dt, g, in_of(q), in_of(k), in_of(v), mb, out_of(&out), lse.data, ctx);
}

void attention_backward(const AttnGeom& g, const AttnMask& m, const Block& q, const Block& k, const Block& v,
                        const Block* bias, const Block& out, const Block& dout, const Block& lse, const Block* dq,
                        const Block* dk, const Block* dv, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "attention", "backward", &ctx);
  if (!native(q.dtype, KernelPass::backward_data, ctx, "attention_backward")) {  // f32 working copies
    detail::F32Work::check_same("attention_backward", {q.dtype, k.dtype, v.dtype, out.dtype, dout.dtype});
    if (const index_t nb = attention_chunk(g, ctx)) {
      check_geom("attention_backward", g);
      check_samples("attention_backward", g, {&q, &k, &v, bias, &out, &dout, dq, dk, dv});
      for (index_t b0 = 0; b0 < g.B; b0 += nb) {
        AttnGeom gc = g;
        gc.B = std::min(nb, g.B - b0);
        Block kb, kq, kk, kv;
        detail::F32Work f(ctx);
        attention_backward(gc, m, f.in(batch_slice(q, b0, gc.B)), f.in(batch_slice(k, b0, gc.B)),
                           f.in(batch_slice(v, b0, gc.B)), f.in(batch_slice(bias, b0, gc.B, kb)),
                           f.in(batch_slice(out, b0, gc.B)), f.in(batch_slice(dout, b0, gc.B)),
                           lse_slice(lse, g, b0, gc.B), f.out(batch_slice(dq, b0, gc.B, kq), true),
                           f.out(batch_slice(dk, b0, gc.B, kk), true), f.out(batch_slice(dv, b0, gc.B, kv), true), ctx);
        f.finish();
      }
      return;
    }
    detail::F32Work f(ctx);
    // dq, dk, dv accumulate: their working copies start from their values.
    attention_backward(g, m, f.in(q), f.in(k), f.in(v), f.in(bias), f.in(out), f.in(dout), lse, f.out(dq, true),
                       f.out(dk, true), f.out(dv, true), ctx);
    return f.finish();
  }
  const char* op = "attention_backward";
  check_geom(op, g);
  const DType dt = q.dtype;
  check_operand(op, "q", q, dt, ctx, {g.B, g.H, g.Nq, g.D});
  check_operand(op, "k", k, dt, ctx, {g.B, g.H, g.Nk, g.D});
  check_operand(op, "v", v, dt, ctx, {g.B, g.H, g.Nk, g.Dv});
  check_operand(op, "out", out, dt, ctx, {g.B, g.H, g.Nq, g.Dv});
  check_operand(op, "dout", dout, dt, ctx, {g.B, g.H, g.Nq, g.Dv});
  check_lse(op, "lse", lse, dt, g, ctx);
  if (dq) check_operand(op, "dq", *dq, dt, ctx, {g.B, g.H, g.Nq, g.D});
  if (dk) check_operand(op, "dk", *dk, dt, ctx, {g.B, g.H, g.Nk, g.D});
  if (dv) check_operand(op, "dv", *dv, dt, ctx, {g.B, g.H, g.Nk, g.Dv});
  const auto& t = detail::storage_table<AttentionKernels>(op, dt, KernelPass::backward_data, ctx.device(), ctx);
  const AttnMask mb = with_bias(op, m, bias, dt, g, ctx);
  if (empty_rows(g) || g.Nk == 0) return;
  t.backward(dt, g, in_of(q), in_of(k), in_of(v), in_of(out), in_of(dout), lse.data, mb, out_of(dq), out_of(dk),
             out_of(dv), ctx);
}

void attention_merge(const AttnGeom& g, const Block& out, const Block& lse, const Block& out_b, const Block& lse_b,
                     ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "attention", "merge", &ctx);
  if (!native(out.dtype, KernelPass::forward, ctx, "attention_merge")) {  // f32 working copies
    detail::F32Work::check_same("attention_merge", {out.dtype, out_b.dtype});
    if (const index_t nb = attention_chunk(g, ctx)) {
      check_geom("attention_merge", g);
      check_samples("attention_merge", g, {&out, &out_b});
      for (index_t b0 = 0; b0 < g.B; b0 += nb) {
        AttnGeom gc = g;
        gc.B = std::min(nb, g.B - b0);
        detail::F32Work f(ctx);
        attention_merge(gc, f.out(batch_slice(out, b0, gc.B), true), lse_slice(lse, g, b0, gc.B),
                        f.in(batch_slice(out_b, b0, gc.B)), lse_slice(lse_b, g, b0, gc.B), ctx);
        f.finish();
      }
      return;
    }
    detail::F32Work f(ctx);
    attention_merge(g, f.out(out, true), lse, f.in(out_b), lse_b, ctx);
    return f.finish();
  }
  const char* op = "attention_merge";
  check_geom(op, g);
  const DType dt = out.dtype;
  check_operand(op, "out", out, dt, ctx, {g.B, g.H, g.Nq, g.Dv});
  check_operand(op, "out_b", out_b, dt, ctx, {g.B, g.H, g.Nq, g.Dv});
  check_lse(op, "lse", lse, dt, g, ctx);
  check_lse(op, "lse_b", lse_b, dt, g, ctx);
  const auto& t = detail::storage_table<AttentionKernels>(op, dt, KernelPass::forward, ctx.device(), ctx);
  if (empty_rows(g)) return;
  t.merge(dt, g, out_of(&out), lse.data, in_of(out_b), lse_b.data, ctx);
}

}  // namespace shard::exec
