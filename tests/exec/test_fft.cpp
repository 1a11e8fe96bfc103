// The fft kernel family's CPU table (exec/fft.hpp, FFTW3) against a naive DFT on small shapes:
// c2c forward and inverse over every kind of dim subset (batched over the rest), r2c against the
// naive transform's non-negative half, c2r as r2c's exact inverse (even and odd last extents),
// scale, input preservation, in-place c2c, fp64 and fp32, empty blocks, and bad input.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <complex>
#include <numbers>
#include <random>
#include <vector>

#include <shardtensor/core/error.hpp>
#include <shardtensor/exec/fft.hpp>

namespace st_exec_test_fft {

using namespace shard;
using exec::FftGeometry;
using exec::FftKind;

namespace {

using cd = std::complex<double>;

index_t numel_of(const std::vector<index_t>& s) {
  index_t n = 1;
  for (index_t e : s) n *= e;
  return n;
}

/// Naive separable DFT of a complex row-major array of shape `s` over `dims`, sign -1 (forward)
/// or +1 (inverse, unnormalised), in double.
std::vector<cd> naive_dft(std::vector<cd> a, const std::vector<index_t>& s, const std::vector<int>& dims, int sign) {
  const int R = static_cast<int>(s.size());
  for (int d : dims) {
    const index_t n = s[static_cast<std::size_t>(d)];
    index_t inner = 1, outer = 1;
    for (int e = d + 1; e < R; ++e) inner *= s[static_cast<std::size_t>(e)];
    for (int e = 0; e < d; ++e) outer *= s[static_cast<std::size_t>(e)];
    std::vector<cd> out(a.size());
    for (index_t o = 0; o < outer; ++o)
      for (index_t i = 0; i < inner; ++i)
        for (index_t k = 0; k < n; ++k) {
          cd acc = 0;
          for (index_t j = 0; j < n; ++j) {
            const double ang = sign * 2.0 * std::numbers::pi * static_cast<double>((k * j) % n) / static_cast<double>(n);
            acc += a[static_cast<std::size_t>((o * n + j) * inner + i)] * cd(std::cos(ang), std::sin(ang));
          }
          out[static_cast<std::size_t>((o * n + k) * inner + i)] = acc;
        }
    a = std::move(out);
  }
  return a;
}

/// The half spectrum (last transformed dim cut to n / 2 + 1) of a full one.
std::vector<cd> cut_half(const std::vector<cd>& full, const std::vector<index_t>& s, int d) {
  auto hs = s;
  hs[static_cast<std::size_t>(d)] = s[static_cast<std::size_t>(d)] / 2 + 1;
  index_t inner = 1, outer = 1;
  for (int e = d + 1; e < static_cast<int>(s.size()); ++e) inner *= s[static_cast<std::size_t>(e)];
  for (int e = 0; e < d; ++e) outer *= s[static_cast<std::size_t>(e)];
  const index_t n = s[static_cast<std::size_t>(d)], h = hs[static_cast<std::size_t>(d)];
  std::vector<cd> out(static_cast<std::size_t>(numel_of(hs)));
  for (index_t o = 0; o < outer; ++o)
    for (index_t k = 0; k < h; ++k)
      for (index_t i = 0; i < inner; ++i)
        out[static_cast<std::size_t>((o * h + k) * inner + i)] = full[static_cast<std::size_t>((o * n + k) * inner + i)];
  return out;
}

std::vector<double> random_reals(index_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(gen);
  return v;
}

/// A contiguous CPU block of `s` holding `v` converted to T (T = float, double, complex<float|double>).
template <class T, class V>
Block block_of(const std::vector<index_t>& s, const std::vector<V>& v) {
  Block b = Block::allocate(dtype_of<T>, Device::cpu(), s);
  T* p = static_cast<T*>(b.data);
  for (std::size_t i = 0; i < v.size(); ++i) p[i] = static_cast<T>(v[i]);
  return b;
}
template <class T>
Block empty_block(const std::vector<index_t>& s) {
  return Block::allocate(dtype_of<T>, Device::cpu(), s);
}

/// max |got - ref| / max |ref| over the elements.
template <class T, class V>
double rel_err(const Block& got, const std::vector<V>& ref) {
  const T* p = static_cast<const T*>(got.data);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::abs(std::complex<double>(p[i]) - std::complex<double>(ref[i])));
    den = std::max(den, std::abs(std::complex<double>(ref[i])));
  }
  return den > 0 ? num / den : num;
}

template <class R>
double tol() {
  return std::is_same_v<R, double> ? 1e-12 : 2e-6;
}

const std::vector<std::pair<std::vector<index_t>, std::vector<int>>> kC2C = {
    {{5}, {0}},          {{3, 4, 5}, {0}},       {{3, 4, 5}, {1}},    {{3, 4, 5}, {2}},
    {{3, 4, 5}, {0, 2}}, {{3, 4, 5}, {0, 1, 2}}, {{2, 7, 11}, {1, 2}}, {{2, 1, 6, 3}, {1, 2}},
};

}  // namespace

