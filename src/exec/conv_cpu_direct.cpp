// Direct (implicit-GEMM) conv path for stride-1 gather problems on AVX-512 / AVX2 CPUs: the
// forward conv with stride 1, every input gradient (its phases are stride-1 gathers) and the
// weight gradient with stride 1. Instead of an im2col buffer of (taps x channels) rows, each
// tile of output rows copies its input block once, zero-padded, and register-blocked
// micro-kernels read the shifted rows of that block directly (conv_cpu_direct_isa.inc).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "conv_cpu_engine.hpp"
#include "shardtensor/core/cpu_isa.hpp"
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/storage_bits.hpp"
#include "shardtensor/exec/conv.hpp"
#include "shardtensor/runtime/memory.hpp"

namespace shard::detail::conv_engine {
namespace {

/// Tiling of one stride-1 gather problem: tiles are (n, g, o0, rows [a1, b1), cols [a2, b2)).
struct FastPlan {
  const Problem* p = nullptr;
  index_t cin_g = 0, cout_g = 0, krows = 0, pyx = 0;
  XLayout xl{};  ///< x's channel and row strides (x_layout)
  Ext3 lo{}, span{};  ///< per dim: smallest tap offset, extent of the tap offsets
  index_t rows = 1, cols = 1, row_tiles = 1, col_tiles = 1, units = 0;
  index_t p_cap = 0, c_cap = 0;  ///< scratch sizes (elements)
  bool stream_y = false;  ///< non-temporal stores of y (large outputs, see store_tile_vec)
};

struct FastTile {
  index_t n, g, o0, a1, b1, a2, b2;
};

/// Extents of one tile's padded input block and its virtual positions.
struct TileGeom {
  index_t E0, E1, E2, PS, V, Vpad;
};

/// Minimal 64-byte aligned buffer (aligned rows for the micro-kernels' loads and stores).
template <class T>
class AlignedBuf {
 public:
  T* data() { return p_; }
  T& operator[](std::size_t i) { return p_[i]; }
  void resize(std::size_t n) {
    if (n <= n_) return;
    // From the host caching allocator (not malloc): steady-state calls reuse cached blocks.
    mem_ = allocate_bytes(n * sizeof(T), Device::cpu());
    p_ = static_cast<T*>(mem_.get());
    n_ = n;
  }
  void assign(std::size_t n, T v) {
    resize(n);
    std::fill_n(p_, n, v);
  }

 private:
  std::shared_ptr<void> mem_;
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

template <class T>
struct FastScratch {
  AlignedBuf<T> P, C, A;  ///< padded input block, output / gy tile, weight-gradient partial sums
  AlignedBuf<index_t> rel;
};

index_t round_up(index_t a, index_t b) { return (a + b - 1) / b * b; }

// Row conversions between a storage dtype S and the compute dtype T of the micro-kernels. Same
// dtype: a copy. bf16 / f16 storage: widened to f32 on the way into the padded block / gy tile and
// rounded (nearest even, like exec::convert) on the way out, so the f32 micro-kernels run on bf16 /
// f16 tensors without f32 copies of the whole tensors (docs/architecture.md, "Mixed precision").
// The direct path only runs at the avx2 / avx512 levels, so AVX2 and F16C are there.
template <class T>
void widen_row(const T* s, T* d, index_t n) {
  std::memcpy(d, s, sizeof(T) * static_cast<std::size_t>(n));
}
__attribute__((target("avx2,f16c"))) void widen_row(const bf16* s, float* d, index_t n) {
  index_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
  }
  for (; i < n; ++i) d[i] = static_cast<float>(s[i]);
}
__attribute__((target("avx2,f16c"))) void widen_row(const f16* s, float* d, index_t n) {
  index_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = static_cast<float>(s[i]);
}
/// d[j] = S(s[j] + b): one rounding, bit-identical to shard::bf16(float) / the F16C conversion of
/// exec::convert.
__attribute__((target("avx2,f16c"))) void narrow_row(const float* s, float b, bf16* d, index_t n) {
  index_t i = 0;
  const __m256 bv = _mm256_set1_ps(b);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i one = _mm256_set1_epi32(1), r7 = _mm256_set1_epi32(0x7fff), qnan = _mm256_set1_epi32(0x7fc0);
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_add_ps(_mm256_loadu_ps(s + i), bv));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(r7, lsb)), 16);
    const __m256i q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000)), qnan);
    const __m256i v = _mm256_blendv_epi8(r, q, nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) d[i] = bf16(s[i] + b);
}
__attribute__((target("avx2,f16c"))) void narrow_row(const float* s, float b, f16* d, index_t n) {
  index_t i = 0;
  const __m256 bv = _mm256_set1_ps(b);
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_add_ps(_mm256_loadu_ps(s + i), bv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) d[i] = f16(s[i] + b);
}

FastTile decode(const FastPlan& fp, index_t u) {
  const Problem& p = *fp.p;
  FastTile t{};
  const index_t ct = u % fp.col_tiles;
  u /= fp.col_tiles;
  const index_t rt = u % fp.row_tiles;
  u /= fp.row_tiles;
  t.o0 = u % p.out[0];
  u /= p.out[0];
  t.g = u % p.groups;
  t.n = u / p.groups;
  t.a1 = rt * fp.rows;
  t.b1 = std::min(t.a1 + fp.rows, p.out[1]);
  t.a2 = ct * fp.cols;
  t.b2 = std::min(t.a2 + fp.cols, p.out[2]);
  return t;
}

TileGeom tile_geom(const FastPlan& fp, const FastTile& u, index_t block) {
  TileGeom g{};
  g.E0 = fp.span[0];
  g.E1 = (u.b1 - u.a1) + fp.span[1] - 1;
  g.E2 = (u.b2 - u.a2) + fp.span[2] - 1;
  g.PS = g.E0 * g.E1 * g.E2;
  g.V = (u.b1 - u.a1 - 1) * g.E2 + (u.b2 - u.a2);
  g.Vpad = round_up(g.V, block);
  return g;
}

/// P[c][e0][e1][e2] = x[c][o0 + lo0 + e0][a1 + lo1 + e1][a2 + lo2 + e2] (0 outside the input),
/// followed by zeroed slack for the micro-kernels' over-read.
template <class S, class T>
void fill_block(const FastPlan& fp, const FastTile& u, const TileGeom& tg, const S* xg, T* P) {
  const Problem& p = *fp.p;
  const index_t s2 = u.a2 + fp.lo[2];
  const index_t va = std::clamp<index_t>(-s2, 0, tg.E2), vb = std::clamp<index_t>(p.in[2] - s2, va, tg.E2);
  for (index_t c = 0; c < fp.cin_g; ++c)
    for (index_t e0 = 0; e0 < tg.E0; ++e0) {
      const index_t i0 = u.o0 + fp.lo[0] + e0;
      for (index_t e1 = 0; e1 < tg.E1; ++e1) {
        const index_t i1 = u.a1 + fp.lo[1] + e1;
        T* dst = P + ((c * tg.E0 + e0) * tg.E1 + e1) * tg.E2;
        if (i0 < 0 || i0 >= p.in[0] || i1 < 0 || i1 >= p.in[1]) {
          std::fill_n(dst, tg.E2, T(0));
          continue;
        }
        const S* src = xg + c * fp.xl.c + i0 * fp.xl.s0 + i1 * fp.xl.s1 + s2;
        std::fill_n(dst, va, T(0));
        widen_row(src + va, dst + va, vb - va);
        std::fill_n(dst + vb, tg.E2 - vb, T(0));
      }
    }
  std::fill_n(P + fp.cin_g * tg.PS, tg.Vpad - tg.V + 64, T(0));
}

