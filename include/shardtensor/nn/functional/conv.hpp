#pragma once
/// \file conv.hpp
/// Domain-parallel convolution (conv1d/2d/3d) and transposed convolution with forward and
/// backward on the autograd tape. Inputs are N, C, spatial... Vars whose spatial dims may be
/// sharded over any mesh dims (1-, 2-, 3-D meshes; several mesh dims on one tensor dim), N may be
/// sharded over a data-parallel mesh dim, C must not be sharded; weight and bias are Replicate.
/// Any kernel extent (odd or even), stride, padding per side, dilation, groups, optional bias,
/// and a padding mode per spatial dim: zero, periodic (PyTorch 'circular'), reflect, replicate.
/// A Partial input is resolved first (F::resolve).
///
/// ## conv: the algorithm
/// Output points are assigned by the anchor rule (window.hpp): each rank computes exactly the
/// outputs whose anchor input it owns, reading ghost layers of widths (c, span - c) in the
/// regular case, given by dist/halo.hpp with the dim's padding mode (zero padding at the global
/// edges is added by the local kernels; other modes come from the halo). The output DistSpec has
/// x's placements and explicit ShardSizes derived locally from x's spec (stride-1 'same' convs
/// keep x's layout exactly).
///
/// Overlap (DESIGN.md §4). Forward: (1) post the halo exchange; (2) while it is in flight, run the
/// local kernel for ALL of this rank's outputs on its own block, with every cell outside the
/// block read as zero: exact for each output whose window stays inside the block or reads only
/// zero padding; (3) finish the exchange; (4) recompute the boundary boxes (the disjoint boxes of
/// outputs whose windows touch ghost cells, WindowPlan::boundary_boxes: one output row per
/// sharded side for a 3x3 conv) from small copies of the ghost and face cells. The extra work is
/// the boundary boxes computed twice (< 0.5% for 1024^2 halves). Backward: dx of the block by one
/// input-gradient kernel call (every local output's contribution to the block's cells), the
/// ghost cells' gradients from the boundary boxes only; the halo ADJOINT (ghost gradients go back
/// to their owners and are added) is posted before the block's dx and dW are computed and
/// finished after them; dW = the block's cells with zeros outside plus the boundary boxes' ghost
/// cells (saved by the forward with the block's cells zeroed, so nothing is counted twice).
///
/// Halo transport. When a single spatial dim needs ghost cells (the common case: one sharded
/// dim, zero padding elsewhere), the exchange and its adjoint run on the thin tensor of every
/// part's face cells (max(width + 1, span) cells at each face; dist/halo_transport.hpp), so neither
/// copies the block's interior: per-rank memory and time are the unsharded conv's / P plus the
/// halos (bench/run_conv_dist.sh: 96% / 94% strong-scaling efficiency for the conv2d / conv3d
/// cases at 2 ranks). Otherwise the halo runs on the whole extended block; in backward, when an
/// unsharded ghost-free spatial dim exists, the ghost gradients are sent in slices along it
/// (ExecSettings::halo_chunk_bytes of the current CPU context, default 2 MiB) on one zeroed slice
/// buffer, so only slice-sized buffers exist beyond dx. ExecSettings::overlap_halo = false
/// finishes each exchange before the compute it overlaps (benchmarks); results do not depend on
/// either setting; ExecSettings::halo_transport (automatic | thin | whole_block) forces a transport.
/// tests/nn/mpi_conv.cpp checks every path equals the unsharded conv at 1..4 ranks.
///
/// Gradients: dx is laid out like x; dW and db are this rank's sums, Partial(sum) on every mesh
/// dim that shards x (or on which the upstream gradient is Partial), Replicate elsewhere; Var's
/// leaf finalisation allreduces them.
///
/// ## conv_transpose
/// The adjoint of the conv y -> x with the same parameters. Output extent (PyTorch):
/// Gy = (G - 1)*s - pl - ph + dl*(k - 1) + output_padding + 1. Output layout: the inverse anchor
/// rule (window.hpp, transpose_output_sizes): part p of y starts at off_p*s - pl + c (clamped), so
/// that conv(conv_transpose(x)) with the same parameters gives back x's layout, and a stride-2
/// transposed conv doubles the layout like upsample(.., 2) does. Forward: the local transposed
/// conv of the block into the extended output range (the y cells its taps reach), then the halo
/// ADJOINT adds overlapping contributions into their owners (contributions outside [0, Gy) are
/// cropped), then the bias. Backward: halo forward of dy + the local conv (the conv forward above,
/// with its overlap) for dx; the weight gradient from dy's block and ghosts; db = sum of dy.
/// Zero padding only (as PyTorch's ConvTranspose).
#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <type_traits>

