#pragma once
// Pointwise formulas shared by the CPU kernels (src/exec/pointwise_cpu.cpp) and the CUDA kernels
// (kernels/pointwise.cu), so both devices evaluate the same expressions. Plain C++17 (kernel
// firewall: no fmt, no public headers). Op codes match shard::exec::UnaryOp / BinaryOp.
#include <cmath>
#include <type_traits>

#if defined(__CUDACC__)
#define SHARD_HD __host__ __device__ __forceinline__
#else
#define SHARD_HD inline
#endif

namespace shard::kernels::pw {

/// Unary op codes (values of shard::exec::UnaryOp).
enum Unary : int {
  u_neg, u_square, u_sqrt, u_exp, u_log, u_abs, u_relu, u_leaky_relu, u_gelu, u_gelu_tanh, u_silu, u_tanh,
  u_sigmoid, u_add_scalar, u_rsub_scalar, u_mul_scalar, u_div_scalar, u_rdiv_scalar, u_count
};
/// Binary op codes (values of shard::exec::BinaryOp).
enum Binary : int { b_add, b_sub, b_mul, b_div, b_count };

/// Logistic function, stable for large |x|.
template <class T> SHARD_HD T sigmoid_value(T x) {
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}

/// y = op(v); `a` is the op's scalar (slope of leaky_relu, the scalar of *_scalar ops).
template <int Op, class T> SHARD_HD T unary_fwd(T v, T a) {
  (void)a;
  if constexpr (Op == u_neg) return -v;
  else if constexpr (Op == u_square) return v * v;
  else if constexpr (Op == u_sqrt) return std::sqrt(v);
  else if constexpr (Op == u_exp) return std::exp(v);
  else if constexpr (Op == u_log) return std::log(v);
  else if constexpr (Op == u_abs) return std::abs(v);
  else if constexpr (Op == u_relu) return v > T(0) ? v : T(0);
  else if constexpr (Op == u_leaky_relu) return v > T(0) ? v : a * v;
  else if constexpr (Op == u_gelu)
    return static_cast<T>(0.5) * v * (T(1) + std::erf(v * static_cast<T>(0.70710678118654752440)));
  else if constexpr (Op == u_gelu_tanh) {
    constexpr T k = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)
    constexpr T c = static_cast<T>(0.044715);
    return static_cast<T>(0.5) * v * (T(1) + std::tanh(k * (v + c * v * v * v)));
  } else if constexpr (Op == u_silu) return v * sigmoid_value(v);
  else if constexpr (Op == u_tanh) return std::tanh(v);
  else if constexpr (Op == u_sigmoid) return sigmoid_value(v);
  else if constexpr (Op == u_add_scalar) return v + a;
  else if constexpr (Op == u_rsub_scalar) return a - v;
  else if constexpr (Op == u_mul_scalar) return v * a;
  else if constexpr (Op == u_div_scalar) return v / a;
  else return a / v;  // u_rdiv_scalar
}

