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

#include "shardtensor/nn/functional/common.hpp"

namespace shard::nn::functional {

namespace detail {

/// out[i] = f(a[i], b[i]) over out's shape; out contiguous, a and b any strides (0 = broadcast).
template <class T, int R, class Fn>
void zip_broadcast(const Tensor<T, R>& out, const Tensor<T, R>& a, const Tensor<T, R>& b, Fn f) {
  const index_t n = out.numel();
  if (n == 0) return;
  T* o = out.data();
  const T* pa = a.data();
  const T* pb = b.data();
  if (a.is_contiguous() && b.is_contiguous() && a.shape() == out.shape() && b.shape() == out.shape()) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
    for (index_t i = 0; i < n; ++i) o[i] = f(pa[i], pb[i]);
    return;
  }
  const auto& s = out.shape();
  const index_t inner = R ? s[R - 1] : 1;
  const index_t outer = n / inner;
  const index_t ia = R ? a.stride(R - 1) : 0, ib = R ? b.stride(R - 1) : 0;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (index_t r = 0; r < outer; ++r) {
    index_t rem = r, oa = 0, ob = 0;
    for (int d = R - 2; d >= 0; --d) {
      const index_t i = rem % s[d];
      rem /= s[d];
      oa += i * a.stride(d);
      ob += i * b.stride(d);
    }
    T* orow = o + r * inner;
    for (index_t i = 0; i < inner; ++i) orow[i] = f(pa[oa + i * ia], pb[ob + i * ib]);
  }
}

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
  const Box xb = xs.local_box(), ob = out.local_box();
  Shape<R> shape{}, strides{};
  for (int od = 0; od < R; ++od) shape[od] = ob.len[static_cast<std::size_t>(od)];
  if (numel(shape) == 0) return Tensor<T, R>::view(nullptr, shape, strides);
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
  return Tensor<T, R>::view(p, shape, strides);
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
  const Box xb = xs.local_box();
  Shape<Rx> xshape{};
  for (int d = 0; d < Rx; ++d) xshape[d] = xb.len[static_cast<std::size_t>(d)];
  std::vector<double> acc(static_cast<std::size_t>(numel(xshape)), 0.0);
  auto acc_view = operand_view<double, R, Rx>(
      Tensor<double, Rx>::view(acc.empty() ? nullptr : acc.data(), xshape), xs, out);
  auto gc = g.contiguous();
  const index_t n = gc.numel();
  if (n > 0) {
    const auto& s = gc.shape();
    const index_t inner = R ? s[R - 1] : 1, outer = n / inner, is = R ? acc_view.stride(R - 1) : 0;
    const T* pg = gc.data();
    double* pa = acc_view.data();
    for (index_t r = 0; r < outer; ++r) {
      index_t rem = r, off = 0;
      for (int d = R - 2; d >= 0; --d) {
        off += (rem % s[d]) * acc_view.stride(d);
        rem /= s[d];
      }
      const T* grow = pg + r * inner;
      for (index_t i = 0; i < inner; ++i) pa[off + i * is] += static_cast<double>(grow[i]);
    }
  }
  auto out_t = Tensor<T, Rx>::empty(xshape);
  for (std::size_t i = 0; i < acc.size(); ++i) out_t.data()[i] = static_cast<T>(acc[i]);
  return out_t;
}

/// Elementwise binary op kinds.
enum class BinaryOp { add, sub, mul, div };
inline const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    default: return "div";
  }
}

