#pragma once
/// \file optim.hpp
/// The optim kernel family's front: one fused elementwise update per optimiser (SGD with
/// momentum / Nesterov / weight decay, Adam, AdamW), on the parameter's device (CPU:
/// src/exec/optim_cpu.cpp; CUDA: kernels/optim.cu). Parameter, gradient and state are
/// contiguous blocks with one element count on one device.
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

/// SGD hyper-parameters: d = g + wd w; with momentum v = mu v + d, d = nesterov ? d + mu v : v;
/// w -= lr d (in the parameter's precision).
struct SgdParams {
  double lr = 0, momentum = 0, weight_decay = 0;
  bool nesterov = false;
  /// When set: {lr} read from this address on the parameter's device when the update runs,
  /// replacing `lr` (a captured step's live value: optim/captured_step.hpp, replay_scalars).
  const double* live = nullptr;
};
/// Adam/AdamW hyper-parameters for one step; bc1 = 1 - beta1^t, bc2 = 1 - beta2^t. decoupled:
/// AdamW (w *= 1 - lr wd) instead of L2 decay added to the gradient. Math in double.
struct AdamParams {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0, bc1 = 1, bc2 = 1;
  bool decoupled = false;
  /// When set: {lr, bc1, bc2} read from this address on the parameter's device when the update
  /// runs, replacing those fields (a captured step's live values; see SgdParams::live).
  const double* live = nullptr;
};

/// w (f32/f64) updated in place from g; `buf` (w's dtype) is the momentum buffer (unused and may be
/// an empty Block when momentum is 0).
void sgd_update(const Block& w, const Block& g, const Block& buf, const SgdParams& p, ExecContext& ctx);
/// w updated in place from g; m and v (f64) are the first and second moments.
void adam_update(const Block& w, const Block& g, const Block& m, const Block& v, const AdamParams& p,
                 ExecContext& ctx);

}  // namespace shard::exec
