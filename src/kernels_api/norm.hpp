#pragma once
// Kernel firewall of the norm family (kernels/norm.cu): plain C++17, no shardtensor headers.
// Launchers enqueue on `stream` (a cudaStream_t), return a cudaError_t code (0 = success) and do
// not synchronise. All pointers are device pointers. dtype: 0 f32, 1 f64, 2 bf16, 3 f16 (the
// storage of x, gy, w, b, y, dx; bf16 / f16 widened to double, results rounded through float).
// kind: 0 batch, 1 group, 2 layer (see include/shardtensor/exec/norm.hpp for the [A, C, S] / G geometry).
// Reductions: per statistic, a fixed number of chunks (one block each, a fixed-order tree) whose
// partials a fixed-order pass adds (batch and group kinds, when few statistics would leave the GPU
// idle), else one block per statistic: no atomics, deterministic.
#include <cstdint>

namespace shard::kernels::norm {

using idx = std::int64_t;

/// Geometry of a norm launch.
struct Geom {
  int kind;
  idx A, C, S, G;
  /// Activation fused after the affine: a pointwise unary code (relu, gelu, gelu_tanh, silu, tanh,
  /// sigmoid; src/kernels_api/pointwise_ops.hpp act_fwd / act_bwd) or -1 for none.
  int act = -1;
  /// Optional residual added before the activation (a dense [A, C, S] block of the storage type,
  /// read by apply, backward_sums and backward_dx) and its gradient (written by backward_dx: gz).
  const void* res = nullptr;
  void* dres = nullptr;
};

/// Doubles of device workspace sums / backward_sums need for g (their chunk partials).
idx workspace(Geom g);
/// out[k] = sum over statistic k of x (mean == nullptr) or (x - mean[k])^2, in double. ws:
/// workspace(g) doubles (null: one block per statistic).
int sums(int dtype, Geom g, const void* x, const double* mean, double* out, double* ws, void* stream);
/// The local moments of each statistic k in one pass over x: sum[k] = sum x, lmean[k] = sum[k] / n,
/// m2[k] = sum (x - lmean[k])^2 (n = the statistic's element count; all 0 when n == 0), from sums
/// shifted by the statistic's first element. ws: workspace(g) doubles (null: one block per statistic).
int moments(int dtype, Geom g, const void* x, double* sum, double* m2, double* lmean, double* ws, void* stream);
/// y = act(z + res), z = (x - mean[k]) * invstd[k] * w[c] + b[c] (w, b, g.res may be null).
int apply(int dtype, Geom g, const void* x, const double* mean, const double* invstd, const void* w, const void* b,
          void* y, void* stream);
/// sg[k], sgx[k] (both or neither) and dw[c], db[c] (each may be null), in double, of gz = gy
/// act'(z) (gy without an activation; b is read only to recompute z).
int backward_sums(int dtype, Geom g, const void* x, const void* gy, const double* mean, const double* invstd,
                  const void* w, const void* b, double* sg, double* sgx, double* dw, double* db, double* ws,
                  void* stream);
/// dx = invstd (gz w - sg inv_count - xhat sgx inv_count), or invstd gz w when sg == nullptr.
int backward_dx(int dtype, Geom g, const void* x, const void* gy, const double* mean, const double* invstd,
                const void* w, const void* b, const double* sg, const double* sgx, double inv_count, void* dx,
                void* stream);
/// dst[i] = (double) src[i].
int to_f64(int dtype, idx n, const void* src, double* dst, void* stream);
/// dst[i] = (T) src[i] (through float for bf16 / f16).
int from_f64(int dtype, idx n, const double* src, void* dst, void* stream);

/// exec::NormFinishArgs in plain form (mode: 0 mean, 1 invstd, 2 eval, 3 check, 4 spread; rm / rv
/// the running statistics, f32 unless *_f64; check: the two allreduced check values or null;
/// spread: v[k] += local_count (aux[k] - mean[k])^2).
struct Finish {
  int mode;
  idx K, count;
  double eps, momentum;
  double* v;
  double* mean;
  void* rm;
  void* rv;
  bool rm_f64, rv_f64;
  const double* check;
  idx P;
  const double* aux = nullptr;
  idx local_count = 0;
};
/// Finishes the statistics in place (one thread per statistic; the host table's arithmetic with
/// _rn intrinsics, no contraction); a failed check makes every written value NaN.
int finish(const Finish& f, void* stream);

}  // namespace shard::kernels::norm