/// The broadcasting binary op behind add/sub/mul/div.
template <class T, int Ra, int Rb>
Var<T, std::max(Ra, Rb)> binary(const Var<T, Ra>& a, const Var<T, Rb>& b, BinaryOp op) {
  constexpr int R = std::max(Ra, Rb);
  static_assert(is_compute_type<T>, "pointwise ops support float and double");
  const char* name = binary_name(op);
  check_host(a.value(), name, "lhs");
  check_host(b.value(), name, "rhs");
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
  auto out = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(out_spec.local_box().len));
  const auto av = operand_view<T, R, Ra>(a.local(), sa, out_spec);
  const auto bv = operand_view<T, R, Rb>(b.local(), sb, out_spec);
  switch (op) {
    case BinaryOp::add: zip_broadcast(out, av, bv, [](T x, T y) { return x + y; }); break;
    case BinaryOp::sub: zip_broadcast(out, av, bv, [](T x, T y) { return x - y; }); break;
    case BinaryOp::mul: zip_broadcast(out, av, bv, [](T x, T y) { return x * y; }); break;
    case BinaryOp::div: zip_broadcast(out, av, bv, [](T x, T y) { return x / y; }); break;
  }
  return Var<T, R>::make(
      DistTensor<T, R>(out_spec, out), name, {a.ref(), b.ref()}, [a, b, op, out_spec](const DistTensor<T, R>& gin) {
        const auto g = align_grad(gin, out_spec).local().contiguous();
        const Shape<R> shape = g.shape();
        auto push = [&](auto& x, const Tensor<T, R>& gx_full) {
          using X = std::decay_t<decltype(x)>;
          constexpr int Rx = X::Value::rank;
          const DistSpec& xs = x.value().spec();
          auto local = reduce_to_operand<T, R, Rx>(gx_full, xs, out_spec);
          DistSpec gs = xs.has_partial() ? grad_spec(xs) : operand_grad_spec(xs, out_spec);
          x.accumulate_grad(DistTensor<T, Rx>(gs, local));
        };
        auto tmp = [&] { return Tensor<T, R>::empty(shape); };
        if (a.requires_grad()) {
          Tensor<T, R> ga;
          if (op == BinaryOp::add || op == BinaryOp::sub) {
            ga = g;
          } else {
            ga = tmp();
            const auto bv2 = operand_view<T, R, Rb>(b.local(), b.value().spec(), out_spec);
            if (op == BinaryOp::mul) zip_broadcast(ga, g, bv2, [](T gg, T y) { return gg * y; });
            else zip_broadcast(ga, g, bv2, [](T gg, T y) { return gg / y; });
          }
          push(a, ga);
        }
        if (b.requires_grad()) {
          Tensor<T, R> gb;
          if (op == BinaryOp::add) {
            gb = g;
          } else if (op == BinaryOp::sub) {
            gb = tmp();
            map_into(gb, g, [](T gg) { return -gg; });
          } else {
            gb = tmp();
            const auto av2 = operand_view<T, R, Ra>(a.local(), a.value().spec(), out_spec);
            if (op == BinaryOp::mul) {
              zip_broadcast(gb, g, av2, [](T gg, T x) { return gg * x; });
            } else {
              const auto bv2 = operand_view<T, R, Rb>(b.local(), b.value().spec(), out_spec);
              auto q = tmp();  // x / y^2
              zip_broadcast(q, av2, bv2, [](T x, T y) { return x / (y * y); });
              zip_broadcast(gb, g, q, [](T gg, T v) { return -gg * v; });
            }
          }
          push(b, gb);
        }
      });
}

