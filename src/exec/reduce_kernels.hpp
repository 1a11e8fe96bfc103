#pragma once
// The reduce kernel family's interface (private): src/exec/reduce_cpu.cpp (DeviceKind::cpu) and
// src/cuda/reduce_cuda.cpp (DeviceKind::cuda). The front (src/exec/reduce.cpp) checks devices,
// dtypes and shapes; tables see contiguous blocks of one dtype (f32/f64) on one device, except
// in the *_strided entry points (strided operands read in place, CPU).
#include "shardtensor/exec/reduce.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct ReduceKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::reduce;
  virtual ~ReduceKernels() = default;
  /// True when reduce_sum / reduce_max / max_ties / max_backward read a strided x (any strides,
  /// e.g. the interior of a halo-padded array) in place; else the front passes a contiguous copy.
  virtual bool takes_strided_input() const { return false; }
  virtual void reduce_sum(const Block& x, const Block& out, double scale, ExecContext& ctx) const = 0;
  virtual void reduce_max(const Block& x, const Block& out, ExecContext& ctx) const = 0;
  virtual void broadcast_scaled(const Block& g, const Block& gx, double scale, ExecContext& ctx) const = 0;
  virtual void max_ties(const Block& x, const Block& m, const Block& ties, ExecContext& ctx) const = 0;
  virtual void max_backward(const Block& x, const Block& m, const Block& g, const Block& ties, const Block& gx,
                            ExecContext& ctx) const = 0;
  /// kind 0: sum a; 1: sum a b; 2: sum (a - b)^2 (b unused for kind 0).
  virtual double global_sum(int kind, DType dt, index_t n, const void* a, const void* b, ExecContext& ctx) const = 0;
  /// out[0] (one element of dt, device memory) = dt(scale * the kind's sum); queued on the
  /// context's stream, no host read (n = 0 writes 0).
  virtual void global_sum_into(int kind, DType dt, index_t n, const void* a, const void* b, double scale, void* out,
                               ExecContext& ctx) const = 0;
  /// gp = c (p - t), gt = -gp (gt null: skipped), c = dt(g ? scale * g[0] : scale); g (one element of
  /// dt, device memory, may be null) is read by the kernel.
  virtual void mse_backward(double scale, const void* g, DType dt, index_t n, const void* p, const void* t, void* gp,
                            void* gt, ExecContext& ctx) const = 0;
  /// Strided entry points (the blocks may have any strides, same shape; gp, gt contiguous):
  /// a table that reads strided operands in place returns true; the default returns false and
  /// the front then passes contiguous copies to the flat entry points above.
  virtual bool sq_diff_sum_strided(const Block& a, const Block& b, double& out, ExecContext& ctx) const {
    (void)a, (void)b, (void)out, (void)ctx;
    return false;
  }
  virtual bool sq_diff_sum_strided_into(const Block& a, const Block& b, double scale, void* out,
                                        ExecContext& ctx) const {
    (void)a, (void)b, (void)scale, (void)out, (void)ctx;
    return false;
  }
  virtual bool mse_backward_strided(double scale, const void* g, const Block& p, const Block& t, const Block& gp,
                                    const Block& gt, ExecContext& ctx) const {
    (void)scale, (void)g, (void)p, (void)t, (void)gp, (void)gt, (void)ctx;
    return false;
  }
  /// rel_l2 over strided p, t (gp, gt contiguous); sample s = the rows with dim-0 index s.
  virtual bool rel_l2_sums_strided(const Block& p, const Block& t, index_t samples, double* sums,
                                   ExecContext& ctx) const {
    (void)p, (void)t, (void)samples, (void)sums, (void)ctx;
    return false;
  }
  virtual bool rel_l2_backward_strided(const Block& p, const Block& t, index_t samples, const double* coef,
                                       const Block& gp, const Block& gt, ExecContext& ctx) const {
    (void)p, (void)t, (void)samples, (void)coef, (void)gp, (void)gt, (void)ctx;
    return false;
  }
  virtual void rel_l2_sums(DType dt, index_t samples, index_t inner, const void* p, const void* t, double* sums,
                           ExecContext& ctx) const = 0;
  virtual void rel_l2_backward(DType dt, index_t samples, index_t inner, const void* p, const void* t,
                               const double* coef, void* gp, void* gt, ExecContext& ctx) const = 0;
  /// exec::rel_l2_value / rel_l2_coefficients (dt: the loss dtype, f32 / f64; every pointer in the
  /// context's device memory).
  virtual void rel_l2_value(DType dt, index_t samples, index_t global, const double* sums, const double* check,
                            index_t P, void* out, ExecContext& ctx) const = 0;
  virtual void rel_l2_coefficients(DType dt, index_t samples, index_t global, const double* sums, const double* check,
                                   index_t P, const void* g, double* coef, ExecContext& ctx) const = 0;
};


/// Defined in src/cuda/reduce_cuda.cpp (shardtensor::cuda) next to the static registrar of the CUDA
/// table: the CUDA library's registration unit calls it so a static link keeps that file.
void cuda_link_reduce() noexcept;

}  // namespace shard::exec