/// rel[(c, t0, t1, t2)] = offset in P of tap t for virtual position 0.
void build_rel(const FastPlan& fp, const TileGeom& tg, index_t* rel) {
  const auto& off = fp.p->taps.off;
  index_t k = 0;
  for (index_t c = 0; c < fp.cin_g; ++c)
    for (index_t d0 : off[0])
      for (index_t d1 : off[1])
        for (index_t d2 : off[2])
          rel[k++] = c * tg.PS + ((d0 - fp.lo[0]) * tg.E1 + (d1 - fp.lo[1])) * tg.E2 + (d2 - fp.lo[2]);
}

/// Valid positions of C[m][v] (+ bias) to y through the problem's y placement.
template <class T>
void store_tile(const FastPlan& fp, const FastTile& u, const TileGeom& tg, const T* C, const T* bias, T* y) {
  const Problem& p = *fp.p;
  const index_t cols = u.b2 - u.a2, st2 = p.y_step[2];
  for (index_t m = 0; m < fp.cout_g; ++m) {
    const index_t co = u.g * fp.cout_g + m;
    const T b = bias ? bias[co] : T(0);
    T* yc = y + u.n * p.y_batch_stride + co * fp.pyx;
    const index_t y0 = u.o0 * p.y_step[0] + p.y_base[0];
    for (index_t r = 0; r < u.b1 - u.a1; ++r) {
      const T* src = C + m * tg.Vpad + r * tg.E2;
      const index_t y1 = (u.a1 + r) * p.y_step[1] + p.y_base[1];
      T* dst = yc + (y0 * p.y_ext[1] + y1) * p.y_ext[2] + u.a2 * st2 + p.y_base[2];
      if (st2 == 1) {
        for (index_t j = 0; j < cols; ++j) dst[j] = src[j] + b;
      } else {
        for (index_t j = 0; j < cols; ++j) dst[j * st2] = src[j] + b;
      }
    }
  }
}

/// store_tile for bf16 / f16 storage: y = S(C + bias), rounded once.
template <class S>
void store_tile_narrow(const FastPlan& fp, const FastTile& u, const TileGeom& tg, const float* C, const float* bias,
                       S* y) {
  const Problem& p = *fp.p;
  const index_t cols = u.b2 - u.a2, st2 = p.y_step[2];
  for (index_t m = 0; m < fp.cout_g; ++m) {
    const index_t co = u.g * fp.cout_g + m;
    const float b = bias ? bias[co] : 0.0f;
    S* yc = y + u.n * p.y_batch_stride + co * fp.pyx;
    const index_t y0 = u.o0 * p.y_step[0] + p.y_base[0];
    for (index_t r = 0; r < u.b1 - u.a1; ++r) {
      const float* src = C + m * tg.Vpad + r * tg.E2;
      const index_t y1 = (u.a1 + r) * p.y_step[1] + p.y_base[1];
      S* dst = yc + (y0 * p.y_ext[1] + y1) * p.y_ext[2] + u.a2 * st2 + p.y_base[2];
      if (st2 == 1) {
        narrow_row(src, b, dst, cols);
      } else {
        for (index_t j = 0; j < cols; ++j) dst[j * st2] = S(src[j] + b);
      }
    }
  }
}

/// G[m][v] = gy[n][g*cout_g + m][o0][a1 + r][a2 + col] at v = r*E2 + col (col < cols), else 0.
template <class S, class T>
void load_gy_tile(const FastPlan& fp, const FastTile& u, const TileGeom& tg, const S* gy, index_t mpad, T* G) {
  const Problem& p = *fp.p;
  const index_t cols = u.b2 - u.a2, pout = p.out[0] * p.out[1] * p.out[2];
  for (index_t m = 0; m < mpad; ++m) {
    T* g = G + m * tg.Vpad;
    if (m >= fp.cout_g) {
      std::fill_n(g, tg.Vpad, T(0));
      continue;
    }
    const S* src = gy + u.n * p.y_batch_stride + (u.g * fp.cout_g + m) * pout + (u.o0 * p.out[1] + u.a1) * p.out[2] + u.a2;
    for (index_t r = 0; r < u.b1 - u.a1; ++r) {
      widen_row(src + r * p.out[2], g + r * tg.E2, cols);
      if (r + 1 < u.b1 - u.a1) std::fill_n(g + r * tg.E2 + cols, tg.E2 - cols, T(0));
    }
    std::fill_n(g + tg.V, tg.Vpad - tg.V, T(0));
  }
}

FastPlan make_plan(const Problem& p, std::size_t elem, int threads, index_t block, index_t mround) {
  FastPlan fp;
  fp.p = &p;
  fp.cin_g = p.cin_g;
  fp.cout_g = p.cout_g;
  fp.krows = p.cin_g * p.taps.count();
  fp.xl = x_layout(p);
  fp.pyx = p.y_ext[0] * p.y_ext[1] * p.y_ext[2];
  for (int d = 0; d < 3; ++d) {
    const auto [mn, mx] = std::minmax_element(p.taps.off[d].begin(), p.taps.off[d].end());
    fp.lo[d] = *mn;
    fp.span[d] = *mx - *mn + 1;
  }
  const index_t mpad = round_up(std::max<index_t>(fp.cout_g, 1), mround);
  auto cost = [&](index_t R, index_t C2) {
    const index_t e2 = C2 + fp.span[2] - 1;
    return static_cast<std::size_t>(fp.cin_g * fp.span[0] * (R + fp.span[1] - 1) * e2 + mpad * (R * e2 + block)) *
           elem;
  };
  const std::size_t budget = p.cfg.column_budget;
  fp.cols = p.out[2];
  while (fp.cols > 4 * block && cost(1, fp.cols) > budget) fp.cols = (fp.cols + 1) / 2;
  fp.rows = 1;
  while (fp.rows < p.out[1] && cost(fp.rows + 1, fp.cols) <= budget) ++fp.rows;
  const index_t other = p.batch * p.groups * p.out[0];
  fp.col_tiles = (p.out[2] + fp.cols - 1) / fp.cols;
  fp.row_tiles = (p.out[1] + fp.rows - 1) / fp.rows;
  if (threads > 1 && other * fp.col_tiles * fp.row_tiles < 4 * threads)  // keep every thread busy
    fp.row_tiles = std::min(p.out[1], std::max(fp.row_tiles, (4 * threads + other * fp.col_tiles - 1) /
                                                                  (other * fp.col_tiles)));
  fp.rows = (p.out[1] + fp.row_tiles - 1) / fp.row_tiles;
  fp.row_tiles = (p.out[1] + fp.rows - 1) / fp.rows;
  fp.cols = (p.out[2] + fp.col_tiles - 1) / fp.col_tiles;
  fp.col_tiles = (p.out[2] + fp.cols - 1) / fp.cols;
  fp.units = other * fp.row_tiles * fp.col_tiles;
  const index_t e1 = fp.rows + fp.span[1] - 1, e2 = fp.cols + fp.span[2] - 1;
  fp.p_cap = fp.cin_g * fp.span[0] * e1 * e2 + 2 * block + 128;
  fp.c_cap = mpad * round_up((fp.rows - 1) * e2 + fp.cols, block);
  // Outputs of 16 MiB and more leave the cache before anything reads them back: store them
  // non-temporally (no read-for-ownership of y's lines).
  fp.stream_y = static_cast<std::size_t>(p.batch * p.groups * fp.cout_g * fp.pyx) * elem >= (std::size_t{16} << 20);
  return fp;
}