TEMPLATE_TEST_CASE("fft c2c equals the naive DFT over any dim subset, forward and inverse", "[exec][fft]", float,
                   double) {
  using C = std::complex<TestType>;
  for (const auto& [s, dims] : kC2C) {
    for (bool inverse : {false, true}) {
      INFO("shape " << s.size() << "-d, first extent " << s[0] << ", dims " << dims.size() << ", inverse " << inverse);
      const index_t n = numel_of(s);
      const auto re = random_reals(n, 7), im = random_reals(n, 8);
      std::vector<cd> a(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = cd(re[i], im[i]);
      const auto ref = naive_dft(a, s, dims, inverse ? +1 : -1);
      const Block in = block_of<C>(s, a), out = empty_block<C>(s);
      FftGeometry g{FftKind::c2c, inverse, s, dims, 1.0};
      ExecContext ctx(Device::cpu());
      const std::vector<C> before(static_cast<const C*>(in.data), static_cast<const C*>(in.data) + n);
      exec::fft(g, in, out, ctx);
      CHECK(rel_err<C>(out, ref) < tol<TestType>());
      CHECK(rel_err<C>(in, before) == 0.0);  // input preserved
      // In place, and with a scale (the inverse's 1/N of numpy's "backward" norm).
      g.scale = 0.25;
      exec::fft(g, in, in, ctx);
      std::vector<cd> scaled(ref);
      for (auto& x : scaled) x *= 0.25;
      CHECK(rel_err<C>(in, scaled) < tol<TestType>());
    }
  }
}

TEMPLATE_TEST_CASE("fft r2c is the naive DFT's non-negative half and c2r inverts it", "[exec][fft]", float, double) {
  using C = std::complex<TestType>;
  const std::vector<std::pair<std::vector<index_t>, std::vector<int>>> cases = {
      {{8}, {0}},          {{7}, {0}},          {{2, 6, 7}, {1, 2}}, {{2, 6, 7}, {2}}, {{3, 5, 4}, {0, 1, 2}},
      {{4, 5}, {0, 1}},    {{5, 4}, {0}},       {{1, 9, 2}, {1}},    {{2, 3, 1}, {2}},
  };
  for (const auto& [s, dims] : cases) {
    INFO("shape " << s.size() << "-d, first extent " << s[0] << ", dims " << dims.size() << ", last dim "
                  << dims.back());
    const index_t n = numel_of(s);
    const auto x = random_reals(n, 11);
    std::vector<cd> xc(x.begin(), x.end());
    const auto ref = cut_half(naive_dft(xc, s, dims, -1), s, dims.back());
    FftGeometry g{FftKind::r2c, false, s, dims, 1.0};
    const auto cs = g.complex_shape();
    REQUIRE(numel_of(cs) == static_cast<index_t>(ref.size()));
    const Block in = block_of<TestType>(s, x), spec = empty_block<C>(cs);
    ExecContext ctx(Device::cpu());
    const std::vector<TestType> before(static_cast<const TestType*>(in.data), static_cast<const TestType*>(in.data) + n);
    exec::fft(g, in, spec, ctx);
    CHECK(rel_err<C>(spec, ref) < tol<TestType>());
    CHECK(rel_err<TestType>(in, before) == 0.0);
    // c2r with scale 1 / (product of the transformed extents) returns x; the spectrum is kept.
    index_t N = 1;
    for (int d : dims) N *= s[static_cast<std::size_t>(d)];
    FftGeometry gi{FftKind::c2r, false, s, dims, 1.0 / static_cast<double>(N)};
    const Block back = empty_block<TestType>(s);
    std::vector<C> spec_copy(static_cast<const C*>(spec.data), static_cast<const C*>(spec.data) + ref.size());
    exec::fft(gi, spec, back, ctx);
    CHECK(rel_err<TestType>(back, x) < 10 * tol<TestType>());
    CHECK(rel_err<C>(spec, spec_copy) == 0.0);  // c2r works on a copy: its input is preserved
  }
}

TEST_CASE("fft of an empty block does nothing, and bad input is a shard::Error", "[exec][fft][errors]") {
  using C = std::complex<double>;
  ExecContext ctx(Device::cpu());
  {
    const std::vector<index_t> s{0, 4};
    exec::fft(FftGeometry{FftKind::c2c, false, s, {1}, 1.0}, empty_block<C>(s), empty_block<C>(s), ctx);
  }
  const std::vector<index_t> s{3, 4};
  const Block c = empty_block<C>(s), c2 = empty_block<C>(s), r = empty_block<double>(s);
  const Block half = empty_block<C>({3, 3});
  auto fails = [&](const FftGeometry& g, const Block& in, const Block& out) {
    CHECK_THROWS_AS(exec::fft(g, in, out, ctx), shard::Error);
  };
  fails({FftKind::c2c, false, s, {}, 1.0}, c, c2);               // no dims
  fails({FftKind::c2c, false, s, {2}, 1.0}, c, c2);              // dim out of range
  fails({FftKind::c2c, false, s, {1, 0}, 1.0}, c, c2);           // unsorted
  fails({FftKind::c2c, false, s, {1, 1}, 1.0}, c, c2);           // repeated
  fails({FftKind::c2c, false, s, {1}, 1.0}, r, c2);              // real input to c2c
  fails({FftKind::c2c, false, s, {1}, 1.0}, c, empty_block<std::complex<float>>(s));  // mixed precision
  fails({FftKind::r2c, false, s, {1}, 1.0}, c, half);            // complex input to r2c
  fails({FftKind::r2c, false, s, {1}, 1.0}, empty_block<float>(s), half);  // f32 with c128
  fails({FftKind::r2c, false, s, {1}, 1.0}, r, c2);              // full instead of half spectrum
  fails({FftKind::r2c, true, s, {1}, 1.0}, r, half);             // r2c has no inverse
  fails({FftKind::c2r, false, s, {1}, 1.0}, half, c);            // complex output of c2r
  fails({FftKind::c2c, false, s, {1}, 1.0}, c, empty_block<C>({4, 3}));  // shape mismatch
  fails({FftKind::c2c, false, {3, 4, 1}, {1}, 1.0}, c, c2);      // geometry rank mismatch
  std::vector<index_t> strided{3, 2};
  Block view = c;
  view.shape[1] = 2;  // a non-contiguous view (row stride 4)
  fails({FftKind::c2c, false, strided, {1}, 1.0}, view, empty_block<C>(strided));
}

}  // namespace st_exec_test_fft