/// dx = g * d op / dv at input v with output y.
template <int Op, class T> SHARD_HD T unary_bwd(T v, T y, T g, T a) {
  (void)v, (void)y, (void)a;
  if constexpr (Op == u_neg) return -g;
  else if constexpr (Op == u_square) return T(2) * v * g;
  else if constexpr (Op == u_sqrt) return g / (T(2) * y);
  else if constexpr (Op == u_exp) return g * y;
  else if constexpr (Op == u_log) return g / v;
  else if constexpr (Op == u_abs) return v > T(0) ? g : (v < T(0) ? -g : T(0));
  else if constexpr (Op == u_relu) return v > T(0) ? g : T(0);
  else if constexpr (Op == u_leaky_relu) return v > T(0) ? g : a * g;
  else if constexpr (Op == u_gelu) {
    const T cdf = static_cast<T>(0.5) * (T(1) + std::erf(v * static_cast<T>(0.70710678118654752440)));
    const T pdf = std::exp(static_cast<T>(-0.5) * v * v) * static_cast<T>(0.39894228040143267794);
    return g * (cdf + v * pdf);
  } else if constexpr (Op == u_gelu_tanh) {
    constexpr T k = static_cast<T>(0.7978845608028654);
    constexpr T c = static_cast<T>(0.044715);
    const T t = std::tanh(k * (v + c * v * v * v));
    const T dt = (T(1) - t * t) * k * (T(1) + T(3) * c * v * v);
    return g * (static_cast<T>(0.5) * (T(1) + t) + static_cast<T>(0.5) * v * dt);
  } else if constexpr (Op == u_silu) {
    const T s = sigmoid_value(v);
    return g * s * (T(1) + v * (T(1) - s));
  } else if constexpr (Op == u_tanh) return g * (T(1) - y * y);
  else if constexpr (Op == u_sigmoid) return g * y * (T(1) - y);
  else if constexpr (Op == u_add_scalar) return g;
  else if constexpr (Op == u_rsub_scalar) return -g;
  else if constexpr (Op == u_mul_scalar) return g * a;
  else if constexpr (Op == u_div_scalar) return g / a;
  else return -g * y / v;  // u_rdiv_scalar
}

/// The type an activation fused into another op (the norms) is evaluated in for storage type T:
/// double for f64, float for everything else (f32, bf16, f16), as the activation op itself
/// computes it. One definition for the CPU and CUDA tables.
template <class T>
using act_t = typename std::conditional<std::is_same<T, double>::value, double, float>::type;

/// unary_fwd with a run-time op code, for the activations a norm fuses (relu, gelu, gelu_tanh,
/// silu, tanh, sigmoid: exec::NormAct); any other code (none: -1) returns v.
template <class T> SHARD_HD T act_fwd(int op, T v) {
  switch (op) {
    case u_relu: return unary_fwd<u_relu>(v, T(0));
    case u_gelu: return unary_fwd<u_gelu>(v, T(0));
    case u_gelu_tanh: return unary_fwd<u_gelu_tanh>(v, T(0));
    case u_silu: return unary_fwd<u_silu>(v, T(0));
    case u_tanh: return unary_fwd<u_tanh>(v, T(0));
    case u_sigmoid: return unary_fwd<u_sigmoid>(v, T(0));
    default: return v;
  }
}
/// g * act'(v) for one activation Op (unary_bwd's formula; the output recomputed where the
/// formula reads it: tanh, sigmoid).
template <int Op, class T> SHARD_HD T act_grad(T v, T g) {
  if constexpr (Op == u_tanh || Op == u_sigmoid) return unary_bwd<Op, T>(v, unary_fwd<Op, T>(v, T(0)), g, T(0));
  else return unary_bwd<Op, T>(v, T(0), g, T(0));
}
/// act_grad with a run-time code (those of act_fwd); any other code returns g.
template <class T> SHARD_HD T act_bwd(int op, T v, T g) {
  switch (op) {
    case u_relu: return act_grad<u_relu>(v, g);
    case u_gelu: return act_grad<u_gelu>(v, g);
    case u_gelu_tanh: return act_grad<u_gelu_tanh>(v, g);
    case u_silu: return act_grad<u_silu>(v, g);
    case u_tanh: return act_grad<u_tanh>(v, g);
    case u_sigmoid: return act_grad<u_sigmoid>(v, g);
    default: return g;
  }
}

/// a (op) b.
template <int Op, class T> SHARD_HD T binary_fwd(T x, T y) {
  if constexpr (Op == b_add) return x + y;
  else if constexpr (Op == b_sub) return x - y;
  else if constexpr (Op == b_mul) return x * y;
  else return x / y;
}

/// Gradient of a / b with respect to b: -g * (a / b^2).
template <class T> SHARD_HD T div_rhs_grad(T g, T x, T y) { return -g * (x / (y * y)); }

}  // namespace shard::kernels::pw