/// gw[i] = the sum over the threads' partial sums partial[t * wn + i], in thread order (deterministic
/// for a thread count), rounded once to T.
template <class T>
void sum_partials(const std::vector<double>& partial, int nth, index_t wn, T* gw) {
  for (index_t i = 0; i < wn; ++i) {
    double s = 0;
    for (int t = 0; t < nth; ++t) s += partial[static_cast<std::size_t>(t * wn + i)];
    gw[i] = static_cast<T>(s);
  }
}

int fast_threads(const EngineSettings& cfg, index_t units) {
  if (cfg.threading == ConvThreading::blas || omp_in_parallel()) return 1;
  return static_cast<int>(std::max<index_t>(1, std::min<index_t>(omp_get_max_threads(), units)));
}

// ---- channel-pair blocks (the bf16 dot-product kernels: AMX tiles and AVX-512 BF16 vdpbf16ps).
// Both units multiply pairs of bf16 along the reduction dim; the forward / input-gradient block
// holds channel PAIRS interleaved in one 32-bit word (P2[cp][e] = x[2cp] | x[2cp+1] << 16).
using u16 = std::uint16_t;
using u32 = std::uint32_t;

const u16* bits(const bf16* p) { return reinterpret_cast<const u16*>(p); }

/// Channel pairs of one call: cpairs = ceil(cin / 2), padded to a multiple of 16 above 16 (every
/// B tile then has kt = min(16, pairs) rows); the padding pairs are zero in the block.
struct PairPlan {
  index_t cpairs = 0, padded = 0, kt = 0, cblocks = 0;
};
PairPlan pair_plan(index_t cin) {
  PairPlan pp;
  pp.cpairs = (cin + 1) / 2;
  pp.padded = pp.cpairs <= 16 ? pp.cpairs : round_up(pp.cpairs, 16);
  pp.kt = std::min<index_t>(16, pp.padded);
  pp.cblocks = pp.padded / pp.kt;
  return pp;
}

/// P2[cp][e0][e1][e2] = x[2cp] | x[2cp+1] << 16 over the tile's block (0 outside the input, for
/// the missing partner of an odd channel count and for the padding pairs), then zeroed slack.
void fill_pairs(const FastPlan& fp, const FastTile& u, const TileGeom& tg, const bf16* xg, index_t padded, u32* P2) {
  const Problem& p = *fp.p;
  const index_t s2 = u.a2 + fp.lo[2];
  const index_t va = std::clamp<index_t>(-s2, 0, tg.E2), vb = std::clamp<index_t>(p.in[2] - s2, va, tg.E2);
  for (index_t cp = 0; cp < padded; ++cp)
    for (index_t e0 = 0; e0 < tg.E0; ++e0) {
      const index_t i0 = u.o0 + fp.lo[0] + e0;
      for (index_t e1 = 0; e1 < tg.E1; ++e1) {
        const index_t i1 = u.a1 + fp.lo[1] + e1;
        u32* dst = P2 + ((cp * tg.E0 + e0) * tg.E1 + e1) * tg.E2;
        if (2 * cp >= fp.cin_g || i0 < 0 || i0 >= p.in[0] || i1 < 0 || i1 >= p.in[1]) {
          std::fill_n(dst, tg.E2, u32{0});
          continue;
        }
        const index_t off = i0 * fp.xl.s0 + i1 * fp.xl.s1 + s2;
        const u16* r0 = bits(xg + 2 * cp * fp.xl.c + off);
        std::fill_n(dst, va, u32{0});
        if (2 * cp + 1 < fp.cin_g) {
          const u16* r1 = bits(xg + (2 * cp + 1) * fp.xl.c + off);
          for (index_t e = va; e < vb; ++e) dst[e] = u32{r0[e]} | (u32{r1[e]} << 16);
        } else {
          for (index_t e = va; e < vb; ++e) dst[e] = u32{r0[e]};
        }
        std::fill_n(dst + vb, tg.E2 - vb, u32{0});
      }
    }
  std::fill_n(P2 + padded * tg.PS, tg.Vpad - tg.V + 64, u32{0});
}

/// Tap offsets in the block for channel 0 (build_rel with one channel).
void tap_offsets(const FastPlan& fp, const TileGeom& tg, index_t* off) {
  FastPlan one = fp;
  one.cin_g = 1;
  build_rel(one, tg, off);
}


}  // namespace

// ---------------------------------------------------------------- AVX-512
namespace avx512 {
#define SHARD_TGT __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
struct VecF {
  using T = float;
  using V = __m512;
  static constexpr int L = 16, MR = 8, NV = 3, WM = 4, WK = 6, WMB = 1;
  SHARD_TGT static inline V zero() { return _mm512_setzero_ps(); }
  SHARD_TGT static inline V load(const T* p) { return _mm512_loadu_ps(p); }
  SHARD_TGT static inline void store(T* p, V v) { _mm512_storeu_ps(p, v); }
  SHARD_TGT static inline V bcast(T a) { return _mm512_set1_ps(a); }
  SHARD_TGT static inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  SHARD_TGT static inline V add(V a, V b) { return _mm512_add_ps(a, b); }
  SHARD_TGT static inline void stream(T* p, V v) { _mm512_stream_ps(p, v); }
};
struct VecD {
  using T = double;
  using V = __m512d;
  static constexpr int L = 8, MR = 8, NV = 3, WM = 4, WK = 6, WMB = 1;
  SHARD_TGT static inline V zero() { return _mm512_setzero_pd(); }
  SHARD_TGT static inline V load(const T* p) { return _mm512_loadu_pd(p); }
  SHARD_TGT static inline void store(T* p, V v) { _mm512_storeu_pd(p, v); }
  SHARD_TGT static inline V bcast(T a) { return _mm512_set1_pd(a); }
  SHARD_TGT static inline V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  SHARD_TGT static inline V add(V a, V b) { return _mm512_add_pd(a, b); }
  SHARD_TGT static inline void stream(T* p, V v) { _mm512_stream_pd(p, v); }
};
#include "conv_cpu_direct_isa.inc"
#undef SHARD_TGT
}  // namespace avx512

// ---------------------------------------------------------------- AVX2 + FMA
namespace avx2 {
#define SHARD_TGT __attribute__((target("avx2,fma")))
struct VecF {
  using T = float;
  using V = __m256;
  static constexpr int L = 8, MR = 4, NV = 3, WM = 2, WK = 6, WMB = 0;
  SHARD_TGT static inline V zero() { return _mm256_setzero_ps(); }
  SHARD_TGT static inline V load(const T* p) { return _mm256_loadu_ps(p); }
  SHARD_TGT static inline void store(T* p, V v) { _mm256_storeu_ps(p, v); }
  SHARD_TGT static inline V bcast(T a) { return _mm256_set1_ps(a); }
  SHARD_TGT static inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  SHARD_TGT static inline V add(V a, V b) { return _mm256_add_ps(a, b); }
  SHARD_TGT static inline void stream(T* p, V v) { _mm256_stream_ps(p, v); }
};
struct VecD {
  using T = double;
  using V = __m256d;
  static constexpr int L = 4, MR = 4, NV = 3, WM = 2, WK = 6, WMB = 0;
  SHARD_TGT static inline V zero() { return _mm256_setzero_pd(); }
  SHARD_TGT static inline V load(const T* p) { return _mm256_loadu_pd(p); }
  SHARD_TGT static inline void store(T* p, V v) { _mm256_storeu_pd(p, v); }
  SHARD_TGT static inline V bcast(T a) { return _mm256_set1_pd(a); }
  SHARD_TGT static inline V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  SHARD_TGT static inline V add(V a, V b) { return _mm256_add_pd(a, b); }
  SHARD_TGT static inline void stream(T* p, V v) { _mm256_stream_pd(p, v); }
};
#include "conv_cpu_direct_isa.inc"
#undef SHARD_TGT
}  // namespace avx2

