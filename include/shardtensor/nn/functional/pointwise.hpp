#pragma once
/// \file pointwise.hpp
/// Differentiable pointwise arithmetic on sharded tensors: add, sub, mul, div (tensor-tensor with
/// broadcasting, tensor-scalar), neg, square, sqrt, exp, log, and the unary-op helper used by
/// the activations.
///
/// Broadcasting (numpy rules, right-aligned; the lower-rank operand gets leading size-1 dims):
///  - every pair of extents is equal or one of them is 1;
///  - on each mesh dim an operand is Shard(d) or Replicate (Partial operands: only add/sub of two
///    operands with identical specs whose Partials are all sum, which stays Partial; other ops
///    refuse Partial inputs, resolve them first);
///  - where one operand is Shard(d) the other is Shard(d) with the same layout, or Replicate —
///    with extent 1 along d (broadcast) or the full extent (its local block is sliced to this
///    rank's box, no communication);
///  - a sharded dim may not be broadcast (extent 1 sharded against a larger extent is refused).
/// Typical uses: per-channel bias/scale [1,C,1,1] (or F::as_channel<4>(v) of a [C] vector)
/// Replicate against a sharded [N,C,H,W]; two activations with the same spec; a Replicate
/// [1,1,H,W] mask against a sharded activation.
/// Gradients: a sharded operand gets a gradient sharded like itself; a Replicate operand that
/// was broadcast or sliced against a sharded result gets its local sum over the broadcast dims,
/// Partial(sum) on the mesh dims where the result is sharded (leaf finalisation reduces it).
#include <cmath>
#include <type_traits>

#include "shardtensor/exec/pointwise.hpp"
#include "shardtensor/nn/functional/common.hpp"

