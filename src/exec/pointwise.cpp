// Front of the pointwise kernel family: checks operands (one device, one dtype, shapes), then
// dispatches to the table registered for the device (see pointwise_kernels.hpp).
#include "shardtensor/exec/pointwise.hpp"

#include "exec/front_util.hpp"
#include "shardtensor/exec/precision.hpp"
#include "exec/pointwise_kernels.hpp"
#include "exec/strided_rows.hpp"
#include "shardtensor/runtime/memory.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

/// Keeps src/exec/pointwise_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
SHARD_KEEP_CPU_TABLE(pointwise);

namespace {

// bf16 / f16 pass these checks only on the native route (native_lp); elsewhere the F32Work route
// has turned them into f32 before.
void check_dtype(const Block& b, DType dt, const char* op, const char* what) {
  SHARD_CHECK(b.dtype == dt, op, "{} has dtype {}, expected {}", what, b.dtype, dt);
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64 || detail::is_low_precision(dt), op,
              "dtype {} is not supported (f32, f64, bf16, f16)", dt);
}
void check_device(const Block& b, Device dev, const char* op, const char* what) {
  SHARD_CHECK(b.device == dev, op, "operands on different devices: {} is on {}, the result on {}", what, b.device, dev);
}
void check_operand(const Block& x, const Block& out, const char* op, const char* what) {
  check_device(x, out.device, op, what);
  check_dtype(x, out.dtype, op, what);
  SHARD_CHECK(x.rank == out.rank, op, "{} has rank {}, the result {}", what, x.rank, out.rank);
  for (int d = 0; d < out.rank; ++d)
    SHARD_CHECK(x.shape[static_cast<std::size_t>(d)] == out.shape[static_cast<std::size_t>(d)], op,
                "{} has shape {} but the result {}", what, x.shape_vec(), out.shape_vec());
}
void check_flat(const Block& x, const Block& out, const char* op, const char* what) {
  check_device(x, out.device, op, what);
  check_dtype(x, out.dtype, op, what);
  SHARD_CHECK(x.is_contiguous() && x.numel() == out.numel(), op,
              "{} must be contiguous with {} elements (shape {}, strides {})", what, out.numel(), x.shape_vec(),
              x.strides_vec());
}
/// The table for the context's device (the result `out` must be on it).
const PointwiseKernels& pointwise_table(const Block& out, const char* op, const ExecContext& ctx) {
  if (!detail::is_low_precision(out.dtype)) return detail::front_table<PointwiseKernels>(op, out.dtype, out.device, ctx);
  SHARD_CHECK(ctx.device() == out.device, op, "operands on different devices: data on {} but the execution context on {}",
              out.device, ctx.device());
  return kernels_for<PointwiseKernels>(out.device, op);
}
/// True when `out`'s table computes `pass` on its bf16/f16 dtype natively (detail::native_storage)
/// and `contiguous` holds: the front then skips the f32 working copies.
bool native_lp(const Block& out, KernelPass pass, bool contiguous, const char* op, const ExecContext& ctx) {
  return contiguous && detail::native_storage(pointwise_table(out, op, ctx), out.dtype, pass, ctx);
}

}  // namespace

const char* op_name(UnaryOp op) noexcept {
  static constexpr const char* names[] = {"neg",  "square", "sqrt",    "exp",        "log",         "abs",
                                          "relu", "leaky_relu", "gelu", "gelu_tanh", "silu",        "tanh",
                                          "sigmoid", "add_scalar", "rsub_scalar", "mul_scalar", "div_scalar",
                                          "rdiv_scalar"};
  const auto i = static_cast<unsigned>(op);
  return i < sizeof(names) / sizeof(names[0]) ? names[i] : "?";
}
const char* op_name(BinaryOp op) noexcept {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    case BinaryOp::div: return "div";
  }
  return "?";
}

