// gpusim lane: the pointwise family (kernels/pointwise.cu, src/cuda/pointwise_cuda.cpp) against
// the CPU table: every unary op forward and backward, binary ops with broadcasting (stride-0)
// operands, div_rhs_backward and sum_to (the adjoint of broadcasting), f32 and f64.
#include "exec/pointwise_kernels.hpp"
#include "gpusim_support.hpp"

namespace st_gpusim_cuda_sim_pointwise {

using namespace gpusim;
using exec::PointwiseKernels;
using exec::BinaryOp;
using exec::UnaryOp;

namespace {

const PointwiseKernels& cu() { return exec::kernels_for<PointwiseKernels>(gpu(), "test"); }
const PointwiseKernels& cpu() { return exec::kernels_for<PointwiseKernels>(Device::cpu(), "test"); }

constexpr UnaryOp kUnary[] = {UnaryOp::neg,        UnaryOp::square,      UnaryOp::sqrt,       UnaryOp::exp,
                              UnaryOp::log,        UnaryOp::abs,         UnaryOp::relu,       UnaryOp::leaky_relu,
                              UnaryOp::gelu,       UnaryOp::gelu_tanh,   UnaryOp::silu,       UnaryOp::tanh,
                              UnaryOp::sigmoid,    UnaryOp::add_scalar,  UnaryOp::rsub_scalar, UnaryOp::mul_scalar,
                              UnaryOp::div_scalar, UnaryOp::rdiv_scalar};

bool positive_domain(UnaryOp op) { return op == UnaryOp::sqrt || op == UnaryOp::log || op == UnaryOp::rdiv_scalar; }

template <class T>
void unary_all() {
  const index_t n = 517;  // not a multiple of a block
  for (UnaryOp op : kUnary) {
    const bool pos = positive_domain(op);
    Pair<T> x({n}, 11u, pos ? 0.1 : -2.0, 2.0), y({n}), dy({n}, 12u), dx({n});
    const double alpha = 0.3;
    cpu().unary(op, alpha, dtype_of<T>, n, x.h.data, y.h.data, hctx());
    cu().unary(op, alpha, dtype_of<T>, n, x.d.data, y.d.data, gctx());
    GPUSIM_CHECK_CLOSE(y, T, "unary " << exec::op_name(op));
    cpu().unary_backward(op, alpha, dtype_of<T>, n, x.h.data, y.h.data, dy.h.data, dx.h.data, hctx());
    cu().unary_backward(op, alpha, dtype_of<T>, n, x.d.data, y.d.data, dy.d.data, dx.d.data, gctx());
    GPUSIM_CHECK_CLOSE(dx, T, "unary_backward " << exec::op_name(op));
  }
}

/// A view of `b` with its shape broadcast to `shape` (stride 0 where b's extent is 1).
Block bcast(const Block& b, const std::vector<index_t>& shape) {
  Block v = b;
  for (int d = 0; d < b.rank; ++d)
    if (b.shape[static_cast<std::size_t>(d)] == 1 && shape[static_cast<std::size_t>(d)] != 1) {
      v.shape[static_cast<std::size_t>(d)] = shape[static_cast<std::size_t>(d)];
      v.strides[static_cast<std::size_t>(d)] = 0;
    }
  return v;
}

template <class T>
void binary_broadcast() {
  const std::vector<index_t> s{3, 5, 7};
  Pair<T> a(s, 21u), b({1, 5, 1}, 22u, 0.5, 2.0), out(s), g(s, 23u), out2(s);
  for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div}) {
    cpu().binary(op, out.h, a.h, bcast(b.h, s), hctx());
    cu().binary(op, out.d, a.d, bcast(b.d, s), gctx());
    GPUSIM_CHECK_CLOSE(out, T, "binary " << exec::op_name(op));
    // broadcast on the left operand too
    cpu().binary(op, out.h, bcast(b.h, s), a.h, hctx());
    cu().binary(op, out.d, bcast(b.d, s), a.d, gctx());
    GPUSIM_CHECK_CLOSE(out, T, "binary (broadcast lhs) " << exec::op_name(op));
  }
  cpu().div_rhs_backward(out2.h, g.h, a.h, bcast(b.h, s), hctx());
  cu().div_rhs_backward(out2.d, g.d, a.d, bcast(b.d, s), gctx());
  GPUSIM_CHECK_CLOSE(out2, T, "div_rhs_backward");

