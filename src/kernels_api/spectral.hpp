#pragma once
// Kernel firewall for the spectral family (kernels/spectral.cu): plain C++17. Complex operands
// are interleaved (re, im) arrays of float (is_f64 = 0) or double; all contiguous:
// x [B, I, K], w [I, O, K], y / gy [B, O, K]. Launchers queue work on `stream` and return a
// cudaError_t as int.
#include <cstdint>

namespace shard::kernels {

using sp_idx = std::int64_t;

/// y[b, o, k] = sum_i x[b, i, k] * w[i, o, k]
int spectral_forward(int is_f64, sp_idx B, sp_idx I, sp_idx O, sp_idx K, const void* x, const void* w, void* y,
                     void* stream);
/// gx[b, i, k] = sum_o gy[b, o, k] * conj(w[i, o, k]) (when gx); gw[i, o, k] = sum_b conj(x[b, i, k]) * gy[b, o, k]
/// (when gw).
int spectral_backward(int is_f64, sp_idx B, sp_idx I, sp_idx O, sp_idx K, const void* x, const void* w,
                      const void* gy, void* gx, void* gw, void* stream);

}  // namespace shard::kernels
