// CPU implementation of the pointwise kernel family (the loops formerly in
// nn/functional/pointwise.hpp and activation.hpp): the op is chosen outside the loop, the loops
// are OpenMP-parallel above 2^16 elements and vectorised. Formulas: src/kernels_api/pointwise_ops.hpp.
#include <complex>
#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "exec/pointwise_kernels.hpp"
#include "exec/storage_cpu.hpp"
#include "exec/strided_rows.hpp"
#include "kernels_api/pointwise_ops.hpp"
#include "shardtensor/core/cpu_isa.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/exec/precision.hpp"

namespace shard::exec {
namespace {

namespace pw = kernels::pw;
constexpr index_t kParallelMin = index_t{1} << 16;

template <class F, int... K>
void dispatch_unary_impl(int op, F&& f, std::integer_sequence<int, K...>) {
  ((op == K ? (f(std::integral_constant<int, K>{}), 0) : 0), ...);
}
/// Calls f(std::integral_constant<int, op>) for a runtime unary op code.
template <class F> void dispatch_unary(UnaryOp op, F&& f) {
  dispatch_unary_impl(static_cast<int>(op), f, std::make_integer_sequence<int, pw::u_count>{});
}
template <class F> void dispatch_binary(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::add: f(std::integral_constant<int, pw::b_add>{}); break;
    case BinaryOp::sub: f(std::integral_constant<int, pw::b_sub>{}); break;
    case BinaryOp::mul: f(std::integral_constant<int, pw::b_mul>{}); break;
    case BinaryOp::div: f(std::integral_constant<int, pw::b_div>{}); break;
  }
}
template <class F> void pw_by_dtype(DType dt, F&& f) {
  if (dt == DType::f64) f(double{});
  else f(float{});
}

/// body(i) for i < n: an OpenMP-parallel simd loop above kParallelMin elements, else a plain simd
/// loop (no OpenMP region at all, which keeps small ops cheap).
template <class Body>
inline void simd_for(index_t n, Body body) {
  if (n > kParallelMin) {
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) body(i);
  } else {
#pragma omp simd
    for (index_t i = 0; i < n; ++i) body(i);
  }
}
/// body(r) for r < rows: OpenMP-parallel when the op has more than kParallelMin elements.
template <class Body>
inline void rows_for(index_t rows, index_t n, Body body) {
  if (n > kParallelMin) {
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < rows; ++r) body(r);
  } else {
    for (index_t r = 0; r < rows; ++r) body(r);
  }
}

/// The ops whose f32 loops have AVX2 and AVX-512 forms: SiLU and sigmoid (pw::sigmoid_f32_host),
/// the exact GELU (pw::normal_cdf_f32_host).
template <int Op>
constexpr bool vec_family = Op == pw::u_silu || Op == pw::u_sigmoid || Op == pw::u_gelu;

#if defined(__x86_64__) || defined(__i386__)
// The f32 SiLU / sigmoid / GELU loops 8 floats wide at the avx2 level of cpu_isa() and 16 wide at
// avx512 (the baseline build vectorises them 4 wide). Nothing may be contracted: target("avx2")
// has no "fma", and the AVX-512 form (whose ISA has its own FMA instructions, which GCC contracts
// into in C++ by default) says fp-contract=off. The same IEEE operations in the same order give
// the same bits at every level and as the norms' fused activation (tests/nn/test_norm.cpp
// asserts fused == separate bit for bit at each level: the ISA lanes run it at scalar and avx2).
#define SHARD_VEC_LOOPS(suffix, attrs)                                                                       \
  template <int Op>                                                                                        \
  attrs void vec_fwd_##suffix(index_t n, float a, const float* x, float* y) {                              \
    _Pragma("omp simd") for (index_t i = 0; i < n; ++i) y[i] = pw::unary_fwd<Op, float>(x[i], a);         \
  }                                                                                                        \
  template <int Op>                                                                                        \
  attrs void vec_bwd_##suffix(index_t n, float a, const float* x, const float* y, const float* g, float* dx) { \
    _Pragma("omp simd") for (index_t i = 0; i < n; ++i) dx[i] = pw::unary_bwd<Op, float>(x[i], y[i], g[i], a); \
  }
