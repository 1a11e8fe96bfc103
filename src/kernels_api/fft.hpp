#pragma once
// Kernel firewall of the fft family (kernels/fft.cu): plain C++17, no fmt, no shardtensor
// headers. The transforms themselves are cuFFT's (src/cuda/fft_cuda.cpp); these are the two small
// kernels around them. Launchers queue work on `stream` (a cudaStream_t; null = the default
// stream) of the current device, do not synchronise, and return a cudaError_t as int (0 =
// success). is_f64: 0 float, 1 double.
#include <cstdint>

namespace shard::kernels {

using fft_idx = std::int64_t;

/// data[i] *= scale for the n reals of `data` (a complex array of m elements is n = 2 m reals).
int fft_scale(int is_f64, fft_idx n, double scale, void* data, void* stream);

/// For a complex array viewed as [outer, h, inner] (h = n / 2 + 1 along a c2r's halved dim): sets
/// the imaginary part of the zero frequency (index 0 along h) and, when `even` (n even), of the
/// Nyquist frequency (index h - 1) to 0, in place. What a 1-D c2r ignores in FFTW and numpy.
int fft_c2r_real_edges(int is_f64, fft_idx outer, fft_idx h, fft_idx inner, int even, void* data, void* stream);

}  // namespace shard::kernels
