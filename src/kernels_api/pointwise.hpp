#pragma once
// Kernel firewall for the pointwise family (kernels/pointwise.cu): plain C++17, no fmt, no
// public headers. Launchers queue work on `stream` (a cudaStream_t; null = default stream) of
// the current device, do not synchronise, and return a cudaError_t as int (0 = success).
// dtype (unary, binary, div_rhs_backward): 0 f32, 1 f64, 2 bf16, 3 f16, every operand of it; bf16
// and f16 compute in float, one rounding per result. is_f64 (sum_to): 0 float, 1 double. Op
// codes: kernels_api/pointwise_ops.hpp (= shard::exec::UnaryOp, BinaryOp). Shapes have at most
// kPwMaxRank dims; strides are in elements.
#include <cstdint>

namespace shard::kernels {

using pw_idx = std::int64_t;
constexpr int kPwMaxRank = 8;

/// y[i] = op(x[i]), i < n.
int pw_unary(int dtype, int op, double alpha, pw_idx n, const void* x, void* y, void* stream);
/// dx[i] = dy[i] * op'(x[i], y[i]), i < n.
int pw_unary_backward(int dtype, int op, double alpha, pw_idx n, const void* x, const void* y, const void* dy,
                      void* dx, void* stream);
/// out (contiguous, `shape`) = a (op) b with a, b strided (0 = broadcast).
int pw_binary(int dtype, int op, int rank, const pw_idx* shape, void* out, const void* a, const pw_idx* sa,
              const void* b, const pw_idx* sb, void* stream);
/// out (contiguous) = -g a / b^2 with g, a, b strided.
int pw_div_rhs_backward(int dtype, int rank, const pw_idx* shape, void* out, const void* g, const pw_idx* sg,
                        const void* a, const pw_idx* sa, const void* b, const pw_idx* sb, void* stream);
/// dst[0..nd) = 0, then for every index i of `shape`: dst[base + sum_d i_d view_strides_d] +=
/// g[lin(i)] (g contiguous). Deterministic: one fixed-order double tree per destination element.
/// code: the storage dtype (0 f32, 1 f64, 2 bf16, 3 f16; bf16 / f16 bit for bit the f32 route's).
int pw_sum_to(int code, pw_idx nd, void* dst, pw_idx base, int rank, const pw_idx* shape,
              const pw_idx* view_strides, const void* g, void* stream);

/// y[i] = (to) x[i] for i < n; dtype codes 0 f32, 1 f64, 2 bf16, 3 f16 (src/kernels_api/convert_ops.hpp).
int pw_convert(int from, int to, pw_idx n, const void* x, void* y, void* stream);

}  // namespace shard::kernels