SHARD_VEC_LOOPS(avx2, __attribute__((target("avx2"))))
#if defined(__GNUC__) && !defined(__clang__)
SHARD_VEC_LOOPS(avx512, __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2"), optimize("fp-contract=off"))))
#else
// Other compilers: no optimize attribute, and clang's `fp contract(off)` pragma does not reach the
// formulas inlined from pointwise_ops.hpp (checked: its AVX-512 loop still held FMAs), so the
// avx512 level keeps the 8-wide loops and their bits.
template <int Op>
void vec_fwd_avx512(index_t n, float a, const float* x, float* y) {
  vec_fwd_avx2<Op>(n, a, x, y);
}
template <int Op>
void vec_bwd_avx512(index_t n, float a, const float* x, const float* y, const float* g, float* dx) {
  vec_bwd_avx2<Op>(n, a, x, y, g, dx);
}
#endif
#undef SHARD_VEC_LOOPS
/// f(lo, len) over blocks of 2^14 elements, across the OpenMP threads above kParallelMin.
template <class F>
void blocks_for(index_t n, F&& f) {
  constexpr index_t kBlock = index_t{1} << 14;
  const index_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (index_t b = 0; b < blocks; ++b) f(b * kBlock, std::min(kBlock, n - b * kBlock));
}
#endif

template <class T, int Op>
void unary_loop(index_t n, T a, const T* x, T* y) {
#if defined(__x86_64__) || defined(__i386__)
  if constexpr (std::is_same_v<T, float> && vec_family<Op>) {
    if (const CpuIsa isa = cpu_isa(); isa != CpuIsa::scalar) {
      blocks_for(n, [&](index_t lo, index_t len) {
        if (isa == CpuIsa::avx512) vec_fwd_avx512<Op>(len, a, x + lo, y + lo);
        else vec_fwd_avx2<Op>(len, a, x + lo, y + lo);
      });
      return;
    }
  }
#endif
  simd_for(n, [&](index_t i) { y[i] = pw::unary_fwd<Op, T>(x[i], a); });
}
template <class T, int Op>
void unary_bwd_loop(index_t n, T a, const T* x, const T* y, const T* g, T* dx) {
#if defined(__x86_64__) || defined(__i386__)
  if constexpr (std::is_same_v<T, float> && vec_family<Op>) {
    if (const CpuIsa isa = cpu_isa(); isa != CpuIsa::scalar) {
      blocks_for(n, [&](index_t lo, index_t len) {
        if (isa == CpuIsa::avx512) vec_bwd_avx512<Op>(len, a, x + lo, y + lo, g + lo, dx + lo);
        else vec_bwd_avx2<Op>(len, a, x + lo, y + lo, g + lo, dx + lo);
      });
      return;
    }
  }
#endif
  simd_for(n, [&](index_t i) { dx[i] = pw::unary_bwd<Op, T>(x[i], y[i], g[i], a); });
}

/// y = op(x) with x strided (any strides, y's shape) and y contiguous: row by row, each row a
/// simd loop (unit inner stride) or a strided one.
template <class T, int Op>
void unary_strided_loop(const Block& x, const Block& y, T a) {
  const index_t inner = detail::row_extent(y), rows = inner ? y.numel() / inner : 0, sx = detail::row_step(x);
  const T* px = static_cast<const T*>(x.data);
  T* py = static_cast<T*>(y.data);
  rows_for(rows, rows * inner, [&](index_t r) {
    const T* xr = px + detail::row_offset(x, r);
    T* yr = py + r * inner;
    if (sx == 1) {
#pragma omp simd
      for (index_t i = 0; i < inner; ++i) yr[i] = pw::unary_fwd<Op, T>(xr[i], a);
    } else {
      for (index_t i = 0; i < inner; ++i) yr[i] = pw::unary_fwd<Op, T>(xr[i * sx], a);
    }
  });
}
/// dx = dy * op'(x, y) with x, y, dy strided and dx contiguous (row by row).
template <class T, int Op>
void unary_bwd_strided_loop(const Block& x, const Block& y, const Block& g, const Block& dx, T a) {
  const index_t inner = detail::row_extent(dx), rows = inner ? dx.numel() / inner : 0;
  const index_t sx = detail::row_step(x), sy = detail::row_step(y), sg = detail::row_step(g);
  const T* px = static_cast<const T*>(x.data);
  const T* py = static_cast<const T*>(y.data);
  const T* pg = static_cast<const T*>(g.data);
  T* pd = static_cast<T*>(dx.data);
  rows_for(rows, rows * inner, [&](index_t r) {
    const T* xr = px + detail::row_offset(x, r);
    const T* yr = py + detail::row_offset(y, r);
    const T* gr = pg + detail::row_offset(g, r);
    T* dr = pd + r * inner;
    if (sx == 1 && sy == 1 && sg == 1) {
#pragma omp simd
      for (index_t i = 0; i < inner; ++i) dr[i] = pw::unary_bwd<Op, T>(xr[i], yr[i], gr[i], a);
    } else {
      for (index_t i = 0; i < inner; ++i) dr[i] = pw::unary_bwd<Op, T>(xr[i * sx], yr[i * sy], gr[i * sg], a);
    }
  });
}

/// out[i] = f(a[i], b[i]) over out's shape; out contiguous, a and b any strides (0 = broadcast).
/// (Formerly nn::functional::detail::zip_broadcast.)
template <class T, class Fn>
void zip_broadcast(const Block& out, const Block& a, const Block& b, Fn f) {
  const index_t n = out.numel();
  if (n == 0) return;
  T* o = static_cast<T*>(out.data);
  const T* pa = static_cast<const T*>(a.data);
  const T* pb = static_cast<const T*>(b.data);
  if (a.is_contiguous() && b.is_contiguous()) {
    simd_for(n, [&](index_t i) { o[i] = f(pa[i], pb[i]); });
    return;
  }
  const int R = out.rank;
  const auto& s = out.shape;
  const index_t inner = R ? s[R - 1] : 1;
  const index_t outer = n / inner;
  const index_t ia = R ? a.strides[R - 1] : 0, ib = R ? b.strides[R - 1] : 0;
  rows_for(outer, n, [&](index_t r) {
    index_t rem = r, oa = 0, ob = 0;
    for (int d = R - 2; d >= 0; --d) {
      const index_t i = rem % s[d];
      rem /= s[d];
      oa += i * a.strides[d];
      ob += i * b.strides[d];
    }
    T* orow = o + r * inner;
    for (index_t i = 0; i < inner; ++i) orow[i] = f(pa[oa + i * ia], pb[ob + i * ib]);
  });
}

/// out[i] = f(a[i], b[i], c[i]) over out's shape (out contiguous, the others any strides).
template <class T, class Fn>
void zip3_broadcast(const Block& out, const Block& a, const Block& b, const Block& c, Fn f) {
  const index_t n = out.numel();
  if (n == 0) return;
  T* o = static_cast<T*>(out.data);
  const T* pa = static_cast<const T*>(a.data);
  const T* pb = static_cast<const T*>(b.data);
  const T* pc = static_cast<const T*>(c.data);
  const int R = out.rank;
  const auto& s = out.shape;
  const index_t inner = R ? s[R - 1] : 1;
  const index_t outer = n / inner;
  const index_t ia = R ? a.strides[R - 1] : 0, ib = R ? b.strides[R - 1] : 0, ic = R ? c.strides[R - 1] : 0;
  rows_for(outer, n, [&](index_t r) {
    index_t rem = r, oa = 0, ob = 0, oc = 0;
    for (int d = R - 2; d >= 0; --d) {
      const index_t i = rem % s[d];
      rem /= s[d];
      oa += i * a.strides[d];
      ob += i * b.strides[d];
      oc += i * c.strides[d];
    }
    T* orow = o + r * inner;
    for (index_t i = 0; i < inner; ++i) orow[i] = f(pa[oa + i * ia], pb[ob + i * ib], pc[oc + i * ic]);
  });
}

/// dst = 0; dst_view[idx] += g[idx] (accumulated in double; bf16 / f16 widened exactly and the
/// result rounded double -> float -> storage, bit for bit the f32 working-copy route). (Formerly
/// the body of nn::functional::detail::reduce_to_operand.)
template <class T>
void sum_to_impl(const Block& dst, const Block& dst_view, const Block& g) {
  const index_t nd = dst.numel();
  std::vector<double> acc(static_cast<std::size_t>(nd), 0.0);
  const index_t base = static_cast<index_t>(static_cast<const T*>(dst_view.data) - static_cast<const T*>(dst.data));
  const index_t n = g.numel();
  if (n > 0) {
    const int R = g.rank;
    const auto& s = g.shape;
    const index_t inner = R ? s[R - 1] : 1, outer = n / inner, is = R ? dst_view.strides[R - 1] : 0;
    const T* pg = static_cast<const T*>(g.data);
    double* pa = acc.data() + base;
    for (index_t r = 0; r < outer; ++r) {
      index_t rem = r, off = 0;
      for (int d = R - 2; d >= 0; --d) {
        off += (rem % s[d]) * dst_view.strides[d];
        rem /= s[d];
      }
      const T* grow = pg + r * inner;
      for (index_t i = 0; i < inner; ++i) pa[off + i * is] += storage::to_double(grow[i]);
    }
  }
  T* out = static_cast<T*>(dst.data);
  for (std::size_t i = 0; i < acc.size(); ++i) out[i] = storage::from_double<T>(acc[i]);
}

/// y[i] = (To) x[i]: through float for bf16 / f16 (their conversions are the dtype.hpp ones, round
/// to nearest even), a plain cast between f32 and f64.
template <class From, class To>
void convert_loop(index_t n, const From* x, To* y) {
  simd_for(n, [&](index_t i) {
    if constexpr (std::is_same_v<From, To>) y[i] = x[i];
    else if constexpr (std::is_same_v<To, double>) y[i] = static_cast<double>(static_cast<float>(x[i]));
    else if constexpr (std::is_same_v<From, double>) y[i] = To(static_cast<float>(x[i]));
    else y[i] = To(static_cast<float>(x[i]));
  });
}
template <> void convert_loop<double, double>(index_t n, const double* x, double* y) {
  simd_for(n, [&](index_t i) { y[i] = x[i]; });
}
template <> void convert_loop<float, double>(index_t n, const float* x, double* y) {
  simd_for(n, [&](index_t i) { y[i] = static_cast<double>(x[i]); });
}
#if defined(__x86_64__) || defined(__i386__)
/// f32 <-> f16 with F16C (every AVX2 CPU has it), used at the avx2 and avx512 levels of cpu_isa():
/// round to nearest even like shard::f16, subnormals and overflow included; only NaN payloads may
/// differ from the software conversion (a quiet NaN either way).
__attribute__((target("avx2,f16c"))) void f32_to_f16_f16c(index_t n, const float* x, f16* y) {
  index_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) y[i] = f16(x[i]);
}
__attribute__((target("avx2,f16c"))) void f16_to_f32_f16c(index_t n, const f16* x, float* y) {
  index_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  for (; i < n; ++i) y[i] = static_cast<float>(x[i]);
}
#endif
/// The F16C path for f32 <-> f16 (blocks of 2^16 elements across the OpenMP threads); false when
/// the pair is another one or the ISA level is scalar.
bool convert_f16_fast(DType from, DType to, index_t n, const void* x, void* y) {
#if defined(__x86_64__) || defined(__i386__)
  const bool f2h = from == DType::f32 && to == DType::f16, h2f = from == DType::f16 && to == DType::f32;
  if (!(f2h || h2f) || cpu_isa() == CpuIsa::scalar) return false;
  constexpr index_t kBlock = index_t{1} << 16;
  const index_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (index_t b = 0; b < blocks; ++b) {
    const index_t lo = b * kBlock, len = std::min(kBlock, n - lo);
    if (f2h) f32_to_f16_f16c(len, static_cast<const float*>(x) + lo, static_cast<f16*>(y) + lo);
    else f16_to_f32_f16c(len, static_cast<const f16*>(x) + lo, static_cast<float*>(y) + lo);
  }
  return true;
#else
  (void)from, (void)to, (void)n, (void)x, (void)y;
  return false;
#endif
}