void unary(UnaryOp op, double alpha, const Block& x, const Block& y, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "pointwise", "unary", &ctx);
  if (detail::F32Work::needed(x.dtype, y.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same(op_name(op), {x.dtype, y.dtype});
    if (!native_lp(y, KernelPass::forward, x.is_contiguous() && y.is_contiguous(), op_name(op), ctx)) {
      if (detail::chunked_f32<1, 1>(ctx, {&x}, {&y}, [&](const auto& in, const auto& out) {
            unary(op, alpha, in[0], out[0], ctx);
          }))
        return;
      detail::F32Work f(ctx);
      unary(op, alpha, f.in(x), f.out(y), ctx);
      return f.finish();
    }
  }
  const char* name = op_name(op);
  check_dtype(y, y.dtype, name, "output");
  SHARD_CHECK(y.is_contiguous(), name, "output must be contiguous");
  if (!x.is_contiguous()) {  // a strided view: read in place where the table can
    check_operand(x, y, name, "input");
    if (y.numel() == 0) return;
    shard::detail::bump_version(y.owner);
    if (pointwise_table(y, name, ctx).unary_strided(op, alpha, x, y, ctx)) return;
    const Block xc = detail::materialize(x, ctx);
    pointwise_table(y, name, ctx).unary(op, alpha, y.dtype, y.numel(), xc.data, y.data, ctx);
    return;
  }
  check_flat(x, y, name, "input");
  if (y.numel() == 0) return;
  shard::detail::bump_version(y.owner);  // in-place writes (y may alias x) are seen by saved tensors
  pointwise_table(y, name, ctx).unary(op, alpha, y.dtype, y.numel(), x.data, y.data, ctx);
}

void unary_backward(UnaryOp op, double alpha, const Block& x, const Block& y, const Block& dy, const Block& dx,
                    ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "pointwise", "unary_backward", &ctx);
  if (detail::F32Work::needed(x.dtype, y.dtype, dy.dtype, dx.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same(op_name(op), {x.dtype, y.dtype, dy.dtype, dx.dtype});
    if (!native_lp(dx, KernelPass::backward_data,
                   x.is_contiguous() && y.is_contiguous() && dy.is_contiguous() && dx.is_contiguous(), op_name(op), ctx)) {
      if (detail::chunked_f32<3, 1>(ctx, {&x, &y, &dy}, {&dx}, [&](const auto& in, const auto& out) {
            unary_backward(op, alpha, in[0], in[1], in[2], out[0], ctx);
          }))
        return;
      detail::F32Work f(ctx);
      unary_backward(op, alpha, f.in(x), f.in(y), f.in(dy), f.out(dx), ctx);
      return f.finish();
    }
  }
  const char* name = op_name(op);
  check_dtype(dx, dx.dtype, name, "gradient");
  SHARD_CHECK(dx.is_contiguous(), name, "gradient output must be contiguous");
  if (!x.is_contiguous() || !y.is_contiguous() || !dy.is_contiguous()) {  // strided operands
    check_operand(x, dx, name, "input");
    check_operand(y, dx, name, "output");
    check_operand(dy, dx, name, "output gradient");
    if (dx.numel() == 0) return;
    if (pointwise_table(dx, name, ctx).unary_backward_strided(op, alpha, x, y, dy, dx, ctx)) return;
    const Block xc = x.is_contiguous() ? x : detail::materialize(x, ctx);
    const Block yc = y.is_contiguous() ? y : detail::materialize(y, ctx);
    const Block gc = dy.is_contiguous() ? dy : detail::materialize(dy, ctx);
    pointwise_table(dx, name, ctx).unary_backward(op, alpha, dx.dtype, dx.numel(), xc.data, yc.data, gc.data, dx.data, ctx);
    return;
  }
  check_flat(x, dx, name, "input");
  check_flat(y, dx, name, "output");
  check_flat(dy, dx, name, "output gradient");
  if (dx.numel() == 0) return;
  pointwise_table(dx, name, ctx).unary_backward(op, alpha, dx.dtype, dx.numel(), x.data, y.data, dy.data, dx.data, ctx);
}

void binary(BinaryOp op, const Block& a, const Block& b, const Block& out, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "pointwise", "binary", &ctx);
  if (detail::F32Work::needed(a.dtype, b.dtype, out.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same(op_name(op), {a.dtype, b.dtype, out.dtype});
    if (!native_lp(out, KernelPass::forward, out.is_contiguous(), op_name(op), ctx)) {
      if (a.shape_vec() == out.shape_vec() && b.shape_vec() == out.shape_vec() &&
          detail::chunked_f32<2, 1>(ctx, {&a, &b}, {&out}, [&](const auto& in, const auto& o) {
            binary(op, in[0], in[1], o[0], ctx);
          }))
        return;
      detail::F32Work f(ctx);
      binary(op, f.in(a), f.in(b), f.out(out), ctx);
      return f.finish();
    }
  }
  const char* name = op_name(op);
  check_dtype(out, out.dtype, name, "result");
  SHARD_CHECK(out.is_contiguous(), name, "result must be contiguous");
  check_operand(a, out, name, "lhs");
  check_operand(b, out, name, "rhs");
  if (out.numel() == 0) return;
  shard::detail::bump_version(out.owner);
  pointwise_table(out, name, ctx).binary(op, out, a, b, ctx);
}

