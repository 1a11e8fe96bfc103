#pragma once
/// \file norm.hpp
/// Norm kernel family front: per-statistic sums, normalise-and-affine, and the backward sums and
/// input gradient of batch / group / instance / layer normalisation, on the device of the data
/// (CPU: src/exec/norm_cpu.cpp; CUDA: kernels/norm.cu). Tensor data (x, y, gy, dx, w, b) are
/// Blocks on the context's device, of one dtype (f32 or f64; bf16 / f16 storage too); the
/// statistics (mean, invstd, the per-statistic and per-channel sums) are small arrays of doubles
/// in the context's DEVICE memory (host memory for a CPU context): the nn layer reduces them
/// across ranks with device collectives and finishes them (mean, variance, running statistics)
/// with norm_finish, so a norm on a GPU never waits for the device or copies to the host. Every
/// sum accumulates in double in a fixed order (deterministic on every device).
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

/// A pointwise activation fused into a norm (applied after the affine: y = act(xhat w + b)). The
/// values equal the matching exec::UnaryOp codes (and the kernels' pointwise codes), so the norm
/// kernels evaluate the pointwise family's own formulas (src/kernels_api/pointwise_ops.hpp), in
/// double. The backward recomputes z = xhat w + b from x, the statistics, w and b: the fused op
/// saves x only, where norm-then-activation also keeps the norm's output for the activation.
enum class NormAct : int { none = -1, relu = 6, gelu = 8, gelu_tanh = 9, silu = 10, tanh = 11, sigmoid = 12 };

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
  /// The activation fused after the affine (none: y is the normalised, affine output).
  NormAct act = NormAct::none;
  /// Number of statistics K.
  index_t stats() const {
    switch (kind) {
      case NormKind::batch: return C;
      case NormKind::group: return A * G;
      default: return A * S;
    }
  }
};

/// out[k] = sum of x (mean == null) or of (x - mean[k])^2 over the elements of statistic k.
void norm_sums(const NormGeom& g, const Block& x, const double* mean, double* out, ExecContext& ctx);
/// The local moments of every statistic k in one pass over x (n = the statistic's local element
/// count): sum[k] = sum of x, lmean[k] = sum[k] / n, m2[k] = sum of (x - lmean[k])^2 (all 0 when
/// n == 0). Computed from sums shifted by the statistic's first local element, so the variance
/// does not cancel the way sum x^2 - n mean^2 does (the shift lies within the data). The forward
/// of a training-mode norm reads x twice (moments, apply) instead of three times (sums of x, sums
/// of (x - mean)^2, apply); ranks combine their moments with norm_finish's spread mode (Chan et
/// al.'s parallel variance).
void norm_moments(const NormGeom& g, const Block& x, double* sum, double* m2, double* lmean, ExecContext& ctx);
/// y = act(z + r), z = (x - mean[k]) * invstd[k] * w[c] + b[c] (w, b [C] may be null; act: g.act;
/// r: an optional residual, a dense [A, C, S] block added before the activation). With r or an
/// activation, z + r and act are evaluated in the activation type (float for f32 / bf16 / f16,
/// double for f64), z rounded to it first: the roundings of norm, add and activation as three ops.
void norm_apply(const NormGeom& g, const Block& x, const Block* w, const Block* b, const Block* r, const double* mean,
                const double* invstd, const Block& y, ExecContext& ctx);
/// Sums sg[k] = sum gz w[c], sgx[k] = sum gz w[c] xhat, dw[c] = sum gz xhat, db[c] = sum gz
/// (each may be null), where gz = gy act'(z + r) (gz = gy without an activation; b and r are
/// only read to recompute z + r when g.act is set).
void norm_backward_sums(const NormGeom& g, const Block& x, const Block& gy, const Block* w, const Block* b,
                        const Block* r, const double* mean, const double* invstd, double* sg, double* sgx, double* dw,
                        double* db, ExecContext& ctx);
/// dx = invstd (gz w - sg/n - xhat sgx/n) with n = 1/inv_count; with sg == null (fixed
/// statistics) dx = invstd gz w (gz as in norm_backward_sums); dr (optional, dense [A, C, S]): the
/// residual's gradient, gz itself.
void norm_backward_dx(const NormGeom& g, const Block& x, const Block& gy, const Block* w, const Block* b,
                      const Block* r, const double* mean, const double* invstd, const double* sg, const double* sgx,
                      double inv_count, const Block& dx, const Block* dr, ExecContext& ctx);
/// out[i] = (double) src[i] for the elements of a contiguous src (statistics, parameters); out
/// in the context's device memory.
void load_f64(const Block& src, double* out, ExecContext& ctx);
/// dst[i] = (dtype) v[i] for the elements of a contiguous dst; v in the context's device memory.
void store_f64(const double* v, const Block& dst, ExecContext& ctx);

/// What norm_finish computes, per statistic k < K (all arrays in the context's device memory).
enum class NormFinish : std::uint8_t {
  mean,    ///< v[k] = v[k] / count (v: the allreduced sums of x)
  invstd,  ///< var = v[k] / count; the running statistics move towards mean[k] and the unbiased
           ///< var; v[k] = 1 / sqrt(var + eps)
  eval,    ///< mean[k] = run_mean[k]; v[k] = 1 / sqrt(run_var[k] + eps)
  check,   ///< nothing but the check below, over v[0, K)
  spread   ///< v[k] += local_count (local_mean[k] - mean[k])^2: this rank's M2 about the global mean
           ///< (v: its local M2 from norm_moments; mean: the global mean), to be allreduced
};
/// The arguments of norm_finish.
struct NormFinishArgs {
  NormFinish mode = NormFinish::mean;
  index_t K = 0;
  index_t count = 1;
  double eps = 0, momentum = 0;
  double* v = nullptr;
  double* mean = nullptr;
  /// Running statistics [K] (batch norm; each may be null; f32 or f64, contiguous, on the device):
  /// updated in place in invstd mode, read in eval mode.
  const Block* run_mean = nullptr;
  const Block* run_var = nullptr;
  /// The two check values a statistics allreduce carried (sum over P ranks of h and of h^2; null:
  /// no check). When P * check[1] != check[0]^2 the ranks disagreed on the call's arguments: every
  /// value this call writes (v, mean, the running statistics) becomes NaN instead, so a device
  /// step never waits to find out (the host path raises shard::Error; SHARDTENSOR_CHECK_COLLECTIVES=1
  /// names the argument on every device).
  const double* check = nullptr;
  index_t P = 1;
  /// Spread mode: this rank's mean of each statistic (norm_moments' lmean) and its element count.
  const double* local_mean = nullptr;
  index_t local_count = 0;
};
/// Finishes the statistics in place on the context's device (queued, no host read).
void norm_finish(const NormFinishArgs& a, ExecContext& ctx);

}  // namespace shard::exec