namespace shard::nn::functional {

namespace detail {

/// True when operand dim d (of an operand of rank rx aligned to an output of rank R at output dim
/// od) is broadcast: missing, or extent 1 against a larger output extent.
inline bool is_broadcast_dim(const DistSpec& xs, int rx, const DistSpec& out, int od) {
  const int d = od - (out.ndim() - rx);
  return d < 0 || (xs.global_shape()[static_cast<std::size_t>(d)] == 1 &&
                   out.global_shape()[static_cast<std::size_t>(od)] != 1);
}

/// The spec of `a (op) b` under the broadcasting rules of this file (checked on specs only).
DistSpec broadcast_spec(const DistSpec& a, const DistSpec& b, const char* op);

/// Placements of the gradient of operand `xs` of a broadcast op with result `out`.
DistSpec operand_grad_spec(const DistSpec& xs, const DistSpec& out);

/// Operand x's local block seen in the result's local index space (stride 0 on broadcast dims,
/// offset to this rank's box where x's block is larger). A view; no copy.
template <class T, int R, int Rx>
Tensor<T, R> operand_view(const Tensor<T, Rx>& xl, const DistSpec& xs, const DistSpec& out) {
  const Box& xb = xs.local_box();
  const Box& ob = out.local_box();
  Shape<R> shape{}, strides{};
  for (int od = 0; od < R; ++od) shape[od] = ob.len[static_cast<std::size_t>(od)];
  if (numel(shape) == 0) return Tensor<T, R>::view(nullptr, shape, strides, xl.device());
  T* p = xl.data();
  for (int od = 0; od < R; ++od) {
    const int d = od - (R - Rx);
    if (is_broadcast_dim(xs, Rx, out, od)) {
      strides[od] = 0;
    } else {
      strides[od] = xl.stride(d);
      p += (ob.lo[static_cast<std::size_t>(od)] - xb.lo[static_cast<std::size_t>(d)]) * xl.stride(d);
    }
  }
  return Tensor<T, R>::view(p, shape, strides, xl.device());
}

/// True when operand_view(x) is x's local block itself (same shape, nothing broadcast or sliced).
template <int R, int Rx>
bool view_is_identity(const DistSpec& xs, const DistSpec& out) {
  if (Rx != R) return false;
  for (int od = 0; od < R; ++od)
    if (is_broadcast_dim(xs, Rx, out, od)) return false;
  return xs.local_box() == out.local_box();
}

/// Sums the result-shaped local gradient `g` into operand x's local shape (adjoint of operand_view).
template <class T, int R, int Rx>
Tensor<T, Rx> reduce_to_operand(const Tensor<T, R>& g, const DistSpec& xs, const DistSpec& out) {
  if (view_is_identity<R, Rx>(xs, out)) {
    if constexpr (R == Rx) return g;
  }
  const Box& xb = xs.local_box();
  Shape<Rx> xshape{};
  for (int d = 0; d < Rx; ++d) xshape[d] = xb.len[static_cast<std::size_t>(d)];
  auto out_t = Tensor<T, Rx>::empty(xshape, g.device());
  const auto view = operand_view<T, R, Rx>(out_t, xs, out);
  const auto gc = g.contiguous();
  exec::sum_to(as_block(gc), as_block(out_t), as_block(view), current_context(g.device()));
  return out_t;
}

using exec::BinaryOp;
using exec::UnaryOp;

/// The broadcasting binary op behind add/sub/mul/div.
template <class T, int Ra, int Rb>
Var<T, std::max(Ra, Rb)> binary(const Var<T, Ra>& a, const Var<T, Rb>& b, BinaryOp op) {
  constexpr int R = std::max(Ra, Rb);
  static_assert(is_float_type<T>, "pointwise ops support float, double, bf16 and f16");
  const char* name = exec::op_name(op);
  check_same_device(a.value(), b.value(), name);
  const DistSpec& sa = a.value().spec();
  const DistSpec& sb = b.value().spec();
  const bool linear = op == BinaryOp::add || op == BinaryOp::sub;
  if (sa.has_partial() || sb.has_partial()) {
    bool ok = linear && Ra == Rb && sa.mesh() == sb.mesh() && sa == sb;
    for (const auto& p : sa.placements()) ok = ok && (!p.is_partial() || p.op == ReduceOp::sum);
    SHARD_CHECK(ok, name,
                "Partial operands are only supported by add/sub of two operands with identical specs and "
                "Partial(sum) placements (got {} and {}); resolve them first (F::resolve)",
                sa, sb);
  }
  const DistSpec out_spec = broadcast_spec(sa, sb, name);
  const Device dev = a.local().device();
  auto out = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(out_spec.local_box().len), dev);
  const auto av = operand_view<T, R, Ra>(a.local(), sa, out_spec);
  const auto bv = operand_view<T, R, Rb>(b.local(), sb, out_spec);
  exec::binary(op, as_block(av), as_block(bv), as_block(out), current_context(dev));
  return Var<T, R>::make(
      DistTensor<T, R>(out_spec, out), name, {a.ref(), b.ref()}, [a, b, op, out_spec](const DistTensor<T, R>& gin) {
        const auto g = autograd::gradient_as(out_spec, gin, autograd::PartialGrad::resolve).local().contiguous();
        const Shape<R> shape = g.shape();
        auto push = [&](auto& x, const Tensor<T, R>& gx_full) {
          using X = std::decay_t<decltype(x)>;
          constexpr int Rx = X::Value::rank;
          const DistSpec& xs = x.value().spec();
          auto local = reduce_to_operand<T, R, Rx>(gx_full, xs, out_spec);
          DistSpec gs = xs.has_partial() ? grad_spec(xs) : operand_grad_spec(xs, out_spec);
          x.accumulate_grad(DistTensor<T, Rx>(gs, local));
        };
        const Device gdev = g.device();
        auto tmp = [&] { return Tensor<T, R>::empty(shape, gdev); };
        ExecContext& ctx = current_context(gdev);
        if (a.requires_grad()) {
          Tensor<T, R> ga;
          if (op == BinaryOp::add || op == BinaryOp::sub) {
            ga = g;
          } else {
            ga = tmp();
            const auto bv2 = operand_view<T, R, Rb>(b.local(), b.value().spec(), out_spec);
            exec::binary(op == BinaryOp::mul ? BinaryOp::mul : BinaryOp::div, as_block(g), as_block(bv2),
                         as_block(ga), ctx);
          }
          push(a, ga);
        }
        if (b.requires_grad()) {
          Tensor<T, R> gb;
          if (op == BinaryOp::add) {
            gb = g;
          } else if (op == BinaryOp::sub) {
            gb = tmp();
            exec::unary(UnaryOp::neg, 0.0, as_block(g), as_block(gb), ctx);
          } else {
            gb = tmp();
            const auto av2 = operand_view<T, R, Ra>(a.local(), a.value().spec(), out_spec);
            if (op == BinaryOp::mul) {
              exec::binary(BinaryOp::mul, as_block(g), as_block(av2), as_block(gb), ctx);
            } else {
              const auto bv2 = operand_view<T, R, Rb>(b.local(), b.value().spec(), out_spec);
              exec::div_rhs_backward(as_block(g), as_block(av2), as_block(bv2), as_block(gb), ctx);
            }
          }
          push(b, gb);
        }
      });
}

/// y = op(x; alpha) elementwise with gradient g * op'(x, y) (exec::UnaryOp); `linear_ok` allows
/// Partial(sum) inputs (only for maps that are linear, f(x) = c x).
template <class T, int R>
Var<T, R> unary_op(const Var<T, R>& x, const char* name, UnaryOp op, double alpha = 0, bool linear_ok = false) {
  static_assert(is_float_type<T>, "pointwise ops support float, double, bf16 and f16");
  const DistSpec& s = x.value().spec();
  if (linear_ok) {
    for (const auto& p : s.placements())
      SHARD_CHECK(!p.is_partial() || p.op == ReduceOp::sum, name,
                  "input has a Partial({}) placement; only Partial(sum) commutes with this op ({})", p.op, s);
  } else {
    check_no_partial(s, name, "input");
  }
  // A strided local view (e.g. the interior of a halo-padded user array) is read in place
  // (exec::unary) and saved as it is for the backward (Var's saved-tensor policy applies).
  const auto& xl = x.local();
  const Device dev = xl.device();
  auto y = Tensor<T, R>::empty(xl.shape(), dev);
  exec::unary(op, alpha, as_block(xl), as_block(y), current_context(dev));
  DistTensor<T, R> yv(s, y);
  DistTensor<T, R> xv(s, xl);
  return Var<T, R>::make(yv, name, {x.ref()}, [x, xv, yv, op, alpha](const DistTensor<T, R>& gin) {
    const auto g = autograd::gradient_as(xv.spec(), gin, autograd::PartialGrad::resolve).local().contiguous();
    auto gx = Tensor<T, R>::empty(g.shape(), g.device());
    exec::unary_backward(op, alpha, as_block(xv.local()), as_block(yv.local()), as_block(g), as_block(gx),
                         current_context(g.device()));
    x.accumulate_grad(DistTensor<T, R>(grad_spec(xv.spec()), gx));
  });
}

}  // namespace detail