void div_rhs_backward(const Block& g, const Block& a, const Block& b, const Block& out, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "pointwise", "div_rhs_backward", &ctx);
  if (detail::F32Work::needed(g.dtype, a.dtype, b.dtype, out.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("div_rhs_backward", {g.dtype, a.dtype, b.dtype, out.dtype});
    if (!native_lp(out, KernelPass::backward_data, out.is_contiguous(), "div_backward", ctx)) {
      if (g.shape_vec() == out.shape_vec() && a.shape_vec() == out.shape_vec() && b.shape_vec() == out.shape_vec() &&
          detail::chunked_f32<3, 1>(ctx, {&g, &a, &b}, {&out}, [&](const auto& in, const auto& o) {
            div_rhs_backward(in[0], in[1], in[2], o[0], ctx);
          }))
        return;
      detail::F32Work f(ctx);
      div_rhs_backward(f.in(g), f.in(a), f.in(b), f.out(out), ctx);
      return f.finish();
    }
  }
  const char* name = "div_backward";
  check_dtype(out, out.dtype, name, "result");
  SHARD_CHECK(out.is_contiguous(), name, "result must be contiguous");
  check_operand(g, out, name, "gradient");
  check_operand(a, out, name, "lhs");
  check_operand(b, out, name, "rhs");
  if (out.numel() == 0) return;
  pointwise_table(out, name, ctx).div_rhs_backward(out, g, a, b, ctx);
}

void sum_to(const Block& g, const Block& dst, const Block& dst_view, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "pointwise", "sum_to", &ctx);
  // bf16 / f16 storage: in place where the table computes it (native_lp), else f32 working copies.
  if (detail::F32Work::needed(g.dtype, dst.dtype)) {
    detail::F32Work::check_same("sum_to", {g.dtype, dst.dtype});
    if (!native_lp(dst, KernelPass::backward_data, g.is_contiguous() && dst.is_contiguous(), "sum_to", ctx)) {
      detail::F32Work f(ctx);
      const Block gw = f.in(g), dw = f.out(dst);  // view_of needs out(dst) first
      sum_to(gw, dw, f.view_of(dst_view, dst), ctx);
      return f.finish();
    }
  }
  const char* name = "sum_to";
  check_dtype(dst, dst.dtype, name, "destination");
  SHARD_CHECK(dst.is_contiguous(), name, "destination must be contiguous");
  check_device(g, dst.device, name, "gradient");
  check_dtype(g, dst.dtype, name, "gradient");
  check_device(dst_view, dst.device, name, "destination view");
  SHARD_CHECK(g.is_contiguous(), name, "gradient must be contiguous");
  SHARD_CHECK(dst_view.rank == g.rank, name, "view rank {} != gradient rank {}", dst_view.rank, g.rank);
  for (int d = 0; d < g.rank; ++d)
    SHARD_CHECK(dst_view.shape[static_cast<std::size_t>(d)] == g.shape[static_cast<std::size_t>(d)], name,
                "view shape {} != gradient shape {}", dst_view.shape_vec(), g.shape_vec());
  if (dst.numel() == 0) return;
  shard::detail::bump_version(dst.owner);
  pointwise_table(dst, name, ctx).sum_to(dst, dst_view, g, ctx);
}

void convert(const Block& src, const Block& dst, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "pointwise", "convert", &ctx);
  const char* name = "convert";
  SHARD_CHECK(is_float_dtype(src.dtype) && is_float_dtype(dst.dtype), name,
              "converts between f32, f64, bf16 and f16, not {} to {}", src.dtype, dst.dtype);
  check_device(src, dst.device, name, "source");
  SHARD_CHECK(src.is_contiguous() && dst.is_contiguous() && src.numel() == dst.numel(), name,
              "source (shape {}, strides {}) and destination (shape {}, strides {}) must be contiguous with one "
              "element count",
              src.shape_vec(), src.strides_vec(), dst.shape_vec(), dst.strides_vec());
  SHARD_CHECK(ctx.device() == dst.device, name, "operands on {} but the execution context on {}", dst.device,
              ctx.device());
  if (dst.numel() == 0) return;
  shard::detail::bump_version(dst.owner);
  kernels_for<PointwiseKernels>(dst.device, name).convert(src.dtype, dst.dtype, dst.numel(), src.data, dst.data, ctx);
}

