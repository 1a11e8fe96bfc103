#pragma once
// The kernel firewall: plain C++17 declarations of the launchers in kernels/*.cu. No fmt, no
// public headers; launchers return cudaError_t as int (0 = success) and take a stream.
#include <cstdint>

namespace shard::kernels {

using idx = std::int64_t;
/// Element width codes for byte-moving kernels.
constexpr int kMaxRank = 8;

int strided_copy(int elem_bytes, int rank, const idx* shape, const void* src, const idx* src_strides, void* dst,
                 const idx* dst_strides, void* stream);
int fill(int elem_bytes, void* dst, idx n, const void* value, void* stream);
/// is_f64: 0 for float, 1 for double.
int axpby(int is_f64, idx n, double alpha, const void* x, double beta, void* y, void* stream);
int mul(int is_f64, idx n, const void* a, const void* b, void* out, void* stream);
int sum(int is_f64, idx n, const void* x, double* host_out, void* stream);
/// Message for a launcher's error code.
const char* error_string(int code);

}  // namespace shard::kernels
