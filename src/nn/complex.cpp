// The element loops of the complex ops (include/shardtensor/nn/functional/complex.hpp), forward and
// backward, in one place: type-erased on contiguous host Blocks of c64/c128 and their real parts
// (f32/f64). The pointwise exec family is real-only, so these loops do not go through it; there
// are no CUDA kernels (device blocks are refused with "complex on CUDA not implemented").
#include <complex>

#include "shardtensor/nn/functional/complex.hpp"

namespace shard::nn::functional::detail {
namespace {

template <class F>
void for_n(index_t n, F&& f) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (index_t i = 0; i < n; ++i) f(i);
}

/// What a kernel reads from operand a / b and writes to out: 'c' complex, 'r' real, '-' unused.
struct Roles {
  char a, b, out;
};
Roles roles_of(ComplexKernel k) {
  switch (k) {
    case ComplexKernel::real:
    case ComplexKernel::imag:
    case ComplexKernel::abs_squared:
    case ComplexKernel::abs: return {'c', '-', 'r'};
    case ComplexKernel::make: return {'r', 'r', 'c'};
    case ComplexKernel::conj:
    case ComplexKernel::scale: return {'c', '-', 'c'};
    case ComplexKernel::add:
    case ComplexKernel::mul:
    case ComplexKernel::mul_conj: return {'c', 'c', 'c'};
    case ComplexKernel::mul_real:
    case ComplexKernel::abs_backward: return {'c', 'r', 'c'};
    case ComplexKernel::re_mul_conj: return {'c', 'c', 'r'};
  }
  return {'-', '-', '-'};
}

void check_block(const Block& b, char role, DType cdt, index_t n, const char* what, const char* op) {
  if (role == '-') return;
  check_complex_host(b.device, op);
  const DType want = role == 'c' ? cdt : (cdt == DType::c64 ? DType::f32 : DType::f64);
  SHARD_CHECK(b.dtype == want, op, "{} has dtype {}, expected {}", what, b.dtype, want);
  SHARD_CHECK(b.numel() == n, op, "{} has {} elements, expected {}", what, b.numel(), n);
  SHARD_CHECK(b.is_contiguous(), op, "{} must be contiguous", what);
}

template <class T>
void run(ComplexKernel k, std::complex<double> sd, const Block& a, const Block& b, const Block& out) {
  using C = std::complex<T>;
  const C s(static_cast<T>(sd.real()), static_cast<T>(sd.imag()));
  const index_t n = out.numel();
  const C* ca = static_cast<const C*>(a.data);
  const C* cb = static_cast<const C*>(b.data);
  const T* ra = static_cast<const T*>(a.data);
  const T* rb = static_cast<const T*>(b.data);
  C* co = static_cast<C*>(out.data);
  T* ro = static_cast<T*>(out.data);
  switch (k) {
    case ComplexKernel::real: for_n(n, [&](index_t i) { ro[i] = ca[i].real(); }); return;
    case ComplexKernel::imag: for_n(n, [&](index_t i) { ro[i] = ca[i].imag(); }); return;
    case ComplexKernel::make:
      for_n(n, [&](index_t i) { co[i] = C(ra ? ra[i] : T(0), rb ? rb[i] : T(0)); });
      return;
    case ComplexKernel::conj: for_n(n, [&](index_t i) { co[i] = s * std::conj(ca[i]); }); return;
    case ComplexKernel::abs_squared: {
      const T f = s.real();
      for_n(n, [&](index_t i) { ro[i] = f * std::norm(ca[i]); });
      return;
    }
    case ComplexKernel::abs: for_n(n, [&](index_t i) { ro[i] = std::abs(ca[i]); }); return;
    case ComplexKernel::scale: for_n(n, [&](index_t i) { co[i] = s * ca[i]; }); return;
    case ComplexKernel::add: for_n(n, [&](index_t i) { co[i] = ca[i] + s * cb[i]; }); return;
    case ComplexKernel::mul: for_n(n, [&](index_t i) { co[i] = s * (ca[i] * cb[i]); }); return;
    case ComplexKernel::mul_conj: for_n(n, [&](index_t i) { co[i] = s * (ca[i] * std::conj(cb[i])); }); return;
    case ComplexKernel::mul_real: for_n(n, [&](index_t i) { co[i] = s * (ca[i] * rb[i]); }); return;
    case ComplexKernel::re_mul_conj:
      for_n(n, [&](index_t i) { ro[i] = (s * (ca[i] * std::conj(cb[i]))).real(); });
      return;
    case ComplexKernel::abs_backward:
      for_n(n, [&](index_t i) {
        const T m = std::abs(ca[i]);
        co[i] = m > T(0) ? ca[i] * (rb[i] / m) : C(0);
      });
      return;
  }
}

}  // namespace

void complex_pointwise(ComplexKernel k, std::complex<double> s, const Block& a, const Block& b, const Block& out,
                       const char* op) {
  const Roles r = roles_of(k);
  check_complex_host(out.device, op);
  // The complex dtype of the kernel: out's when out is complex, else a's.
  const DType cdt = r.out == 'c' ? out.dtype : a.dtype;
  SHARD_CHECK(cdt == DType::c64 || cdt == DType::c128, op, "expected a complex (c64, c128) tensor, got {}", cdt);
  const index_t n = out.numel();
  check_block(out, r.out, cdt, n, "the output", op);
  // make reads a null block as zeros (the gradients of real and imag).
  const bool a_zero = k == ComplexKernel::make && a.data == nullptr;
  const bool b_zero = k == ComplexKernel::make && b.data == nullptr;
  if (!a_zero) check_block(a, r.a, cdt, n, "the first operand", op);
  if (!b_zero) check_block(b, r.b, cdt, n, "the second operand", op);
  SHARD_CHECK(!(a_zero && b_zero) || n == 0, op, "both parts are missing");
  if (n == 0) return;
  if (cdt == DType::c64) run<float>(k, s, a, b, out);
  else run<double>(k, s, a, b, out);
}

std::complex<double> complex_sum(const Block& x, const char* op) {
  check_complex_host(x.device, op);
  SHARD_CHECK(x.dtype == DType::c64 || x.dtype == DType::c128, op, "expected a complex (c64, c128) tensor, got {}",
              x.dtype);
  SHARD_CHECK(x.is_contiguous(), op, "the input must be contiguous");
  const index_t n = x.numel();
  double re = 0, im = 0;
  auto accumulate = [&](const auto* p) {
#pragma omp parallel for reduction(+ : re, im) schedule(static) if (n > (1 << 16))
    for (index_t i = 0; i < n; ++i) {
      re += static_cast<double>(p[i].real());
      im += static_cast<double>(p[i].imag());
    }
  };
  if (n == 0) return {};
  if (x.dtype == DType::c64) accumulate(static_cast<const std::complex<float>*>(x.data));
  else accumulate(static_cast<const std::complex<double>*>(x.data));
  return {re, im};
}

}  // namespace shard::nn::functional::detail