// ---- bf16 / f16 storage, computed natively (KernelTable::native_storage). Contiguous
// operands go tile by tile: kLpTile elements of each operand converted to f32 on the stack (the
// conversions of convert() below), the f32 loop above, one rounding back per result. That is the
// same f32 kernel on the same f32 values as the F32Work route, so bit for bit its results, while
// the f32 working set stays a few KiB per thread instead of tensor-sized copies. Strided and
// broadcast operands are converted element by element in the zip loops.
constexpr index_t kLpTile = 1024;
void lp_to_f32(DType dt, index_t n, const void* x, float* y) {
  if (convert_f16_fast(dt, DType::f32, n, x, y)) return;
  if (dt == DType::bf16) convert_loop<bf16, float>(n, static_cast<const bf16*>(x), y);
  else convert_loop<f16, float>(n, static_cast<const f16*>(x), y);
}
void lp_from_f32(DType dt, index_t n, const float* x, void* y) {
  if (convert_f16_fast(DType::f32, dt, n, x, y)) return;
  if (dt == DType::bf16) convert_loop<float, bf16>(n, x, static_cast<bf16*>(y));
  else convert_loop<float, f16>(n, x, static_cast<f16*>(y));
}
/// fn(len, in, out) per tile: in[i] the f32 values of operand i's elements [lo, lo + len), out an
/// f32 tile that goes back to `dst` (which may alias an input: a tile is read before it is
/// written). OpenMP over tiles above kParallelMin elements.
template <std::size_t NI, class Fn>
void lp_tiles(DType dt, index_t n, const std::array<const void*, NI>& ins, void* dst, Fn fn) {
  const index_t tiles = (n + kLpTile - 1) / kLpTile;
  const auto at = [](const void* p, index_t lo) { return static_cast<const char*>(p) + lo * 2; };
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (index_t t = 0; t < tiles; ++t) {
    alignas(64) float buf[NI + 1][kLpTile];
    const index_t lo = t * kLpTile, len = std::min(kLpTile, n - lo);
    std::array<const float*, NI> in{};
    for (std::size_t i = 0; i < NI; ++i) {
      lp_to_f32(dt, len, at(ins[i], lo), buf[i]);
      in[i] = buf[i];
    }
    fn(len, in, buf[NI]);
    lp_from_f32(dt, len, buf[NI], static_cast<char*>(dst) + lo * 2);
  }
}
/// Calls f(S{}) with S = bf16 or f16 for a bf16 / f16 dtype.
template <class F> void by_lp_dtype(DType dt, F&& f) {
  if (dt == DType::bf16) f(bf16{});
  else f(f16{});
}

