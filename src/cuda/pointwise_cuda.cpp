// CUDA implementation of the pointwise kernel family: host glue from the PointwiseKernels table
// to the launchers in kernels/pointwise.cu (firewall: src/kernels_api/pointwise.hpp). Registered
// for DeviceKind::cuda when shardtensor::cuda is linked.
#include <cuda_runtime.h>

#include "cuda/family_util.hpp"
#include "exec/pointwise_kernels.hpp"
#include "kernels_api/complex.hpp"
#include "kernels_api/pointwise.hpp"

namespace shard::exec {
namespace {

using cuda_glue::storage_code;

using cuda_glue::check_rc;
using cuda_glue::DeviceScope;


struct CudaPointwise final : PointwiseKernels {
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void unary(UnaryOp op, double alpha, DType dt, index_t n, const void* x, void* y, ExecContext& ctx) const override {
    DeviceScope scope(ctx, op_name(op));
    check_rc(kernels::pw_unary(storage_code(dt), static_cast<int>(op), alpha, n, x, y, ctx.stream().handle),
             op_name(op), ctx);
  }
  void unary_backward(UnaryOp op, double alpha, DType dt, index_t n, const void* x, const void* y, const void* dy,
                      void* dx, ExecContext& ctx) const override {
    DeviceScope scope(ctx, op_name(op));
    check_rc(kernels::pw_unary_backward(storage_code(dt), static_cast<int>(op), alpha, n, x, y, dy, dx,
                                        ctx.stream().handle),
             op_name(op), ctx);
  }
  void binary(BinaryOp op, const Block& out, const Block& a, const Block& b, ExecContext& ctx) const override {
    DeviceScope scope(ctx, op_name(op));
    check_rc(kernels::pw_binary(storage_code(out.dtype), static_cast<int>(op), out.rank, out.shape.data(), out.data,
                                a.data, a.strides.data(), b.data, b.strides.data(), ctx.stream().handle),
             op_name(op), ctx);
  }
  void div_rhs_backward(const Block& out, const Block& g, const Block& a, const Block& b,
                        ExecContext& ctx) const override {
    DeviceScope scope(ctx, "div_backward");
    check_rc(kernels::pw_div_rhs_backward(storage_code(out.dtype), out.rank, out.shape.data(), out.data, g.data,
                                          g.strides.data(), a.data, a.strides.data(), b.data, b.strides.data(),
                                          ctx.stream().handle),
             "div_backward", ctx);
  }
  void sum_to(const Block& dst, const Block& dst_view, const Block& g, ExecContext& ctx) const override {
    DeviceScope scope(ctx, "sum_to");
    const index_t esz = static_cast<index_t>(dtype_size(dst.dtype));
    const index_t base =
        g.numel() > 0 ? (static_cast<const char*>(dst_view.data) - static_cast<const char*>(dst.data)) / esz : 0;
    check_rc(kernels::pw_sum_to(storage_code(dst.dtype), dst.numel(), dst.data, base, g.rank, g.shape.data(),
                                dst_view.strides.data(), g.data, ctx.stream().handle),
             "sum_to", ctx);
  }
  void convert(DType from, DType to, index_t n, const void* x, void* y, ExecContext& ctx) const override {
    DeviceScope scope(ctx, "convert");
    check_rc(kernels::pw_convert(storage_code(from), storage_code(to), n, x, y, ctx.stream().handle), "convert", ctx);
  }
  // Complex (c64 / c128 interleaved pairs): kernels/complex.cu, the CPU table's arithmetic.
  void complex_map(ComplexOp op, std::complex<double> s, DType cdt, index_t n, const void* a, const void* b, void* out,
                   ExecContext& ctx) const override {
    DeviceScope scope(ctx, op_name(op));
    check_rc(kernels::cx_map(cdt == DType::c128 ? 1 : 0, static_cast<int>(op), s.real(), s.imag(), n, a, b, out,
                             ctx.stream().handle),
             op_name(op), ctx);
  }
  std::complex<double> complex_sum(DType cdt, index_t n, const void* x, ExecContext& ctx) const override {
    DeviceScope scope(ctx, "sum");
    double out[2] = {0, 0};
    check_rc(kernels::cx_sum(cdt == DType::c128 ? 1 : 0, n, x, out, ctx.stream().handle), "sum", ctx);
    return {out[0], out[1]};
  }
};

const CudaPointwise g_cuda_pointwise;
struct Registrar {
  Registrar() { register_family(DeviceKind::cuda, KernelFamily::pointwise, &g_cuda_pointwise); }
} g_registrar;

}  // namespace

/// Anchor: referencing it keeps this file (and its registrar) in a static link.
void cuda_link_pointwise() noexcept {}

}  // namespace shard::exec