// ---------------------------------------------------------------- AMX (bf16 tiles)
// bf16 x and y (or gy) with bf16 weights on a CPU with AMX-BF16 (cpu_has_amx_bf16()): TDPBF16PS
// multiplies a 16 x 32 bf16 tile by a 32 x 16 one (B in pairs of K, "VNNI" layout) into a 16 x 16
// f32 tile, each output summing exact bf16 products in f32.
//  * Forward / input gradient: the padded block holds channel PAIRS interleaved (P2[cp][e] =
//    x[2cp] | x[2cp+1] << 16), so for one tap the B tile (16 channel pairs x 16 positions) is 16 rows
//    of 64 bytes at stride PS: loaded in place. The A tiles (16 output channels x 16 channel pairs)
//    are the weights, packed once per call. C: output channels x positions.
//  * Weight gradient: A = 16 input channels x 32 positions of the plain bf16 block, read in place
//    at the tap's offset; B = the gy tile transposed into position pairs x output channels (once
//    per tile). C: input channels x output channels per tap, summed over the tile's positions.
// Tile counts: 8 tile registers; C takes 4 (or 3), A and B the rest.
namespace amx {
#define SHARD_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
struct TileCfg {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14]{};
  std::uint16_t colsb[16]{};
  std::uint8_t rows[16]{};
};
static_assert(sizeof(TileCfg) == 64, "AMX tile configuration is 64 bytes");

struct Scratch {
  AlignedBuf<u32> P2;   ///< forward: channel-pair block
  AlignedBuf<bf16> P;   ///< weight gradient: plain block
  AlignedBuf<bf16> G;   ///< weight gradient: gy tile [mpad][Vpad]
  AlignedBuf<u32> Gt;   ///< weight gradient: gy tile as position pairs [Vpad / 2][mpad]
  AlignedBuf<float> C;  ///< forward: output tile; weight gradient: one C tile group
  AlignedBuf<index_t> rel;
};