/// y = f(x) elementwise with gradient g * df(x, y); `linear_ok` allows Partial(sum) inputs
/// (only for maps that are linear, f(x) = c x).
template <class T, int R, class Fwd, class Dfn>
Var<T, R> unary_op(const Var<T, R>& x, const char* name, Fwd f, Dfn df, bool linear_ok = false) {
  static_assert(is_compute_type<T>, "pointwise ops support float and double");
  check_host(x.value(), name, "input");
  const DistSpec& s = x.value().spec();
  if (linear_ok) {
    for (const auto& p : s.placements())
      SHARD_CHECK(!p.is_partial() || p.op == ReduceOp::sum, name,
                  "input has a Partial({}) placement; only Partial(sum) commutes with this op ({})", p.op, s);
  } else {
    check_no_partial(s, name, "input");
  }
  auto xl = x.local().contiguous();
  auto y = Tensor<T, R>::empty(xl.shape());
  map_into(y, xl, f);
  DistTensor<T, R> yv(s, y);
  DistTensor<T, R> xv(s, xl);
  return Var<T, R>::make(yv, name, {x.ref()}, [x, xv, yv, df](const DistTensor<T, R>& gin) {
    const auto g = align_grad(gin, xv.spec()).local().contiguous();
    auto gx = Tensor<T, R>::empty(g.shape());
    const T* px = xv.local().data();
    const T* py = yv.local().data();
    const T* pg = g.data();
    T* po = gx.data();
    const index_t n = g.numel();
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
    for (index_t i = 0; i < n; ++i) po[i] = df(px[i], py[i], pg[i]);
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
  return detail::unary_op(x, "add_scalar", [s](T v) { return v + s; }, [](T, T, T g) { return g; });
}
/// s + x.
template <class T, int R>
Var<T, R> add(std::type_identity_t<T> s, const Var<T, R>& x) {
  return add(x, s);
}
/// x - s.
template <class T, int R>
Var<T, R> sub(const Var<T, R>& x, std::type_identity_t<T> s) {
  return detail::unary_op(x, "sub_scalar", [s](T v) { return v - s; }, [](T, T, T g) { return g; });
}
/// s - x.
template <class T, int R>
Var<T, R> sub(std::type_identity_t<T> s, const Var<T, R>& x) {
  return detail::unary_op(x, "rsub_scalar", [s](T v) { return s - v; }, [](T, T, T g) { return -g; });
}
/// x * s (Partial(sum) inputs allowed: the result stays Partial).
template <class T, int R>
Var<T, R> mul(const Var<T, R>& x, std::type_identity_t<T> s) {
  return detail::unary_op(x, "mul_scalar", [s](T v) { return v * s; }, [s](T, T, T g) { return g * s; }, true);
}
/// s * x.
template <class T, int R>
Var<T, R> mul(std::type_identity_t<T> s, const Var<T, R>& x) {
  return mul(x, s);
}
/// x / s (Partial(sum) inputs allowed).
template <class T, int R>
Var<T, R> div(const Var<T, R>& x, std::type_identity_t<T> s) {
  return detail::unary_op(x, "div_scalar", [s](T v) { return v / s; }, [s](T, T, T g) { return g / s; }, true);
}
/// s / x.
template <class T, int R>
Var<T, R> div(std::type_identity_t<T> s, const Var<T, R>& x) {
  return detail::unary_op(x, "rdiv_scalar", [s](T v) { return s / v; },
                          [](T v, T y, T g) { return -g * y / v; });
}
/// -x (Partial(sum) inputs allowed).
template <class T, int R>
Var<T, R> neg(const Var<T, R>& x) {
  return detail::unary_op(x, "neg", [](T v) { return -v; }, [](T, T, T g) { return -g; }, true);
}
/// x * x.
template <class T, int R>
Var<T, R> square(const Var<T, R>& x) {
  return detail::unary_op(x, "square", [](T v) { return v * v; }, [](T v, T, T g) { return T(2) * v * g; });
}
/// sqrt(x) (gradient g / (2 sqrt(x)); infinite at 0).
template <class T, int R>
Var<T, R> sqrt(const Var<T, R>& x) {
  return detail::unary_op(x, "sqrt", [](T v) { return std::sqrt(v); }, [](T, T y, T g) { return g / (T(2) * y); });
}
/// exp(x).
template <class T, int R>
Var<T, R> exp(const Var<T, R>& x) {
  return detail::unary_op(x, "exp", [](T v) { return std::exp(v); }, [](T, T y, T g) { return g * y; });
}
/// log(x) (natural).
template <class T, int R>
Var<T, R> log(const Var<T, R>& x) {
  return detail::unary_op(x, "log", [](T v) { return std::log(v); }, [](T v, T, T g) { return g / v; });
}

/// A Replicate [C] vector viewed as [1, C, 1, ...] of rank R (differentiable; no copy), for
/// per-channel broadcasting against N, C, spatial... activations.
template <int R, class T>
Var<T, R> as_channel(const Var<T, 1>& v) {
  static_assert(R >= 2, "as_channel needs a target rank >= 2");
  detail::check_host(v.value(), "as_channel", "input");
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
    auto g2 = detail::align_grad(gin, os);  // Replicate, like os
    auto gl = g2.local().contiguous().template reshape<1>(Shape<1>{g2.local().numel()});
    v.accumulate_grad(DistTensor<T, 1>(s, gl));
  });
}

}  // namespace shard::nn::functional
