#pragma once
/// \file linear.hpp
/// Differentiable channel mixing with replicated weights, on GEMM (OpenBLAS via tensor/gemm.hpp):
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
#include "shardtensor/tensor/gemm.hpp"

namespace shard::nn::functional {

namespace detail {

/// Validates x / W / b of a channel-mixing op along tensor dim `cdim`; returns Cout.
template <class T, int R>
index_t check_linear_args(const Var<T, R>& x, const Var<T, 2>& w, const std::optional<Var<T, 1>>& b, int cdim,
                          const char* op) {
  check_host(x.value(), op, "input");
  check_host(w.value(), op, "weight");
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
    check_host(b->value(), op, "bias");
    SHARD_CHECK(b->value().mesh() == xs.mesh(), op, "bias and input live on different meshes");
    check_replicated(b->value().spec(), op, "bias");
    SHARD_CHECK(b->value().global_shape()[0] == ws[0], op, "bias of shape {} for a weight of shape {} ({} outputs)",
                b->value().global_shape(), ws, ws[0]);
  }
  return ws[0];
}

/// Channel-mixing core on a contiguous local block viewed as [A, C, S] (cdim = 1: A = N, S =
/// spatial; cdim = last: A = leading dims, S = 1). Forward / backward pieces.
template <class T>
void mix_forward(const T* x, const T* w, const T* b, T* y, index_t A, index_t cin, index_t cout, index_t S) {
  if (A == 0 || S == 0) return;
  if (S == 1) {  // tokens: Y[A, cout] = X[A, cin] W^T
    gemm<T>(Trans::no, Trans::yes, A, cout, cin, T(1), x, cin, w, cin, T(0), y, cout);
    if (b)
      for (index_t a = 0; a < A; ++a)
        for (index_t o = 0; o < cout; ++o) y[a * cout + o] += b[o];
    return;
  }
  for (index_t a = 0; a < A; ++a) {
    T* ya = y + a * cout * S;
    gemm<T>(Trans::no, Trans::no, cout, S, cin, T(1), w, cin, x + a * cin * S, S, T(0), ya, S);
    if (b)
      for (index_t o = 0; o < cout; ++o)
        for (index_t s = 0; s < S; ++s) ya[o * S + s] += b[o];
  }
}

template <class T>
void mix_backward(const T* x, const T* w, const T* g, T* dx, T* dw, double* db, index_t A, index_t cin, index_t cout,
                  index_t S) {
  if (dw) std::fill_n(dw, cout * cin, T(0));
  if (db) std::fill_n(db, cout, 0.0);
  if (A == 0 || S == 0) return;
  if (S == 1) {
    if (dx) gemm<T>(Trans::no, Trans::no, A, cin, cout, T(1), g, cout, w, cin, T(0), dx, cin);
    if (dw) gemm<T>(Trans::yes, Trans::no, cout, cin, A, T(1), g, cout, x, cin, T(0), dw, cin);
    if (db)
      for (index_t a = 0; a < A; ++a)
        for (index_t o = 0; o < cout; ++o) db[o] += g[a * cout + o];
    return;
  }
  for (index_t a = 0; a < A; ++a) {
    const T* ga = g + a * cout * S;
    if (dx) gemm<T>(Trans::yes, Trans::no, cin, S, cout, T(1), w, cin, ga, S, T(0), dx + a * cin * S, S);
    if (dw) gemm<T>(Trans::no, Trans::yes, cout, cin, S, T(1), ga, S, x + a * cin * S, S, T(1), dw, cin);
    if (db)
      for (index_t o = 0; o < cout; ++o) {
        double acc = 0;
        for (index_t s = 0; s < S; ++s) acc += ga[o * S + s];
        db[o] += acc;
      }
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
  const auto xl = x.local().contiguous();
  const auto wl = w.local().contiguous();
  const Tensor<T, 1> bl = b ? b->local().contiguous() : Tensor<T, 1>();
  index_t A = 1, S = 1;
  for (int d = 0; d < cdim; ++d) A *= xl.size(d);
  for (int d = cdim + 1; d < R; ++d) S *= xl.size(d);
  auto y = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(out_spec.local_box().len));
  mix_forward<T>(xl.data(), wl.data(), b ? bl.data() : nullptr, y.data(), A, cin, cout, S);
  std::optional<Var<T, 1>> bb = b;
  return Var<T, R>::make(
      DistTensor<T, R>(out_spec, y), op, {x.ref(), w.ref(), b ? b->ref() : autograd::VarRef{}},
      [x, w, bb, xs, xl, wl, out_spec, A, S, cin, cout](const DistTensor<T, R>& gin) {
        const auto g = align_grad(gin, out_spec).local().contiguous();
        Tensor<T, R> dx;
        if (x.requires_grad()) dx = Tensor<T, R>::empty(xl.shape());
        Tensor<T, 2> dw;
        if (w.requires_grad()) dw = Tensor<T, 2>::empty({cout, cin});
        std::vector<double> db(bb && bb->requires_grad() ? static_cast<std::size_t>(cout) : 0);
        mix_backward<T>(xl.data(), wl.data(), g.data(), x.requires_grad() ? dx.data() : nullptr,
                        w.requires_grad() ? dw.data() : nullptr, db.empty() ? nullptr : db.data(), A, cin, cout, S);
        if (x.requires_grad()) x.accumulate_grad(DistTensor<T, R>(xs, dx));
        if (w.requires_grad()) w.accumulate_grad(DistTensor<T, 2>(param_grad_spec(w.value().spec(), xs), dw));
        if (!db.empty()) {
          auto dbt = Tensor<T, 1>::empty({cout});
          for (index_t o = 0; o < cout; ++o) dbt.data()[o] = static_cast<T>(db[static_cast<std::size_t>(o)]);
          bb->accumulate_grad(DistTensor<T, 1>(param_grad_spec(bb->value().spec(), xs), dbt));
        }
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