/// a + b with broadcasting (see the file comment).
template <class T, int Ra, int Rb>
Var<T, std::max(Ra, Rb)> add(const Var<T, Ra>& a, const Var<T, Rb>& b) {
  return detail::binary(a, b, detail::BinaryOp::add);
}
/// a - b with broadcasting.
template <class T, int Ra, int Rb>
Var<T, std::max(Ra, Rb)> sub(const Var<T, Ra>& a, const Var<T, Rb>& b) {
  return detail::binary(a, b, detail::BinaryOp::sub);
}
/// a * b (elementwise) with broadcasting.
template <class T, int Ra, int Rb>
Var<T, std::max(Ra, Rb)> mul(const Var<T, Ra>& a, const Var<T, Rb>& b) {
  return detail::binary(a, b, detail::BinaryOp::mul);
}
/// a / b (elementwise) with broadcasting.
template <class T, int Ra, int Rb>
Var<T, std::max(Ra, Rb)> div(const Var<T, Ra>& a, const Var<T, Rb>& b) {
  return detail::binary(a, b, detail::BinaryOp::div);
}

/// x + s.
template <class T, int R>
Var<T, R> add(const Var<T, R>& x, std::type_identity_t<T> s) {
  return detail::unary_op(x, "add_scalar", exec::UnaryOp::add_scalar, static_cast<double>(s));
}
/// s + x.
template <class T, int R>
Var<T, R> add(std::type_identity_t<T> s, const Var<T, R>& x) {
  return add(x, s);
}
/// x - s.
template <class T, int R>
Var<T, R> sub(const Var<T, R>& x, std::type_identity_t<T> s) {
  return detail::unary_op(x, "sub_scalar", exec::UnaryOp::add_scalar, -static_cast<double>(s));
}
/// s - x.
template <class T, int R>
Var<T, R> sub(std::type_identity_t<T> s, const Var<T, R>& x) {
  return detail::unary_op(x, "rsub_scalar", exec::UnaryOp::rsub_scalar, static_cast<double>(s));
}
/// x * s (Partial(sum) inputs allowed: the result stays Partial).
template <class T, int R>
Var<T, R> mul(const Var<T, R>& x, std::type_identity_t<T> s) {
  return detail::unary_op(x, "mul_scalar", exec::UnaryOp::mul_scalar, static_cast<double>(s), true);
}
/// s * x.
template <class T, int R>
Var<T, R> mul(std::type_identity_t<T> s, const Var<T, R>& x) {
  return mul(x, s);
}
/// x / s (Partial(sum) inputs allowed).
template <class T, int R>
Var<T, R> div(const Var<T, R>& x, std::type_identity_t<T> s) {
  return detail::unary_op(x, "div_scalar", exec::UnaryOp::div_scalar, static_cast<double>(s), true);
}
/// s / x.
template <class T, int R>
Var<T, R> div(std::type_identity_t<T> s, const Var<T, R>& x) {
  return detail::unary_op(x, "rdiv_scalar", exec::UnaryOp::rdiv_scalar, static_cast<double>(s));
}
/// -x (Partial(sum) inputs allowed).
template <class T, int R>
Var<T, R> neg(const Var<T, R>& x) {
  return detail::unary_op(x, "neg", exec::UnaryOp::neg, 0.0, true);
}
/// x * x.
template <class T, int R>
Var<T, R> square(const Var<T, R>& x) {
  return detail::unary_op(x, "square", exec::UnaryOp::square);
}
/// sqrt(x) (gradient g / (2 sqrt(x)); infinite at 0).
template <class T, int R>
Var<T, R> sqrt(const Var<T, R>& x) {
  return detail::unary_op(x, "sqrt", exec::UnaryOp::sqrt);
}
/// exp(x).
template <class T, int R>
Var<T, R> exp(const Var<T, R>& x) {
  return detail::unary_op(x, "exp", exec::UnaryOp::exp);
}
/// |x| (gradient sign(x), 0 at 0).
template <class T, int R>
Var<T, R> abs(const Var<T, R>& x) {
  return detail::unary_op(x, "abs", exec::UnaryOp::abs);
}
/// log(x) (natural).
template <class T, int R>
Var<T, R> log(const Var<T, R>& x) {
  return detail::unary_op(x, "log", exec::UnaryOp::log);
}

/// A Replicate [C] vector viewed as [1, C, 1, ...] of rank R (differentiable; no copy), for
/// per-channel broadcasting against N, C, spatial... activations.
template <int R, class T>
Var<T, R> as_channel(const Var<T, 1>& v) {
  static_assert(R >= 2, "as_channel needs a target rank >= 2");
  const DistSpec& s = v.value().spec();
  detail::check_replicated(s, "as_channel", "the per-channel vector");
  const index_t c = s.global_shape()[0];
  Shape<R> shape{};
  shape.fill(1);
  shape[1] = c;
  auto local = v.local().contiguous().template reshape<R>(shape);
  std::vector<index_t> g(shape.begin(), shape.end());
  DistSpec os(s.mesh(), s.placements(), g);
  return Var<T, R>::make(DistTensor<T, R>(os, local), "as_channel", {v.ref()}, [v, os, s](const DistTensor<T, R>& gin) {
    auto g2 = autograd::gradient_as(os, gin, autograd::PartialGrad::resolve);  // Replicate, like os
    auto gl = g2.local().contiguous().template reshape<1>(Shape<1>{g2.local().numel()});
    v.accumulate_grad(DistTensor<T, 1>(s, gl));
  });
}

}  // namespace shard::nn::functional
