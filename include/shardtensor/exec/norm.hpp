#pragma once
/// \file norm.hpp
/// Norm kernel family front: per-statistic sums, normalise-and-affine, and the backward sums and
/// input gradient of batch / group / instance / layer normalisation, on the device of the data
/// (CPU: src/exec/norm_cpu.cpp; CUDA: kernels/norm.cu). Tensor data (x, y, gy, dx, w, b) lives
/// on `dev`; the statistics (mean, invstd, the per-statistic and per-channel sums) are small
/// arrays of doubles in HOST memory, so the nn layer can reduce them across ranks and finish
/// them (mean, variance, running statistics) without touching tensor data. Every sum
/// accumulates in double in a fixed order (deterministic on every device).
#include <array>
#include <cstdint>

#include "shardtensor/core/device.hpp"
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/exec/context.hpp"

namespace shard::exec {

/// Which statistic index set a normalisation uses.
enum class NormKind : std::uint8_t {
  batch,  ///< statistic k = c (over N and all spatial dims)
  group,  ///< statistic k = a * G + c / (C / G) (over the group's channels and the spatial dims)
  layer   ///< statistic k = a * S + s (over the channels)
};

/// A local block viewed as [A, C, S] with G groups (group kind): contiguous, or x a strided view.
struct NormGeom {
  NormKind kind = NormKind::batch;
  index_t A = 0, C = 0, S = 0, G = 1;
  /// x as a strided view (e.g. the interior of a halo-padded user array): its rank, channel dim
  /// and local shape / element strides (A = the dims before cdim, S = the dims after it).
  /// xrank == 0 (the default): x is the dense [A, C, S] block. Only x is read through these; y,
  /// gy and dx are always dense. The CPU table reads such an x in place; other tables get a
  /// contiguous copy made by the front.
  int xrank = 0, cdim = 1;
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
void norm_sums(DType dt, const NormGeom& g, const void* x, const double* mean, double* out, Device dev,
               ExecContext& ctx);
/// y = (x - mean[k]) * invstd[k] * w[c] + b[c] (w, b may be null; mean, invstd in host memory).
void norm_apply(DType dt, const NormGeom& g, const void* x, const double* mean, const double* invstd, const void* w,
                const void* b, void* y, Device dev, ExecContext& ctx);
/// Host sums sg[k] = sum gy w[c], sgx[k] = sum gy w[c] xhat, dw[c] = sum gy xhat, db[c] = sum gy
/// (each may be null).
void norm_backward_sums(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                        const double* invstd, const void* w, double* sg, double* sgx, double* dw, double* db,
                        Device dev, ExecContext& ctx);
/// dx = invstd (gy w - sg/n - xhat sgx/n) with n = 1/inv_count; with sg == null (fixed
/// statistics) dx = invstd gy w. sg, sgx in host memory.
void norm_backward_dx(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                      const double* invstd, const void* w, const double* sg, const double* sgx, double inv_count,
                      void* dx, Device dev, ExecContext& ctx);
/// host[i] = (double) src[i] for n elements of dtype dt on `dev` (statistics, parameters).
void load_f64(DType dt, index_t n, const void* src, double* host, Device dev, ExecContext& ctx);
/// dst[i] = (dt) host[i] for n elements of dtype dt on `dev`.
void store_f64(DType dt, index_t n, const double* host, void* dst, Device dev, ExecContext& ctx);

}  // namespace shard::exec
