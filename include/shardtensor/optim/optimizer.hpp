#pragma once
/// \file optimizer.hpp
/// Optimisers over replicated parameters: SGD (momentum, Nesterov, weight decay), Adam, AdamW,
/// and a cosine learning-rate schedule with linear warm-up. Parameter gradients arrive already
/// reduced over every mesh dim (domain and data-parallel) by the autograd tape, so each rank
/// applies the same update and parameters stay replicated without further communication.
/// Updates run on the parameters' device through the optim kernel family (exec/optim.hpp);
/// optimiser state lives next to each parameter.
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/exec/optim.hpp"
#include "shardtensor/nn/parameter.hpp"
#include "shardtensor/optim/captured_step.hpp"
#include "shardtensor/runtime/profiler.hpp"
#include "shardtensor/tensor/tensor_block.hpp"

namespace shard::optim {

/// A contiguous 1-D Block of n elements at p on dev (no allocation).
template <class T>
Block param_block(const T* p, index_t n, Device dev) {
  return Block::view(dtype_of<T>, dev, const_cast<T*>(p), &n, 1);
}

/// An optimiser's state, exported for checkpoints (io/checkpoint.hpp) and imported on resume:
/// scalars (learning rate, step count, ...) and named buffers (per-parameter moments, keyed
/// "<what>.<parameter index>"). Buffers are 1-D Blocks that own their memory (copies of the
/// optimiser's; their dtype is the optimiser's: T for SGD momentum, f64 for Adam moments).
struct OptimizerState {
  std::string kind;                        ///< "sgd", "adam", "adamw"
  std::map<std::string, double> scalars;   ///< e.g. "lr", "t"
  std::map<std::string, Block> buffers;    ///< e.g. "exp_avg.3"
};

namespace detail {
/// An owning host copy of the 1-D tensor t.
template <class U>
Block export_buffer(const Tensor<U, 1>& t) {
  return as_block(t.to(Device::cpu()).clone());
}
/// Replaces `dst`'s contents by `src` (dtype and length checked), on device `dev`: in place when
/// `dst` already has that size there (a captured step's graph keeps reading the same address).
template <class U>
void import_buffer(Tensor<U, 1>& dst, const Block& src, index_t n, Device dev, const std::string& key) {
  SHARD_CHECK(src.dtype == dtype_of<U> && src.rank == 1 && src.numel() == n, "Optimizer::load_state",
              "buffer '{}' is {} of {} elements, the optimiser expects {} of {}", key, src.dtype, src.numel(),
              dtype_of<U>, n);
  if (dst.numel() != n || dst.device() != dev || !dst.is_contiguous()) dst = Tensor<U, 1>::empty({n}, dev);
  dst.copy_from(tensor_of<U, 1>(src));
}
}  // namespace detail

/// Base optimiser: holds parameters and a learning rate.
template <class T>
class Optimizer {
 public:
  explicit Optimizer(std::vector<std::shared_ptr<nn::ParameterBase<T>>> params, double lr)
      : params_(std::move(params)), lr_(lr) {
    SHARD_CHECK(lr >= 0, "Optimizer", "negative learning rate {}", lr);
  }
  virtual ~Optimizer() = default;
  /// Applies one update with the current gradients (parameters without a gradient are skipped).
  virtual void step() = 0;
  /// Clears every parameter's gradient.
  void zero_grad() {
    for (auto& p : params_) p->zero_grad();
  }
  double lr() const { return lr_; }
  /// Takes effect at the next step(), also in a captured step's replays.
  void set_lr(double lr) { lr_ = lr; }
  const std::vector<std::shared_ptr<nn::ParameterBase<T>>>& params() const { return params_; }
  /// Everything step() depends on besides the parameters and gradients (for checkpoints).
  virtual OptimizerState state() const = 0;
  /// Restores a state exported by state() of the same kind of optimiser over parameters of the
  /// same sizes (checked; shard::Error otherwise). Buffers are copied to the parameters' devices.
  virtual void load_state(const OptimizerState& s) = 0;