/// Forward unit with MB output-channel blocks x NB position blocks of C tiles (2 x 2 or 1 x 3).
template <int MB, int NB>
SHARD_AMX void forward_unit(const FastPlan& fp, const FastTile& u, const bf16* x, const u32* ap, const PairPlan& pp,
                            const float* bias, bf16* y, Scratch& s) {
  static_assert((MB == 2 && NB == 2) || (MB == 1 && NB == 3), "tile layouts: 2 x 2 or 1 x 3");
  const Problem& p = *fp.p;
  const TileGeom tg = tile_geom(fp, u, NB * 16);
  const index_t ntaps = p.taps.count();
  fill_pairs(fp, u, tg, x + u.n * p.x_batch_stride + u.g * fp.cin_g * fp.xl.c, pp.padded, s.P2.data());
  tap_offsets(fp, tg, s.rel.data());
  const index_t mblocks = (fp.cout_g + 16 * MB - 1) / (16 * MB) * MB;
  TileCfg cfg;
  for (int i = 0; i < MB * NB; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;                       // C
  for (int i = MB * NB; i < MB * NB + MB; ++i) cfg.rows[i] = 16, cfg.colsb[i] = static_cast<std::uint16_t>(pp.kt * 4);  // A
  for (int i = MB * NB + MB; i < MB * NB + MB + NB; ++i) cfg.rows[i] = static_cast<std::uint8_t>(pp.kt), cfg.colsb[i] = 64;  // B
  _tile_loadconfig(&cfg);
  const long bstride = static_cast<long>(tg.PS * 4), cstride = static_cast<long>(tg.Vpad * 4);
  const u32* apg = ap + u.g * mblocks * ntaps * pp.cblocks * 256;
  for (index_t v0 = 0; v0 < tg.Vpad; v0 += NB * 16)
    for (index_t mb = 0; mb < mblocks; mb += MB) {
      float* c0 = s.C.data() + mb * 16 * tg.Vpad + v0;
      if constexpr (MB == 2) {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      } else {
        _tile_zero(0); _tile_zero(1); _tile_zero(2);
      }
      for (index_t t = 0; t < ntaps; ++t)
        for (index_t cb = 0; cb < pp.cblocks; ++cb) {
          const u32* b = s.P2.data() + cb * 16 * tg.PS + s.rel[static_cast<std::size_t>(t)] + v0;
          const u32* a = apg + ((mb * ntaps + t) * pp.cblocks + cb) * 256;
          if constexpr (MB == 2) {
            _tile_loadd(4, a, 64);
            _tile_loadd(5, a + ntaps * pp.cblocks * 256, 64);
            _tile_loadd(6, b, bstride);
            _tile_loadd(7, b + 16, bstride);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          } else {
            _tile_loadd(3, a, 64);
            _tile_loadd(4, b, bstride);
            _tile_loadd(5, b + 16, bstride);
            _tile_loadd(6, b + 32, bstride);
            _tile_dpbf16ps(0, 3, 4);
            _tile_dpbf16ps(1, 3, 5);
            _tile_dpbf16ps(2, 3, 6);
          }
        }
      if constexpr (MB == 2) {
        _tile_stored(0, c0, cstride);
        _tile_stored(1, c0 + 16, cstride);
        _tile_stored(2, c0 + 16 * tg.Vpad, cstride);
        _tile_stored(3, c0 + 16 * tg.Vpad + 16, cstride);
      } else {
        _tile_stored(0, c0, cstride);
        _tile_stored(1, c0 + 16, cstride);
        _tile_stored(2, c0 + 32, cstride);
      }
    }
  _tile_release();
  store_tile_narrow(fp, u, tg, s.C.data(), bias, y);
}

template <int MB, int NB>
void run_forward_tiles(const Problem& p, const bf16* x, const float* w, const float* bias, bf16* y) {
  const FastPlan fp = make_plan(p, sizeof(float), fast_threads(p.cfg, 1 << 30), NB * 16, MB * 16);
  const index_t ntaps = p.taps.count();
  const PairPlan pp = pair_plan(fp.cin_g);
  const index_t mblocks = (fp.cout_g + 16 * MB - 1) / (16 * MB) * MB;
  // ap[g][mb][t][cb][m][j] = (w[co][2cp][t], w[co][2cp+1][t]) as bf16 bits, co = 16 mb + m,
  // cp = kt cb + j (w holds bf16 values, so the rounding is exact); 16 x 16 words per A tile.
  std::vector<u32> ap(static_cast<std::size_t>(p.groups * mblocks * ntaps * pp.cblocks * 256), 0);
  for (index_t g = 0; g < p.groups; ++g)
    for (index_t co = 0; co < fp.cout_g; ++co) {
      const float* wr = w + (g * fp.cout_g + co) * fp.krows;
      for (index_t cp = 0; cp < pp.cpairs; ++cp)
        for (index_t t = 0; t < ntaps; ++t) {
          const u32 lo = cvt::bf16_bits(wr[2 * cp * ntaps + t]);
          const u32 hi = 2 * cp + 1 < fp.cin_g ? u32{cvt::bf16_bits(wr[(2 * cp + 1) * ntaps + t])} : 0u;
          const index_t tile = ((g * mblocks + co / 16) * ntaps + t) * pp.cblocks + cp / pp.kt;
          ap[static_cast<std::size_t>(tile * 256 + (co % 16) * 16 + cp % pp.kt)] = lo | (hi << 16);
        }
    }
  const index_t ps_max = fp.span[0] * (fp.rows + fp.span[1] - 1) * (fp.cols + fp.span[2] - 1);
  const int nth = fast_threads(p.cfg, fp.units);
  std::vector<Scratch> scratch(static_cast<std::size_t>(nth));
  for (auto& s : scratch) {
    s.P2.resize(static_cast<std::size_t>(pp.padded * ps_max + 2 * NB * 16 + 128));
    s.C.resize(static_cast<std::size_t>(fp.c_cap));
    s.rel.resize(static_cast<std::size_t>(ntaps + 16));
  }
#pragma omp parallel for schedule(static) num_threads(nth)
  for (index_t u = 0; u < fp.units; ++u)
    forward_unit<MB, NB>(fp, decode(fp, u), x, ap.data(), pp, bias, y,
                         scratch[static_cast<std::size_t>(omp_get_thread_num())]);
}

void run_forward(const Problem& p, const bf16* x, const float* w, const float* bias, bf16* y) {
  if (p.cout_g > 16) run_forward_tiles<2, 2>(p, x, w, bias, y);
  else run_forward_tiles<1, 3>(p, x, w, bias, y);
}

/// Weight-gradient unit: for each pair of (tap, channel block) A tiles and each pair of output
/// channel blocks, C (input channels x output channels) sums over the tile's positions in tile
/// registers, then adds into acc[g][co][c * taps + t] (double).
SHARD_AMX void wgrad_unit(const FastPlan& fp, const FastTile& u, const bf16* x, const bf16* gy, Scratch& s,
                          double* acc) {
  const Problem& p = *fp.p;
  const TileGeom tg = tile_geom(fp, u, 32);
  const index_t ntaps = p.taps.count();
  const index_t cin_pad = fp.cin_g <= 16 ? fp.cin_g : round_up(fp.cin_g, 16), kc = std::min<index_t>(16, cin_pad);
  const index_t cblocks = cin_pad / kc;
  fill_block(fp, u, tg, x + u.n * p.x_batch_stride + u.g * fp.cin_g * fp.xl.c, s.P.data());
  std::fill_n(s.P.data() + fp.cin_g * tg.PS, (cin_pad - fp.cin_g) * tg.PS + tg.Vpad - tg.V + 64, bf16{});
  tap_offsets(fp, tg, s.rel.data());
  const index_t mpad = round_up(fp.cout_g, 16), mblocks = mpad / 16;
  load_gy_tile(fp, u, tg, gy, mpad, s.G.data());
  // Gt[vp][m] = the two bf16 of G[m][2vp, 2vp + 1] as one word.
  const u32* Gw = reinterpret_cast<const u32*>(s.G.data());
  u32* Gt = s.Gt.data();
  const index_t vpairs = tg.Vpad / 2;
  for (index_t v0 = 0; v0 < vpairs; v0 += 16)
    for (index_t m = 0; m < mpad; ++m)
      for (index_t v = v0; v < v0 + 16; ++v) Gt[v * mpad + m] = Gw[m * vpairs + v];
  TileCfg cfg;
  for (int i = 0; i < 4; ++i) cfg.rows[i] = static_cast<std::uint8_t>(kc), cfg.colsb[i] = 64;  // C
  for (int i = 4; i < 6; ++i) cfg.rows[i] = static_cast<std::uint8_t>(kc), cfg.colsb[i] = 64;  // A
  for (int i = 6; i < 8; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;                              // B
  _tile_loadconfig(&cfg);
  const long astride = static_cast<long>(tg.PS * 2), bstride = static_cast<long>(mpad * 4);
  const index_t combos = ntaps * cblocks;  // A tiles: combo = t * cblocks + cb
  float* cb_buf = s.C.data();              // 4 tiles of 16 x 16
  double* accg = acc + u.g * fp.cout_g * fp.krows;
  for (index_t q = 0; q < combos; q += 2)
    for (index_t mb = 0; mb < mblocks; mb += 2) {
      const bool two_a = q + 1 < combos, two_b = mb + 1 < mblocks;
      const index_t t0 = q / cblocks, c0 = q % cblocks, t1 = (q + 1) / cblocks, c1 = (q + 1) % cblocks;
      const bf16* a0 = s.P.data() + c0 * 16 * tg.PS + s.rel[static_cast<std::size_t>(t0)];
      const bf16* a1 = two_a ? s.P.data() + c1 * 16 * tg.PS + s.rel[static_cast<std::size_t>(t1)] : a0;
      const u32* b0 = Gt + mb * 16;
      const u32* b1 = two_b ? b0 + 16 : b0;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (index_t v0 = 0; v0 < tg.Vpad; v0 += 32) {
        _tile_loadd(4, a0 + v0, astride);
        _tile_loadd(5, a1 + v0, astride);
        _tile_loadd(6, b0 + (v0 / 2) * mpad, bstride);
        _tile_loadd(7, b1 + (v0 / 2) * mpad, bstride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, cb_buf, 64);
      _tile_stored(1, cb_buf + 256, 64);
      _tile_stored(2, cb_buf + 512, 64);
      _tile_stored(3, cb_buf + 768, 64);
      for (int ia = 0; ia < (two_a ? 2 : 1); ++ia)
        for (int ib = 0; ib < (two_b ? 2 : 1); ++ib) {
          const float* ct = cb_buf + (ia * 2 + ib) * 256;
          const index_t t = ia ? t1 : t0, cbk = ia ? c1 : c0;
          for (index_t ci = 0; ci < kc && cbk * 16 + ci < fp.cin_g; ++ci)
            for (index_t mi = 0; mi < 16 && (mb + ib) * 16 + mi < fp.cout_g; ++mi)
              accg[((mb + ib) * 16 + mi) * fp.krows + (cbk * 16 + ci) * ntaps + t] +=
                  static_cast<double>(ct[ci * 16 + mi]);
        }
    }
  _tile_release();
}
#undef SHARD_AMX

void run_wgrad(const Problem& p, const bf16* x, const bf16* gy, float* gw) {
  const FastPlan fp = make_plan(p, sizeof(float), fast_threads(p.cfg, 1 << 30), 32, 16);
  const index_t wn = p.groups * fp.cout_g * fp.krows;
  const index_t cin_pad = fp.cin_g <= 16 ? fp.cin_g : round_up(fp.cin_g, 16);
  const index_t ps_max = fp.span[0] * (fp.rows + fp.span[1] - 1) * (fp.cols + fp.span[2] - 1);
  const int nth = fast_threads(p.cfg, fp.units);
  std::vector<Scratch> scratch(static_cast<std::size_t>(nth));
  std::vector<double> partial(static_cast<std::size_t>(nth * wn), 0.0);
  for (auto& s : scratch) {
    s.P.resize(static_cast<std::size_t>(cin_pad * ps_max + 2 * 32 + 128));
    s.G.resize(static_cast<std::size_t>(fp.c_cap));
    s.Gt.resize(static_cast<std::size_t>(fp.c_cap / 2 + 16));
    s.C.resize(1024);
    s.rel.resize(static_cast<std::size_t>(p.taps.count() + 16));
  }
#pragma omp parallel for schedule(static) num_threads(nth)
  for (index_t u = 0; u < fp.units; ++u) {
    const int t = omp_get_thread_num();
    wgrad_unit(fp, decode(fp, u), x, gy, scratch[static_cast<std::size_t>(t)], partial.data() + t * wn);
  }
  sum_partials(partial, nth, wn, gw);
}
}  // namespace amx

// ---------------------------------------------------------------- AVX-512 BF16 (vdpbf16ps)
// bf16 x and y (or gy) with bf16 weights on a CPU whose bf16 unit is avx512_bf16 (cpu_bf16()):
// VDPBF16PS adds, in each of 16 f32 lanes, the two exact products of a bf16 pair to the lane
// (two f32 roundings per instruction, as two FMAs on the widened values would do), so one
// instruction does the work of two f32 FMAs. The register blocking follows the f32 kernels:
//  * Forward / input gradient: the channel-pair block P2 (fill_pairs); 8 output channels x 48
//    positions of accumulators; per (channel pair, tap) row: 3 loads of 16 pairs and 8 broadcast
//    weight pairs (packed once per call).
//  * Weight gradient: both operands are plain bf16 rows (the gy tile and the block at the tap's
//    offset), whose consecutive POSITIONS form the pairs: 4 output channels x 6 (channel, tap)
//    rows of accumulators over 32 positions per instruction, lane sums added in double at the end.
namespace dot {
#define SHARD_DOT __attribute__((target("avx512bf16,avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
constexpr int L = 16, MR = 8, NV = 3, NVL = NV * L;  // forward register block
constexpr int WM = 4, WK = 6, WL = 2 * L;            // weight-gradient register block; positions per vector

struct Scratch {
  AlignedBuf<u32> P2;   ///< forward: channel-pair block
  AlignedBuf<bf16> P;   ///< weight gradient: plain block
  AlignedBuf<bf16> G;   ///< weight gradient: gy tile [mpad][Vpad]
  AlignedBuf<float> C;  ///< forward: output tile
  AlignedBuf<float> A;  ///< weight gradient: vector partial sums
  AlignedBuf<index_t> rel;
};

SHARD_DOT inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

/// c[m][j] (+)= sum over the K (pair, tap) rows k of ap[k][m] . base[rel[k] + j] (a bf16 pair dot
/// product per lane), m < MR, j < NVL.
SHARD_DOT void kernel_fwd(index_t K, const u32* ap, const u32* base, const index_t* rel, float* c, index_t ldc,
                          bool accumulate) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 3
    for (int j = 0; j < NV; ++j) acc[m][j] = accumulate ? _mm512_loadu_ps(c + m * ldc + j * L) : _mm512_setzero_ps();
  for (index_t k = 0; k < K; ++k) {
    const u32* bk = base + rel[k];
    __m512bh b[NV];
#pragma GCC unroll 3
    for (int j = 0; j < NV; ++j) b[j] = as_bh(_mm512_loadu_si512(bk + j * L));
    const u32* a = ap + k * MR;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512bh am = as_bh(_mm512_set1_epi32(static_cast<int>(a[m])));
#pragma GCC unroll 3
      for (int j = 0; j < NV; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], b[j], am);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 3
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(c + m * ldc + j * L, acc[m][j]);
}

SHARD_DOT void forward_unit(const FastPlan& fp, const FastTile& u, const bf16* x, const u32* ap, index_t cpairs,
                            index_t kp, const float* bias, bf16* y, Scratch& s) {
  const Problem& p = *fp.p;
  const TileGeom tg = tile_geom(fp, u, NVL);
  fill_pairs(fp, u, tg, x + u.n * p.x_batch_stride + u.g * fp.cin_g * fp.xl.c, cpairs, s.P2.data());
  FastPlan pairs = fp;  // rel[(cp, t)] = cp * PS + the tap's offset
  pairs.cin_g = cpairs;
  build_rel(pairs, tg, s.rel.data());
  const index_t mblocks = (fp.cout_g + MR - 1) / MR;
  const u32* apg = ap + u.g * mblocks * MR * kp;
  constexpr index_t kchunk = 24576 / (NVL * sizeof(u32));  // one v-block's rows of a k chunk stay in L1
  for (index_t v0 = 0; v0 < tg.Vpad; v0 += NVL)
    for (index_t k0 = 0; k0 < kp; k0 += kchunk)
      for (index_t mb = 0; mb < mblocks; ++mb)
        kernel_fwd(std::min(kchunk, kp - k0), apg + (mb * kp + k0) * MR, s.P2.data() + v0, s.rel.data() + k0,
                   s.C.data() + mb * MR * tg.Vpad + v0, tg.Vpad, k0 > 0);
  store_tile_narrow(fp, u, tg, s.C.data(), bias, y);
}

void run_forward(const Problem& p, const bf16* x, const float* w, const float* bias, bf16* y) {
  const FastPlan fp = make_plan(p, sizeof(float), fast_threads(p.cfg, 1 << 30), NVL, MR);
  const index_t ntaps = p.taps.count(), cpairs = (fp.cin_g + 1) / 2, kp = cpairs * ntaps;
  const index_t mblocks = (fp.cout_g + MR - 1) / MR;
  // ap[g][mb][cp * ntaps + t][m] = (w[co][2cp][t], w[co][2cp+1][t]) as bf16 bits, co = MR mb + m
  // (w holds bf16 values: the rounding is exact; the partner of an odd last channel is 0).
  std::vector<u32> ap(static_cast<std::size_t>(p.groups * mblocks * kp * MR), 0);
  for (index_t g = 0; g < p.groups; ++g)
    for (index_t co = 0; co < fp.cout_g; ++co) {
      const float* wr = w + (g * fp.cout_g + co) * fp.krows;
      for (index_t cp = 0; cp < cpairs; ++cp)
        for (index_t t = 0; t < ntaps; ++t) {
          const u32 lo = cvt::bf16_bits(wr[2 * cp * ntaps + t]);
          const u32 hi = 2 * cp + 1 < fp.cin_g ? u32{cvt::bf16_bits(wr[(2 * cp + 1) * ntaps + t])} : 0u;
          ap[static_cast<std::size_t>(((g * mblocks + co / MR) * kp + cp * ntaps + t) * MR + co % MR)] = lo | (hi << 16);
        }
    }
  const index_t ps_max = fp.span[0] * (fp.rows + fp.span[1] - 1) * (fp.cols + fp.span[2] - 1);
  const int nth = fast_threads(p.cfg, fp.units);
  std::vector<Scratch> scratch(static_cast<std::size_t>(nth));
  for (auto& sc : scratch) {
    sc.P2.resize(static_cast<std::size_t>(cpairs * ps_max + 2 * NVL + 128));
    sc.C.resize(static_cast<std::size_t>(fp.c_cap));
    sc.rel.resize(static_cast<std::size_t>(kp + 16));
  }
#pragma omp parallel for schedule(static) num_threads(nth)
  for (index_t u = 0; u < fp.units; ++u)
    forward_unit(fp, decode(fp, u), x, ap.data(), cpairs, kp, bias, y,
                 scratch[static_cast<std::size_t>(omp_get_thread_num())]);
}

/// acc[m][t] (vector partial sums in accmem, block mb at accmem + mb * WM * WK * L) += the pair dot
/// products of g[m][v, v+1] and base[rel[t] + v, + v+1] over v < nvec * WL, for nmb m-blocks.
SHARD_DOT void kernel_wgrad(index_t nvec, index_t nmb, const bf16* g, index_t ldg, const bf16* base,
                            const index_t* rel, float* accmem) {
  const bf16* bt[WK];
#pragma GCC unroll 6
  for (int t = 0; t < WK; ++t) bt[t] = base + rel[t];
  for (index_t mb = 0; mb < nmb; ++mb, g += WM * ldg, accmem += WM * WK * L) {
    __m512 acc[WM][WK];
#pragma GCC unroll 4
    for (int m = 0; m < WM; ++m)
#pragma GCC unroll 6
      for (int t = 0; t < WK; ++t) acc[m][t] = _mm512_loadu_ps(accmem + (m * WK + t) * L);
    for (index_t v = 0; v < nvec * WL; v += WL) {
      __m512bh a[WM];
#pragma GCC unroll 4
      for (int m = 0; m < WM; ++m) a[m] = as_bh(_mm512_loadu_si512(g + m * ldg + v));
#pragma GCC unroll 6
      for (int t = 0; t < WK; ++t) {
        __m512i bi = _mm512_loadu_si512(bt[t] + v);
        __asm__("" : "+v"(bi));  // one load of the P row, reused by the WM instructions (kernel_wgrad, .inc)
        const __m512bh b = as_bh(bi);
#pragma GCC unroll 4
        for (int m = 0; m < WM; ++m) acc[m][t] = _mm512_dpbf16_ps(acc[m][t], a[m], b);
      }
    }
#pragma GCC unroll 4
    for (int m = 0; m < WM; ++m)
#pragma GCC unroll 6
      for (int t = 0; t < WK; ++t) _mm512_storeu_ps(accmem + (m * WK + t) * L, acc[m][t]);
  }
}

/// accg[m][k] += the sum of the 16 lanes of partial-sum vector (m, k), in double (widened exactly,
/// summed in a fixed tree: deterministic). Vectorised: with scalar lane sums this loop was a fifth
/// of the weight gradient's time.
SHARD_DOT void add_lane_sums(const FastPlan& fp, index_t kpad, index_t mpad, const float* A, double* accg) {
  for (index_t kb = 0; kb < kpad; kb += WK)
    for (index_t mb = 0; mb < mpad; mb += WM) {
      const float* a = A + ((kb / WK) * (mpad / WM) + mb / WM) * WM * WK * L;
      for (int m = 0; m < WM && mb + m < fp.cout_g; ++m)
        for (int t = 0; t < WK && kb + t < fp.krows; ++t) {
          const __m512 v = _mm512_loadu_ps(a + (m * WK + t) * L);
          // maskz extracts (no casts, no _mm512_reduce_add_pd): GCC 12 builds those on an "undefined"
          // source it warns about (-Wmaybe-uninitialized)
          const __m512d lo = _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, v, 0));
          const __m512d hi = _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, v, 1));
          const __m512d s8 = _mm512_add_pd(lo, hi);
          const __m256d s4 = _mm256_add_pd(_mm512_maskz_extractf64x4_pd(0xff, s8, 0), _mm512_maskz_extractf64x4_pd(0xff, s8, 1));
          const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
          accg[(mb + m) * fp.krows + kb + t] += _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
        }
    }
}

