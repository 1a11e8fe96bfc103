// Norm kernel family front: operand checks and device dispatch (see include/shardtensor/exec/norm.hpp).
#include "shardtensor/exec/norm.hpp"

#include "exec/front_util.hpp"
#include "shardtensor/exec/precision.hpp"
#include "exec/norm_kernels.hpp"
#include "exec/strided_rows.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

/// Keeps src/exec/norm_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
SHARD_KEEP_CPU_TABLE(norm);

namespace {

/// The geometry and x the table reads: a contiguous x as it is; a strided x described by
/// g.xrank / xshape / xstrides where the table takes strides, else one contiguous copy on x's
/// device (kept alive by `copy`).
struct Input {
  NormGeom g;
  const void* x;
  Block copy;
};
Input input(const char* op, const NormKernels& tab, const NormGeom& g0, const Block& x, ExecContext& ctx) {
  detail::check_block(op, "input", x, x.dtype, -1, ctx);
  Input in{g0, x.data, {}};
  in.g.xrank = 0;
  if (x.is_contiguous()) {
    SHARD_CHECK(x.numel() == g0.A * g0.C * g0.S, op, "input of shape {} does not hold [A {}, C {}, S {}]",
                x.shape_vec(), g0.A, g0.C, g0.S);
    return in;
  }
  SHARD_CHECK(x.rank >= 1 && g0.cdim >= 0 && g0.cdim < x.rank, op, "strided input of rank {} with channel dim {}",
              x.rank, g0.cdim);
  index_t a = 1, s = 1;  // extents of the dims before and after the channel dim
  for (int d = 0; d < g0.cdim; ++d) a *= x.shape[static_cast<std::size_t>(d)];
  for (int d = g0.cdim + 1; d < x.rank; ++d) s *= x.shape[static_cast<std::size_t>(d)];
  SHARD_CHECK(a == g0.A && s == g0.S && x.shape[static_cast<std::size_t>(g0.cdim)] == g0.C, op,
              "strided input of shape {} does not match [A {}, C {}, S {}]", x.shape_vec(), g0.A, g0.C, g0.S);
  if (tab.takes_strided_input()) {
    in.g.xrank = x.rank;
    for (int d = 0; d < x.rank; ++d) {
      in.g.xshape[static_cast<std::size_t>(d)] = x.shape[static_cast<std::size_t>(d)];
      in.g.xstrides[static_cast<std::size_t>(d)] = x.strides[static_cast<std::size_t>(d)];
    }
    return in;
  }
  in.copy = detail::materialize(x, ctx);
  in.x = in.copy.data;
  return in;
}

/// The table after checking the dense [A, C, S] operands and the optional [C] parameter.
const NormKernels& norm_table(const char* op, KernelPass pass, const NormGeom& g, const Block& x, const Block* dense,
                              const char* what, const Block* w, const Block* b, const ExecContext& ctx) {
  if (dense) detail::check_block(op, what, *dense, x.dtype, g.A * g.C * g.S, ctx);
  if (w) detail::check_block(op, "weight", *w, x.dtype, g.C, ctx);
  if (b) detail::check_block(op, "bias", *b, x.dtype, g.C, ctx);
  return detail::storage_table<NormKernels>(op, x.dtype, pass, ctx.device(), ctx);
}
const void* data(const Block* b) { return b ? b->data : nullptr; }

/// Throws unless an optional residual (or its gradient) is a dense [A, C, S] block of x's dtype.
void check_residual(const char* op, const char* what, const Block* r, const NormGeom& g, const Block& x,
                    const ExecContext& ctx) {
  if (!r) return;
  detail::check_block(op, what, *r, x.dtype, g.A * g.C * g.S, ctx);
  SHARD_CHECK(r->is_contiguous(), op, "the {} must be a dense [A, C, S] block", what);
}

/// Throws unless g.act is one of the NormAct values.
void check_act(const char* op, const NormGeom& g) {
  switch (g.act) {
    case NormAct::none:
    case NormAct::relu:
    case NormAct::gelu:
    case NormAct::gelu_tanh:
    case NormAct::silu:
    case NormAct::tanh:
    case NormAct::sigmoid: return;
  }
  SHARD_FAIL(op, "unknown fused activation code {}", static_cast<int>(g.act));
}

/// True when the device's table computes `pass` on the dtype dt itself (detail::native_storage).
bool norm_storage_native(DType dt, KernelPass pass, const ExecContext& ctx) {
  return detail::native_storage(kernels_for<NormKernels>(ctx.device(), "norm"), dt, pass, ctx);
}

}  // namespace

