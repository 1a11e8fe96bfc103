#pragma once
/// \file activation.hpp
/// Differentiable elementwise activations on sharded tensors: relu, leaky_relu, gelu (exact erf
/// by default, tanh approximation on request), silu, tanh, sigmoid. Purely local: the result has
/// the input's spec, the gradient the input's spec. Partial inputs are refused (resolve first).
#include "shardtensor/nn/functional/pointwise.hpp"

namespace shard::nn::functional {

/// Which GELU: the exact x * Phi(x) with the Gauss error function (PyTorch's default,
/// approximate='none'), or the tanh approximation (approximate='tanh').
enum class GeluApprox { none, tanh };

/// max(x, 0); gradient 1 where x > 0, else 0 (0 at x == 0).
template <class T, int R>
Var<T, R> relu(const Var<T, R>& x) {
  return detail::unary_op(x, "relu", exec::UnaryOp::relu);
}

/// x for x > 0, slope * x otherwise.
template <class T, int R>
Var<T, R> leaky_relu(const Var<T, R>& x, double negative_slope = 0.01) {
  return detail::unary_op(x, "leaky_relu", exec::UnaryOp::leaky_relu,
                          static_cast<double>(static_cast<T>(negative_slope)));
}

/// GELU. Default: exact, 0.5 x (1 + erf(x / sqrt 2)) (matches torch.nn.GELU()); GeluApprox::tanh:
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class T, int R>
Var<T, R> gelu(const Var<T, R>& x, GeluApprox approx = GeluApprox::none) {
  if (approx == GeluApprox::none) return detail::unary_op(x, "gelu", exec::UnaryOp::gelu);
  return detail::unary_op(x, "gelu_tanh", exec::UnaryOp::gelu_tanh);
}

/// SiLU (swish): x * sigmoid(x).
template <class T, int R>
Var<T, R> silu(const Var<T, R>& x) {
  return detail::unary_op(x, "silu", exec::UnaryOp::silu);
}

/// tanh(x).
template <class T, int R>
Var<T, R> tanh(const Var<T, R>& x) {
  return detail::unary_op(x, "tanh", exec::UnaryOp::tanh);
}

/// 1 / (1 + exp(-x)).
template <class T, int R>
Var<T, R> sigmoid(const Var<T, R>& x) {
  return detail::unary_op(x, "sigmoid", exec::UnaryOp::sigmoid);
}

}  // namespace shard::nn::functional
