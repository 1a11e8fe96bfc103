// Front of the optim kernel family: operand checks, then dispatch by the parameter's device.
#include "shardtensor/exec/optim.hpp"

#include "exec/front_util.hpp"
#include "exec/optim_kernels.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

/// Keeps src/exec/optim_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
SHARD_KEEP_CPU_TABLE(optim);

namespace {

/// The table for the context's device (operand `b` must be on it, of a supported dtype).
const OptimKernels& optim_table(const Block& b, const char* op, const ExecContext& ctx) {
  return detail::front_table<OptimKernels>(op, b.dtype, b.device, ctx);
}
void check_state(const Block& s, const Block& w, DType dt, const char* op, const char* what) {
  SHARD_CHECK(s.device == w.device, op, "operands on different devices: {} is on {}, the parameter on {}", what,
              s.device, w.device);
  SHARD_CHECK(s.dtype == dt, op, "{} has dtype {}, expected {}", what, s.dtype, dt);
  SHARD_CHECK(s.is_contiguous() && s.numel() == w.numel(), op, "{} must be contiguous with {} elements (shape {})",
              what, w.numel(), s.shape_vec());
}
void check_param(const Block& w, const char* op) {
  SHARD_CHECK(w.dtype == DType::f32 || w.dtype == DType::f64, op, "parameter dtype {} (f32 or f64 needed)", w.dtype);
  SHARD_CHECK(w.is_contiguous(), op, "parameter must be contiguous");
}

}  // namespace

void sgd_update(const Block& w, const Block& g, const Block& buf, const SgdParams& p, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "optim", "sgd_update", &ctx);
  const char* op = "SGD::step";
  check_param(w, op);
  check_state(g, w, w.dtype, op, "gradient");
  if (p.momentum > 0) check_state(buf, w, w.dtype, op, "momentum buffer");
  if (w.numel() == 0) return;
  optim_table(w, op, ctx).sgd(w.dtype, w.numel(), w.data, g.data, p.momentum > 0 ? buf.data : nullptr, p, ctx);
}

void adam_update(const Block& w, const Block& g, const Block& m, const Block& v, const AdamParams& p,
                 ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "optim", "adam_update", &ctx);
  const char* op = "Adam::step";
  check_param(w, op);
  check_state(g, w, w.dtype, op, "gradient");
  check_state(m, w, DType::f64, op, "first moment");
  check_state(v, w, DType::f64, op, "second moment");
  if (w.numel() == 0) return;
  optim_table(w, op, ctx).adam(w.dtype, w.numel(), w.data, g.data, static_cast<double*>(m.data),
                           static_cast<double*>(v.data), p, ctx);
}

}  // namespace shard::exec