#include "shardtensor/nn/functional/autocast.hpp"
#include "shardtensor/nn/functional/window.hpp"
#include "shardtensor/exec/pointwise.hpp"
#include "shardtensor/nn/functional/conv_local.hpp"
#include "shardtensor/nn/functional/conv_options.hpp"

namespace shard::nn::functional {

namespace detail {

/// Channel counts of a distributed conv seen as a map from its input to its output.
struct ConvChannels {
  index_t batch = 0, in = 1, out = 1, groups = 1;
};

/// What conv_forward keeps for the weight gradient: per boundary box (global output and
/// input ranges) the input cells it read, with this rank's own block cells zeroed.
struct ConvGhosts {
  struct Box {
    std::vector<Range> out, in;
    Block ghost;
  };
  std::vector<Box> boxes;
};

/// The schedule (src/nn/conv.cpp): y[batch, ch.out, out_block] = conv of the rank's block
/// x[batch, ch.in, in_block] (contiguous, or a strided view of that shape read in place where the
/// kernels take strides) with its halo (the halo plan's exchange, overlapped as described in the
/// file comment); w and bias (may be null) as the conv family takes them; every block on
/// ctx.device(), where the kernels, scratch and halo buffers run. Fills `saved` when non-null.
/// Collective over the communicators of the sharded dims. `user_ext` (optional): the extended
/// block (plan.halo around x) viewed in the user's memory, whose declared ghost cells are read
/// instead of exchanging (no communication; declared_ghost_block decided it on every rank alike).
void conv_forward(const WindowPlan& plan, const DistSpec& in_spec, const ConvChannels& ch, const Block& x,
                  const Block& w, const Block* bias, const Block& y, ConvGhosts* saved, const Block* user_ext,
                  ExecContext& ctx);

/// Backward of conv_forward for the output gradient gy[batch, ch.out, out_block]: returns the
/// input block's gradient when `input_grad` (halo adjoint included; an empty block otherwise)
/// and overwrites *gw (if non-null) with this rank's weight gradient. Collective like the forward.
Block conv_backward(const WindowPlan& plan, const DistSpec& in_spec, const ConvChannels& ch, const Block& x,
                    const ConvGhosts& ghosts, const Block& gy, const Block& w, bool input_grad, const Block* gw,
                    ExecContext& ctx);

/// Gradient spec of a replicated parameter whose local gradient sums this rank's outputs.
inline DistSpec window_param_grad_spec(const DistSpec& param, const DistSpec& xs, const DistSpec& grad_out) {
  auto p = param.placements();
  for (int m = 0; m < xs.mesh().ndim(); ++m)
    if (xs.placement(m).is_shard() || grad_out.placement(m).is_partial()) p[static_cast<std::size_t>(m)] = Partial();
  return param.with_placements(p);
}

/// Collective consistency check of a conv-family call (debug mode, dist/consistency.hpp): input
/// layout, weight shape, bias, stride, dilation, padding (and its mode / output padding), groups.
template <class T, int R, class Opt>
void check_conv_call(const char* op, const Var<T, R>& x, const Var<T, R>& w, const std::optional<Var<T, 1>>& b,
                     const Opt& opt) {
  shard::detail::CollectiveFingerprint f(op);
  f.dtype(dtype_of<T>).spec(x.value().spec()).field("weight shape", w.value().global_shape()).field("bias", b.has_value());
  f.field("kernel stride", opt.stride).field("dilation", opt.dilation).field("groups", opt.groups);
  f.text("padding", fmt::format("lo {} hi {}", opt.pad_lo, opt.pad_hi));
  if constexpr (requires { opt.padding_mode; })
    f.text("padding mode", fmt::format("[{}]", fmt::join(opt.padding_mode, ", ")));
  if constexpr (requires { opt.output_padding; }) f.field("output padding", opt.output_padding);
  f.agree(x.value().mesh());
}

/// Shared checks of the conv family (spec-only, so every rank throws alike): one device, one
/// mesh, C unsharded, Replicate weight / bias, channel counts against `groups`.
/// `w_in_dim` is the weight dim that holds C_in / groups (1 for conv, 0 holds C_in for transpose).
template <class T, int R>
void check_conv_args(const char* op, const Var<T, R>& x, const Var<T, R>& w, const std::optional<Var<T, 1>>& b,
                     index_t groups, bool transpose) {
  SHARD_CHECK(w.value().device() == x.value().device(), op,
              "operands on different devices: input on {}, weight on {}", x.value().device(), w.value().device());
  const DistSpec& xs = x.value().spec();
  check_unsharded(xs, 1, op, "input");
  SHARD_CHECK(w.value().mesh() == xs.mesh(), op, "weight and input live on different meshes: {}",
              mesh_mismatch(w.value().mesh(), xs.mesh()));
  check_replicated(w.value().spec(), op, "weight");
  SHARD_CHECK(groups >= 1, op, "groups {} must be >= 1", groups);
  const auto ws = w.value().global_shape();
  const index_t cin = xs.global_shape()[1];
  index_t cout = 0;
  if (!transpose) {
    SHARD_CHECK(ws[0] % groups == 0 && cin % groups == 0, op,
                "groups {} must divide the input channels {} and the output channels {} (weight {})", groups, cin,
                ws[0], ws);
    SHARD_CHECK(ws[1] * groups == cin, op,
                "input {} has {} channels but the weight {} expects {} (= {} per group x {} groups)", xs.global_shape(),
                cin, ws, ws[1] * groups, ws[1], groups);
    cout = ws[0];
  } else {
    SHARD_CHECK(ws[0] == cin, op, "input {} has {} channels but the weight {} expects {} (dim 0)", xs.global_shape(),
                cin, ws, ws[0]);
    SHARD_CHECK(cin % groups == 0, op, "groups {} must divide the input channels {} (weight {})", groups, cin, ws);
    cout = ws[1] * groups;
  }
  for (int d = 2; d < R; ++d)
    SHARD_CHECK(ws[static_cast<std::size_t>(d)] >= 1, op, "weight {} has an empty kernel", ws);
  if (b) {
    SHARD_CHECK(b->value().device() == x.value().device(), op,
                "operands on different devices: input on {}, bias on {}", x.value().device(), b->value().device());
    SHARD_CHECK(b->value().mesh() == xs.mesh(), op, "bias and input live on different meshes: {}",
                mesh_mismatch(b->value().mesh(), xs.mesh()));
    check_replicated(b->value().spec(), op, "bias");
    SHARD_CHECK(b->value().global_shape()[0] == cout, op, "bias of shape {} for {} output channels (weight {})",
                b->value().global_shape(), cout, ws);
  }
}

/// Adds bias[c] to every point of channel c of a contiguous [N, C, ...] block (in place, on the
/// blocks' device: a broadcasting add with b viewed with stride 0 on every dim but C).
template <class T, int R>
void add_channel_bias(const Tensor<T, R>& y, const Tensor<T, 1>& b) {
  SHARD_CHECK(b.device() == y.device(), "conv bias", "operands on different devices: output on {}, bias on {}",
              y.device(), b.device());
  const Block yb = as_block(y);
  std::array<index_t, R> bstride{};
  bstride[1] = 1;
  const Block bb = Block::view(dtype_of<T>, b.device(), b.data(), y.shape().data(), R, bstride.data());
  exec::binary(exec::BinaryOp::add, yb, bb, yb, current_context(y.device()));
}

/// The contiguous local block t on `dev` (an upstream gradient arriving on another device, e.g. a
/// host seed, is moved; same-device tensors are not copied when contiguous).
template <class T, int R>
Tensor<T, R> on_device(const Tensor<T, R>& t, Device dev, const char*) {
  return t.device() == dev ? t.contiguous() : t.to(dev).contiguous();
}

/// Local bias gradient (sum over N and positions) as a Var gradient with the parameter rule.
template <class T, int R>
void push_bias_grad(const Var<T, 1>& b, const Tensor<T, R>& gy, const DistSpec& xs, const DistSpec& gs) {
  Tensor<T, 1> gb = conv_backward_bias(gy);
  b.accumulate_grad(DistTensor<T, 1>(window_param_grad_spec(b.value().spec(), xs, gs), gb));
}

}  // namespace detail

/// Domain-parallel S-d convolution of x[N, C_in, spatial...] with w[C_out, C_in/groups, k...]
/// and optional bias[C_out] (see the file comment for layouts, overlap and gradients).
template <class T, int R>
Var<T, R> conv(const Var<T, R>& input, const Var<T, R>& weight,
               const std::type_identity_t<std::optional<Var<T, 1>>>& bias, const ConvOptions<R - 2>& opt = {}) {
  constexpr int S = R - 2;
  static_assert(S >= 1 && S <= 3 && is_float_type<T>, "conv: 1-3 spatial dims, float, double, bf16 or f16");
  if (auto y = detail::autocast([](const auto&... a) { return conv(a...); }, input, weight, bias, opt)) return *y;
  const char* op = S == 1 ? "conv1d" : S == 2 ? "conv2d" : "conv3d";
  if (shard::detail::checking_collectives(input.value().device())) [[unlikely]]
    detail::check_conv_call(op, input, weight, bias, opt);
  detail::check_conv_args(op, input, weight, bias, opt.groups, false);
  const auto x = resolve(input);
  const DistSpec xs = x.value().spec();
  const auto wsh = weight.value().global_shape();
  std::vector<WindowDim> dims;
  for (int d = 0; d < S; ++d)
    dims.push_back({wsh[static_cast<std::size_t>(d) + 2], opt.stride[d], opt.dilation[d], opt.pad_lo[d],
                    opt.pad_hi[d], opt.padding_mode[static_cast<std::size_t>(d)]});
  const DistSpec ys = detail::anchor_output_spec(op, xs, wsh[0], dims);
  auto plan = std::make_shared<const detail::WindowPlan>(detail::make_window_plan(op, xs, ys, dims));
  // x is read in place: a strided local view (e.g. the interior of a halo-padded user array) is
  // not copied where the kernels take input strides (exec/conv.hpp); it is saved as it is (the
  // saved-tensor policy of Var applies: a user view is snapshotted unless declared stable).
  const Tensor<T, R> xl = x.local(), wl = weight.local().contiguous();
  const Tensor<T, 1> bl = bias ? bias->local().contiguous() : Tensor<T, 1>();
  const detail::ConvChannels ch{xl.size(0), xs.global_shape()[1], wsh[0], opt.groups};
  const Device dev = xl.device();
  auto y = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(ys.local_box().len), dev);
  auto ghosts = std::make_shared<detail::ConvGhosts>();
  const bool keep = autograd::grad_enabled() && weight.requires_grad();
  // Ghost reuse (dist/ghosts.hpp): the user's declared ghost cells replace the exchange when they
  // cover the halo (same decision on every rank); zero padding never reads beyond the domain.
  const Block user_ext = plan->exchange ? declared_ghost_block(x.value(), plan->halo, true) : Block{};
  const Block bblk = bias ? as_block(bl) : Block{};
  detail::conv_forward(*plan, xs, ch, as_block(xl), as_block(wl), bias ? &bblk : nullptr, as_block(y),
                       keep ? ghosts.get() : nullptr, user_ext.data ? &user_ext : nullptr, current_context(dev));
  std::optional<Var<T, 1>> bb = bias;
  return Var<T, R>::make(
      DistTensor<T, R>(ys, y), op, {x.ref(), weight.ref(), bias ? bias->ref() : autograd::VarRef{}},
      [x, weight, bb, xs, ys, plan, ghosts, xl, wl, ch, dev](const DistTensor<T, R>& g) {
        const DistTensor<T, R> gn = autograd::gradient_as(ys, g);
        const Tensor<T, R> gy = detail::on_device(gn.local(), dev, "conv backward");
        Tensor<T, R> gw;
        if (weight.requires_grad()) gw = Tensor<T, R>::empty(wl.shape(), dev);
        const Block gwb = weight.requires_grad() ? as_block(gw) : Block{};
        auto gx = detail::conv_backward(*plan, xs, ch, as_block(xl), *ghosts, as_block(gy), as_block(wl),
                                        x.requires_grad(), weight.requires_grad() ? &gwb : nullptr,
                                        current_context(dev));
        if (x.requires_grad())
          x.accumulate_grad(DistTensor<T, R>(detail::window_input_grad_spec(xs, ys, gn.spec()),
                                             tensor_of<T, R>(gx)));
        if (weight.requires_grad())
          weight.accumulate_grad(DistTensor<T, R>(detail::window_param_grad_spec(weight.value().spec(), xs, gn.spec()), gw));
        if (bb && bb->requires_grad()) detail::push_bias_grad(*bb, gy, xs, gn.spec());
      });
}

