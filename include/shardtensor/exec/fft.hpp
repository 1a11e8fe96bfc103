#pragma once
/// \file fft.hpp
/// FFT kernel family front: batched local discrete Fourier transforms over any subset of a
/// block's dims, on the context's device (CPU: src/exec/fft_cpu.cpp over FFTW3, plans created
/// once per geometry and cached; CUDA: src/cuda/fft_cuda.cpp over cuFFT when shardtensor::cuda
/// is linked, plans cached per geometry and device and run on the context's stream; a dim subset
/// cuFFT's layout cannot batch in one call runs as several calls, src/cuda/fft_passes.hpp). The
/// distributed FFT (issue 16) runs these on the dims a rank holds whole, between all-to-all
/// transposes.
///
/// Conventions (numpy / PyTorch, unnormalised; `scale` applies a norm):
///  - c2c forward:  X[k] = sum_n x[n] exp(-2 pi i k n / N), per transformed dim;
///  - c2c inverse:  x[n] = sum_k X[k] exp(+2 pi i k n / N) (no 1/N: put it in `scale`);
///  - r2c: the forward transform of a real block; along the LAST transformed dim only the
///    n / 2 + 1 non-negative frequencies are stored (Hermitian symmetry);
///  - c2r: the inverse of r2c's layout back to a real block whose last transformed dim has the
///    geometry's extent n (even or odd: the caller says which, as numpy's irfftn `s`). With one
///    transformed dim the imaginary parts of the zero (and, for even n, the Nyquist) frequency
///    are ignored, as FFTW, numpy and PyTorch do (on both tables). With several dims: on the CPU
///    table (FFTW) the result is the inverse c2c over the leading dims followed by that 1-D c2r,
///    for any input (the distributed FFT's adjoints rely on it; tests/nn/mpi_fft.cpp and
///    mpi_fno.cpp compare one-call and staged transforms of arbitrary spectra); on the CUDA
///    table (cuFFT) the input must be Hermitian-consistent (what r2c produces), so the
///    distributed plan runs such transforms as the two steps explicitly off the CPU.
/// Precision: c64 <-> f32, c128 <-> f64 (complex<float> / complex<double>). The input is never
/// modified (c2r works on a scratch copy: FFTW's multi-dim c2r and cuFFT's c2r destroy their input).
#include <vector>

#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

/// Which transform.
enum class FftKind : unsigned char { c2c, r2c, c2r };

/// A batched local FFT. `shape` is the real-space (r2c input, c2r output) or c2c shape; `dims`
/// are the transformed dims, ascending and distinct (for r2c/c2r the halved dim is dims.back());
/// every other dim is a batch dim. The output is multiplied by `scale`.
struct FftGeometry {
  FftKind kind = FftKind::c2c;
  bool inverse = false;  ///< c2c only: the +i sign (r2c is always forward, c2r always inverse)
  std::vector<index_t> shape;
  std::vector<int> dims;
  double scale = 1.0;

  /// Shape of the complex side (r2c output / c2r input): shape with dims.back() -> n / 2 + 1;
  /// for c2c the shape itself.
  std::vector<index_t> complex_shape() const;
};

/// out = FFT(in) per `g` (see the file comment). `in` and `out` are contiguous blocks on
/// ctx.device(): c2c both complex (c64 or c128) of g.shape (out may be in); r2c in real (f32 or
/// f64) of g.shape, out complex of g.complex_shape(); c2r the reverse. Throws shard::Error
/// (before any work) for dims out of range, repeated or unsorted, a dtype pairing other than
/// the above, a shape that does not match, or a device without an FFT table.
void fft(const FftGeometry& g, const Block& in, const Block& out, ExecContext& ctx);

}  // namespace shard::exec
