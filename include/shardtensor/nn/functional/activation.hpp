#pragma once
/// \file activation.hpp
/// Differentiable elementwise activations on sharded tensors: relu, leaky_relu, gelu (exact erf
/// by default, tanh approximation on request), silu, tanh, sigmoid. Purely local: the result has
/// the input's spec, the gradient the input's spec. Partial inputs are refused (resolve first).
#include <cmath>

#include "shardtensor/nn/functional/pointwise.hpp"

namespace shard::nn::functional {

/// Which GELU: the exact x * Phi(x) with the Gauss error function (PyTorch's default,
/// approximate='none'), or the tanh approximation (approximate='tanh').
enum class GeluApprox { none, tanh };

namespace detail {
/// Logistic function, stable for large |x|.
template <class T> inline T sigmoid_value(T x) {
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}
}  // namespace detail

/// max(x, 0); gradient 1 where x > 0, else 0 (0 at x == 0).
template <class T, int R>
Var<T, R> relu(const Var<T, R>& x) {
  return detail::unary_op(
      x, "relu", [](T v) { return v > T(0) ? v : T(0); }, [](T v, T, T g) { return v > T(0) ? g : T(0); });
}

/// x for x > 0, slope * x otherwise.
template <class T, int R>
Var<T, R> leaky_relu(const Var<T, R>& x, double negative_slope = 0.01) {
  const T a = static_cast<T>(negative_slope);
  return detail::unary_op(
      x, "leaky_relu", [a](T v) { return v > T(0) ? v : a * v; }, [a](T v, T, T g) { return v > T(0) ? g : a * g; });
}

/// GELU. Default: exact, 0.5 x (1 + erf(x / sqrt 2)) (matches torch.nn.GELU()); GeluApprox::tanh:
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class T, int R>
Var<T, R> gelu(const Var<T, R>& x, GeluApprox approx = GeluApprox::none) {
  if (approx == GeluApprox::none) {
    return detail::unary_op(
        x, "gelu",
        [](T v) { return static_cast<T>(0.5) * v * (T(1) + std::erf(v * static_cast<T>(0.70710678118654752440))); },
        [](T v, T, T g) {
          const T cdf = static_cast<T>(0.5) * (T(1) + std::erf(v * static_cast<T>(0.70710678118654752440)));
          const T pdf = std::exp(static_cast<T>(-0.5) * v * v) * static_cast<T>(0.39894228040143267794);
          return g * (cdf + v * pdf);
        });
  }
  constexpr T k = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)
  constexpr T c = static_cast<T>(0.044715);
  return detail::unary_op(
      x, "gelu_tanh",
      [](T v) { return static_cast<T>(0.5) * v * (T(1) + std::tanh(k * (v + c * v * v * v))); },
      [](T v, T, T g) {
        const T t = std::tanh(k * (v + c * v * v * v));
        const T dt = (T(1) - t * t) * k * (T(1) + T(3) * c * v * v);
        return g * (static_cast<T>(0.5) * (T(1) + t) + static_cast<T>(0.5) * v * dt);
      });
}

/// SiLU (swish): x * sigmoid(x).
template <class T, int R>
Var<T, R> silu(const Var<T, R>& x) {
  return detail::unary_op(
      x, "silu", [](T v) { return v * detail::sigmoid_value(v); },
      [](T v, T, T g) {
        const T s = detail::sigmoid_value(v);
        return g * s * (T(1) + v * (T(1) - s));
      });
}

/// tanh(x).
template <class T, int R>
Var<T, R> tanh(const Var<T, R>& x) {
  return detail::unary_op(
      x, "tanh", [](T v) { return std::tanh(v); }, [](T, T y, T g) { return g * (T(1) - y * y); });
}

/// 1 / (1 + exp(-x)).
template <class T, int R>
Var<T, R> sigmoid(const Var<T, R>& x) {
  return detail::unary_op(
      x, "sigmoid", [](T v) { return detail::sigmoid_value(v); }, [](T, T y, T g) { return g * y * (T(1) - y); });
}

}  // namespace shard::nn::functional
