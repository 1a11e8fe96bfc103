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
#include <optional>
#include <type_traits>

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
  SHARD_CHECK(w.value().mesh() == xs.mesh(), op, "weight and input live on different meshes: {}",
              mesh_mismatch(w.value().mesh(), xs.mesh()));
  check_replicated(w.value().spec(), op, "weight");
  const auto ws = w.value().global_shape();
  const index_t cin = xs.global_shape()[static_cast<std::size_t>(cdim)];
  SHARD_CHECK(ws[1] == cin, op, "weight of shape {} expects {} input channels but the input {} has {} along dim {}", ws,
              ws[1], xs.global_shape(), cin, cdim);
  if (b) {
    SHARD_CHECK(b->value().device() == dev, op, "operands on different devices: bias on {} but the input on {}",
                b->value().device(), dev);
    SHARD_CHECK(b->value().mesh() == xs.mesh(), op, "bias and input live on different meshes: {}",
                mesh_mismatch(b->value().mesh(), xs.mesh()));
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
  const auto xl = x.local().contiguous();
  const auto wl = w.local().contiguous();
  const Tensor<T, 1> bl = b ? b->local().contiguous() : Tensor<T, 1>();
  index_t A = 1, S = 1;
  for (int d = 0; d < cdim; ++d) A *= xl.size(d);
  for (int d = cdim + 1; d < R; ++d) S *= xl.size(d);
  const Device dev = xl.device();
  auto y = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(out_spec.local_box().len), dev);
  mix_forward<T>(xl.data(), wl.data(), b ? bl.data() : nullptr, y.data(), A, cin, cout, S, dev, current_context(dev));
  std::optional<Var<T, 1>> bb = b;
  return Var<T, R>::make(
      DistTensor<T, R>(out_spec, y), op, {x.ref(), w.ref(), b ? b->ref() : autograd::VarRef{}},
      [x, w, bb, xs, xl, wl, out_spec, A, S, cin, cout, dev](const DistTensor<T, R>& gin) {
        const auto g = align_grad(gin, out_spec).local().contiguous();
        const bool need_b = bb && bb->requires_grad();
        Tensor<T, R> dx;
        if (x.requires_grad()) dx = Tensor<T, R>::empty(xl.shape(), dev);
        Tensor<T, 2> dw;
        if (w.requires_grad()) dw = Tensor<T, 2>::zeros({cout, cin}, dev);
        Tensor<T, 1> db;
        if (need_b) db = Tensor<T, 1>::empty({cout}, dev);
        mix_backward<T>(xl.data(), wl.data(), g.data(), x.requires_grad() ? dx.data() : nullptr,
                        w.requires_grad() ? dw.data() : nullptr, need_b ? db.data() : nullptr, A, cin, cout, S, dev,
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