void norm_sums(const NormGeom& g, const Block& x, const double* mean, double* out, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "norm", "sums", &ctx);
  if (detail::F32Work::needed(x.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("norm_sums", {x.dtype});
    if (!norm_storage_native(x.dtype, KernelPass::forward, ctx)) {
      detail::F32Work f(ctx);
      norm_sums(g, f.in(x), mean, out, ctx);
      return f.finish();
    }
  }
  const char* op = "norm_sums";
  const auto& tab = norm_table(op, KernelPass::forward, g, x, nullptr, nullptr, nullptr, nullptr, ctx);
  const Input in = input(op, tab, g, x, ctx);
  tab.sums(x.dtype, in.g, in.x, mean, out, ctx);
}

void norm_moments(const NormGeom& g, const Block& x, double* sum, double* m2, double* lmean, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "norm", "moments", &ctx);
  if (detail::F32Work::needed(x.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("norm_moments", {x.dtype});
    if (!norm_storage_native(x.dtype, KernelPass::forward, ctx)) {
      detail::F32Work f(ctx);
      norm_moments(g, f.in(x), sum, m2, lmean, ctx);
      return f.finish();
    }
  }
  const char* op = "norm_moments";
  SHARD_CHECK(g.stats() == 0 || (sum && m2 && lmean), op, "needs the sum, M2 and mean buffers");
  const auto& tab = norm_table(op, KernelPass::forward, g, x, nullptr, nullptr, nullptr, nullptr, ctx);
  const Input in = input(op, tab, g, x, ctx);
  if (g.stats() > 0) tab.moments(x.dtype, in.g, in.x, sum, m2, lmean, ctx);
}

void norm_apply(const NormGeom& g, const Block& x, const Block* w, const Block* b, const Block* r, const double* mean,
                const double* invstd, const Block& y, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "norm", "apply", &ctx);
  const DType rt = r ? r->dtype : x.dtype;
  if (detail::F32Work::needed(x.dtype, (w ? w->dtype : x.dtype), (b ? b->dtype : x.dtype), rt, y.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("norm_apply", {x.dtype, (w ? w->dtype : x.dtype), (b ? b->dtype : x.dtype), rt, y.dtype});
    if (!norm_storage_native(x.dtype, KernelPass::forward, ctx)) {
      detail::F32Work f(ctx);
      norm_apply(g, f.in(x), f.in(w), f.in(b), f.in(r), mean, invstd, f.out(y), ctx);
      return f.finish();
    }
  }
  const char* op = "norm_apply";
  check_act(op, g);
  const auto& tab = norm_table(op, KernelPass::forward, g, x, &y, "output", w, b, ctx);
  check_residual(op, "residual", r, g, x, ctx);
  const Input in = input(op, tab, g, x, ctx);
  tab.apply(x.dtype, in.g, in.x, mean, invstd, data(w), data(b), data(r), y.data, ctx);
}

void norm_backward_sums(const NormGeom& g, const Block& x, const Block& gy, const Block* w, const Block* b,
                        const Block* r, const double* mean, const double* invstd, double* sg, double* sgx, double* dw,
                        double* db, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "norm", "backward_sums", &ctx);
  const char* op = "norm_backward_sums";
  check_act(op, g);
  if (g.act == NormAct::none) b = r = nullptr;  // only read to recompute z + r
  const DType bt = b ? b->dtype : x.dtype, rt = r ? r->dtype : x.dtype;
  if (detail::F32Work::needed(x.dtype, gy.dtype, (w ? w->dtype : x.dtype), bt, rt)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same(op, {x.dtype, gy.dtype, (w ? w->dtype : x.dtype), bt, rt});
    if (!norm_storage_native(x.dtype, KernelPass::backward_data, ctx)) {
      detail::F32Work f(ctx);
      norm_backward_sums(g, f.in(x), f.in(gy), f.in(w), f.in(b), f.in(r), mean, invstd, sg, sgx, dw, db, ctx);
      return f.finish();
    }
  }
  const auto& tab = norm_table(op, KernelPass::backward_data, g, x, &gy, "output gradient", w, b, ctx);
  check_residual(op, "residual", r, g, x, ctx);
  const Input in = input(op, tab, g, x, ctx);
  tab.backward_sums(x.dtype, in.g, in.x, gy.data, mean, invstd, data(w), data(b), data(r), sg, sgx, dw, db, ctx);
}