/// 1-d convolution of x[N, C, L] (see conv).
template <class T>
Var<T, 3> conv1d(const Var<T, 3>& x, const Var<T, 3>& w, const std::type_identity_t<std::optional<Var<T, 1>>>& b,
                 const ConvOptions<1>& opt = {}) {
  return conv(x, w, b, opt);
}
/// 2-d convolution of x[N, C, H, W] (see conv).
template <class T>
Var<T, 4> conv2d(const Var<T, 4>& x, const Var<T, 4>& w, const std::type_identity_t<std::optional<Var<T, 1>>>& b,
                 const ConvOptions<2>& opt = {}) {
  return conv(x, w, b, opt);
}
/// 3-d convolution of x[N, C, D, H, W] (see conv).
template <class T>
Var<T, 5> conv3d(const Var<T, 5>& x, const Var<T, 5>& w, const std::type_identity_t<std::optional<Var<T, 1>>>& b,
                 const ConvOptions<3>& opt = {}) {
  return conv(x, w, b, opt);
}

/// Domain-parallel transposed convolution of x[N, C_in, spatial...] with w[C_in, C_out/groups,
/// k...] (PyTorch layout) and optional bias[C_out] (see the file comment).
template <class T, int R>
Var<T, R> conv_transpose(const Var<T, R>& input, const Var<T, R>& weight,
                         const std::type_identity_t<std::optional<Var<T, 1>>>& bias,
                         const ConvTransposeOptions<R - 2>& opt = {}) {
  constexpr int S = R - 2;
  static_assert(S >= 1 && S <= 3 && is_float_type<T>, "conv_transpose: 1-3 spatial dims, float, double, bf16 or f16");
  if (auto y = detail::autocast([](const auto&... a) { return conv_transpose(a...); }, input, weight, bias, opt))
    return *y;
  const char* op = S == 1 ? "conv_transpose1d" : S == 2 ? "conv_transpose2d" : "conv_transpose3d";
  if (shard::detail::checking_collectives(input.value().device())) [[unlikely]]
    detail::check_conv_call(op, input, weight, bias, opt);
  detail::check_conv_args(op, input, weight, bias, opt.groups, true);
  const auto x = resolve(input);
  const DistSpec xs = x.value().spec();
  const auto wsh = weight.value().global_shape();
  const index_t cout = wsh[1] * opt.groups;
  std::vector<WindowDim> dims;
  std::vector<index_t> ext;
  std::vector<std::vector<index_t>> sizes;
  for (int d = 0; d < S; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const WindowDim w{wsh[u + 2], opt.stride[d], opt.dilation[d], opt.pad_lo[d], opt.pad_hi[d], Boundary::zero};
    SHARD_CHECK(w.stride >= 1 && w.dilation >= 1 && w.pad_lo >= 0 && w.pad_hi >= 0, op,
                "stride {}, dilation {} must be >= 1 and padding lo {} hi {} >= 0", opt.stride, opt.dilation,
                opt.pad_lo, opt.pad_hi);
    SHARD_CHECK(opt.output_padding[d] >= 0 && opt.output_padding[d] < std::max(w.stride, w.dilation), op,
                "output_padding {} must be >= 0 and < max(stride {}, dilation {})", opt.output_padding, opt.stride,
                opt.dilation);
    SHARD_CHECK(std::max({w.kernel, w.stride, w.dilation, w.pad_lo, w.pad_hi}) <= kMaxWindowParam, op,
                "spatial dim {}: kernel {}, stride {}, dilation {}, padding {} + {} must each be at most {}", d,
                w.kernel, w.stride, w.dilation, w.pad_lo, w.pad_hi, kMaxWindowParam);
    const index_t G = xs.global_shape()[u + 2];
    index_t gy = 0;
    SHARD_CHECK(!__builtin_mul_overflow(std::max<index_t>(G - 1, 0), w.stride, &gy), op,
                "spatial dim {}: input extent {} times stride {} overflows int64", d, G, w.stride);
    gy += -w.pad_lo - w.pad_hi + w.span() + opt.output_padding[d] + 1;
    SHARD_CHECK(G >= 1 && gy >= 1, op,
                "spatial dim {}: input extent {} with kernel {}, stride {}, padding {} + {} gives an empty output", d,
                G, w.kernel, w.stride, w.pad_lo, w.pad_hi);
    dims.push_back(w);
    ext.push_back(gy);
    sizes.push_back(detail::transpose_output_sizes(xs.layout(d + 2), w, gy));
  }
  const DistSpec ys = detail::window_output_spec(xs, cout, ext, sizes);
  // The conv y -> x (input y-space, output x-space) whose adjoint this op is.
  auto plan = std::make_shared<const detail::WindowPlan>(detail::make_window_plan(op, ys, xs, dims));
  const Tensor<T, R> xl = x.local().contiguous(), wl = weight.local().contiguous();
  const Device dev = xl.device();
  const detail::ConvChannels ch{xl.size(0), cout, xs.global_shape()[1], opt.groups};
  auto yb = detail::conv_backward(*plan, ys, ch, Block{}, detail::ConvGhosts{}, as_block(xl), as_block(wl), true,
                                  nullptr, current_context(dev));
  Tensor<T, R> y = tensor_of<T, R>(yb);
  if (bias) detail::add_channel_bias(y, bias->local().contiguous());
  std::optional<Var<T, 1>> bb = bias;
  return Var<T, R>::make(
      DistTensor<T, R>(ys, y), op, {x.ref(), weight.ref(), bias ? bias->ref() : autograd::VarRef{}},
      [x, weight, bb, xs, ys, plan, xl, wl, ch, dev](const DistTensor<T, R>& g) {
        const DistTensor<T, R> gn = autograd::gradient_as(ys, g);
        const Tensor<T, R> gy = detail::on_device(gn.local(), dev, "conv_transpose backward");
        detail::ConvGhosts ghosts;
        if (x.requires_grad()) {
          auto gx = Tensor<T, R>::empty(xl.shape(), dev);
          detail::conv_forward(*plan, ys, ch, as_block(gy), as_block(wl), nullptr, as_block(gx),
                               weight.requires_grad() ? &ghosts : nullptr, nullptr, current_context(dev));
          x.accumulate_grad(DistTensor<T, R>(detail::window_input_grad_spec(xs, ys, gn.spec()), gx));
        } else if (weight.requires_grad()) {
          // The ghosts of dy are needed for the weight gradient: run the exchange alone.
          auto scratch = Tensor<T, R>::empty(xl.shape(), dev);
          detail::conv_forward(*plan, ys, ch, as_block(gy), as_block(wl), nullptr, as_block(scratch), &ghosts, nullptr,
                               current_context(dev));
        }
        if (weight.requires_grad()) {
          auto gw = Tensor<T, R>::empty(wl.shape(), dev);
          const Block gwb = as_block(gw);
          detail::conv_backward(*plan, ys, ch, as_block(gy), ghosts, as_block(xl), as_block(wl), false, &gwb,
                                current_context(dev));
          weight.accumulate_grad(DistTensor<T, R>(detail::window_param_grad_spec(weight.value().spec(), xs, gn.spec()), gw));
        }
        if (bb && bb->requires_grad()) detail::push_bias_grad(*bb, gy, xs, gn.spec());
      });
}

/// 1-d transposed convolution (see conv_transpose).
template <class T>
Var<T, 3> conv_transpose1d(const Var<T, 3>& x, const Var<T, 3>& w,
                           const std::type_identity_t<std::optional<Var<T, 1>>>& b,
                           const ConvTransposeOptions<1>& opt = {}) {
  return conv_transpose(x, w, b, opt);
}
/// 2-d transposed convolution (see conv_transpose).
template <class T>
Var<T, 4> conv_transpose2d(const Var<T, 4>& x, const Var<T, 4>& w,
                           const std::type_identity_t<std::optional<Var<T, 1>>>& b,
                           const ConvTransposeOptions<2>& opt = {}) {
  return conv_transpose(x, w, b, opt);
}
/// 3-d transposed convolution (see conv_transpose).
template <class T>
Var<T, 5> conv_transpose3d(const Var<T, 5>& x, const Var<T, 5>& w,
                           const std::type_identity_t<std::optional<Var<T, 1>>>& b,
                           const ConvTransposeOptions<3>& opt = {}) {
  return conv_transpose(x, w, b, opt);
}

}  // namespace shard::nn::functional
