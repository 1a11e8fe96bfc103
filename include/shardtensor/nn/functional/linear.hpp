#pragma once
/// \file linear.hpp
/// Differentiable channel mixing with replicated weights, on the GEMM kernel family (exec/gemm.hpp:
/// OpenBLAS on the host, cuBLAS on CUDA), on the device of the operands:
///  - channel_linear: 1x1 "pointwise convolution" on N, C, spatial... activations,
///    y[n,o,s...] = sum_c W[o,c] x[n,c,s...] + b[o];
///  - linear: on the last dim of token-like tensors [..., C] (torch.nn.functional.linear),
///    y[..., o] = sum_c W[o,c] x[..., c] + b[o].
/// The mixed dim must not be sharded; every other dim may be (spatial, and N over a data-parallel
/// mesh dim). W [Cout, Cin] and b [Cout] must be Replicate. The result has the input's placements
/// and layouts. Gradients: dx sharded like x; dW and db are local sums, Partial(sum) on every mesh
/// dim that shards x (reduced by Var's leaf finalisation), Replicate elsewhere.
#include <algorithm>
#include <optional>
#include <type_traits>
#include <vector>

#include "shardtensor/nn/functional/common.hpp"
#include "shardtensor/exec/gemm.hpp"

namespace shard::nn::functional {

namespace detail {

/// Validates x / W / b of a channel-mixing op along tensor dim `cdim`; returns Cout.
template <class T, int R>
index_t check_linear_args(const Var<T, R>& x, const Var<T, 2>& w, const std::optional<Var<T, 1>>& b, int cdim,
                          const char* op) {
  const Device dev = x.value().device();
  SHARD_CHECK(w.value().device() == dev, op, "operands on different devices: weight on {} but the input on {}",
              w.value().device(), dev);
  const DistSpec& xs = x.value().spec();
  check_no_partial(xs, op, "input");
  check_unsharded(xs, cdim, op, "input");
  SHARD_CHECK(w.value().mesh() == xs.mesh(), op, "weight and input live on different meshes");
  check_replicated(w.value().spec(), op, "weight");
  const auto ws = w.value().global_shape();
  const index_t cin = xs.global_shape()[static_cast<std::size_t>(cdim)];
  SHARD_CHECK(ws[1] == cin, op, "weight of shape {} expects {} input channels but the input {} has {} along dim {}", ws,
              ws[1], xs.global_shape(), cin, cdim);
  if (b) {
    SHARD_CHECK(b->value().device() == dev, op, "operands on different devices: bias on {} but the input on {}",
                b->value().device(), dev);
    SHARD_CHECK(b->value().mesh() == xs.mesh(), op, "bias and input live on different meshes");
    check_replicated(b->value().spec(), op, "bias");
    SHARD_CHECK(b->value().global_shape()[0] == ws[0], op, "bias of shape {} for a weight of shape {} ({} outputs)",
                b->value().global_shape(), ws, ws[0]);
  }
  return ws[0];
}

/// Channel-mixing core on a contiguous local block viewed as [A, C, S] (cdim = 1: A = N, S =
/// spatial; cdim = last: A = leading dims, S = 1), on `dev`. Forward / backward pieces.
template <class T>
void mix_forward(const T* x, const T* w, const T* b, T* y, index_t A, index_t cin, index_t cout, index_t S, Device dev,
                 ExecContext& ctx) {
  if (A == 0 || S == 0) return;
  const DType dt = dtype_of<T>;
  if (S == 1) {  // tokens: Y[A, cout] = X[A, cin] W^T
    exec::gemm(dt, Trans::no, Trans::yes, A, cout, cin, 1.0, x, cin, w, cin, 0.0, y, cout, dev, ctx);
  } else {  // per sample: Y_a[cout, S] = W[cout, cin] X_a[cin, S]
    exec::gemm_strided_batched(dt, Trans::no, Trans::no, cout, S, cin, 1.0, w, cin, 0, x, S, cin * S, 0.0, y, S,
                               cout * S, A, dev, ctx);
  }
  if (b) exec::add_bias(dt, A, cout, S, b, y, dev, ctx);
}

/// dx, dw (accumulated over the samples; must be zero on entry) and db (rounded from double sums);
/// each may be null.
template <class T>
void mix_backward(const T* x, const T* w, const T* g, T* dx, T* dw, T* db, index_t A, index_t cin, index_t cout,
                  index_t S, Device dev, ExecContext& ctx) {
  const DType dt = dtype_of<T>;
  if (db) exec::bias_grad(dt, A, cout, S, g, db, dev, ctx);
  if (A == 0 || S == 0) return;
  if (S == 1) {
    if (dx) exec::gemm(dt, Trans::no, Trans::no, A, cin, cout, 1.0, g, cout, w, cin, 0.0, dx, cin, dev, ctx);
    if (dw) exec::gemm(dt, Trans::yes, Trans::no, cout, cin, A, 1.0, g, cout, x, cin, 0.0, dw, cin, dev, ctx);
    return;
  }
  if (dx)
    exec::gemm_strided_batched(dt, Trans::yes, Trans::no, cin, S, cout, 1.0, w, cin, 0, g, S, cout * S, 0.0, dx, S,
                               cin * S, A, dev, ctx);
  if (dw)  // one GEMM per sample, accumulated in sample order (as a sum over the batch)
    for (index_t a = 0; a < A; ++a)
      exec::gemm(dt, Trans::no, Trans::yes, cout, cin, S, 1.0, g + a * cout * S, S, x + a * cin * S, S, 1.0, dw, cin,
                 dev, ctx);
}

/// x's local block read in place by the GEMMs: `offsets.size()` panels in element order. linear
/// (cdim = R - 1): panel g is a [panel, cin] matrix of tokens (row stride ld, unit column stride)
/// whose result rows are y[g * panel .. +panel, :]; channel_linear (cdim = 1): panel g is a
/// [cin, panel] matrix (row stride ld = x's channel stride, unit column stride) of sample g / Q and
/// spatial points (g % Q) * panel .. +panel, Q = S / panel. A user view of the interior of a
/// halo-padded array is typically one panel per padded row.
struct MixPanels {
  index_t ld = 0;                ///< BLAS leading dimension of each panel
  index_t panel = 0;             ///< tokens (linear) or spatial points (channel_linear) per panel
  std::vector<index_t> offsets;  ///< element offset in x of each panel's first element
};

/// The panels of a strided x of shape `shape` / `strides` for channel dim cdim (1 or R - 1), or
/// nullopt when BLAS cannot read x in place (the unit-stride dim is not the channel dim (linear) or
/// the innermost spatial dim (channel_linear)): the caller then takes a contiguous copy.
template <int R>
std::optional<MixPanels> mix_panels(const Shape<R>& shape, const Shape<R>& strides, int cdim) {
  const bool tokens = cdim == R - 1;
  const int first = tokens ? 0 : 2, last = tokens ? R - 2 : R - 1;
  const index_t cin = shape[static_cast<std::size_t>(cdim)];
  // The longest run of dims [k, last] that collapses into one dim of stride `step`.
  index_t run = 1, step = 0;
  bool found = false;
  int k = last + 1;
  for (int d = last; d >= first; --d) {
    const auto u = static_cast<std::size_t>(d);
    if (shape[u] == 1) {
      k = d;
      continue;
    }
    if (found && strides[u] != step * run) break;
    if (!found) step = strides[u], found = true;
    run *= shape[u];
    k = d;
  }
  MixPanels p;
  p.panel = run;
  if (tokens) {
    if (cin != 1 && strides[static_cast<std::size_t>(cdim)] != 1) return std::nullopt;
    p.ld = found ? step : std::max<index_t>(cin, 1);
    if (p.ld < std::max<index_t>(cin, 1)) return std::nullopt;
  } else {
    if (found && step != 1) return std::nullopt;
    p.ld = cin == 1 ? std::max<index_t>(run, 1) : strides[1];
    if (p.ld < std::max<index_t>(run, 1)) return std::nullopt;
  }
  // Outer dims, enumerated in row-major order: the leading dims before k (linear), or N and the
  // spatial dims before k (channel_linear).
  std::vector<int> outer;
  if (!tokens) outer.push_back(0);
  for (int d = first; d < k; ++d) outer.push_back(d);
  index_t groups = 1;
  for (int d : outer) groups *= shape[static_cast<std::size_t>(d)];
  p.offsets.reserve(static_cast<std::size_t>(groups));
  for (index_t g = 0; g < groups; ++g) {
    index_t rem = g, off = 0;
    for (auto it = outer.rbegin(); it != outer.rend(); ++it) {
      const auto u = static_cast<std::size_t>(*it);
      off += (rem % shape[u]) * strides[u];
      rem /= shape[u];
    }
    p.offsets.push_back(off);
  }
  return p;
}

/// mix_forward on x read through panels (cdim: 1 or the last dim, as `tokens` says).
template <class T>
void mix_forward_panels(const T* x, const MixPanels& p, bool tokens, const T* w, const T* b, T* y, index_t A,
                        index_t cin, index_t cout, index_t S, Device dev, ExecContext& ctx) {
  if (A == 0 || S == 0) return;
  const DType dt = dtype_of<T>;
  const index_t Q = tokens ? 1 : S / p.panel;
  for (std::size_t g = 0; g < p.offsets.size(); ++g) {
    const auto gi = static_cast<index_t>(g);
    if (tokens)
      exec::gemm(dt, Trans::no, Trans::yes, p.panel, cout, cin, 1.0, x + p.offsets[g], p.ld, w, cin, 0.0,
                 y + gi * p.panel * cout, cout, dev, ctx);
    else
      exec::gemm(dt, Trans::no, Trans::no, cout, p.panel, cin, 1.0, w, cin, x + p.offsets[g], p.ld, 0.0,
                 y + (gi / Q) * cout * S + (gi % Q) * p.panel, S, dev, ctx);
  }
  if (b) exec::add_bias(dt, A, cout, S, b, y, dev, ctx);
}

/// The weight gradient on x read through panels, accumulated into dw (zero on entry) in panel order.
template <class T>
void mix_weight_grad_panels(const T* x, const MixPanels& p, bool tokens, const T* g, T* dw, index_t cin, index_t cout,
                            index_t S, Device dev, ExecContext& ctx) {
  const DType dt = dtype_of<T>;
  const index_t Q = tokens ? 1 : S / p.panel;
  for (std::size_t i = 0; i < p.offsets.size(); ++i) {
    const auto gi = static_cast<index_t>(i);
    if (tokens)
      exec::gemm(dt, Trans::yes, Trans::no, cout, cin, p.panel, 1.0, g + gi * p.panel * cout, cout, x + p.offsets[i],
                 p.ld, 1.0, dw, cin, dev, ctx);
    else
      exec::gemm(dt, Trans::no, Trans::yes, cout, cin, p.panel, 1.0, g + (gi / Q) * cout * S + (gi % Q) * p.panel, S,
                 x + p.offsets[i], p.ld, 1.0, dw, cin, dev, ctx);
  }
}

/// Shared front of channel_linear (cdim = 1) and linear (cdim = R - 1).
template <class T, int R>
Var<T, R> mix_channels(const Var<T, R>& x, const Var<T, 2>& w, const std::optional<Var<T, 1>>& b, int cdim,
                       const char* op) {
  static_assert(is_compute_type<T>, "linear supports float and double");
  const index_t cout = check_linear_args(x, w, b, cdim, op);
  const DistSpec& xs = x.value().spec();
  const index_t cin = xs.global_shape()[static_cast<std::size_t>(cdim)];
  auto og = xs.global_shape();
  og[static_cast<std::size_t>(cdim)] = cout;
  const DistSpec out_spec = derived_spec(xs, xs.placements(), og);
  // x as it is where the GEMMs can read it in place through leading dimensions (a strided view
  // of user memory, e.g. the interior of a halo-padded array: saved as it is when stable; a
  // snapshot view was copied by local()); else one contiguous copy.
  const Tensor<T, R> xv = x.local();
  std::optional<MixPanels> panels;
  if (!xv.is_contiguous()) panels = mix_panels<R>(xv.shape(), xv.strides(), cdim);
  const Tensor<T, R> xl = xv.is_contiguous() || panels ? xv : xv.contiguous();
  if (xl.is_contiguous()) panels.reset();
  const auto wl = w.local().contiguous();
  const Tensor<T, 1> bl = b ? b->local().contiguous() : Tensor<T, 1>();
  index_t A = 1, S = 1;
  for (int d = 0; d < cdim; ++d) A *= xl.size(d);
  for (int d = cdim + 1; d < R; ++d) S *= xl.size(d);
  const Device dev = xl.device();
  auto y = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(out_spec.local_box().len), dev);
  const bool tokens = cdim == R - 1;
  if (panels)
    mix_forward_panels<T>(xl.data(), *panels, tokens, wl.data(), b ? bl.data() : nullptr, y.data(), A, cin, cout, S,
                          dev, current_context(dev));
  else
    mix_forward<T>(xl.data(), wl.data(), b ? bl.data() : nullptr, y.data(), A, cin, cout, S, dev, current_context(dev));
  std::optional<Var<T, 1>> bb = b;
  return Var<T, R>::make(
      DistTensor<T, R>(out_spec, y), op, {x.ref(), w.ref(), b ? b->ref() : autograd::VarRef{}},
      [x, w, bb, xs, xl, wl, out_spec, A, S, cin, cout, dev, panels, tokens](const DistTensor<T, R>& gin) {
        const auto g = align_grad(gin, out_spec).local().contiguous();
        const bool need_b = bb && bb->requires_grad();
        Tensor<T, R> dx;
        if (x.requires_grad()) dx = Tensor<T, R>::empty(xl.shape(), dev);
        Tensor<T, 2> dw;
        if (w.requires_grad()) dw = Tensor<T, 2>::zeros({cout, cin}, dev);
        Tensor<T, 1> db;
        if (need_b) db = Tensor<T, 1>::empty({cout}, dev);
        // dx and db read no x; the weight gradient reads x through its panels when strided.
        mix_backward<T>(xl.data(), wl.data(), g.data(), x.requires_grad() ? dx.data() : nullptr,
                        w.requires_grad() && !panels ? dw.data() : nullptr, need_b ? db.data() : nullptr, A, cin, cout,
                        S, dev, current_context(dev));
        if (w.requires_grad() && panels && A > 0 && S > 0)
          mix_weight_grad_panels<T>(xl.data(), *panels, tokens, g.data(), dw.data(), cin, cout, S, dev,
                                    current_context(dev));
        if (x.requires_grad()) x.accumulate_grad(DistTensor<T, R>(xs, dx));
        if (w.requires_grad()) w.accumulate_grad(DistTensor<T, 2>(param_grad_spec(w.value().spec(), xs), dw));
        if (need_b) bb->accumulate_grad(DistTensor<T, 1>(param_grad_spec(bb->value().spec(), xs), db));
      });
}

}  // namespace detail

/// 1x1 channel mixing of N, C, spatial... activations: y[n,o,...] = sum_c W[o,c] x[n,c,...] + b[o].
/// W [Cout, Cin] and b [Cout] Replicate; C unsharded; any other dim may be sharded.
template <class T, int R>
Var<T, R> channel_linear(const Var<T, R>& x, const Var<T, 2>& weight,
                         const std::type_identity_t<std::optional<Var<T, 1>>>& bias = std::nullopt) {
  static_assert(R >= 2, "channel_linear needs N, C, ... inputs");
  return detail::mix_channels(x, weight, bias, 1, "channel_linear");
}

/// Linear map of the last dim (tokens [..., Cin] -> [..., Cout]): y = x W^T + b, as
/// torch.nn.functional.linear. The last dim must be unsharded; W, b Replicate.
template <class T, int R>
Var<T, R> linear(const Var<T, R>& x, const Var<T, 2>& weight, const std::type_identity_t<std::optional<Var<T, 1>>>& bias = std::nullopt) {
  static_assert(R >= 1, "linear needs a rank >= 1 input");
  return detail::mix_channels(x, weight, bias, R - 1, "linear");
}

}  // namespace shard::nn::functional
