#pragma once
/// \file norm.hpp
/// Norm kernel family front: per-statistic sums, normalise-and-affine, and the backward sums and
/// input gradient of batch / group / instance / layer normalisation, on the device of the data
/// (CPU: src/exec/norm_cpu.cpp; CUDA: kernels/norm.cu). Tensor data (x, y, gy, dx, w, b) are
/// Blocks on the context's device, of one dtype (f32 or f64); the statistics (mean, invstd, the per-statistic and per-channel sums) are small
/// arrays of doubles in HOST memory, so the nn layer can reduce them across ranks and finish
/// them (mean, variance, running statistics) without touching tensor data. Every sum
/// accumulates in double in a fixed order (deterministic on every device).
#include <array>
#include <cstdint>

#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

/// Which statistic index set a normalisation uses.
enum class NormKind : std::uint8_t {
  batch,  ///< statistic k = c (over N and all spatial dims)
  group,  ///< statistic k = a * G + c / (C / G) (over the group's channels and the spatial dims)
  layer   ///< statistic k = a * S + s (over the channels)
};

/// A local block viewed as [A, C, S] with G groups (group kind).
struct NormGeom {
  NormKind kind = NormKind::batch;
  index_t A = 0, C = 0, S = 0, G = 1;
  /// x's channel dim when x is a strided view (e.g. the interior of a halo-padded user array):
  /// A = the product of the dims before it, S = of the dims after it. Only x may be strided; y, gy
  /// and dx are always dense [A, C, S] blocks.
  int cdim = 1;
  /// Set by the front from a strided x (the tables read x through them; xrank == 0: x is the dense
  /// [A, C, S] block). The CPU table reads such an x in place; other tables get a contiguous copy
  /// made by the front.
  int xrank = 0;
  std::array<index_t, 8> xshape{}, xstrides{};
  /// Number of statistics K.
  index_t stats() const {
    switch (kind) {
      case NormKind::batch: return C;
      case NormKind::group: return A * G;
      default: return A * S;
    }
  }
};

/// out[k] (host) = sum of x (mean == null) or of (x - mean[k])^2 over the elements of statistic k.
void norm_sums(const NormGeom& g, const Block& x, const double* mean, double* out, ExecContext& ctx);
/// y = (x - mean[k]) * invstd[k] * w[c] + b[c] (w, b [C] may be null; mean, invstd in host memory).
void norm_apply(const NormGeom& g, const Block& x, const Block* w, const Block* b, const double* mean,
                const double* invstd, const Block& y, ExecContext& ctx);
/// Host sums sg[k] = sum gy w[c], sgx[k] = sum gy w[c] xhat, dw[c] = sum gy xhat, db[c] = sum gy
/// (each may be null).
void norm_backward_sums(const NormGeom& g, const Block& x, const Block& gy, const Block* w, const double* mean,
                        const double* invstd, double* sg, double* sgx, double* dw, double* db, ExecContext& ctx);
/// dx = invstd (gy w - sg/n - xhat sgx/n) with n = 1/inv_count; with sg == null (fixed
/// statistics) dx = invstd gy w. sg, sgx in host memory.
void norm_backward_dx(const NormGeom& g, const Block& x, const Block& gy, const Block* w, const double* mean,
                      const double* invstd, const double* sg, const double* sgx, double inv_count, const Block& dx,
                      ExecContext& ctx);
/// host[i] = (double) src[i] for the elements of a contiguous src (statistics, parameters).
void load_f64(const Block& src, double* host, ExecContext& ctx);
/// dst[i] = (dtype) host[i] for the elements of a contiguous dst.
void store_f64(const double* host, const Block& dst, ExecContext& ctx);

}  // namespace shard::exec
