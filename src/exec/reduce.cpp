// Front of the reduce kernel family: operand checks, then dispatch by device.
#include "shardtensor/exec/reduce.hpp"

#include "exec/front_util.hpp"
#include "exec/reduce_kernels.hpp"
#include "exec/strided_rows.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/exec/precision.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

/// Keeps src/exec/reduce_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
SHARD_KEEP_CPU_TABLE(reduce);

namespace {

/// The table for the context's device (operand `b` must be on it, of a supported dtype).
const ReduceKernels& reduce_table(const Block& b, const char* op, const ExecContext& ctx) {
  return detail::front_table<ReduceKernels>(op, b.dtype, b.device, ctx);
}
void check_main(const Block& x, const char* op, const char* what) {
  SHARD_CHECK(x.dtype == DType::f32 || x.dtype == DType::f64, op, "{} has dtype {}; f32 or f64 needed", what, x.dtype);
  SHARD_CHECK(x.is_contiguous(), op, "{} must be contiguous (shape {}, strides {})", what, x.shape_vec(),
              x.strides_vec());
}
void check_like(const Block& y, const Block& x, DType dt, const char* op, const char* what) {
  SHARD_CHECK(y.device == x.device, op, "operands on different devices: {} is on {}, the input on {}", what, y.device,
              x.device);
  SHARD_CHECK(y.dtype == dt, op, "{} has dtype {}, expected {}", what, y.dtype, dt);
  SHARD_CHECK(y.is_contiguous(), op, "{} must be contiguous", what);
}
/// `k` is x's keepdim reduction: same rank, each extent equal to x's or 1.
void check_keepdim(const Block& x, const Block& k, const char* op, const char* what) {
  bool ok = k.rank == x.rank;
  for (int d = 0; ok && d < x.rank; ++d) {
    const auto e = k.shape[static_cast<std::size_t>(d)];
    ok = e == 1 || e == x.shape[static_cast<std::size_t>(d)];
  }
  SHARD_CHECK(ok, op, "{} of shape {} is not a keepdim reduction of shape {}", what, k.shape_vec(), x.shape_vec());
}
/// A strided operand x (any strides) with y's shape, on y's device, of dtype dt.
void check_strided(const Block& x, const Block& y, DType dt, const char* op, const char* what) {
  SHARD_CHECK(x.device == y.device, op, "operands on different devices: {} is on {}, the input on {}", what, x.device,
              y.device);
  SHARD_CHECK(x.dtype == dt && (dt == DType::f32 || dt == DType::f64), op, "{} has dtype {}, expected {} (f32 or f64)",
              what, x.dtype, dt);
  SHARD_CHECK(x.shape_vec() == y.shape_vec(), op, "{} has shape {}, expected {}", what, x.shape_vec(), y.shape_vec());
}
/// The reduced operand x as the table reads it: as it is when contiguous or when the table reads
/// strided inputs in place (CPU); else a contiguous copy on x's device (held by the Block).
Block reduced_input(const Block& x, const ReduceKernels& tab, const char* op, ExecContext& ctx) {
  SHARD_CHECK(x.dtype == DType::f32 || x.dtype == DType::f64, op, "input has dtype {}; f32 or f64 needed", x.dtype);
  if (x.is_contiguous() || tab.takes_strided_input() || x.numel() == 0) return x;
  return detail::materialize(x, ctx);
}
void check_same_shape(const Block& a, const Block& b, const char* op, const char* what) {
  SHARD_CHECK(a.numel() == b.numel(), op, "{} has {} elements, expected {} (shapes {} vs {})", what, b.numel(),
              a.numel(), b.shape_vec(), a.shape_vec());
}

}  // namespace

