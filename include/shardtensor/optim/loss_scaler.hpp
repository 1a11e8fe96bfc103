#pragma once
/// \file loss_scaler.hpp
/// Dynamic loss scaling for fp16 training (mixed precision, docs/architecture.md): the loss is
/// multiplied by a scale S before backward so small fp16 gradients do not flush to zero; before
/// the optimiser step the f32 master gradients are divided by S and checked for inf/NaN. The
/// check is agreed by every rank of the parameters' mesh (one allreduce of one flag), so all ranks
/// skip or take the step together. On overflow the step is skipped, the gradients cleared and
/// S *= backoff; after `growth_interval` clean steps in a row S *= growth. Rule and defaults as
/// PyTorch's torch.amp.GradScaler (init 2^16, growth 2, backoff 0.5, interval 2000).
///
///   optim::LossScaler scaler;
///   auto loss = F::mse_loss(F::cast<float>(model(x16)), y);
///   scaler.scale(loss).backward();
///   scaler.step(opt);   // false: skipped (overflow); S was backed off
///
/// bf16 has f32's exponent range and needs no scaler (use it with scale 1 or not at all).
#include <cmath>
#include <memory>
#include <vector>

#include "shardtensor/core/error.hpp"
#include "shardtensor/nn/functional/pointwise.hpp"
#include "shardtensor/optim/optimizer.hpp"

namespace shard::optim {

class LossScaler {
 public:
  struct Options {
    double init_scale = 65536.0;   ///< S at the start
    double growth_factor = 2.0;    ///< S *= this after growth_interval clean steps (> 1)
    double backoff_factor = 0.5;   ///< S *= this on overflow (in (0, 1))
    int growth_interval = 2000;    ///< clean steps in a row before growing (>= 1)
    /// S below this after a backoff throws shard::Error on every rank: the gradients are inf/NaN
    /// at every scale (a diverged model, bad data or learning rate), not an fp16 range problem.
    double min_scale = 1.0 / 16777216.0;
  };
  LossScaler() : LossScaler(Options{}) {}
  explicit LossScaler(Options o) : o_(o), scale_(o.init_scale) {
    SHARD_CHECK(o.init_scale > 0 && std::isfinite(o.init_scale), "LossScaler", "init_scale {} must be finite and > 0",
                o.init_scale);
    SHARD_CHECK(o.growth_factor > 1, "LossScaler", "growth_factor {} must be > 1", o.growth_factor);
    SHARD_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, "LossScaler", "backoff_factor {} must be in (0, 1)",
                o.backoff_factor);
    SHARD_CHECK(o.growth_interval >= 1, "LossScaler", "growth_interval {} must be >= 1", o.growth_interval);
    SHARD_CHECK(o.min_scale > 0 && o.min_scale <= o.init_scale, "LossScaler",
                "min_scale {} must be in (0, init_scale {}]", o.min_scale, o.init_scale);
  }

  /// loss * S on the tape (backward from it gives S times the gradients).
  template <class T, int R>
  autograd::Var<T, R> scale(const autograd::Var<T, R>& loss) const {
    return nn::functional::mul(loss, static_cast<T>(scale_));
  }

  /// Divides every gradient by S in place and checks them for inf/NaN, agreed over the mesh of
  /// the first parameter (collective: every rank calls it with its parameters). Returns true when
  /// every gradient is finite. Does not change S (see update()).
  template <class T>
  bool unscale(const std::vector<std::shared_ptr<nn::ParameterBase<T>>>& params) const {
    double bad = 0;
    CommPtr comm;
    for (const auto& p : params) {
      if (!comm) comm = p->mesh().comm();
      auto g = p->grad_flat();
      if (g.numel() == 0) continue;
      // The sum in double of finite floats is finite: a non-finite sum means a non-finite element.
      if (!std::isfinite(static_cast<double>(shard::sum(g)))) bad = 1;
      else shard::scale(g, static_cast<T>(1.0 / scale_));
    }
    if (comm && comm->size() > 1) comm->allreduce(&bad, &bad, 1, DType::f64, ReduceOp::max);
    return bad == 0;
  }

  /// The scale rule after a step's check: backoff on overflow (throws shard::Error, on every rank,
  /// once S falls below min_scale), growth after growth_interval clean steps.
  void update(bool finite) {
    if (!finite) {
      ++skipped_;
      clean_ = 0;
      scale_ *= o_.backoff_factor;
      SHARD_CHECK(scale_ >= o_.min_scale, "LossScaler",
                  "the loss scale collapsed to {} (< min_scale {}) after {} skipped steps: the gradients are inf/NaN "
                  "at every scale (a diverged model, bad data or learning rate), not an fp16 range problem",
                  scale_, o_.min_scale, skipped_);
      return;
    }
    if (++clean_ >= o_.growth_interval) {
      scale_ *= o_.growth_factor;
      clean_ = 0;
    }
  }

  /// unscale + update + the optimiser's step when the gradients are finite; on overflow the
  /// gradients are cleared and the step skipped. Returns whether the step was taken. Collective.
  template <class T>
  bool step(Optimizer<T>& opt) {
    const bool finite = unscale(opt.params());
    update(finite);
    if (!finite) {
      opt.zero_grad();
      return false;
    }
    opt.step();
    return true;
  }

  double scale_value() const { return scale_; }
  long skipped_steps() const { return skipped_; }

 private:
  Options o_;
  double scale_;
  int clean_ = 0;
  long skipped_ = 0;
};

}  // namespace shard::optim