void wgrad_unit(const FastPlan& fp, const FastTile& u, const bf16* x, const bf16* gy, Scratch& s, double* acc) {
  const Problem& p = *fp.p;
  const TileGeom tg = tile_geom(fp, u, WL);
  const std::size_t acc_bytes =
      static_cast<std::size_t>(((fp.cout_g + WM - 1) / WM * WM) * ((fp.krows + WK - 1) / WK * WK) * L) * sizeof(float);
  const index_t chunk = acc_bytes <= (std::size_t{256} << 10) ? index_t{512} : tg.Vpad;  // 1 KiB of each G row
  fill_block(fp, u, tg, x + u.n * p.x_batch_stride + u.g * fp.cin_g * fp.xl.c, s.P.data());
  build_rel(fp, tg, s.rel.data());
  const index_t mpad = (fp.cout_g + WM - 1) / WM * WM;
  load_gy_tile(fp, u, tg, gy, mpad, s.G.data());
  const index_t kpad = (fp.krows + WK - 1) / WK * WK;
  for (index_t k = fp.krows; k < kpad; ++k) s.rel[static_cast<std::size_t>(k)] = 0;
  const index_t blocks = (mpad / WM) * (kpad / WK);
  s.A.assign(static_cast<std::size_t>(blocks * WM * WK * L), 0.0f);
  for (index_t v0 = 0; v0 < tg.Vpad; v0 += chunk) {
    const index_t nvec = std::min(chunk, tg.Vpad - v0) / WL;
    for (index_t kb = 0; kb < kpad; kb += WK)
      kernel_wgrad(nvec, mpad / WM, s.G.data() + v0, tg.Vpad, s.P.data() + v0, s.rel.data() + kb,
                   s.A.data() + (kb / WK) * (mpad / WM) * WM * WK * L);
  }
  add_lane_sums(fp, kpad, mpad, s.A.data(), acc + u.g * fp.cout_g * fp.krows);
}