void reduce_sum(const Block& x, const Block& out, double scale, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "sum", &ctx);
  if (detail::F32Work::needed(x.dtype, out.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("reduce_sum", {x.dtype, out.dtype});
    detail::F32Work f(ctx);
    reduce_sum(f.in(x), f.out(out), scale, ctx);
    return f.finish();
  }
  const char* op = "sum";
  check_like(out, x, x.dtype, op, "result");
  check_keepdim(x, out, op, "result");
  const auto& tab = reduce_table(x, op, ctx);
  const Block xr = reduced_input(x, tab, op, ctx);
  if (out.numel() == 0) return;
  tab.reduce_sum(xr, out, scale, ctx);
}
void reduce_max(const Block& x, const Block& out, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "max", &ctx);
  if (detail::F32Work::needed(x.dtype, out.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("reduce_max", {x.dtype, out.dtype});
    detail::F32Work f(ctx);
    reduce_max(f.in(x), f.out(out), ctx);
    return f.finish();
  }
  const char* op = "max";
  check_like(out, x, x.dtype, op, "result");
  check_keepdim(x, out, op, "result");
  const auto& tab = reduce_table(x, op, ctx);
  const Block xr = reduced_input(x, tab, op, ctx);
  if (out.numel() == 0) return;
  tab.reduce_max(xr, out, ctx);
}
void broadcast_scaled(const Block& g, const Block& gx, double scale, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "broadcast_scaled", &ctx);
  if (detail::F32Work::needed(g.dtype, gx.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("broadcast_scaled", {g.dtype, gx.dtype});
    detail::F32Work f(ctx);
    broadcast_scaled(f.in(g), f.out(gx), scale, ctx);
    return f.finish();
  }
  const char* op = "sum_backward";
  check_main(gx, op, "input gradient");
  check_like(g, gx, gx.dtype, op, "gradient");
  check_keepdim(gx, g, op, "gradient");
  if (gx.numel() == 0) return;
  reduce_table(gx, op, ctx).broadcast_scaled(g, gx, scale, ctx);
}
void max_ties(const Block& x, const Block& m, const Block& ties, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "max_ties", &ctx);
  if (detail::F32Work::needed(x.dtype, m.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("max_ties", {x.dtype, m.dtype});
    detail::F32Work f(ctx);
    max_ties(f.in(x), f.in(m), ties, ctx);
    return f.finish();
  }
  const char* op = "max_backward";
  check_like(m, x, x.dtype, op, "maximum");
  check_like(ties, x, DType::f64, op, "tie counts");
  check_keepdim(x, m, op, "maximum");
  check_same_shape(m, ties, op, "tie counts");
  const auto& tab = reduce_table(x, op, ctx);
  const Block xr = reduced_input(x, tab, op, ctx);
  if (m.numel() == 0) return;
  tab.max_ties(xr, m, ties, ctx);
}
void max_backward(const Block& x, const Block& m, const Block& g, const Block& ties, const Block& gx,
                  ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "max_backward", &ctx);
  if (detail::F32Work::needed(x.dtype, m.dtype, g.dtype, gx.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("max_backward", {x.dtype, m.dtype, g.dtype, gx.dtype});
    detail::F32Work f(ctx);
    max_backward(f.in(x), f.in(m), f.in(g), ties, f.out(gx), ctx);
    return f.finish();
  }
  const char* op = "max_backward";
  check_like(m, x, x.dtype, op, "maximum");
  check_like(g, x, x.dtype, op, "gradient");
  check_like(ties, x, DType::f64, op, "tie counts");
  check_like(gx, x, x.dtype, op, "input gradient");
  check_keepdim(x, m, op, "maximum");
  check_same_shape(m, g, op, "gradient");
  check_same_shape(m, ties, op, "tie counts");
  SHARD_CHECK(gx.shape_vec() == x.shape_vec(), op, "input gradient has shape {}, expected {}", gx.shape_vec(),
              x.shape_vec());
  if (x.numel() == 0) return;
  const auto& tab = reduce_table(x, op, ctx);
  tab.max_backward(reduced_input(x, tab, op, ctx), m, g, ties, gx, ctx);
}

