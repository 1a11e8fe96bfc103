#pragma once
/// \file complex.hpp
/// Differentiable complex pointwise ops and reductions on sharded tensors of std::complex<float>
/// (c64) and std::complex<double> (c128): real, imag, complex, conj, abs, abs_squared, add, sub,
/// mul (complex * complex, complex * real, by a real or complex scalar), sum and mean over all
/// elements. max of a complex tensor is refused (no order). Host and CUDA tensors.
///
/// Gradient convention (PyTorch's): for a real loss L and a complex input z, the gradient Var
/// holds dL/dRe(z) + i dL/dIm(z) (the conjugate Wirtinger derivative times 2, what torch puts in
/// z.grad). The chain rule for a holomorphic y = f(z) is then g_z = g_y * conj(f'(z)); for the
/// real-valued ops, g_z = g_y * (dy/dRe z + i dy/dIm z). backward() of a complex scalar loss seeds
/// 1 + 0i, i.e. differentiates Re(loss).
///
/// Layouts: the operands of a binary op must have the same spec (mesh, placements, global shape,
/// shard sizes; no broadcasting) and device; mismatches throw shard::Error on every rank (spec
/// checks, before any collective). Partial placements follow pointwise.hpp: the linear ops (real,
/// imag, conj, complex, add, sub, mul by a scalar, sum, mean) accept Partial(sum) inputs and keep
/// the result Partial; the nonlinear ones (mul of two tensors, abs, abs_squared) refuse Partial
/// inputs (resolve them first, F::resolve).
///
/// Where the code is: checks, spec algebra and the tape nodes here; the element kernels of every
/// op, forward and backward, are the pointwise exec family's complex_map / complex_sum
/// (exec/pointwise.hpp: c64/c128 on contiguous Blocks with their f32/f64 parts): the CPU table's
/// loops in src/exec/pointwise_cpu.cpp (OpenMP over n > 65536) and the CUDA table's kernels over
/// interleaved (re, im) pairs in kernels/complex.cu. Tensors on a device compute there, with the
/// results and gradients on that device (sum/mean bring one complex scalar to the host and back).
/// A device whose pointwise table has no complex kernels throws shard::Error naming the op
/// ("complex on <device> not implemented").
#include <complex>
#include <type_traits>

#include "shardtensor/exec/pointwise.hpp"
#include "shardtensor/nn/functional/common.hpp"
#include "shardtensor/nn/functional/pointwise.hpp"
#include "shardtensor/nn/functional/reduction.hpp"