template <class F> void by_float_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f64: f(double{}); break;
    case DType::bf16: f(bf16{}); break;
    case DType::f16: f(f16{}); break;
    default: f(float{}); break;
  }
}

/// The complex element loops (exec::complex_map; moved here from src/nn/complex.cpp), OpenMP
/// over n > 65536. The CUDA table (kernels/complex.cu) writes out the same arithmetic on the parts.
template <class F>
void cx_for(index_t n, F&& f) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (index_t i = 0; i < n; ++i) f(i);
}
template <class T>
void complex_loop(ComplexOp k, std::complex<double> sd, index_t n, const void* a, const void* b, void* out) {
  using C = std::complex<T>;
  const C s(static_cast<T>(sd.real()), static_cast<T>(sd.imag()));
  const C* ca = static_cast<const C*>(a);
  const C* cb = static_cast<const C*>(b);
  const T* ra = static_cast<const T*>(a);
  const T* rb = static_cast<const T*>(b);
  C* co = static_cast<C*>(out);
  T* ro = static_cast<T*>(out);
  switch (k) {
    case ComplexOp::real: cx_for(n, [&](index_t i) { ro[i] = ca[i].real(); }); return;
    case ComplexOp::imag: cx_for(n, [&](index_t i) { ro[i] = ca[i].imag(); }); return;
    case ComplexOp::make: cx_for(n, [&](index_t i) { co[i] = C(ra ? ra[i] : T(0), rb ? rb[i] : T(0)); }); return;
    case ComplexOp::conj: cx_for(n, [&](index_t i) { co[i] = s * std::conj(ca[i]); }); return;
    case ComplexOp::abs_squared: {
      const T f = s.real();
      cx_for(n, [&](index_t i) { ro[i] = f * std::norm(ca[i]); });
      return;
    }
    case ComplexOp::abs: cx_for(n, [&](index_t i) { ro[i] = std::abs(ca[i]); }); return;
    case ComplexOp::scale: cx_for(n, [&](index_t i) { co[i] = s * ca[i]; }); return;
    case ComplexOp::add: cx_for(n, [&](index_t i) { co[i] = ca[i] + s * cb[i]; }); return;
    case ComplexOp::mul: cx_for(n, [&](index_t i) { co[i] = s * (ca[i] * cb[i]); }); return;
    case ComplexOp::mul_conj: cx_for(n, [&](index_t i) { co[i] = s * (ca[i] * std::conj(cb[i])); }); return;
    case ComplexOp::mul_real: cx_for(n, [&](index_t i) { co[i] = s * (ca[i] * rb[i]); }); return;
    case ComplexOp::re_mul_conj:
      cx_for(n, [&](index_t i) { ro[i] = (s * (ca[i] * std::conj(cb[i]))).real(); });
      return;
    case ComplexOp::abs_backward:
      cx_for(n, [&](index_t i) {
        const T m = std::abs(ca[i]);
        co[i] = m > T(0) ? ca[i] * (rb[i] / m) : C(0);
      });
      return;
  }
}
template <class C>
std::complex<double> complex_sum_loop(index_t n, const C* p) {
  double re = 0, im = 0;
#pragma omp parallel for reduction(+ : re, im) schedule(static) if (n > (1 << 16))
  for (index_t i = 0; i < n; ++i) {
    re += static_cast<double>(p[i].real());
    im += static_cast<double>(p[i].imag());
  }
  return {re, im};
}

