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
// forced inline on the host too: the CPU loops over these formulas vectorise only if the whole
// formula is inlined into the loop body (GCC's size heuristics otherwise keep the larger ones,
// e.g. the normal CDF, as a per-element call)
#define SHARD_HD inline __attribute__((always_inline))
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
/// The host helpers below are forced inline: a loop vectorises only if they are inlined into it,
/// and GCC's size heuristics declined the normal CDF in the baseline (4-wide) loop, which then
/// called it per element through the PLT (5x slower than glibc's erff).
#define SHARD_VEC_INLINE inline __attribute__((always_inline))

/// exp(t + lo) in float on the host, branch-free (vectorises), for t + lo in [-125, 2] with lo
/// carrying what t cannot hold (the low part of an exactly split -x^2 / 2): Cody-Waite reduction
/// t + lo = k ln2 + r, the reduction's t - k ln2_hi exact, lo added to the small remainder,
/// Cephes' degree-6 polynomial for exp(r), and 2^k applied as two exact halves so that a
/// subnormal result rounds once. Results below 2^-149 round to 0. The sigmoid calls it with lo = 0
/// (then bit for bit the reduction without lo), the normal CDF with the split -x^2 / 2.
SHARD_VEC_INLINE float exp_sum_f32_host(float t, float lo) {
  const float kf = ((t + lo) * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round((t + lo) log2 e)
  const float r = ((t - kf * 0.693359375f) + lo) - kf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const auto k = static_cast<std::int32_t>(kf);  // in [-181, 3]
  const std::int32_t k1 = k / 2, k2 = k - k1;
  const std::int32_t b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  return y * s1 * s2;
}

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
SHARD_VEC_INLINE float sigmoid_f32_host(float x) {
  const float ax = std::fabs(x);
  std::int32_t ai;
  std::memcpy(&ai, &ax, sizeof ai);
  const std::int32_t nan = -static_cast<std::int32_t>(ai > 0x7f800000);  // all ones for a NaN
  ai = ai > 0x42d00000 ? 0x42d00000 : ai;                                 // min(|x|, 104) (NaN: 104)
  float a;
  std::memcpy(&a, &ai, sizeof a);
  const float e = exp_sum_f32_host(-a, 0.0f);  // exp(-|x|), in [2^-150, 1]: 0 below
  const float v = (x >= 0.0f ? 1.0f : e) / (1.0f + e);
  std::int32_t vb;
  std::memcpy(&vb, &v, sizeof vb);
  vb |= nan & 0x7fc00000;
  float out;
  std::memcpy(&out, &vb, sizeof out);
  return out;
}

/// The standard normal CDF Phi(x) = 0.5 erfc(-x / sqrt 2) of the exact GELU (x Phi(x)) in float on
/// the host, branch-free so that the CPU GELU loops vectorise (glibc's erff is a scalar call: GELU
/// was ~19 % of the f32 ViT CPU step), plus the split -x^2 / 2 = hi + lo the backward's density
/// exp(-x^2 / 2) / sqrt(2 pi) reuses.
///  - |x| < 1 / sqrt 2: 0.5 + 0.5 erf(z), z = x / sqrt 2, erf by its Taylor series to z^17
///    (truncation < 1e-10 relative).
///  - otherwise 0.5 erfc(|z|) (x < 0) or 1 - 0.5 erfc(|z|): erfc(a) = t exp(-a^2 + P(t)),
///    t = 1 / (1 + a / 2), with the degree-9 P of Numerical Recipes' erfcc (fractional error
///    < 1.2e-7 for every a >= 0). -a^2 = -x^2 / 2 is split exactly (x with its low 12 mantissa
///    bits cleared squares exactly), so the tail keeps its relative accuracy: the form
///    0.5 x (1 + erf(z)) cancels there (1 + erf(z) is a multiple of 2^-24 near 0).
/// Measured against double erfc / exp over every 97th float (and on a grid in
/// tests/nn/test_pointwise_activation.cpp): Phi within 6.1 ulp, x Phi(x) within 6.7 ulp where Phi
/// is a normal float (10 ulp where it is subnormal, x < -13.1), the backward
/// Phi + x phi within 6 ulp of its larger term (it cancels near x = -0.7518). The erf form was
/// within 2 ulp for |x| < 1 and off by up to 1.7e7 ulp for x < -4. |x| is clamped at 15 (Phi
/// and exp(-x^2 / 2) are 0 or 1 in float beyond 14.9) through its bits, so a NaN is clamped too
/// and comes back through the factor x. Same FMA rule as sigmoid_f32_host.
struct NormalCdfF32 {
  float cdf;     ///< Phi(x)
  float hi, lo;  ///< -x^2 / 2 = hi + lo (|x| clamped at 15); hi exact
};
SHARD_VEC_INLINE NormalCdfF32 normal_cdf_f32_host(float x) {
  const float ax0 = std::fabs(x);
  std::int32_t ai;
  std::memcpy(&ai, &ax0, sizeof ai);
  ai = ai > 0x41700000 ? 0x41700000 : ai;  // min(|x|, 15) (NaN: 15)
  float ax, xs;
  std::memcpy(&ax, &ai, sizeof ax);
  const std::int32_t si = ai & ~0xfff;  // 12 significant bits: xs * xs is exact
  std::memcpy(&xs, &si, sizeof xs);
  const float hi = -0.5f * (xs * xs);
  const float lo = -0.5f * ((ax - xs) * (ax + xs));
  const float a = ax * 0.70710678118654752f;  // |z|
  const float t = 1.0f / (1.0f + 0.5f * a);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float h = 0.5f * t * exp_sum_f32_host(hi, lo + p);  // 0.5 erfc(a)
  const float z = x * 0.70710678118654752f, z2 = z * z;
  float q = -1.492565036e-05f;  // erf(z) / z: 2 / sqrt(pi) sum (-1)^n z^2n / (n! (2n + 1))
  q = q * z2 + 1.205533298e-04f;
  q = q * z2 - 8.548327023e-04f;
  q = q * z2 + 5.223977625e-03f;
  q = q * z2 - 2.686617065e-02f;
  q = q * z2 + 1.128379167e-01f;
  q = q * z2 - 3.761263890e-01f;
  q = q * z2 + 1.128379167e+00f;
  const float near0 = 0.5f + 0.5f * (z * q), upper = 1.0f - h;
  // The selections as integer masks: GCC sinks each float operation into the branch that uses it
  // and then cannot if-convert it (-ftrapping-math), which leaves the loop scalar.
  std::int32_t xb, nb, ub, hb;
  std::memcpy(&xb, &x, sizeof xb);
  std::memcpy(&nb, &near0, sizeof nb);
  std::memcpy(&ub, &upper, sizeof ub);
  std::memcpy(&hb, &h, sizeof hb);
  const std::int32_t pos = ~(xb >> 31);                          // all ones where x >= +0
  const std::int32_t small = -static_cast<std::int32_t>(ai < 0x3f3504f3);  // |x| < 1 / sqrt 2
  const std::int32_t tb = (ub & pos) | (hb & ~pos);
  const std::int32_t cb = (nb & small) | (tb & ~small);
  float cdf;
  std::memcpy(&cdf, &cb, sizeof cdf);
  return {cdf, hi, lo};
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
  else if constexpr (Op == u_gelu) {
#if !defined(__CUDACC__)
    if constexpr (std::is_same<T, float>::value) return v * normal_cdf_f32_host(v).cdf;  // host float
#endif
    return static_cast<T>(0.5) * v * (T(1) + std::erf(v * static_cast<T>(0.70710678118654752440)));
  }
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
#if !defined(__CUDACC__)
    if constexpr (std::is_same<T, float>::value) {  // host float: the vectorisable form
      const NormalCdfF32 c = normal_cdf_f32_host(v);
      return g * (c.cdf + v * (exp_sum_f32_host(c.hi, c.lo) * 0.39894228040143267794f));
    }
#endif
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