const char* op_name(ComplexOp op) noexcept {
  static constexpr const char* names[] = {"real", "imag",  "complex",  "conj",     "abs_squared", "abs",
                                          "scale", "add",  "mul",      "mul_conj", "mul_real",    "re_mul_conj",
                                          "abs_backward"};
  const auto i = static_cast<unsigned>(op);
  return i < sizeof(names) / sizeof(names[0]) ? names[i] : "?";
}

namespace {
/// What a complex op reads from a / b and writes to out: 'c' complex, 'r' its part, '-' unused.
struct ComplexRoles {
  char a, b, out;
};
ComplexRoles roles_of(ComplexOp k) {
  switch (k) {
    case ComplexOp::real:
    case ComplexOp::imag:
    case ComplexOp::abs_squared:
    case ComplexOp::abs: return {'c', '-', 'r'};
    case ComplexOp::make: return {'r', 'r', 'c'};
    case ComplexOp::conj:
    case ComplexOp::scale: return {'c', '-', 'c'};
    case ComplexOp::add:
    case ComplexOp::mul:
    case ComplexOp::mul_conj: return {'c', 'c', 'c'};
    case ComplexOp::mul_real:
    case ComplexOp::abs_backward: return {'c', 'r', 'c'};
    case ComplexOp::re_mul_conj: return {'c', 'c', 'r'};
  }
  return {'-', '-', '-'};
}
bool is_complex_dtype(DType dt) { return dt == DType::c64 || dt == DType::c128; }
void check_complex_block(const Block& b, char role, DType cdt, index_t n, Device dev, const char* what,
                         const char* op) {
  if (role == '-') return;
  SHARD_CHECK(b.device == dev, op, "operands on different devices: {} is on {}, the execution context on {}", what,
              b.device, dev);
  const DType want = role == 'c' ? cdt : (cdt == DType::c64 ? DType::f32 : DType::f64);
  SHARD_CHECK(b.dtype == want, op, "{} has dtype {}, expected {}", what, b.dtype, want);
  SHARD_CHECK(b.numel() == n, op, "{} has {} elements, expected {}", what, b.numel(), n);
  SHARD_CHECK(b.is_contiguous(), op, "{} must be contiguous", what);
}
}  // namespace

void complex_map(ComplexOp op, std::complex<double> s, const Block& a, const Block& b, const Block& out,
                 ExecContext& ctx, const char* name) {
  SHARD_PROFILE_SCOPE("op", "pointwise", "complex_map", &ctx);
  if (!name) name = op_name(op);
  const ComplexRoles r = roles_of(op);
  SHARD_CHECK(r.out != '-', name, "unknown complex op {}", static_cast<int>(op));
  // The complex dtype of the kernel: out's when out is complex, else a's.
  const DType cdt = r.out == 'c' ? out.dtype : a.dtype;
  SHARD_CHECK(is_complex_dtype(cdt), name, "expected a complex (c64, c128) tensor, got {}", cdt);
  const Device dev = ctx.device();
  const index_t n = out.numel();
  check_complex_block(out, r.out, cdt, n, dev, "the output", name);
  // make reads a null block as zeros (the gradients of real and imag).
  const bool a_zero = op == ComplexOp::make && a.data == nullptr;
  const bool b_zero = op == ComplexOp::make && b.data == nullptr;
  if (!a_zero) check_complex_block(a, r.a, cdt, n, dev, "the first operand", name);
  if (!b_zero) check_complex_block(b, r.b, cdt, n, dev, "the second operand", name);
  SHARD_CHECK(!(a_zero && b_zero) || n == 0, name, "both parts are missing");
  const PointwiseKernels& t = kernels_for<PointwiseKernels>(dev, name);
  if (n == 0) return;
  shard::detail::bump_version(out.owner);
  t.complex_map(op, s, cdt, n, r.a == '-' || a_zero ? nullptr : a.data, r.b == '-' || b_zero ? nullptr : b.data,
                out.data, ctx);
}

std::complex<double> complex_sum(const Block& x, ExecContext& ctx, const char* name) {
  SHARD_PROFILE_SCOPE("op", "pointwise", "complex_sum", &ctx);
  if (!name) name = "sum";
  SHARD_CHECK(is_complex_dtype(x.dtype), name, "expected a complex (c64, c128) tensor, got {}", x.dtype);
  SHARD_CHECK(x.device == ctx.device(), name, "the input is on {} but the execution context on {}", x.device,
              ctx.device());
  SHARD_CHECK(x.is_contiguous(), name, "the input must be contiguous");
  const PointwiseKernels& t = kernels_for<PointwiseKernels>(x.device, name);
  if (x.numel() == 0) return {};
  return t.complex_sum(x.dtype, x.numel(), x.data, ctx);
}

}  // namespace shard::exec