double sum_all(const Block& x, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "sum_all", &ctx);
  if (detail::F32Work::needed(x.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("sum_all", {x.dtype});
    detail::F32Work f(ctx);
    return sum_all(f.in(x), ctx);
  }
  check_main(x, "sum", "input");
  if (x.numel() == 0) return 0;
  return reduce_table(x, "sum", ctx).global_sum(0, x.dtype, x.numel(), x.data, nullptr, ctx);
}
double dot(const Block& a, const Block& b, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "dot", &ctx);
  if (detail::F32Work::needed(a.dtype, b.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("dot", {a.dtype, b.dtype});
    detail::F32Work f(ctx);
    return dot(f.in(a), f.in(b), ctx);
  }
  check_main(a, "dot", "lhs");
  check_like(b, a, a.dtype, "dot", "rhs");
  check_same_shape(a, b, "dot", "rhs");
  if (a.numel() == 0) return 0;
  return reduce_table(a, "dot", ctx).global_sum(1, a.dtype, a.numel(), a.data, b.data, ctx);
}
double sq_diff_sum(const Block& a, const Block& b, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "sq_diff_sum", &ctx);
  if (detail::F32Work::needed(a.dtype, b.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("sq_diff_sum", {a.dtype, b.dtype});
    detail::F32Work f(ctx);
    return sq_diff_sum(f.in(a), f.in(b), ctx);
  }
  if (!a.is_contiguous() || !b.is_contiguous()) {
    // Strided views (e.g. the interior of a halo-padded array): read in place where the table can.
    check_strided(a, a, a.dtype, "mse_loss", "pred");
    check_strided(b, a, a.dtype, "mse_loss", "target");
    if (a.numel() == 0) return 0;
    double s = 0;
    if (reduce_table(a, "mse_loss", ctx).sq_diff_sum_strided(a, b, s, ctx)) return s;
    const Block ac = a.is_contiguous() ? a : detail::materialize(a, ctx);
    const Block bc = b.is_contiguous() ? b : detail::materialize(b, ctx);
    return reduce_table(a, "mse_loss", ctx).global_sum(2, a.dtype, a.numel(), ac.data, bc.data, ctx);
  }
  check_main(a, "mse_loss", "pred");
  check_like(b, a, a.dtype, "mse_loss", "target");
  check_same_shape(a, b, "mse_loss", "target");
  if (a.numel() == 0) return 0;
  return reduce_table(a, "mse_loss", ctx).global_sum(2, a.dtype, a.numel(), a.data, b.data, ctx);
}

void sq_diff_sum_into(const Block& a, const Block& b, double scale, const Block& out, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "sq_diff_sum", &ctx);
  const char* op = "mse_loss";
  if (detail::F32Work::needed(a.dtype, b.dtype, out.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same(op, {a.dtype, b.dtype, out.dtype});
    detail::F32Work f(ctx);
    sq_diff_sum_into(f.in(a), f.in(b), scale, f.out(out), ctx);
    return f.finish();
  }
  check_strided(a, a, a.dtype, op, "pred");
  check_strided(b, a, a.dtype, op, "target");
  check_like(out, a, a.dtype, op, "loss value");
  SHARD_CHECK(out.numel() == 1, op, "the loss value has {} elements, expected 1", out.numel());
  const auto& tab = reduce_table(a, op, ctx);
  if ((!a.is_contiguous() || !b.is_contiguous()) && a.numel() > 0) {
    // Strided views (e.g. the interior of a halo-padded array): read in place where the table can.
    if (tab.sq_diff_sum_strided_into(a, b, scale, out.data, ctx)) return;
    const Block ac = a.is_contiguous() ? a : detail::materialize(a, ctx);
    const Block bc = b.is_contiguous() ? b : detail::materialize(b, ctx);
    return tab.global_sum_into(2, a.dtype, a.numel(), ac.data, bc.data, scale, out.data, ctx);
  }
  tab.global_sum_into(2, a.dtype, a.numel(), a.data, b.data, scale, out.data, ctx);
}

void mse_backward(double scale, const Block& p, const Block& t, const Block& gp, const Block& gt, ExecContext& ctx) {
  mse_backward(scale, Block{}, p, t, gp, gt, ctx);
}