void norm_backward_dx(const NormGeom& g, const Block& x, const Block& gy, const Block* w, const Block* b,
                      const Block* r, const double* mean, const double* invstd, const double* sg, const double* sgx,
                      double inv_count, const Block& dx, const Block* dr, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "norm", "backward_dx", &ctx);
  const char* op = "norm_backward_dx";
  check_act(op, g);
  if (g.act == NormAct::none) b = r = nullptr;  // only read to recompute z + r
  const DType bt = b ? b->dtype : x.dtype, rt = r ? r->dtype : x.dtype, drt = dr ? dr->dtype : x.dtype;
  if (detail::F32Work::needed(x.dtype, gy.dtype, (w ? w->dtype : x.dtype), bt, rt, dx.dtype, drt)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same(op, {x.dtype, gy.dtype, (w ? w->dtype : x.dtype), bt, rt, dx.dtype, drt});
    if (!norm_storage_native(x.dtype, KernelPass::backward_data, ctx)) {
      detail::F32Work f(ctx);
      norm_backward_dx(g, f.in(x), f.in(gy), f.in(w), f.in(b), f.in(r), mean, invstd, sg, sgx, inv_count, f.out(dx),
                       f.out(dr), ctx);
      return f.finish();
    }
  }
  const auto& tab = norm_table(op, KernelPass::backward_data, g, x, &gy, "output gradient", w, b, ctx);
  detail::check_block(op, "input gradient", dx, x.dtype, g.A * g.C * g.S, ctx);
  check_residual(op, "residual", r, g, x, ctx);
  check_residual(op, "residual gradient", dr, g, x, ctx);
  const Input in = input(op, tab, g, x, ctx);
  tab.backward_dx(x.dtype, in.g, in.x, gy.data, mean, invstd, data(w), data(b), data(r), sg, sgx, inv_count, dx.data,
                  dr ? dr->data : nullptr, ctx);
}

void load_f64(const Block& src, double* host, ExecContext& ctx) {  // host: device memory of ctx
  if (detail::F32Work::needed(src.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("load_f64", {src.dtype});
    if (!norm_storage_native(src.dtype, KernelPass::forward, ctx)) {
      detail::F32Work f(ctx);
      load_f64(f.in(src), host, ctx);
      return f.finish();
    }
  }
  detail::check_block("load_f64", "source", src, src.dtype, src.numel(), ctx);
  const auto& tab = detail::storage_table<NormKernels>("load_f64", src.dtype, KernelPass::forward, ctx.device(), ctx);
  if (src.numel() > 0) tab.load_f64(src.dtype, src.numel(), src.data, host, ctx);
}

void store_f64(const double* host, const Block& dst, ExecContext& ctx) {
  if (detail::F32Work::needed(dst.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("store_f64", {dst.dtype});
    if (!norm_storage_native(dst.dtype, KernelPass::forward, ctx)) {
      detail::F32Work f(ctx);
      store_f64(host, f.out(dst), ctx);
      return f.finish();
    }
  }
  detail::check_block("store_f64", "destination", dst, dst.dtype, dst.numel(), ctx);
  const auto& tab = detail::storage_table<NormKernels>("store_f64", dst.dtype, KernelPass::forward, ctx.device(), ctx);
  if (dst.numel() > 0) tab.store_f64(dst.dtype, dst.numel(), host, dst.data, ctx);
}

void norm_finish(const NormFinishArgs& a, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "norm", "finish", &ctx);
  const char* op = "norm_finish";
  SHARD_CHECK(a.K >= 0 && a.count >= 0 && a.P >= 1, op, "bad sizes (K {}, count {}, ranks {})", a.K, a.count, a.P);
  SHARD_CHECK(a.K == 0 || a.v, op, "no statistics buffer");
  SHARD_CHECK(a.mode != NormFinish::eval || (a.mean && a.run_mean && a.run_var), op,
              "evaluation mode needs the mean buffer and both running statistics");
  SHARD_CHECK(a.mode != NormFinish::invstd || a.mean || (!a.run_mean && !a.run_var), op,
              "updating the running statistics needs the mean");
  SHARD_CHECK(a.mode != NormFinish::spread || (a.mean && a.local_mean && a.local_count >= 0), op,
              "spread mode needs the global and the local mean");
  for (const Block* r : {a.run_mean, a.run_var}) {
    if (!r) continue;
    SHARD_CHECK(r->dtype == DType::f32 || r->dtype == DType::f64, op, "running statistic of dtype {}; f32 or f64 needed",
                r->dtype);
    detail::check_block(op, "running statistic", *r, r->dtype, a.K, ctx);
    SHARD_CHECK(r->is_contiguous(), op, "running statistic must be contiguous");
  }
  if (a.K == 0) return;
  kernels_for<NormKernels>(ctx.device(), op).finish(a, ctx);
}

}  // namespace shard::exec
