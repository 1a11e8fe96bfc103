// Front of the conv kernel family (exec/conv.hpp): operand checks (dtype, every block on
// ctx.device(), contiguity, sizes against the geometry), then the table of ctx.device(). bf16 /
// f16 operands go to the table as they are where it takes them (KernelTable::native_storage,
// asked through detail::native_storage with the geometry: the CPU direct path, cuDNN), else
// through f32 working copies (exec/precision.hpp).
#include "shardtensor/exec/conv.hpp"

#include "exec/conv_kernels.hpp"
#include "exec/front_util.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/exec/box.hpp"
#include "shardtensor/exec/precision.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

SHARD_KEEP_CPU_TABLE(conv);

namespace {

index_t vol(const std::array<index_t, 3>& e) { return e[0] * e[1] * e[2]; }

/// The table of the context's device (every operand is checked to be there).
const ConvKernels& conv_table(const ExecContext& ctx, const char* op) { return kernels_for<ConvKernels>(ctx.device(), op); }

void check_geometry(const char* op, const ConvGeometry& g) {
  SHARD_CHECK(g.spatial_dims >= 1 && g.spatial_dims <= 3, op, "spatial dims {} must be 1, 2 or 3", g.spatial_dims);
  SHARD_CHECK(g.batch >= 0 && g.groups >= 1 && g.in_channels >= 0 && g.out_channels >= 0 &&
                  g.in_channels % g.groups == 0 && g.out_channels % g.groups == 0,
              op, "channels {} -> {} not divisible by groups {}", g.in_channels, g.out_channels, g.groups);
  for (int d = 0; d < 3; ++d) {
    SHARD_CHECK(g.in[d] >= 0 && g.out[d] >= 0 && g.kernel[d] >= 1 && g.stride[d] >= 1 && g.dilation[d] >= 1, op,
                "bad geometry: in {} out {} kernel {} stride {} dilation {}", g.in, g.out, g.kernel, g.stride,
                g.dilation);
    SHARD_CHECK(d >= 3 - g.spatial_dims ||
                    (g.in[d] == 1 && g.out[d] == 1 && g.kernel[d] == 1 && g.stride[d] == 1 && g.pad_lo[d] == 0),
                op, "leading unused spatial entries must be 1 (in {} out {} kernel {}, {} spatial dims)", g.in, g.out,
                g.kernel, g.spatial_dims);
  }
}

/// Every operand: same dtype (f32/f64) as the first, on ctx.device(), contiguous, `numel` elements.
void check_operand(const char* op, const char* name, const Block& b, index_t numel, const Block& first,
                   const ExecContext& ctx) {
  // bf16 / f16 reach here only when the table computes them natively (detail::native_storage).
  SHARD_CHECK(b.dtype == DType::f32 || b.dtype == DType::f64 || detail::is_low_precision(b.dtype), op,
              "{} has dtype {} (conv supports f32, f64, bf16, f16)", name, b.dtype);
  SHARD_CHECK(b.dtype == first.dtype, op, "{} has dtype {} but the first operand has {}", name, b.dtype, first.dtype);
  SHARD_CHECK(ctx.device() == b.device, op, "{} on {} but the execution context on {}", name, b.device, ctx.device());
  SHARD_CHECK(b.is_contiguous(), op, "{} (shape {}) must be contiguous", name, b.shape_vec());
  SHARD_CHECK(b.numel() == numel, op, "{} has shape {} ({} elements), geometry needs {}", name, b.shape_vec(),
              b.numel(), numel);
}

index_t weight_numel(const ConvGeometry& g) { return g.out_channels * (g.in_channels / g.groups) * vol(g.kernel); }

/// The input operand as the table reads it. A contiguous x goes as it is. A strided x must have
/// the geometry's N, C, spatial shape (rank 2 + spatial_dims); a table that takes input strides
/// gets it in place with g.x_strides set when its innermost stride is 1 (else, and for other
/// tables such as cuDNN's, one contiguous copy is made here on x's device).
struct InputOperand {
  ConvGeometry g;
  Block x;  ///< what the table reads (x itself or the copy)
};
InputOperand input_operand(const char* op, const ConvGeometry& g0, const Block& x, const ConvKernels& table,
                           const Block& first, ExecContext& ctx) {
  InputOperand r{g0, x};
  r.g.x_strides = {};
  if (x.is_contiguous()) return r;
  SHARD_CHECK(x.dtype == first.dtype, op, "input has dtype {}, the first operand {}", x.dtype, first.dtype);
  SHARD_CHECK(ctx.device() == x.device, op, "input on {} but the execution context on {}", x.device, ctx.device());
  const int S = g0.spatial_dims;
  SHARD_CHECK(x.rank == 2 + S, op, "a strided input must have rank {} (N, C, {} spatial), got shape {}", 2 + S, S,
              x.shape_vec());
  bool shape_ok = x.shape[0] == g0.batch && x.shape[1] == g0.in_channels;
  for (int d = 0; d < S; ++d) shape_ok = shape_ok && x.shape[static_cast<std::size_t>(2 + d)] == g0.in[3 - S + d];
  SHARD_CHECK(shape_ok, op, "input of shape {} (strides {}) does not match the geometry (N {}, C {}, spatial {})",
              x.shape_vec(), x.strides_vec(), g0.batch, g0.in_channels, g0.in);
  bool unit_inner = x.strides[static_cast<std::size_t>(x.rank - 1)] == 1;
  for (int d = 0; d < x.rank; ++d) unit_inner = unit_inner && x.strides[static_cast<std::size_t>(d)] >= 0;
  if (table.takes_input_strides() && unit_inner) {
    // N, C, then 3 spatial entries; the unused leading ones (extent 1) get any stride.
    r.g.x_strides = {x.strides[0], x.strides[1], 0, 0, 1};
    for (int d = 0; d < S; ++d) r.g.x_strides[static_cast<std::size_t>(2 + 3 - S + d)] = x.strides[static_cast<std::size_t>(2 + d)];
    return r;
  }
  r.x = Block::allocate(x.dtype, x.device, x.shape.data(), x.rank);
  box_copy(r.x, x, ctx);
  return r;
}

}  // namespace

