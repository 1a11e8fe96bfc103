#pragma once
// Pointwise formulas shared by the CPU kernels (src/exec/pointwise_cpu.cpp) and the CUDA kernels
// (kernels/pointwise.cu), so both devices evaluate the same expressions. Plain C++17 (kernel
// firewall: no fmt, no public headers). Op codes match shard::exec::UnaryOp / BinaryOp.
#include <cmath>
#include <cstdint>
#include <cstring>
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

#if !defined(__CUDACC__)
/// The logistic function in float on the host, branch-free so that a CPU loop over it vectorises
/// (glibc's expf is a scalar call: SiLU forward and backward were ~20 % of the CPU U-Net step).
/// e = exp(-|x|) by Cody-Waite reduction -|x| = k ln2 + r (|r| <= ln2 / 2) and Cephes' degree-6
/// polynomial for exp(r) (<= 0.98 ulp measured over [-110, 0]), 2^k applied as two exact halves
/// so that a subnormal e rounds once; then 1 / (1 + e) or e / (1 + e) by the sign of x, the
/// formula of the scalar form (worst error of the sigmoid: 2.1 ulp, the same as with glibc's
/// expf). |x| > 104 gives e = 0. Selections are integer masks or selections between two values
/// other than the operand compared (GCC does not if-convert a float clamp without
/// -ffinite-math-only): a NaN is carried as a mask and restored at the end. Host compilers only
/// (the CUDA kernels keep the device's expf), and nothing here may be contracted into an FMA
/// differently per ISA: the CPU library is built for the baseline ISA.
inline float sigmoid_f32_host(float x) {
  const float ax = std::fabs(x);
  std::int32_t ai;
  std::memcpy(&ai, &ax, sizeof ai);
  const std::int32_t nan = -static_cast<std::int32_t>(ai > 0x7f800000);  // all ones for a NaN
  ai = ai > 0x42d00000 ? 0x42d00000 : ai;                                 // min(|x|, 104) (NaN: 104)
  float a;
  std::memcpy(&a, &ai, sizeof a);
  const float t = -a;
  const float kf = (t * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(t log2 e)
  const float r = (t - kf * 0.693359375f) - kf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const auto k = static_cast<std::int32_t>(kf);  // in [-150, 0]
  const std::int32_t k1 = k / 2, k2 = k - k1;
  const std::int32_t b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  const float e = y * s1 * s2;
  const float v = (x >= 0.0f ? 1.0f : e) / (1.0f + e);
  std::int32_t vb;
  std::memcpy(&vb, &v, sizeof vb);
  vb |= nan & 0x7fc00000;
  float out;
  std::memcpy(&out, &vb, sizeof out);
  return out;
}
#endif

/// Logistic function, stable for large |x|.
template <class T> SHARD_HD T sigmoid_value(T x) {
#if !defined(__CUDACC__)
  if constexpr (std::is_same<T, float>::value) {  // host float: the vectorisable form
    return sigmoid_f32_host(x);
  } else
#endif
  {
    if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
    const T e = std::exp(x);
    return e / (T(1) + e);
  }
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