 protected:
  /// Inside a CapturedStep's capture: the device address of `n` live values that `fill` writes
  /// before every replay (the graph must read each replay's learning rate and step count, not
  /// the capture's); null otherwise (values passed as usual). Parameters without gradients are
  /// skipped by step(), so the first with one names the device.
  const double* live_values(std::size_t n, std::function<void(double*)> fill) const {
    for (const auto& p : params_) {
      if (!p->grad()) continue;
      const Device dev = p->device();
      if (!CapturedStep::capturing(dev)) return nullptr;
      for (const auto& q : params_)  // one device address cannot serve parameters elsewhere
        SHARD_CHECK(!q->grad() || q->device() == dev, "Optimizer::step",
                    "a captured step's optimiser has parameters on {} and on {}: capture one device's", dev,
                    q->device());
      return replay_scalars(dev, n, std::move(fill));
    }
    return nullptr;
  }
  void check_kind(const OptimizerState& s, const std::string& kind) const {
    SHARD_CHECK(s.kind == kind, "Optimizer::load_state", "state of a '{}' optimiser loaded into a '{}' one", s.kind,
                kind);
  }
  double scalar(const OptimizerState& s, const std::string& key) const {
    auto it = s.scalars.find(key);
    SHARD_CHECK(it != s.scalars.end(), "Optimizer::load_state", "state of '{}' lacks '{}'", s.kind, key);
    return it->second;
  }

  std::vector<std::shared_ptr<nn::ParameterBase<T>>> params_;
  double lr_;
};

/// Stochastic gradient descent: v = mu v + (g + wd p); p -= lr (nesterov ? g + wd p + mu v : v).
template <class T>
class SGD final : public Optimizer<T> {
 public:
  struct Options {
    double lr = 1e-2, momentum = 0, weight_decay = 0;
    bool nesterov = false;
  };
  SGD(std::vector<std::shared_ptr<nn::ParameterBase<T>>> params, Options o)
      : Optimizer<T>(std::move(params), o.lr), o_(o), buf_(this->params_.size()) {
    SHARD_CHECK(!o.nesterov || o.momentum > 0, "SGD", "Nesterov momentum needs momentum > 0");
  }
  void step() override {
    SHARD_PROFILE_SCOPE("optim", "sgd", "step", nullptr);
    exec::SgdParams sp{this->lr_, o_.momentum, o_.weight_decay, o_.nesterov};
    sp.live = this->live_values(1, [this](double* v) { v[0] = this->lr_; });
    for (std::size_t i = 0; i < this->params_.size(); ++i) {
      auto& p = *this->params_[i];
      const T* g = p.grad();
      if (!g) continue;
      const index_t n = p.numel();
      const Device dev = p.device();
      if (o_.momentum > 0 && buf_[i].numel() != n) buf_[i] = Tensor<T, 1>::zeros({n}, dev);
      exec::sgd_update(param_block(p.data(), n, dev), param_block(g, n, dev),
                       o_.momentum > 0 ? param_block(buf_[i].data(), n, dev) : Block{}, sp, current_context(dev));
      p.value_flat().bump_version();  // updated in place: a graph that saved it can no longer backward
    }
  }
  OptimizerState state() const override {
    OptimizerState s{"sgd", {{"lr", this->lr_}}, {}};
    for (std::size_t i = 0; i < buf_.size(); ++i)
      if (buf_[i].numel() > 0) s.buffers.emplace(fmt::format("momentum.{}", i), detail::export_buffer(buf_[i]));
    return s;
  }
  void load_state(const OptimizerState& s) override {
    this->check_kind(s, "sgd");
    this->lr_ = this->scalar(s, "lr");
    for (std::size_t i = 0; i < buf_.size(); ++i) {
      auto it = s.buffers.find(fmt::format("momentum.{}", i));
      if (it == s.buffers.end()) buf_[i] = Tensor<T, 1>();
      else detail::import_buffer(buf_[i], it->second, this->params_[i]->numel(), this->params_[i]->device(), it->first);
    }
  }