void conv_forward(const ConvGeometry& g, const Block& x, const Block& w, const Block* bias, const Block& y,
                  ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "conv", "forward", &ctx);
  const char* op = "conv_forward";
  if (detail::F32Work::needed(x.dtype, w.dtype, (bias ? bias->dtype : x.dtype), y.dtype)) {  // bf16 / f16 storage
    detail::F32Work::check_same(op, {x.dtype, w.dtype, (bias ? bias->dtype : x.dtype), y.dtype});
    check_geometry(op, g);
    if (!detail::native_storage(conv_table(ctx, op), x.dtype, KernelPass::forward, ctx, &g)) {  // f32 working copies
      detail::F32Work f(ctx);
      conv_forward(g, f.in(x), f.in(w), f.in(bias), f.out(y), ctx);
      return f.finish();
    }
  }
  check_geometry(op, g);
  const ConvKernels& tab = conv_table(ctx, op);
  const InputOperand in = input_operand(op, g, x, tab, w, ctx);
  if (in.x.is_contiguous()) check_operand(op, "input", in.x, g.batch * g.in_channels * vol(g.in), w, ctx);
  check_operand(op, "weight", w, weight_numel(g), w, ctx);
  if (bias) check_operand(op, "bias", *bias, g.out_channels, w, ctx);
  check_operand(op, "output", y, g.batch * g.out_channels * vol(g.out), w, ctx);
  tab.forward(w.dtype, in.g, in.x.data, w.data, bias ? bias->data : nullptr, y.data, ctx);
}

