#pragma once
/// \file ops.hpp
/// Local elementwise arithmetic and reductions on Tensor (CPU multithreaded; CUDA via kernels/).
/// Complex element types (std::complex<float>/<double>, c64/c128): every function compiles for
/// them. On the host they work as for real types (sum accumulates in std::complex<double>,
/// max_rel_diff uses |.|; dot is real-only). On CUDA, axpy/scale/add/sub with a real factor run
/// as the real kernel over the interleaved parts (exact: real-linear); a genuinely complex factor,
/// mul and sum run the complex kernels (kernels/complex.cu) through the device's tensor table,
/// which throws shard::Error ("complex on <device> not implemented") where it has none.
#include <cmath>
#include <complex>
#include <type_traits>

#include "shardtensor/tensor/tensor.hpp"

namespace shard {

namespace detail {
/// y = alpha * x + beta * y on contiguous device buffers.
void device_axpby(DType dt, index_t n, double alpha, const void* x, double beta, void* y, Device dev);
/// out = a * b (elementwise) on contiguous device buffers.
void device_mul(DType dt, index_t n, const void* a, const void* b, void* out, Device dev);
/// Sum of a contiguous device buffer, returned in double.
double device_sum(DType dt, index_t n, const void* x, Device dev);
/// y = alpha x + beta y on contiguous complex (c64 / c128) device buffers, complex factors.
void device_axpby_complex(DType dt, index_t n, std::complex<double> alpha, const void* x, std::complex<double> beta,
                          void* y, Device dev);
/// Sum of a contiguous complex (c64 / c128) device buffer, in complex<double>.
std::complex<double> device_sum_complex(DType dt, index_t n, const void* x, Device dev);
/// Throws shard::Error naming `op` unless a and b have one shape.
/// True for std::complex<float> and std::complex<double>.
template <class T> inline constexpr bool is_complex_v = false;
template <class T> inline constexpr bool is_complex_v<std::complex<T>> = true;
/// The real type of T (T itself for real types).
template <class T> struct real_of { using type = T; };
template <class T> struct real_of<std::complex<T>> { using type = T; };
/// Accumulator of sum(): double, or std::complex<double> for complex T.
template <class T> using sum_t = std::conditional_t<is_complex_v<T>, std::complex<double>, double>;
/// The DType and element count under which a real-linear CUDA kernel sees `n` elements of T
/// (complex: the interleaved real parts, 2n of them).
template <class T> constexpr DType real_view_dtype() {
  if constexpr (is_complex_v<T>) return dtype_of<typename T::value_type>;
  else return dtype_of<T>;
}
template <class T> constexpr index_t real_view_count(index_t n) { return is_complex_v<T> ? 2 * n : n; }
/// True when `alpha` is real (always for real T): the device kernels then run the real kernel
/// over the interleaved parts; a complex factor takes the complex kernel.
template <class T> bool is_real_factor(T alpha) {
  if constexpr (is_complex_v<T>) return alpha.imag() == 0;
  else return true;
}
template <class T> double real_part(T alpha) {
  if constexpr (is_complex_v<T>) return static_cast<double>(alpha.real());
  else return static_cast<double>(alpha);
}
template <class T, int R>
void check_same_shape(const char* op, const Tensor<T, R>& a, const Tensor<T, R>& b) {
  SHARD_CHECK(a.shape() == b.shape(), op, "shapes {} and {} differ", a.shape(), b.shape());
}
}  // namespace detail

/// out[i] = f(a[i]) elementwise on host tensors of one shape (out may alias a).
template <class T, int R, class F>
void map_into(const Tensor<T, R>& out, const Tensor<T, R>& a, F&& f) {
  SHARD_CHECK(out.shape() == a.shape(), "map", "shape {} != {}", a.shape(), out.shape());
  SHARD_CHECK(out.device().is_cpu() && a.device().is_cpu(), "map", "host tensors required (got {}, {})",
              out.device(), a.device());
  out.bump_version();
  const index_t n = out.numel();
  if (out.is_contiguous() && a.is_contiguous()) {
    T* o = out.data();
    const T* x = a.data();
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
    for (index_t i = 0; i < n; ++i) o[i] = f(x[i]);
    return;
  }
  const index_t so = R ? out.stride(R - 1) : 1, sa = R ? a.stride(R - 1) : 1;
  for_each_row(out.shape(), out.strides(), a.strides(), [&](index_t oo, index_t oa, index_t len) {
    for (index_t i = 0; i < len; ++i) out.data()[oo + i * so] = f(a.data()[oa + i * sa]);
  });
}

/// out[i] = f(a[i], b[i]) elementwise on host tensors of one shape (out may alias a or b).
template <class T, int R, class F>
void zip_into(const Tensor<T, R>& out, const Tensor<T, R>& a, const Tensor<T, R>& b, F&& f) {
  SHARD_CHECK(out.shape() == a.shape() && a.shape() == b.shape(), "zip", "shapes {}, {} -> {} differ", a.shape(),
              b.shape(), out.shape());
  SHARD_CHECK(out.device().is_cpu() && a.device().is_cpu() && b.device().is_cpu(), "zip", "host tensors required");
  out.bump_version();
  const index_t n = out.numel();
  if (out.is_contiguous() && a.is_contiguous() && b.is_contiguous()) {
    T* o = out.data();
    const T* x = a.data();
    const T* y = b.data();
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
    for (index_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    return;
  }
  auto ac = a.contiguous(), bc = b.contiguous();
  if (out.is_contiguous()) return zip_into(out, ac, bc, f);
  auto tmp = Tensor<T, R>::empty(out.shape());
  zip_into(tmp, ac, bc, f);
  out.copy_from(tmp);
}

/// New tensor f(a).
template <class T, int R, class F>
Tensor<T, R> map(const Tensor<T, R>& a, F&& f) {
  auto out = Tensor<T, R>::empty(a.shape(), a.device());
  map_into(out, a, f);
  return out;
}

/// y += alpha * x (in place on y).
template <class T, int R>
void axpy(T alpha, const Tensor<T, R>& x, const Tensor<T, R>& y) {
  detail::check_same_shape("axpy", x, y);
  if (y.device().is_cuda() && x.is_contiguous() && y.is_contiguous()) {
    y.bump_version();
    if constexpr (detail::is_complex_v<T>) {
      if (!detail::is_real_factor(alpha))
        return detail::device_axpby_complex(dtype_of<T>, y.numel(), std::complex<double>(alpha), x.data(), 1.0,
                                            y.data(), y.device());
    }
    detail::device_axpby(detail::real_view_dtype<T>(), detail::real_view_count<T>(y.numel()), detail::real_part(alpha),
                         x.data(), 1.0, y.data(), y.device());
    return;
  }
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {  // one rounding, as the device path
    const float fa = static_cast<float>(alpha);
    zip_into(y, y, x, [fa](T a, T b) { return T(static_cast<float>(a) + fa * static_cast<float>(b)); });
  } else {
    zip_into(y, y, x, [alpha](T a, T b) { return a + alpha * b; });
  }
}
/// x *= alpha (in place).
template <class T, int R>
void scale(const Tensor<T, R>& x, T alpha) {
  if (x.device().is_cuda() && x.is_contiguous()) {
    x.bump_version();
    if constexpr (detail::is_complex_v<T>) {
      if (!detail::is_real_factor(alpha))
        return detail::device_axpby_complex(dtype_of<T>, x.numel(), 0.0, x.data(), std::complex<double>(alpha),
                                            x.data(), x.device());
    }
    detail::device_axpby(detail::real_view_dtype<T>(), detail::real_view_count<T>(x.numel()), 0.0, x.data(),
                         detail::real_part(alpha), x.data(), x.device());
    return;
  }
  map_into(x, x, [alpha](T a) { return a * alpha; });
}
/// a + b.
template <class T, int R>
Tensor<T, R> add(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  detail::check_same_shape("add", a, b);
  if (a.device().is_cuda()) {
    auto out = a.clone();
    axpy(T(1), b.contiguous(), out);
    return out;
  }
  auto out = Tensor<T, R>::empty(a.shape());
  zip_into(out, a, b, [](T x, T y) { return x + y; });
  return out;
}
/// a - b.
template <class T, int R>
Tensor<T, R> sub(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  detail::check_same_shape("sub", a, b);
  if (a.device().is_cuda()) {
    auto out = a.clone();
    axpy(T(-1), b.contiguous(), out);
    return out;
  }
  auto out = Tensor<T, R>::empty(a.shape());
  zip_into(out, a, b, [](T x, T y) { return x - y; });
  return out;
}
/// a * b (elementwise).
template <class T, int R>
Tensor<T, R> mul(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  detail::check_same_shape("mul", a, b);
  auto out = Tensor<T, R>::empty(a.shape(), a.device());
  if (a.device().is_cuda()) {
    auto ac = a.contiguous(), bc = b.contiguous();
    detail::device_mul(dtype_of<T>, a.numel(), ac.data(), bc.data(), out.data(), a.device());
    return out;
  }
  zip_into(out, a, b, [](T x, T y) { return x * y; });
  return out;
}

/// Sum of all elements, accumulated in double (std::complex<double> for complex T).
template <class T, int R>
detail::sum_t<T> sum(const Tensor<T, R>& a) {
  if (a.device().is_cuda()) {
    auto c = a.contiguous();
    if constexpr (detail::is_complex_v<T>) return detail::device_sum_complex(dtype_of<T>, c.numel(), c.data(), c.device());
    else return detail::device_sum(dtype_of<T>, c.numel(), c.data(), c.device());
  }
  auto c = a.contiguous();
  const T* x = c.data();
  const index_t n = c.numel();
  if constexpr (detail::is_complex_v<T>) {
    double re = 0, im = 0;
#pragma omp parallel for reduction(+ : re, im) schedule(static) if (n > (1 << 16))
    for (index_t i = 0; i < n; ++i) {
      re += static_cast<double>(x[i].real());
      im += static_cast<double>(x[i].imag());
    }
    return {re, im};
  } else {
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (n > (1 << 16))
    for (index_t i = 0; i < n; ++i) s += static_cast<double>(x[i]);
    return s;
  }
}

/// Sum of a[i]*b[i], accumulated in double.
template <class T, int R>
double dot(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  static_assert(!detail::is_complex_v<T>, "dot is real-only (for complex tensors write sum(conj(a) * b) explicitly)");
  SHARD_CHECK(a.shape() == b.shape(), "dot", "shape {} != {}", a.shape(), b.shape());
  auto ac = a.device().is_cpu() ? a.contiguous() : a.to(Device::cpu());
  auto bc = b.device().is_cpu() ? b.contiguous() : b.to(Device::cpu());
  const index_t n = ac.numel();
  double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (n > (1 << 16))
  for (index_t i = 0; i < n; ++i) s += static_cast<double>(ac.data()[i]) * static_cast<double>(bc.data()[i]);
  return s;
}

/// max_i |a[i] - b[i]| / max(max_i |b[i]|, tiny): the relative error used by the test oracle.
template <class T, int R>
double max_rel_diff(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  SHARD_CHECK(a.shape() == b.shape(), "max_rel_diff", "shape {} != {}", a.shape(), b.shape());
  auto ac = a.to(Device::cpu()), bc = b.to(Device::cpu());
  double num = 0, den = 0;
  for (index_t i = 0; i < ac.numel(); ++i) {
    if constexpr (detail::is_complex_v<T>) {
      const std::complex<double> x(ac.data()[i]), y(bc.data()[i]);
      const bool nx = std::isnan(x.real()) || std::isnan(x.imag()), ny = std::isnan(y.real()) || std::isnan(y.imag());
      if (nx != ny) return INFINITY;
      num = std::max(num, std::abs(x - y));
      den = std::max(den, std::abs(y));
    } else {
      const double x = static_cast<double>(ac.data()[i]), y = static_cast<double>(bc.data()[i]);
      if (std::isnan(x) != std::isnan(y)) return INFINITY;
      num = std::max(num, std::abs(x - y));
      den = std::max(den, std::abs(y));
    }
  }
  return num / std::max(den, 1e-300);
}

}  // namespace shard
