#pragma once
/// \file activation_layers.hpp
/// Activation modules (ReLU, GELU, SiLU, Tanh, Sigmoid, Identity) over rank-R activations, the
/// Activation enum that configurable models (ResidualBlock, UNet) take, and make_activation.
/// Parameter-free and purely local: the output has the input's spec (nn/functional/activation.hpp).
#include <memory>

#include "shardtensor/nn/functional/activation.hpp"
#include "shardtensor/nn/module.hpp"

namespace shard::nn {

/// Which pointwise nonlinearity a configurable model uses.
/// (gelu is the exact, erf form; gelu_tanh its tanh approximation, GELU(GeluApprox::tanh)'s kind.)
enum class Activation { identity, relu, gelu, silu, tanh, sigmoid, gelu_tanh };

/// Name of an activation ("silu", ...).
constexpr const char* activation_name(Activation a) {
  switch (a) {
    case Activation::identity: return "identity";
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::silu: return "silu";
    case Activation::tanh: return "tanh";
    default: return "sigmoid";
  }
}

/// Applies activation `a` to x (differentiable; identity returns x itself).
template <class T, int R>
autograd::Var<T, R> activate(Activation a, const autograd::Var<T, R>& x) {
  switch (a) {
    case Activation::identity: return x;
    case Activation::relu: return F::relu(x);
    case Activation::gelu: return F::gelu(x);
    case Activation::gelu_tanh: return F::gelu(x, F::GeluApprox::tanh);
    case Activation::silu: return F::silu(x);
    case Activation::tanh: return F::tanh(x);
    case Activation::sigmoid: return F::sigmoid(x);
  }
  SHARD_FAIL("activate", "unknown activation {}", static_cast<int>(a));
}

/// A parameter-free module applying one fixed Activation.
template <class T, int R>
class ActivationModule : public UnaryModule<T, R> {
 public:
  explicit ActivationModule(Activation a) : a_(a) {}
  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override { return activate(a_, x); }
  /// The activation applied.
  Activation kind() const { return a_; }

 private:
  Activation a_;
};

/// y = x.
template <class T, int R>
class Identity final : public ActivationModule<T, R> {
 public:
  Identity() : ActivationModule<T, R>(Activation::identity) {}
};
/// y = max(x, 0).
template <class T, int R>
class ReLU final : public ActivationModule<T, R> {
 public:
  ReLU() : ActivationModule<T, R>(Activation::relu) {}
};
/// Exact (erf) GELU, or the tanh approximation with `approx = GeluApprox::tanh`.
template <class T, int R>
class GELU final : public ActivationModule<T, R> {
 public:
  explicit GELU(F::GeluApprox approx = F::GeluApprox::none)
      : ActivationModule<T, R>(approx == F::GeluApprox::tanh ? Activation::gelu_tanh : Activation::gelu),
        approx_(approx) {}
  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override { return F::gelu(x, approx_); }
  /// Exact or the tanh approximation.
  F::GeluApprox approx() const { return approx_; }

 private:
  F::GeluApprox approx_;
};
/// y = x * sigmoid(x).
template <class T, int R>
class SiLU final : public ActivationModule<T, R> {
 public:
  SiLU() : ActivationModule<T, R>(Activation::silu) {}
};
/// y = tanh(x).
template <class T, int R>
class Tanh final : public ActivationModule<T, R> {
 public:
  Tanh() : ActivationModule<T, R>(Activation::tanh) {}
};
/// y = 1 / (1 + exp(-x)).
template <class T, int R>
class Sigmoid final : public ActivationModule<T, R> {
 public:
  Sigmoid() : ActivationModule<T, R>(Activation::sigmoid) {}
};

/// A module for activation `a`.
template <class T, int R>
std::shared_ptr<UnaryModule<T, R>> make_activation(Activation a) {
  return std::make_shared<ActivationModule<T, R>>(a);
}

}  // namespace shard::nn