void mse_backward(double scale, const Block& g, const Block& p, const Block& t, const Block& gp, const Block& gt,
                  ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "mse_backward", &ctx);
  const DType gdt = g.data ? g.dtype : p.dtype;
  if (detail::F32Work::needed(p.dtype, t.dtype, gp.dtype, (gt.numel() ? gt.dtype : gp.dtype), gdt)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("mse_backward", {p.dtype, t.dtype, gp.dtype, (gt.numel() ? gt.dtype : gp.dtype), gdt});
    detail::F32Work f(ctx);
    mse_backward(scale, g.data ? f.in(g) : g, f.in(p), f.in(t), f.out(gp), gt.numel() ? f.out(gt) : gt, ctx);
    return f.finish();
  }
  const char* op = "mse_loss_backward";
  if (g.data) {
    check_like(g, p, p.dtype, op, "loss gradient");
    SHARD_CHECK(g.numel() == 1, op, "the loss gradient has {} elements, expected 1", g.numel());
  }
  if (!p.is_contiguous() || !t.is_contiguous()) {
    check_strided(p, p, p.dtype, op, "pred");
    check_strided(t, p, p.dtype, op, "target");
    check_like(gp, p, p.dtype, op, "pred gradient");
    check_same_shape(p, gp, op, "pred gradient");
    if (gt.data) {
      check_like(gt, p, p.dtype, op, "target gradient");
      check_same_shape(p, gt, op, "target gradient");
    }
    if (p.numel() == 0) return;
    if (reduce_table(p, op, ctx).mse_backward_strided(scale, g.data, p, t, gp, gt, ctx)) return;
    const Block pc = p.is_contiguous() ? p : detail::materialize(p, ctx);
    const Block tc = t.is_contiguous() ? t : detail::materialize(t, ctx);
    reduce_table(p, op, ctx).mse_backward(scale, g.data, p.dtype, p.numel(), pc.data, tc.data, gp.data, gt.data, ctx);
    return;
  }
  check_main(p, op, "pred");
  check_like(t, p, p.dtype, op, "target");
  check_like(gp, p, p.dtype, op, "pred gradient");
  check_same_shape(p, t, op, "target");
  check_same_shape(p, gp, op, "pred gradient");
  if (gt.data) {
    check_like(gt, p, p.dtype, op, "target gradient");
    check_same_shape(p, gt, op, "target gradient");
  }
  if (p.numel() == 0) return;
  reduce_table(p, op, ctx).mse_backward(scale, g.data, p.dtype, p.numel(), p.data, t.data, gp.data, gt.data, ctx);
}
void rel_l2_sums(const Block& p, const Block& t, index_t samples, double* sums, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "rel_l2_sums", &ctx);
  if (detail::F32Work::needed(p.dtype, t.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("rel_l2_sums", {p.dtype, t.dtype});
    detail::F32Work f(ctx);
    rel_l2_sums(f.in(p), f.in(t), samples, sums, ctx);
    return f.finish();
  }
  const char* op = "rel_l2_loss";
  if (!p.is_contiguous() || !t.is_contiguous()) {  // strided views: in place where the table can
    check_strided(p, p, p.dtype, op, "pred");
    check_strided(t, p, p.dtype, op, "target");
    SHARD_CHECK(samples >= 0 && (samples == 0 ? p.numel() == 0 : p.numel() % samples == 0), op,
                "{} elements do not split into {} samples", p.numel(), samples);
    if (samples == 0) return;
    if (reduce_table(p, op, ctx).rel_l2_sums_strided(p, t, samples, sums, ctx)) return;
    const Block pc = p.is_contiguous() ? p : detail::materialize(p, ctx);
    const Block tc = t.is_contiguous() ? t : detail::materialize(t, ctx);
    reduce_table(p, op, ctx).rel_l2_sums(p.dtype, samples, p.numel() / samples, pc.data, tc.data, sums, ctx);
    return;
  }
  check_main(p, op, "pred");
  check_like(t, p, p.dtype, op, "target");
  check_same_shape(p, t, op, "target");
  SHARD_CHECK(samples >= 0 && (samples == 0 ? p.numel() == 0 : p.numel() % samples == 0), op,
              "{} elements do not split into {} samples", p.numel(), samples);
  if (samples == 0) return;
  reduce_table(p, op, ctx).rel_l2_sums(p.dtype, samples, p.numel() / samples, p.data, t.data, sums, ctx);
}
void rel_l2_backward(const Block& p, const Block& t, index_t samples, const double* coef, const Block& gp,
                     const Block& gt, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "rel_l2_backward", &ctx);
  if (detail::F32Work::needed(p.dtype, t.dtype, gp.dtype, (gt.numel() ? gt.dtype : gp.dtype))) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("rel_l2_backward", {p.dtype, t.dtype, gp.dtype, (gt.numel() ? gt.dtype : gp.dtype)});
    detail::F32Work f(ctx);
    rel_l2_backward(f.in(p), f.in(t), samples, coef, f.out(gp), gt.numel() ? f.out(gt) : gt, ctx);
    return f.finish();
  }
  const char* op = "rel_l2_loss_backward";
  if (!p.is_contiguous() || !t.is_contiguous()) {
    check_strided(p, p, p.dtype, op, "pred");
    check_strided(t, p, p.dtype, op, "target");
    check_like(gp, p, p.dtype, op, "pred gradient");
    check_like(gt, p, p.dtype, op, "target gradient");
    check_same_shape(p, gp, op, "pred gradient");
    check_same_shape(p, gt, op, "target gradient");
    SHARD_CHECK(samples >= 0 && (samples == 0 ? p.numel() == 0 : p.numel() % samples == 0), op,
                "{} elements do not split into {} samples", p.numel(), samples);
    if (samples == 0) return;
    if (reduce_table(p, op, ctx).rel_l2_backward_strided(p, t, samples, coef, gp, gt, ctx)) return;
    const Block pc = p.is_contiguous() ? p : detail::materialize(p, ctx);
    const Block tc = t.is_contiguous() ? t : detail::materialize(t, ctx);
    reduce_table(p, op, ctx).rel_l2_backward(p.dtype, samples, p.numel() / samples, pc.data, tc.data, coef, gp.data,
                                        gt.data, ctx);
    return;
  }
  check_main(p, op, "pred");
  check_like(t, p, p.dtype, op, "target");
  check_like(gp, p, p.dtype, op, "pred gradient");
  check_like(gt, p, p.dtype, op, "target gradient");
  check_same_shape(p, t, op, "target");
  check_same_shape(p, gp, op, "pred gradient");
  check_same_shape(p, gt, op, "target gradient");
  SHARD_CHECK(samples >= 0 && (samples == 0 ? p.numel() == 0 : p.numel() % samples == 0), op,
              "{} elements do not split into {} samples", p.numel(), samples);
  if (samples == 0) return;
  reduce_table(p, op, ctx).rel_l2_backward(p.dtype, samples, p.numel() / samples, p.data, t.data, coef, gp.data,
                                      gt.data, ctx);
}