struct CpuPointwise final : PointwiseKernels {
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void unary(UnaryOp op, double alpha, DType dt, index_t n, const void* x, void* y, ExecContext&) const override {
    if (detail::is_low_precision(dt))
      return dispatch_unary(op, [&](auto k) {
        lp_tiles<1>(dt, n, {x}, y, [&](index_t len, const auto& in, float* out) {
          unary_loop<float, decltype(k)::value>(len, static_cast<float>(alpha), in[0], out);
        });
      });
    pw_by_dtype(dt, [&](auto t) {
      using T = decltype(t);
      dispatch_unary(op, [&](auto k) {
        unary_loop<T, decltype(k)::value>(n, static_cast<T>(alpha), static_cast<const T*>(x), static_cast<T*>(y));
      });
    });
  }
  void unary_backward(UnaryOp op, double alpha, DType dt, index_t n, const void* x, const void* y, const void* dy,
                      void* dx, ExecContext&) const override {
    if (detail::is_low_precision(dt))
      return dispatch_unary(op, [&](auto k) {
        lp_tiles<3>(dt, n, {x, y, dy}, dx, [&](index_t len, const auto& in, float* out) {
          unary_bwd_loop<float, decltype(k)::value>(len, static_cast<float>(alpha), in[0], in[1], in[2], out);
        });
      });
    pw_by_dtype(dt, [&](auto t) {
      using T = decltype(t);
      dispatch_unary(op, [&](auto k) {
        unary_bwd_loop<T, decltype(k)::value>(n, static_cast<T>(alpha), static_cast<const T*>(x),
                                              static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx));
      });
    });
  }
  bool unary_strided(UnaryOp op, double alpha, const Block& x, const Block& y, ExecContext&) const override {
    pw_by_dtype(y.dtype, [&](auto t) {
      using T = decltype(t);
      dispatch_unary(op, [&](auto k) { unary_strided_loop<T, decltype(k)::value>(x, y, static_cast<T>(alpha)); });
    });
    return true;
  }
  bool unary_backward_strided(UnaryOp op, double alpha, const Block& x, const Block& y, const Block& dy,
                              const Block& dx, ExecContext&) const override {
    pw_by_dtype(dx.dtype, [&](auto t) {
      using T = decltype(t);
      dispatch_unary(op, [&](auto k) {
        unary_bwd_strided_loop<T, decltype(k)::value>(x, y, dy, dx, static_cast<T>(alpha));
      });
    });
    return true;
  }
  void binary(BinaryOp op, const Block& out, const Block& a, const Block& b, ExecContext&) const override {
    if (detail::is_low_precision(out.dtype))
      return dispatch_binary(op, [&](auto k) {
        constexpr int K = decltype(k)::value;
        if (a.is_contiguous() && b.is_contiguous())
          return lp_tiles<2>(out.dtype, out.numel(), {a.data, b.data}, out.data,
                             [](index_t len, const auto& in, float* o) {
                               simd_for(len, [&](index_t i) { o[i] = pw::binary_fwd<K, float>(in[0][i], in[1][i]); });
                             });
        by_lp_dtype(out.dtype, [&](auto t) {
          using S = decltype(t);
          zip_broadcast<S>(out, a, b, [](S x, S y) {
            return S(pw::binary_fwd<K, float>(static_cast<float>(x), static_cast<float>(y)));
          });
        });
      });
    pw_by_dtype(out.dtype, [&](auto t) {
      using T = decltype(t);
      dispatch_binary(op, [&](auto k) {
        zip_broadcast<T>(out, a, b, [](T x, T y) { return pw::binary_fwd<decltype(k)::value, T>(x, y); });
      });
    });
  }
  void div_rhs_backward(const Block& out, const Block& g, const Block& a, const Block& b, ExecContext&) const override {
    if (detail::is_low_precision(out.dtype))
      return by_lp_dtype(out.dtype, [&](auto t) {
        using S = decltype(t);
        zip3_broadcast<S>(out, g, a, b, [](S gg, S x, S y) {
          return S(pw::div_rhs_grad<float>(static_cast<float>(gg), static_cast<float>(x), static_cast<float>(y)));
        });
      });
    pw_by_dtype(out.dtype, [&](auto t) {
      using T = decltype(t);
      zip3_broadcast<T>(out, g, a, b, [](T gg, T x, T y) { return pw::div_rhs_grad<T>(gg, x, y); });
    });
  }
  void sum_to(const Block& dst, const Block& dst_view, const Block& g, ExecContext&) const override {
    SHARD_STORAGE_DISPATCH("sum_to", dst.dtype, sum_to_impl<T>(dst, dst_view, g));
  }
  void convert(DType from, DType to, index_t n, const void* x, void* y, ExecContext&) const override {
    if (convert_f16_fast(from, to, n, x, y)) return;
    by_float_dtype(from, [&](auto a) {
      by_float_dtype(to, [&](auto b) {
        using A = decltype(a);
        using B = decltype(b);
        convert_loop<A, B>(n, static_cast<const A*>(x), static_cast<B*>(y));
      });
    });
  }
  void complex_map(ComplexOp op, std::complex<double> s, DType cdt, index_t n, const void* a, const void* b, void* out,
                   ExecContext&) const override {
    if (cdt == DType::c64) complex_loop<float>(op, s, n, a, b, out);
    else complex_loop<double>(op, s, n, a, b, out);
  }
  std::complex<double> complex_sum(DType cdt, index_t n, const void* x, ExecContext&) const override {
    if (cdt == DType::c64) return complex_sum_loop(n, static_cast<const std::complex<float>*>(x));
    return complex_sum_loop(n, static_cast<const std::complex<double>*>(x));
  }
};

const CpuPointwise g_cpu_pointwise;

}  // namespace

SHARD_CPU_TABLE(pointwise, g_cpu_pointwise);

}  // namespace shard::exec
