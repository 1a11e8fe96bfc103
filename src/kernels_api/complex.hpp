#pragma once
// Kernel firewall for the complex elementwise kernels (kernels/complex.cu): plain C++17, no fmt,
// no public headers. Complex tensors are interleaved (re, im) pairs of float (c64, is_f64 = 0) or
// double (c128, is_f64 = 1); a "real" operand is the part dtype (float resp. double). Launchers
// return a cudaError_t as int (0 = success).
#include <cstdint>

namespace shard::kernels {

using cx_idx = std::int64_t;

/// out = op(a, b; s) elementwise over n elements. `op` is shard::exec::ComplexOp as int (real,
/// imag, make, conj, abs_squared, abs, scale, add, mul, mul_conj, mul_real, re_mul_conj,
/// abs_backward: exec/pointwise.hpp says what each reads and writes); s = s_re + i s_im. For
/// `make`, a null a or b reads as zeros. Queued on `stream`, not synchronised.
int cx_map(int is_f64, int op, double s_re, double s_im, cx_idx n, const void* a, const void* b, void* out,
           void* stream);
/// y = alpha x + beta y over n complex elements (alpha, beta complex). Synchronises the stream.
int cx_axpby(int is_f64, cx_idx n, double a_re, double a_im, const void* x, double b_re, double b_im, void* y,
             void* stream);
/// Sum of n complex elements into host_out[0] (re) and host_out[1] (im), accumulated in double,
/// deterministic (per-block fixed-order trees, then one fixed-order final pass; no atomics).
/// Synchronises the stream.
int cx_sum(int is_f64, cx_idx n, const void* x, double* host_out, void* stream);

}  // namespace shard::kernels
