#pragma once
/// \file optimizer.hpp
/// Optimisers over replicated parameters: SGD (momentum, Nesterov, weight decay), Adam, AdamW,
/// and a cosine learning-rate schedule with linear warm-up. Parameter gradients arrive already
/// reduced over every mesh dim (domain and data-parallel) by the autograd tape, so each rank
/// applies the same update and parameters stay replicated without further communication.
#include <cmath>
#include <memory>
#include <vector>

#include "shardtensor/nn/parameter.hpp"

namespace shard::optim {

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
  void set_lr(double lr) { lr_ = lr; }
  const std::vector<std::shared_ptr<nn::ParameterBase<T>>>& params() const { return params_; }

 protected:
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
    for (std::size_t i = 0; i < this->params_.size(); ++i) {
      auto& p = *this->params_[i];
      const T* g = p.grad();
      if (!g) continue;
      T* w = p.data();
      const index_t n = p.numel();
      if (o_.momentum > 0 && buf_[i].empty()) buf_[i].assign(static_cast<std::size_t>(n), T(0));
      const T lr = static_cast<T>(this->lr_), mu = static_cast<T>(o_.momentum), wd = static_cast<T>(o_.weight_decay);
      for (index_t k = 0; k < n; ++k) {
        T d = g[k] + wd * w[k];
        if (o_.momentum > 0) {
          T& v = buf_[i][static_cast<std::size_t>(k)];
          v = mu * v + d;
          d = o_.nesterov ? d + mu * v : v;
        }
        w[k] -= lr * d;
      }
    }
  }

 private:
  Options o_;
  std::vector<std::vector<T>> buf_;
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
    ++t_;
    const double bc1 = 1 - std::pow(o_.beta1, t_), bc2 = 1 - std::pow(o_.beta2, t_);
    for (std::size_t i = 0; i < this->params_.size(); ++i) {
      auto& p = *this->params_[i];
      const T* g = p.grad();
      if (!g) continue;
      T* w = p.data();
      const index_t n = p.numel();
      if (m_[i].empty()) {
        m_[i].assign(static_cast<std::size_t>(n), 0.0);
        v_[i].assign(static_cast<std::size_t>(n), 0.0);
      }
      for (index_t k = 0; k < n; ++k) {
        double gk = g[k];
        double wk = w[k];
        if (!decoupled_) gk += o_.weight_decay * wk;
        else wk *= 1 - this->lr_ * o_.weight_decay;
        double& m = m_[i][static_cast<std::size_t>(k)];
        double& v = v_[i][static_cast<std::size_t>(k)];
        m = o_.beta1 * m + (1 - o_.beta1) * gk;
        v = o_.beta2 * v + (1 - o_.beta2) * gk * gk;
        wk -= this->lr_ * (m / bc1) / (std::sqrt(v / bc2) + o_.eps);
        w[k] = static_cast<T>(wk);
      }
    }
  }
  /// Number of steps taken.
  long steps() const { return t_; }

 private:
  Options o_;
  bool decoupled_;
  long t_ = 0;
  std::vector<std::vector<double>> m_, v_;  // moments kept in double for fp32 parameters too
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