void run_wgrad(const Problem& p, const bf16* x, const bf16* gy, float* gw) {
  const FastPlan fp = make_plan(p, sizeof(float), fast_threads(p.cfg, 1 << 30), WL, WM);
  const index_t wn = p.groups * fp.cout_g * fp.krows;
  const index_t ps_max = fp.span[0] * (fp.rows + fp.span[1] - 1) * (fp.cols + fp.span[2] - 1);
  const int nth = fast_threads(p.cfg, fp.units);
  std::vector<Scratch> scratch(static_cast<std::size_t>(nth));
  std::vector<double> partial(static_cast<std::size_t>(nth * wn), 0.0);
  for (auto& sc : scratch) {
    sc.P.resize(static_cast<std::size_t>(fp.cin_g * ps_max + 2 * WL + 128));
    sc.G.resize(static_cast<std::size_t>(fp.c_cap));
    sc.rel.resize(static_cast<std::size_t>(fp.krows + WK + 16));
  }
#pragma omp parallel for schedule(static) num_threads(nth)
  for (index_t u = 0; u < fp.units; ++u) {
    const int t = omp_get_thread_num();
    wgrad_unit(fp, decode(fp, u), x, gy, scratch[static_cast<std::size_t>(t)], partial.data() + t * wn);
  }
  sum_partials(partial, nth, wn, gw);
}
#undef SHARD_DOT
}  // namespace dot

