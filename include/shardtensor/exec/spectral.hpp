#pragma once
/// \file spectral.hpp
/// Spectral kernel family front: the per-mode channel mixing of a Fourier Neural Operator layer
/// on contiguous complex blocks (c64 or c128) on ctx.device() (CPU: src/exec/spectral_cpu.cpp;
/// CUDA: src/cuda/spectral_cuda.cpp + kernels/spectral.cu).
///   forward:  y[b, o, k] = sum_i x[b, i, k] * w[i, o, k]
///   backward: gx[b, i, k] = sum_o gy[b, o, k] * conj(w[i, o, k])
///             gw[i, o, k] = sum_b conj(x[b, i, k]) * gy[b, o, k]
/// (PyTorch's convention for complex gradients: dL/dRe + i dL/dIm.)
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

/// x [batch, cin, modes], w [cin, cout, modes], y [batch, cout, modes] (modes flattened).
struct SpectralGeometry {
  index_t batch = 0, cin = 0, cout = 0, modes = 0;
};

/// y = the mix of x by w (see the file comment). All blocks contiguous, one complex dtype.
void spectral_mul_forward(const SpectralGeometry& g, const Block& x, const Block& w, const Block& y, ExecContext& ctx);

/// gx and / or gw (null: not wanted) from gy (see the file comment); both are overwritten.
void spectral_mul_backward(const SpectralGeometry& g, const Block& x, const Block& w, const Block& gy, const Block* gx,
                           const Block* gw, ExecContext& ctx);

}  // namespace shard::exec