namespace shard::nn::functional {

namespace detail {

/// The element kernels of the complex ops (exec/pointwise.hpp, ComplexOp).
using ComplexKernel = exec::ComplexOp;

/// out = kernel(a, b; s) elementwise over out's elements, on out's device (its current
/// context): exec::complex_map. Every block is contiguous with out's element count, on one
/// device, of the complex dtype (c64 or c128) or its real part's dtype (f32 or f64) as the kernel
/// reads it. Throws shard::Error naming `op` otherwise.
void complex_pointwise(ComplexKernel k, std::complex<double> s, const Block& a, const Block& b, const Block& out,
                       const char* op);
/// Sum of the elements of a contiguous c64/c128 block (host or device), in complex<double>.
std::complex<double> complex_sum(const Block& x, const char* op);

/// Throws unless every Partial placement of `s` is Partial(sum) (linear ops commute with it only).
inline void check_partial_sum_only(const DistSpec& s, const char* op) {
  for (const auto& p : s.placements())
    SHARD_CHECK(!p.is_partial() || p.op == ReduceOp::sum, op,
                "input has a Partial({}) placement; only Partial(sum) commutes with this op ({}); resolve it first "
                "(F::resolve)",
                p.op, s);
}

/// A new tensor of `shape` on the operands' device filled by kernel `k` from blocks a, b.
template <class Out, int R>
Tensor<Out, R> complex_kernel(ComplexKernel k, std::complex<double> s, const Shape<R>& shape, const Block& a,
                              const Block& b, const char* op) {
  auto out = Tensor<Out, R>::empty(shape, a.data ? a.device : b.device);
  complex_pointwise(k, s, a, b, as_block(out), op);
  return out;
}

/// The upstream gradient laid out like a value of spec `s` (Replicate where s is Partial), as a
/// contiguous local tensor.
template <class T, int R>
Tensor<T, R> aligned_grad(const DistSpec& s, const DistTensor<T, R>& gin) {
  return autograd::gradient_as(s, gin, autograd::PartialGrad::resolve).local().contiguous();
}

/// Shared checks of the binary ops: one device and one spec.
template <class A, class B, int R>
void check_complex_pair(const Var<A, R>& a, const Var<B, R>& b, const char* op) {
  check_same_spec(a.value().spec(), b.value().spec(), op, "the first operand", "the second operand");
  SHARD_CHECK(a.value().device() == b.value().device(), op, "operands on different devices: {} and {}",
              a.value().device(), b.value().device());
}

/// y = s z (gradient conj(s) g) or y = s conj(z) (gradient s conj(g)); linear, Partial(sum) kept.
template <class T, int R>
Var<std::complex<T>, R> complex_scale(const Var<std::complex<T>, R>& z, std::complex<double> s, bool conjugate,
                                      const char* name) {
  using C = std::complex<T>;
  const DistSpec& zs = z.value().spec();
  check_partial_sum_only(zs, name);
  const auto zl = z.local().contiguous();
  const ComplexKernel k = conjugate ? ComplexKernel::conj : ComplexKernel::scale;
  auto y = complex_kernel<C, R>(k, s, zl.shape(), as_block(zl), Block{}, name);
  return Var<C, R>::make(DistTensor<C, R>(zs, y), name, {z.ref()}, [z, zs, s, k, name](const DistTensor<C, R>& gin) {
    const auto g = aligned_grad(zs, gin);
    // y = s z: g_z = conj(s) g (kernel scale).  y = s conj(z): g_z = s conj(g) (kernel conj).
    auto gz = complex_kernel<C, R>(k, k == ComplexKernel::conj ? s : std::conj(s), g.shape(), as_block(g), Block{}, name);
    z.accumulate_grad(DistTensor<C, R>(grad_spec(zs), gz));
  });
}

/// The all-elements sum (scaled by `f`: 1 for sum, 1 / numel for mean) of a complex Var.
template <class T, int R>
Var<std::complex<T>, 1> complex_reduce_all(const Var<std::complex<T>, R>& z, double f, const char* name) {
  using C = std::complex<T>;
  const DistSpec& zs = z.value().spec();
  check_partial_sum_only(zs, name);
  auto pl = zs.placements();
  for (auto& p : pl)
    if (p.is_shard()) p = Partial(ReduceOp::sum);
  const DistSpec ss(zs.mesh(), pl, {1});
  const auto zl = z.local().contiguous();
  const Device dev = zl.device();
  auto out = Tensor<C, 1>::full(Shape<1>{1}, static_cast<C>(complex_sum(as_block(zl), name) * f), dev);
  const Shape<R> zshape = zl.shape();
  return Var<C, 1>::make(DistTensor<C, 1>(ss, out), name, {z.ref()}, [z, zs, ss, f, zshape, dev](const DistTensor<C, 1>& gin) {
    const C g = first_value(aligned_grad(ss, gin));  // Replicate: the same on every rank
    const auto gz = Tensor<C, R>::full(zshape, static_cast<C>(std::complex<double>(g) * f), dev);
    z.accumulate_grad(DistTensor<C, R>(grad_spec(zs), gz));
  });
}

}  // namespace detail

/// Re(z) (Partial(sum) kept). Gradient: g + 0i.
template <class T, int R>
Var<T, R> real(const Var<std::complex<T>, R>& z) {
  using C = std::complex<T>;
  const char* name = "real";
  const DistSpec& zs = z.value().spec();
  detail::check_partial_sum_only(zs, name);
  const auto zl = z.local().contiguous();
  auto y = detail::complex_kernel<T, R>(detail::ComplexKernel::real, 1, zl.shape(), as_block(zl), Block{}, name);
  return Var<T, R>::make(DistTensor<T, R>(zs, y), name, {z.ref()}, [z, zs, name](const DistTensor<T, R>& gin) {
    const auto g = detail::aligned_grad(zs, gin);
    auto gz = detail::complex_kernel<C, R>(detail::ComplexKernel::make, 1, g.shape(), as_block(g), Block{}, name);
    z.accumulate_grad(DistTensor<C, R>(detail::grad_spec(zs), gz));
  });
}

/// Im(z) (Partial(sum) kept). Gradient: 0 + i g.
template <class T, int R>
Var<T, R> imag(const Var<std::complex<T>, R>& z) {
  using C = std::complex<T>;
  const char* name = "imag";
  const DistSpec& zs = z.value().spec();
  detail::check_partial_sum_only(zs, name);
  const auto zl = z.local().contiguous();
  auto y = detail::complex_kernel<T, R>(detail::ComplexKernel::imag, 1, zl.shape(), as_block(zl), Block{}, name);
  return Var<T, R>::make(DistTensor<T, R>(zs, y), name, {z.ref()}, [z, zs, name](const DistTensor<T, R>& gin) {
    const auto g = detail::aligned_grad(zs, gin);
    auto gz = detail::complex_kernel<C, R>(detail::ComplexKernel::make, 1, g.shape(), Block{}, as_block(g), name);
    z.accumulate_grad(DistTensor<C, R>(detail::grad_spec(zs), gz));
  });
}

/// re + i im from two real Vars with the same spec (Partial(sum) kept). Gradients: Re g, Im g.
template <class T, int R>
Var<std::complex<T>, R> complex(const Var<T, R>& re, const Var<T, R>& im) {
  using C = std::complex<T>;
  const char* name = "complex";
  detail::check_complex_pair(re, im, name);
  const DistSpec& s = re.value().spec();
  detail::check_partial_sum_only(s, name);
  const auto rl = re.local().contiguous(), il = im.local().contiguous();
  auto y = detail::complex_kernel<C, R>(detail::ComplexKernel::make, 1, rl.shape(), as_block(rl), as_block(il), name);
  return Var<C, R>::make(DistTensor<C, R>(s, y), name, {re.ref(), im.ref()}, [re, im, s, name](const DistTensor<C, R>& gin) {
    const auto g = detail::aligned_grad(s, gin);
    const DistSpec gs = detail::grad_spec(s);
    if (re.requires_grad())
      re.accumulate_grad(DistTensor<T, R>(
          gs, detail::complex_kernel<T, R>(detail::ComplexKernel::real, 1, g.shape(), as_block(g), Block{}, name)));
    if (im.requires_grad())
      im.accumulate_grad(DistTensor<T, R>(
          gs, detail::complex_kernel<T, R>(detail::ComplexKernel::imag, 1, g.shape(), as_block(g), Block{}, name)));
  });
}

/// conj(z) (Partial(sum) kept). Gradient: conj(g).
template <class T, int R>
Var<std::complex<T>, R> conj(const Var<std::complex<T>, R>& z) {
  return detail::complex_scale(z, 1.0, true, "conj");
}

/// |z|^2 (real). Gradient: 2 g z. Refuses Partial inputs.
template <class T, int R>
Var<T, R> abs_squared(const Var<std::complex<T>, R>& z) {
  using C = std::complex<T>;
  const char* name = "abs_squared";
  const DistSpec& zs = z.value().spec();
  detail::check_no_partial(zs, name, "input");
  const auto zl = z.local().contiguous();
  auto y = detail::complex_kernel<T, R>(detail::ComplexKernel::abs_squared, 1, zl.shape(), as_block(zl), Block{}, name);
  return Var<T, R>::make(DistTensor<T, R>(zs, y), name, {z.ref()}, [z, zs, zl, name](const DistTensor<T, R>& gin) {
    const auto g = detail::aligned_grad(zs, gin);
    auto gz = detail::complex_kernel<C, R>(detail::ComplexKernel::mul_real, 2, g.shape(), as_block(zl), as_block(g), name);
    z.accumulate_grad(DistTensor<C, R>(zs, gz));
  });
}

/// |z| (real). Gradient: g z / |z|, 0 at z = 0 (like torch). Refuses Partial inputs.
template <class T, int R>
Var<T, R> abs(const Var<std::complex<T>, R>& z) {
  using C = std::complex<T>;
  const char* name = "abs";
  const DistSpec& zs = z.value().spec();
  detail::check_no_partial(zs, name, "input");
  const auto zl = z.local().contiguous();
  auto y = detail::complex_kernel<T, R>(detail::ComplexKernel::abs, 1, zl.shape(), as_block(zl), Block{}, name);
  return Var<T, R>::make(DistTensor<T, R>(zs, y), name, {z.ref()}, [z, zs, zl, name](const DistTensor<T, R>& gin) {
    const auto g = detail::aligned_grad(zs, gin);
    auto gz = detail::complex_kernel<C, R>(detail::ComplexKernel::abs_backward, 1, g.shape(), as_block(zl), as_block(g),
                                           name);
    z.accumulate_grad(DistTensor<C, R>(zs, gz));
  });
}

/// a + b (same spec; Partial(sum) kept). Gradients: g, g.
template <class T, int R>
Var<std::complex<T>, R> add(const Var<std::complex<T>, R>& a, const Var<std::complex<T>, R>& b) {
  using C = std::complex<T>;
  const char* name = "add";
  detail::check_complex_pair(a, b, name);
  const DistSpec& s = a.value().spec();
  detail::check_partial_sum_only(s, name);
  const auto al = a.local().contiguous(), bl = b.local().contiguous();
  auto y = detail::complex_kernel<C, R>(detail::ComplexKernel::add, 1, al.shape(), as_block(al), as_block(bl), name);
  return Var<C, R>::make(DistTensor<C, R>(s, y), name, {a.ref(), b.ref()}, [a, b, s](const DistTensor<C, R>& gin) {
    const auto g = detail::aligned_grad(s, gin);
    const DistSpec gs = detail::grad_spec(s);
    if (a.requires_grad()) a.accumulate_grad(DistTensor<C, R>(gs, g));
    if (b.requires_grad()) b.accumulate_grad(DistTensor<C, R>(gs, g));
  });
}

/// a - b (same spec; Partial(sum) kept). Gradients: g, -g.
template <class T, int R>
Var<std::complex<T>, R> sub(const Var<std::complex<T>, R>& a, const Var<std::complex<T>, R>& b) {
  using C = std::complex<T>;
  const char* name = "sub";
  detail::check_complex_pair(a, b, name);
  const DistSpec& s = a.value().spec();
  detail::check_partial_sum_only(s, name);
  const auto al = a.local().contiguous(), bl = b.local().contiguous();
  auto y = detail::complex_kernel<C, R>(detail::ComplexKernel::add, -1, al.shape(), as_block(al), as_block(bl), name);
  return Var<C, R>::make(DistTensor<C, R>(s, y), name, {a.ref(), b.ref()}, [a, b, s, name](const DistTensor<C, R>& gin) {
    const auto g = detail::aligned_grad(s, gin);
    const DistSpec gs = detail::grad_spec(s);
    if (a.requires_grad()) a.accumulate_grad(DistTensor<C, R>(gs, g));
    if (b.requires_grad())
      b.accumulate_grad(DistTensor<C, R>(
          gs, detail::complex_kernel<C, R>(detail::ComplexKernel::scale, -1, g.shape(), as_block(g), Block{}, name)));
  });
}

/// a * b elementwise (same spec; Partial refused). Gradients: g conj(b), g conj(a).
template <class T, int R>
Var<std::complex<T>, R> mul(const Var<std::complex<T>, R>& a, const Var<std::complex<T>, R>& b) {
  using C = std::complex<T>;
  const char* name = "mul";
  detail::check_complex_pair(a, b, name);
  const DistSpec& s = a.value().spec();
  detail::check_no_partial(s, name, "an operand");
  const auto al = a.local().contiguous(), bl = b.local().contiguous();
  auto y = detail::complex_kernel<C, R>(detail::ComplexKernel::mul, 1, al.shape(), as_block(al), as_block(bl), name);
  return Var<C, R>::make(DistTensor<C, R>(s, y), name, {a.ref(), b.ref()}, [a, b, al, bl, s, name](const DistTensor<C, R>& gin) {
    const auto g = detail::aligned_grad(s, gin);
    if (a.requires_grad())
      a.accumulate_grad(DistTensor<C, R>(
          s, detail::complex_kernel<C, R>(detail::ComplexKernel::mul_conj, 1, g.shape(), as_block(g), as_block(bl), name)));
    if (b.requires_grad())
      b.accumulate_grad(DistTensor<C, R>(
          s, detail::complex_kernel<C, R>(detail::ComplexKernel::mul_conj, 1, g.shape(), as_block(g), as_block(al), name)));
  });
}

/// z * r elementwise, r real (same spec; Partial refused). Gradients: g r (for z), Re(g conj(z)) (for r).
template <class T, int R>
Var<std::complex<T>, R> mul(const Var<std::complex<T>, R>& z, const Var<T, R>& r) {
  using C = std::complex<T>;
  const char* name = "mul";
  detail::check_complex_pair(z, r, name);
  const DistSpec& s = z.value().spec();
  detail::check_no_partial(s, name, "an operand");
  const auto zl = z.local().contiguous();
  const auto rl = r.local().contiguous();
  auto y = detail::complex_kernel<C, R>(detail::ComplexKernel::mul_real, 1, zl.shape(), as_block(zl), as_block(rl), name);
  return Var<C, R>::make(DistTensor<C, R>(s, y), name, {z.ref(), r.ref()}, [z, r, zl, rl, s, name](const DistTensor<C, R>& gin) {
    const auto g = detail::aligned_grad(s, gin);
    if (z.requires_grad())
      z.accumulate_grad(DistTensor<C, R>(
          s, detail::complex_kernel<C, R>(detail::ComplexKernel::mul_real, 1, g.shape(), as_block(g), as_block(rl), name)));
    if (r.requires_grad())
      r.accumulate_grad(DistTensor<T, R>(
          s, detail::complex_kernel<T, R>(detail::ComplexKernel::re_mul_conj, 1, g.shape(), as_block(g), as_block(zl), name)));
  });
}
/// r * z (see mul(z, r)).
template <class T, int R>
Var<std::complex<T>, R> mul(const Var<T, R>& r, const Var<std::complex<T>, R>& z) {
  return mul(z, r);
}

/// z * s, s real (Partial(sum) kept). Gradient: s g.
template <class T, int R>
Var<std::complex<T>, R> mul(const Var<std::complex<T>, R>& z, std::type_identity_t<T> s) {
  return detail::complex_scale(z, static_cast<double>(s), false, "mul_scalar");
}
/// s * z, s real.
template <class T, int R>
Var<std::complex<T>, R> mul(std::type_identity_t<T> s, const Var<std::complex<T>, R>& z) {
  return mul(z, s);
}
/// z * s, s complex (Partial(sum) kept). Gradient: conj(s) g.
template <class T, int R>
Var<std::complex<T>, R> mul(const Var<std::complex<T>, R>& z, std::type_identity_t<std::complex<T>> s) {
  return detail::complex_scale(z, std::complex<double>(s), false, "mul_scalar");
}
/// s * z, s complex.
template <class T, int R>
Var<std::complex<T>, R> mul(std::type_identity_t<std::complex<T>> s, const Var<std::complex<T>, R>& z) {
  return mul(z, s);
}

/// Sum of all elements: a complex scalar of global shape {1}, Partial(sum) on every mesh dim that
/// shards z (resolve with F::resolve; backward() may start from it). Gradient: g broadcast.
template <class T, int R>
Var<std::complex<T>, 1> sum(const Var<std::complex<T>, R>& z) {
  return detail::complex_reduce_all(z, 1.0, "sum");
}
/// Mean of all elements (sum / global count; Partial(sum) like sum). Gradient: g / count broadcast.
template <class T, int R>
Var<std::complex<T>, 1> mean(const Var<std::complex<T>, R>& z) {
  const index_t n = numel(z.value().global_shape());
  SHARD_CHECK(n > 0, "mean", "mean of an empty tensor (global shape {})", z.value().global_shape());
  return detail::complex_reduce_all(z, 1.0 / static_cast<double>(n), "mean");
}

/// Refused: complex numbers have no order (shard::Error on every rank; no collective).
template <class T, int R>
Var<std::complex<T>, R> max(const Var<std::complex<T>, R>&, std::vector<int>) {
  SHARD_FAIL("max", "{} tensors have no order (complex); reduce real(z), imag(z) or abs(z) instead",
             dtype_of<std::complex<T>>);
}
/// Refused: complex numbers have no order.
template <class T, int R>
Var<std::complex<T>, 1> max(const Var<std::complex<T>, R>&) {
  SHARD_FAIL("max", "{} tensors have no order (complex); reduce real(z), imag(z) or abs(z) instead",
             dtype_of<std::complex<T>>);
}

}  // namespace shard::nn::functional