 private:
  Options o_;
  std::vector<Tensor<T, 1>> buf_;  // momentum buffers, on each parameter's device
};

/// Adam (decoupled = false: L2 weight decay added to the gradient) and AdamW (decoupled = true).
template <class T>
class Adam : public Optimizer<T> {
 public:
  struct Options {
    double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  };
  Adam(std::vector<std::shared_ptr<nn::ParameterBase<T>>> params, Options o, bool decoupled = false)
      : Optimizer<T>(std::move(params), o.lr), o_(o), decoupled_(decoupled), m_(this->params_.size()),
        v_(this->params_.size()) {
    SHARD_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "Adam", "betas ({}, {}) outside [0, 1)",
                o.beta1, o.beta2);
  }
  void step() override {
    SHARD_PROFILE_SCOPE("optim", "adam", "step", nullptr);
    // In a capture the step count advances per replay, in fill (the capture itself runs nothing).
    const double* live = this->live_values(3, [this](double* v) {
      ++t_;
      v[0] = this->lr_;
      v[1] = 1 - std::pow(o_.beta1, t_);
      v[2] = 1 - std::pow(o_.beta2, t_);
    });
    if (!live) ++t_;
    const double bc1 = 1 - std::pow(o_.beta1, t_), bc2 = 1 - std::pow(o_.beta2, t_);
    exec::AdamParams ap{this->lr_, o_.beta1, o_.beta2, o_.eps, o_.weight_decay, bc1, bc2, decoupled_};
    ap.live = live;
    for (std::size_t i = 0; i < this->params_.size(); ++i) {
      auto& p = *this->params_[i];
      const T* g = p.grad();
      if (!g) continue;
      const index_t n = p.numel();
      const Device dev = p.device();
      if (m_[i].numel() != n) {
        m_[i] = Tensor<double, 1>::zeros({n}, dev);
        v_[i] = Tensor<double, 1>::zeros({n}, dev);
      }
      exec::adam_update(param_block(p.data(), n, dev), param_block(g, n, dev), param_block(m_[i].data(), n, dev),
                        param_block(v_[i].data(), n, dev), ap, current_context(dev));
      p.value_flat().bump_version();
    }
  }
  /// Number of steps taken.
  long steps() const { return t_; }
  OptimizerState state() const override {
    OptimizerState s{decoupled_ ? "adamw" : "adam", {{"lr", this->lr_}, {"t", static_cast<double>(t_)}}, {}};
    for (std::size_t i = 0; i < m_.size(); ++i)
      if (m_[i].numel() > 0) {
        s.buffers.emplace(fmt::format("exp_avg.{}", i), detail::export_buffer(m_[i]));
        s.buffers.emplace(fmt::format("exp_avg_sq.{}", i), detail::export_buffer(v_[i]));
      }
    return s;
  }
  void load_state(const OptimizerState& s) override {
    this->check_kind(s, decoupled_ ? "adamw" : "adam");
    this->lr_ = this->scalar(s, "lr");
    t_ = static_cast<long>(this->scalar(s, "t"));
    for (std::size_t i = 0; i < m_.size(); ++i) {
      auto a = s.buffers.find(fmt::format("exp_avg.{}", i)), b = s.buffers.find(fmt::format("exp_avg_sq.{}", i));
      SHARD_CHECK((a == s.buffers.end()) == (b == s.buffers.end()), "Optimizer::load_state",
                  "Adam state of parameter {} has one moment without the other", i);
      if (a == s.buffers.end()) {
        m_[i] = Tensor<double, 1>();
        v_[i] = Tensor<double, 1>();
        continue;
      }
      const index_t n = this->params_[i]->numel();
      const Device dev = this->params_[i]->device();
      detail::import_buffer(m_[i], a->second, n, dev, a->first);
      detail::import_buffer(v_[i], b->second, n, dev, b->first);
    }
  }

 private:
  Options o_;
  bool decoupled_;
  long t_ = 0;
  std::vector<Tensor<double, 1>> m_, v_;  // moments kept in double for fp32 parameters too, on the parameter's device
};

/// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter).
template <class T>
class AdamW final : public Adam<T> {
 public:
  using Options = typename Adam<T>::Options;
  AdamW(std::vector<std::shared_ptr<nn::ParameterBase<T>>> params, Options o) : Adam<T>(std::move(params), o, true) {}
};

/// Cosine decay from base_lr to min_lr over total_steps after a linear warm-up of warmup_steps.
class CosineWarmup {
 public:
  CosineWarmup(double base_lr, long warmup_steps, long total_steps, double min_lr = 0)
      : base_(base_lr), min_(min_lr), warm_(warmup_steps), total_(total_steps) {
    SHARD_CHECK(warmup_steps >= 0 && total_steps > 0 && warmup_steps <= total_steps, "CosineWarmup",
                "need 0 <= warmup ({}) <= total ({}) and total > 0", warmup_steps, total_steps);
  }
  /// Learning rate for 0-based `step`.
  double operator()(long step) const {
    if (step < warm_) return base_ * static_cast<double>(step + 1) / static_cast<double>(warm_);
    if (step >= total_) return min_;
    const double t = static_cast<double>(step - warm_) / static_cast<double>(std::max(1L, total_ - warm_));
    return min_ + 0.5 * (base_ - min_) * (1 + std::cos(3.141592653589793 * t));
  }

 private:
  double base_, min_;
  long warm_, total_;
};

}  // namespace shard::optim