namespace {

/// The micro-kernel family to use (cpu_isa(), lowered by the ConvKernel setting).
CpuIsa active_isa(ConvKernel kernel) {
  const CpuIsa hw = cpu_isa();
  switch (kernel) {
    case ConvKernel::automatic: return hw;
    case ConvKernel::direct_avx2: return std::min(hw, CpuIsa::avx2);
    default: return CpuIsa::scalar;
  }
}

bool eligible(const Problem& p) {
  if (active_isa(p.cfg.kernel) == CpuIsa::scalar) return false;
  if (p.taps.stride != Ext3{1, 1, 1} || p.taps.count() == 0 || p.cin_g == 0 || p.cout_g == 0) return false;
  return p.batch > 0 && p.out[0] * p.out[1] * p.out[2] > 0;
}

template <class Vt, class S>
void run_forward(const Problem& p, const S* x, const typename Vt::T* w, const typename Vt::T* bias, S* y,
                 void (*unit)(const FastPlan&, const FastTile&, const S*, const typename Vt::T*,
                              const typename Vt::T*, S*, FastScratch<typename Vt::T>&)) {
  using T = typename Vt::T;
  constexpr index_t NVL = Vt::NV * Vt::L;
  const FastPlan fp = make_plan(p, sizeof(T), fast_threads(p.cfg, 1 << 30), NVL, Vt::MR);
  std::vector<T> ap;
  {
    const index_t mblocks = (fp.cout_g + Vt::MR - 1) / Vt::MR;
    ap.assign(static_cast<std::size_t>(p.groups * mblocks * Vt::MR * fp.krows), T(0));
    for (index_t g = 0; g < p.groups; ++g)
      for (index_t co = 0; co < fp.cout_g; ++co)
        for (index_t k = 0; k < fp.krows; ++k)
          ap[static_cast<std::size_t>(((g * mblocks + co / Vt::MR) * fp.krows + k) * Vt::MR + co % Vt::MR)] =
              w[(g * fp.cout_g + co) * fp.krows + k];
  }
  const int nth = fast_threads(p.cfg, fp.units);
  std::vector<FastScratch<T>> scratch(static_cast<std::size_t>(nth));
  for (auto& s : scratch) {
    s.P.resize(static_cast<std::size_t>(fp.p_cap));
    s.C.resize(static_cast<std::size_t>(fp.c_cap));
    s.rel.resize(static_cast<std::size_t>(fp.krows + 16));
  }
#pragma omp parallel for schedule(static) num_threads(nth)
  for (index_t u = 0; u < fp.units; ++u)
    unit(fp, decode(fp, u), x, ap.data(), bias, y, scratch[static_cast<std::size_t>(omp_get_thread_num())]);
}

/// gw in the compute dtype T (rounded once from the double sums).
template <class Vt, class S>
void run_wgrad(const Problem& p, const S* x, const S* gy, typename Vt::T* gw,
               void (*unit)(const FastPlan&, const FastTile&, const S*, const S*, FastScratch<typename Vt::T>&,
                            double*)) {
  using T = typename Vt::T;
  const FastPlan fp = make_plan(p, sizeof(T), fast_threads(p.cfg, 1 << 30), Vt::L, Vt::WM);
  const index_t wn = p.groups * fp.cout_g * fp.krows;
  const int nth = fast_threads(p.cfg, fp.units);
  std::vector<FastScratch<T>> scratch(static_cast<std::size_t>(nth));
  std::vector<double> partial(static_cast<std::size_t>(nth * wn), 0.0);
  for (auto& s : scratch) {
    s.P.resize(static_cast<std::size_t>(fp.p_cap));
    s.C.resize(static_cast<std::size_t>(fp.c_cap));
    s.rel.resize(static_cast<std::size_t>(fp.krows + Vt::WK + 16));
  }
#pragma omp parallel for schedule(static) num_threads(nth)
  for (index_t u = 0; u < fp.units; ++u) {
    const int t = omp_get_thread_num();
    unit(fp, decode(fp, u), x, gy, scratch[static_cast<std::size_t>(t)], partial.data() + t * wn);
  }
  sum_partials(partial, nth, wn, gw);
}

template <class T> struct Pick;
template <> struct Pick<float> {
  using A512 = avx512::VecF;
  using A2 = avx2::VecF;
};
template <> struct Pick<double> {
  using A512 = avx512::VecD;
  using A2 = avx2::VecD;
};

}  // namespace

/// The bf16 dot-product kernels for p: bf16 storage, ExecSettings::native_low_precision, the avx512
/// level with the automatic kernel choice, and the CPU's bf16 unit (cpu_bf16(): AMX tiles or AVX-512
/// BF16); `widened` otherwise (the f32 micro-kernels on widened values).
template <class S>
CpuBf16 bf16_unit(const Problem& p) {
  if (!std::is_same_v<S, bf16> || !p.cfg.native_low_precision || active_isa(p.cfg.kernel) != CpuIsa::avx512)
    return CpuBf16::widened;
  return cpu_bf16();
}

template <class S, class T>
bool fast_gather_conv(const Problem& p, const S* x, const T* w, const T* bias, S* y) {
  if (!eligible(p)) return false;
  if constexpr (std::is_same_v<S, bf16>) {
    switch (bf16_unit<S>(p)) {
      case CpuBf16::amx: amx::run_forward(p, x, w, bias, y); return true;
      case CpuBf16::avx512_bf16: dot::run_forward(p, x, w, bias, y); return true;
      case CpuBf16::widened: break;
    }
  }
  if (active_isa(p.cfg.kernel) == CpuIsa::avx512) {
    using Vt = typename Pick<T>::A512;
    run_forward<Vt, S>(p, x, w, bias, y, &avx512::forward_unit<Vt, S>);
  } else {
    using Vt = typename Pick<T>::A2;
    run_forward<Vt, S>(p, x, w, bias, y, &avx2::forward_unit<Vt, S>);
  }
  return true;
}

template <class S, class T>
bool fast_weight_grad(const Problem& p, const S* x, const S* gy, T* gw) {
  if (!eligible(p) || p.y_ext != p.out || p.y_step != Ext3{1, 1, 1} || p.y_base != Ext3{0, 0, 0}) return false;
  if constexpr (std::is_same_v<S, bf16>) {
    switch (bf16_unit<S>(p)) {
      case CpuBf16::amx: amx::run_wgrad(p, x, gy, gw); return true;
      case CpuBf16::avx512_bf16: dot::run_wgrad(p, x, gy, gw); return true;
      case CpuBf16::widened: break;
    }
  }
  if (active_isa(p.cfg.kernel) == CpuIsa::avx512) {
    using Vt = typename Pick<T>::A512;
    run_wgrad<Vt, S>(p, x, gy, gw, &avx512::wgrad_unit<Vt, S>);
  } else {
    using Vt = typename Pick<T>::A2;
    run_wgrad<Vt, S>(p, x, gy, gw, &avx2::wgrad_unit<Vt, S>);
  }
  return true;
}

template bool fast_gather_conv<float, float>(const Problem&, const float*, const float*, const float*, float*);
template bool fast_gather_conv<double, double>(const Problem&, const double*, const double*, const double*, double*);
template bool fast_gather_conv<bf16, float>(const Problem&, const bf16*, const float*, const float*, bf16*);
template bool fast_gather_conv<f16, float>(const Problem&, const f16*, const float*, const float*, f16*);
template bool fast_weight_grad<float, float>(const Problem&, const float*, const float*, float*);
template bool fast_weight_grad<double, double>(const Problem&, const double*, const double*, double*);
template bool fast_weight_grad<bf16, float>(const Problem&, const bf16*, const bf16*, float*);
template bool fast_weight_grad<f16, float>(const Problem&, const f16*, const f16*, float*);

bool storage_path_applies(const Problem& p) { return eligible(p); }

const char* kernel_isa(ConvKernel kernel) noexcept {
  switch (active_isa(kernel)) {
    case CpuIsa::avx512: return "direct_avx512";
    case CpuIsa::avx2: return "direct_avx2";
    default: return "im2col_blas";
  }
}

}  // namespace shard::detail::conv_engine

namespace shard {
const char* conv_kernel_isa(ConvKernel kernel) noexcept { return detail::conv_engine::kernel_isa(kernel); }
}  // namespace shard
