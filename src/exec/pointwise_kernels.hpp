#pragma once
// The pointwise kernel family's interface (private): implemented by src/exec/pointwise_cpu.cpp
// (DeviceKind::cpu) and src/cuda/pointwise_cuda.cpp (DeviceKind::cuda). The front
// (src/exec/pointwise.cpp) checks devices, dtypes and shapes before calling a table.
#include "shardtensor/exec/pointwise.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"
#include "shardtensor/core/error.hpp"

namespace shard::exec {

struct PointwiseKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::pointwise;
  virtual ~PointwiseKernels() = default;
  /// y[i] = op(x[i]) for i < n (contiguous).
  virtual void unary(UnaryOp op, double alpha, DType dt, index_t n, const void* x, void* y, ExecContext& ctx) const = 0;
  /// dx[i] = dy[i] * op'(x[i], y[i]) for i < n (contiguous).
  virtual void unary_backward(UnaryOp op, double alpha, DType dt, index_t n, const void* x, const void* y,
                              const void* dy, void* dx, ExecContext& ctx) const = 0;
  /// Strided forms of unary / unary_backward: x (and y, dy) any strides with the result's shape,
  /// the result (y resp. dx) contiguous. A table that reads strided operands in place returns
  /// true; the default returns false and the front passes contiguous copies to the flat forms.
  virtual bool unary_strided(UnaryOp op, double alpha, const Block& x, const Block& y, ExecContext& ctx) const {
    (void)op, (void)alpha, (void)x, (void)y, (void)ctx;
    return false;
  }
  virtual bool unary_backward_strided(UnaryOp op, double alpha, const Block& x, const Block& y, const Block& dy,
                                      const Block& dx, ExecContext& ctx) const {
    (void)op, (void)alpha, (void)x, (void)y, (void)dy, (void)dx, (void)ctx;
    return false;
  }
  /// out = a (op) b; out contiguous, a/b strided with out's rank and shape.
  virtual void binary(BinaryOp op, const Block& out, const Block& a, const Block& b, ExecContext& ctx) const = 0;
  /// out = -g a / b^2; out contiguous, the others strided.
  virtual void div_rhs_backward(const Block& out, const Block& g, const Block& a, const Block& b,
                                ExecContext& ctx) const = 0;
  /// dst = 0; dst_view[idx] += g[idx] over g's (contiguous) shape; accumulation in double.
  virtual void sum_to(const Block& dst, const Block& dst_view, const Block& g, ExecContext& ctx) const = 0;
  // native_storage (KernelTable): true when the table computes bf16/f16 storage itself: unary
  // (forward) and unary_backward (backward_data) in their flat forms, binary (forward) and
  // div_rhs_backward (backward_data) then take operands of one bf16 or f16 dtype, load them as f32,
  // compute in f32 and round each result once, and sum_to (backward_data) widens g exactly, sums in
  // double and rounds double -> float -> storage; each is bit for bit the f32 working-copy route
  // (exec/precision.hpp) without its f32 copies. The default (false) leaves bf16/f16 to that route;
  // the strided unary forms always take it. CPU and CUDA: yes.
  /// y[i] = (to) x[i] for i < n (contiguous; from, to among f32, f64, bf16, f16).
  virtual void convert(DType from, DType to, index_t n, const void* x, void* y, ExecContext& ctx) const = 0;
  /// Complex kernels (exec::complex_map, complex_sum): the front has checked the blocks (roles,
  /// dtypes, element counts, contiguity, device). `cdt` is the complex dtype (c64, c128). The
  /// defaults throw: a table without complex kernels refuses them clearly. CPU and CUDA: yes.
  virtual void complex_map(ComplexOp op, std::complex<double> s, DType cdt, index_t n, const void* a, const void* b,
                           void* out, ExecContext& ctx) const {
    (void)s, (void)cdt, (void)n, (void)a, (void)b, (void)out;
    SHARD_FAIL(op_name(op), "complex on {} not implemented (no complex kernels in its pointwise table)", ctx.device());
  }
  virtual std::complex<double> complex_sum(DType cdt, index_t n, const void* x, ExecContext& ctx) const {
    (void)cdt, (void)n, (void)x;
    SHARD_FAIL("sum", "complex on {} not implemented (no complex kernels in its pointwise table)", ctx.device());
  }
};


/// Defined in src/cuda/pointwise_cuda.cpp (shardtensor::cuda) next to the static registrar of the CUDA
/// table: the CUDA library's registration unit calls it so a static link keeps that file.
void cuda_link_pointwise() noexcept;

}  // namespace shard::exec
