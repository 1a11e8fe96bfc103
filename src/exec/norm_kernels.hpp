#pragma once
// Norm kernel family (private interface; see include/shardtensor/exec/norm.hpp for the contract).
// Device pointers for tensor data and for the statistics (host memory on the CPU).
#include "shardtensor/exec/norm.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct NormKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::norm;
  virtual ~NormKernels() = default;
  /// True when the table reads a strided x described by NormGeom::xrank/xshape/xstrides; else
  /// the front passes a contiguous copy (and xrank = 0).
  virtual bool takes_strided_input() const { return false; }
  // g.act (NormGeom) and the residual r (dense [A, C, S] or null): apply writes act(z + r);
  // backward_sums / backward_dx use gz = gy act'(z + r), z recomputed from x, the statistics, w
  // and b (b and r only read then); backward_dx writes the residual's gradient gz into dr.
  // native_storage (KernelTable): the table reads and writes bf16 / f16 operands itself (f64
  // arithmetic, like its f32 path; results rounded once), every pass (sums, apply, load / store:
  // forward; backward sums, dx: backward_data). CPU and CUDA: yes.
  virtual void sums(DType dt, const NormGeom& g, const void* x, const double* mean, double* out,
                    ExecContext& ctx) const = 0;
  /// exec::norm_moments (x contiguous, or strided when takes_strided_input).
  virtual void moments(DType dt, const NormGeom& g, const void* x, double* sum, double* m2, double* lmean,
                       ExecContext& ctx) const = 0;
  virtual void apply(DType dt, const NormGeom& g, const void* x, const double* mean, const double* invstd,
                     const void* w, const void* b, const void* r, void* y, ExecContext& ctx) const = 0;
  virtual void backward_sums(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                             const double* invstd, const void* w, const void* b, const void* r, double* sg,
                             double* sgx, double* dw, double* db, ExecContext& ctx) const = 0;
  virtual void backward_dx(DType dt, const NormGeom& g, const void* x, const void* gy, const double* mean,
                           const double* invstd, const void* w, const void* b, const void* r, const double* sg,
                           const double* sgx, double inv_count, void* dx, void* dr, ExecContext& ctx) const = 0;
  virtual void load_f64(DType dt, index_t n, const void* src, double* out, ExecContext& ctx) const = 0;
  virtual void store_f64(DType dt, index_t n, const double* v, void* dst, ExecContext& ctx) const = 0;
  /// NormFinishArgs (the front checked the running statistics: f32 / f64, [K], contiguous).
  virtual void finish(const NormFinishArgs& a, ExecContext& ctx) const = 0;
};


}  // namespace shard::exec