void rel_l2_value(index_t samples, index_t global_samples, const double* sums, const double* check, index_t P,
                  const Block& out, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "rel_l2_value", &ctx);
  const char* op = "rel_l2_loss";
  if (detail::F32Work::needed(out.dtype)) {  // bf16 / f16 loss: an f32 value, rounded once more
    detail::F32Work f(ctx);
    rel_l2_value(samples, global_samples, sums, check, P, f.out(out), ctx);
    return f.finish();
  }
  check_main(out, op, "loss value");
  SHARD_CHECK(out.numel() == 1 && samples >= 0 && global_samples > 0, op,
              "bad arguments ({} loss elements, {} samples of {})", out.numel(), samples, global_samples);
  SHARD_CHECK(out.device == ctx.device(), op, "the loss value is on {}, the context on {}", out.device, ctx.device());
  reduce_table(out, op, ctx).rel_l2_value(out.dtype, samples, global_samples, sums, check, P, out.data, ctx);
}
void rel_l2_coefficients(index_t samples, index_t global_samples, const double* sums, const double* check, index_t P,
                         const Block& g, double* coef, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "reduce", "rel_l2_coefficients", &ctx);
  const char* op = "rel_l2_loss_backward";
  if (detail::F32Work::needed(g.dtype)) {
    detail::F32Work f(ctx);
    return rel_l2_coefficients(samples, global_samples, sums, check, P, f.in(g), coef, ctx);
  }
  check_main(g, op, "loss gradient");
  SHARD_CHECK(g.numel() == 1 && samples >= 0 && global_samples > 0, op,
              "bad arguments ({} gradient elements, {} samples of {})", g.numel(), samples, global_samples);
  SHARD_CHECK(g.device == ctx.device(), op, "the loss gradient is on {}, the context on {}", g.device, ctx.device());
  if (samples == 0) return;
  reduce_table(g, op, ctx).rel_l2_coefficients(g.dtype, samples, global_samples, sums, check, P, g.data, coef, ctx);
}

}  // namespace shard::exec
