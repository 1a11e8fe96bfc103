#pragma once
/// \file pointwise.hpp
/// The pointwise kernel family's front: elementwise unary ops and their backward, broadcasting
/// binary ops (stride-0 operands) and the broadcast adjoint (sum over broadcast dims). Dispatch
/// goes by the blocks' device (CPU: src/exec/pointwise_cpu.cpp; CUDA: kernels/pointwise.cu).
/// Every function checks that its blocks share one device and one dtype (f32 or f64) and throws
/// shard::Error naming the op otherwise. Nothing here allocates on the host heap.
/// Complex (c64 / c128, interleaved (re, im) pairs): complex_map and complex_sum, the element
/// kernels of nn/functional/complex.hpp, forward and backward; CPU (src/exec/pointwise_cpu.cpp)
/// and CUDA (kernels/complex.cu). The real-valued ops above stay f32/f64 (bf16, f16) only.
#include <complex>

#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

/// Elementwise unary ops; `alpha` is the op's scalar where it has one.
enum class UnaryOp : int {
  neg,          ///< -x
  square,       ///< x^2
  sqrt,         ///< sqrt(x)
  exp,          ///< exp(x)
  log,          ///< log(x)
  abs,          ///< |x| (gradient sign(x), 0 at 0)
  relu,         ///< max(x, 0)
  leaky_relu,   ///< x > 0 ? x : alpha x
  gelu,         ///< 0.5 x (1 + erf(x / sqrt 2))
  gelu_tanh,    ///< 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  silu,         ///< x sigmoid(x)
  tanh,         ///< tanh(x)
  sigmoid,      ///< 1 / (1 + exp(-x))
  add_scalar,   ///< x + alpha
  rsub_scalar,  ///< alpha - x
  mul_scalar,   ///< x * alpha
  div_scalar,   ///< x / alpha
  rdiv_scalar,  ///< alpha / x
};
/// Elementwise binary ops.
enum class BinaryOp : int { add, sub, mul, div };

/// Name of an op (for messages).
const char* op_name(UnaryOp op) noexcept;
const char* op_name(BinaryOp op) noexcept;

/// y = op(x) elementwise; y contiguous; x contiguous with y's element count (y may alias x), or a
/// strided view of y's shape (e.g. the interior of a halo-padded array), which the CPU table reads
/// in place (other tables, CUDA's, get a contiguous copy made by the front).
void unary(UnaryOp op, double alpha, const Block& x, const Block& y, ExecContext& ctx);
/// dx = dy * op'(x) elementwise, given the forward's input x and output y (either may be unused by
/// the op but must have dx's element count); dx contiguous; x, y, dy contiguous, or strided views
/// of dx's shape (read in place on the CPU, copied first elsewhere, like unary's x).
void unary_backward(UnaryOp op, double alpha, const Block& x, const Block& y, const Block& dy, const Block& dx,
                    ExecContext& ctx);
/// out = a (op) b over out's shape; out contiguous, a and b of out's rank and shape with any
/// strides (stride 0 broadcasts).
void binary(BinaryOp op, const Block& a, const Block& b, const Block& out, ExecContext& ctx);
/// out = -g * a / b^2 (the gradient of a / b with respect to b) over out's shape; out contiguous,
/// g, a, b of out's shape with any strides.
void div_rhs_backward(const Block& g, const Block& a, const Block& b, const Block& out, ExecContext& ctx);
/// dst = src converted to dst's dtype, elementwise: src and dst contiguous with one element count,
/// each f32, f64, bf16 or f16 (the dtypes may be equal: a copy). Narrowing rounds to nearest even
/// (f64 -> bf16/f16 goes through f32), overflow gives inf, NaN stays NaN. The storage-precision
/// boundary of mixed precision: every bf16/f16 op of the families that compute in f32 converts
/// through it (exec/precision.hpp).
void convert(const Block& src, const Block& dst, ExecContext& ctx);
/// True for the dtypes convert() handles (f32, f64, bf16, f16).
constexpr bool is_float_dtype(DType dt) {
  return dt == DType::f32 || dt == DType::f64 || dt == DType::bf16 || dt == DType::f16;
}
/// Broadcast adjoint: dst (contiguous, the operand's shape) = 0, then every element of g
/// (contiguous, the result's shape) is added to dst_view at the same index. dst_view views dst's
/// memory in the result's index space (stride 0 on broadcast dims). Sums in double.
void sum_to(const Block& g, const Block& dst, const Block& dst_view, ExecContext& ctx);

/// The complex element kernels (complex_map). `a`, `b`: the operands; `s`: a complex scalar.
/// Roles: c = complex (c64/c128), r = its part dtype (f32/f64).
enum class ComplexOp : int {
  real,          ///< out(r) = Re a(c)
  imag,          ///< out(r) = Im a(c)
  make,          ///< out(c) = a(r) + i b(r) (a block with null data reads as zeros)
  conj,          ///< out(c) = s conj(a(c))
  abs_squared,   ///< out(r) = Re(s) |a(c)|^2
  abs,           ///< out(r) = |a(c)|
  scale,         ///< out(c) = s a(c)
  add,           ///< out(c) = a(c) + s b(c)
  mul,           ///< out(c) = s a(c) b(c)
  mul_conj,      ///< out(c) = s a(c) conj(b(c))
  mul_real,      ///< out(c) = s a(c) b(r)
  re_mul_conj,   ///< out(r) = Re(s a(c) conj(b(c)))
  abs_backward,  ///< out(c) = b(r) a(c) / |a(c)|, 0 where a = 0
};
/// Name of a complex op (for messages).
const char* op_name(ComplexOp op) noexcept;
/// out = op(a, b; s) elementwise over out's elements: every block used by the op (see the roles
/// above) contiguous with out's element count, on ctx's device, of the complex dtype (c64, c128)
/// or its part dtype. Throws shard::Error naming `name` otherwise, and on a device whose pointwise
/// table has no complex kernels.
void complex_map(ComplexOp op, std::complex<double> s, const Block& a, const Block& b, const Block& out,
                 ExecContext& ctx, const char* name);
/// Sum of the elements of a contiguous c64/c128 block, accumulated in complex<double> (on the
/// device's table; the result comes back to the host, synchronising ctx's stream).
std::complex<double> complex_sum(const Block& x, ExecContext& ctx, const char* name);

}  // namespace shard::exec