void conv_backward_input(const ConvGeometry& g, const Block& gy, const Block& w, const Block* bias, const Block& gx,
                         ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "conv", "backward_input", &ctx);
  const char* op = "conv_backward_input";
  if (detail::F32Work::needed(gy.dtype, w.dtype, (bias ? bias->dtype : gy.dtype), gx.dtype)) {  // bf16 / f16 storage
    detail::F32Work::check_same(op, {gy.dtype, w.dtype, (bias ? bias->dtype : gy.dtype), gx.dtype});
    check_geometry(op, g);
    if (!detail::native_storage(conv_table(ctx, op), gy.dtype, KernelPass::backward_data, ctx, &g)) {  // f32 copies
      detail::F32Work f(ctx);
      conv_backward_input(g, f.in(gy), f.in(w), f.in(bias), f.out(gx), ctx);
      return f.finish();
    }
  }
  check_geometry(op, g);
  check_operand(op, "output gradient", gy, g.batch * g.out_channels * vol(g.out), gy, ctx);
  check_operand(op, "weight", w, weight_numel(g), gy, ctx);
  if (bias) check_operand(op, "bias", *bias, g.in_channels, gy, ctx);
  check_operand(op, "input gradient", gx, g.batch * g.in_channels * vol(g.in), gy, ctx);
  conv_table(ctx, op).backward_input(gy.dtype, g, gy.data, w.data, bias ? bias->data : nullptr, gx.data, ctx);
}

void conv_backward_weight(const ConvGeometry& g, const Block& x, const Block& gy, const Block& gw, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "conv", "backward_weight", &ctx);
  const char* op = "conv_backward_weight";
  if (detail::F32Work::needed(x.dtype, gy.dtype, gw.dtype)) {  // bf16 / f16 storage
    detail::F32Work::check_same(op, {x.dtype, gy.dtype, gw.dtype});
    check_geometry(op, g);
    if (!detail::native_storage(conv_table(ctx, op), x.dtype, KernelPass::backward_weight, ctx, &g)) {  // f32 copies
      detail::F32Work f(ctx);
      conv_backward_weight(g, f.in(x), f.in(gy), f.out(gw), ctx);
      return f.finish();
    }
  }
  check_geometry(op, g);
  const ConvKernels& tab = conv_table(ctx, op);
  const InputOperand in = input_operand(op, g, x, tab, gy, ctx);
  if (in.x.is_contiguous()) check_operand(op, "input", in.x, g.batch * g.in_channels * vol(g.in), gy, ctx);
  check_operand(op, "output gradient", gy, g.batch * g.out_channels * vol(g.out), gy, ctx);
  check_operand(op, "weight gradient", gw, weight_numel(g), gy, ctx);
  tab.backward_weight(gy.dtype, in.g, in.x.data, gy.data, gw.data, ctx);
}

void conv_backward_bias(const Block& gy, const Block& gb, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "conv", "backward_bias", &ctx);
  const char* op = "conv_backward_bias";
  if (detail::F32Work::needed(gy.dtype, gb.dtype)) {  // bf16 / f16 storage
    detail::F32Work::check_same(op, {gy.dtype, gb.dtype});
    if (!detail::native_storage(conv_table(ctx, op), gy.dtype, KernelPass::backward_bias, ctx)) {
      detail::F32Work f(ctx);  // f32 working copies
      conv_backward_bias(f.in(gy), f.out(gb), ctx);
      return f.finish();
    }
  }
  SHARD_CHECK(gy.rank >= 2, op, "output gradient of rank {} (needs N, C, ...)", gy.rank);
  const index_t batch = gy.shape[0], channels = gy.shape[1];
  const index_t positions = channels * batch == 0 ? 0 : gy.numel() / (batch * channels);
  check_operand(op, "output gradient", gy, gy.numel(), gy, ctx);
  check_operand(op, "bias gradient", gb, channels, gy, ctx);
  conv_table(ctx, op).backward_bias(gy.dtype, batch, channels, positions, gy.data, gb.data, ctx);
}

}  // namespace shard::exec