  // sum_to: the adjoint of broadcasting b to s (dst [1,5,1], summed over dims 0 and 2).
  Pair<T> dst({1, 5, 1}, std::vector<double>{7.0});  // overwritten (dst = 0 first)
  cpu().sum_to(dst.h, bcast(dst.h, s), g.h, hctx());
  cu().sum_to(dst.d, bcast(dst.d, s), g.d, gctx());
  GPUSIM_CHECK_CLOSE(dst, T, "sum_to [3,5,7] -> [1,5,1]");
  Pair<T> dst2({3, 1, 7}, std::vector<double>{7.0});
  cpu().sum_to(dst2.h, bcast(dst2.h, s), g.h, hctx());
  cu().sum_to(dst2.d, bcast(dst2.d, s), g.d, gctx());
  GPUSIM_CHECK_CLOSE(dst2, T, "sum_to [3,5,7] -> [3,1,7]");
}

/// The vectorised kernels (contiguous, 16-byte aligned operands: 16 bytes per thread and step, the
/// n % V tail scalar) and the scalar fallback for operands one element off alignment: both equal
/// the CPU table.
template <class T>
void contiguous_vec_and_unaligned() {
  const index_t n = 1031;  // n % 4, n % 2: a tail for f32 and f64
  Pair<T> a({n + 1}, 31u), b({n + 1}, 32u, 0.5, 2.0), out({n + 1}), y({n + 1}), dx({n + 1});
  for (index_t off : {index_t{0}, index_t{1}}) {
    INFO("element offset " << off << (off ? " (unaligned: scalar kernels)" : " (aligned: vectorised)"));
    auto sub = [&](const Block& blk) {
      const index_t lo[1] = {off}, len[1] = {n};
      return blk.slice(lo, len);
    };
    for (BinaryOp op : {BinaryOp::add, BinaryOp::mul, BinaryOp::div}) {
      cpu().binary(op, sub(out.h), sub(a.h), sub(b.h), hctx());
      cu().binary(op, sub(out.d), sub(a.d), sub(b.d), gctx());
      GPUSIM_CHECK_CLOSE(out, T, "contiguous binary " << exec::op_name(op));
    }
    cpu().unary(UnaryOp::silu, 0.0, dtype_of<T>, n, sub(a.h).data, sub(y.h).data, hctx());
    cu().unary(UnaryOp::silu, 0.0, dtype_of<T>, n, sub(a.d).data, sub(y.d).data, gctx());
    GPUSIM_CHECK_CLOSE(y, T, "silu");
    cpu().unary_backward(UnaryOp::silu, 0.0, dtype_of<T>, n, sub(a.h).data, sub(y.h).data, sub(b.h).data,
                         sub(dx.h).data, hctx());
    cu().unary_backward(UnaryOp::silu, 0.0, dtype_of<T>, n, sub(a.d).data, sub(y.d).data, sub(b.d).data,
                        sub(dx.d).data, gctx());
    GPUSIM_CHECK_CLOSE(dx, T, "silu backward");
  }
}

}  // namespace

TEST_CASE("gpusim pointwise: vectorised contiguous kernels and the unaligned fallback", "[gpusim][pointwise]") {
  GPUSIM_REQUIRE_GPU();
  SECTION("f32") { contiguous_vec_and_unaligned<float>(); }
  SECTION("f64") { contiguous_vec_and_unaligned<double>(); }
}

TEST_CASE("gpusim pointwise: unary forward/backward, every op", "[gpusim][pointwise]") {
  GPUSIM_REQUIRE_GPU();
  SECTION("f32") { unary_all<float>(); }
  SECTION("f64") { unary_all<double>(); }
}

TEST_CASE("gpusim pointwise: binary with broadcasting, div_rhs_backward, sum_to", "[gpusim][pointwise]") {
  GPUSIM_REQUIRE_GPU();
  SECTION("f32") { binary_broadcast<float>(); }
  SECTION("f64") { binary_broadcast<double>(); }
}

}  // namespace st_gpusim_cuda_sim_pointwise
