#pragma once
// Tensor-core building blocks shared by the wmma attention kernels (kernels/attention_tc.cu: local
// attention; kernels/neighborhood_tc.cu: neighbourhood attention): fragment kinds (f16, bf16,
// TF32) and their shared-memory element types, the shared-memory layout of 64-row tiles, staging
// rows into tiles, the 16 x 64 score block of a warp and the accumulation of P V-like products.
// A block is 4 warps (kT threads) owning 64 rows, each warp 16; see attention_tc.cu's comment.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace shard::kernels::tc {

namespace wmma = nvcuda::wmma;
using tidx = std::int64_t;

constexpr int kT = 128;         ///< threads per block: 4 warps
constexpr int kBR = 64;         ///< rows a block owns, and rows of a walked tile
constexpr int kLS = kBR + 4;    ///< row stride of the float score tiles
constexpr int kMaxDM = 128;     ///< the largest padded head dim

struct HalfTag {};
struct Bf16Tag {};
struct Tf32Tag {};

/// f32 -> TF32 (kept in a float): round to nearest, ties away from zero, on the 13 bits below
/// TF32's 10-bit mantissa (cvt.rna.tf32.f32); inf and NaN pass unchanged.
__device__ inline float round_tf32(float x) {
  unsigned u = __float_as_uint(x);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  return __uint_as_float(u);
}

/// The shared-memory element type of a fragment kind, its k step, and the conversions into it.
template <class Tag>
struct Elem;
template <>
struct Elem<HalfTag> {
  using E = __half;
  static constexpr int KS = 16;
  __device__ static E from(float x) { return __float2half_rn(x); }
  __device__ static E in(__half x) { return x; }
};
template <>
struct Elem<Bf16Tag> {
  using E = __nv_bfloat16;
  static constexpr int KS = 16;
  __device__ static E from(float x) { return __float2bfloat16(x); }
  __device__ static E in(__nv_bfloat16 x) { return x; }
};
template <>
struct Elem<Tf32Tag> {
  using E = float;
  static constexpr int KS = 8;
  __device__ static E from(float x) { return round_tf32(x); }
  __device__ static E in(float x) { return round_tf32(x); }
};

/// wmma's element type of a fragment kind (bf16 and TF32 exist from compute capability 8.0).
template <class Tag>
struct Wm;
template <>
struct Wm<HalfTag> {
  using P = __half;
};
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // as mma.h's __CUDA_AMPERE_MMA__ (undefined at its end)
template <>
struct Wm<Bf16Tag> {
  using P = __nv_bfloat16;
};
template <>
struct Wm<Tf32Tag> {
  using P = wmma::precision::tf32;
};
#endif
template <class Tag, class Layout>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, Elem<Tag>::KS, typename Wm<Tag>::P, Layout>;
template <class Tag, class Layout>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, Elem<Tag>::KS, typename Wm<Tag>::P, Layout>;
template <class Tag>
using FragC = wmma::fragment<wmma::accumulator, 16, 16, Elem<Tag>::KS, float>;

constexpr std::size_t round128(std::size_t n) { return (n + 127) / 128 * 128; }

/// Shared-memory layout (bytes) of a fragment kind at padded head dim DM. Operand tiles are
/// [64][DM + pad] in the element type (pad: 16 bytes, which keeps wmma's ldm a multiple of 16
/// bytes and shifts consecutive rows by 4 banks); score tiles [64][68] float; probability / dS
/// tiles [64][64 + pad]. Every region starts on 128 bytes (wmma wants 32).
template <class Tag, int DM>
struct Lay {
  using E = typename Elem<Tag>::E;
  static constexpr int PAD = 16 / static_cast<int>(sizeof(E));
  static constexpr int LDE = DM + PAD;  ///< operand tiles
  static constexpr int LDP = kBR + PAD; ///< probability / dS tiles
  static constexpr int LDO = DM + 4;    ///< float output tile (over two operand tiles at the end)
  static constexpr std::size_t kE = round128(sizeof(E) * kBR * LDE);
  static constexpr std::size_t kS = round128(sizeof(float) * kBR * kLS);
  static constexpr std::size_t kP = round128(sizeof(E) * kBR * LDP);
  static constexpr std::size_t kRid = sizeof(float) * 256;  ///< the 16 x 16 row-index matrix
  static constexpr std::size_t kRow = sizeof(float) * kBR;  ///< one float per row
  static constexpr std::size_t fwd = 3 * kE + kS + kP + kRid + kRow;
  static constexpr std::size_t dq = 4 * kE + 2 * kS + kP;
  static constexpr std::size_t dkdv = 4 * kE + 2 * kS + 2 * kP + 2 * kRow;
  static_assert(2 * kE >= sizeof(float) * kBR * LDO, "the float output tile must fit over two operand tiles");
};

/// 64 rows into dst[rr * ld + d] (rr < 64, d < DM), converted to the element type: row rr is
/// `row(rr)` (a const T* to its first element, or nullptr for a zero row), width w (zero beyond).
/// `vec`: every row pointer is 16-byte aligned (then 16-byte vector loads; the caller decides
/// once per block).
template <class Tag, int DM, class T, class Row>
__device__ inline void stage_rows(typename Elem<Tag>::E* dst, int ld, Row row, tidx w, bool vec) {
  using E = typename Elem<Tag>::E;
  static_assert(sizeof(E) == sizeof(T), "storage and fragment elements have one width");
  constexpr int VW = 16 / static_cast<int>(sizeof(T));
  constexpr int CH = DM / VW;
  for (int e = threadIdx.x; e < kBR * CH; e += kT) {
    const int rr = e / CH, c = (e % CH) * VW;
    E* d = dst + rr * ld + c;
    const T* s = row(rr);
    if (s && vec && c + VW <= w) {
      s += c;
      if constexpr (std::is_same<E, float>::value) {
        float4 f = *reinterpret_cast<const float4*>(s);
        f.x = Elem<Tag>::in(f.x), f.y = Elem<Tag>::in(f.y), f.z = Elem<Tag>::in(f.z), f.w = Elem<Tag>::in(f.w);
        *reinterpret_cast<float4*>(d) = f;
      } else {
        *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(s);
      }
    } else {
#pragma unroll
      for (int t = 0; t < VW; ++t) d[t] = s && c + t < w ? Elem<Tag>::in(s[c + t]) : Elem<Tag>::from(0.f);
    }
  }
}
/// Rows [r0, r0 + nr) of X (row stride sn, width w), zero rows beyond nr; vector loads where the
/// base is 16-byte aligned and the row stride a multiple of 16 bytes.
template <class Tag, int DM, class T>
__device__ inline void stage(typename Elem<Tag>::E* dst, int ld, const T* X, tidx sn, tidx r0, int nr, tidx w) {
  constexpr int VW = 16 / static_cast<int>(sizeof(T));
  const bool vec = reinterpret_cast<std::uintptr_t>(X) % 16 == 0 && sn % VW == 0;
  stage_rows<Tag, DM, T>(dst, ld, [&](int rr) { return rr < nr ? X + (r0 + rr) * sn : static_cast<const T*>(nullptr); },
                         w, vec);
}

/// The first multiple of `step` at or above n.
__device__ inline int round_up(tidx n, int step) { return static_cast<int>((n + step - 1) / step * step); }

/// acc[n] (n < 4) = rows [16w, 16w + 16) of A (ld la, row-major) times the transposed rows
/// [16n, 16n + 16) of B (ld lb): the 16 x 64 block A_w B^T over reduction length kd.
template <class Tag>
__device__ inline void scores(FragC<Tag> (&acc)[4], const typename Elem<Tag>::E* A, int la,
                              const typename Elem<Tag>::E* B, int lb, int kd, int w) {
  constexpr int KS = Elem<Tag>::KS;
#pragma unroll
  for (int n = 0; n < 4; ++n) wmma::fill_fragment(acc[n], 0.f);
  for (int kk = 0; kk < kd; kk += KS) {
    FragA<Tag, wmma::row_major> a;
    wmma::load_matrix_sync(a, A + 16 * w * la + kk, la);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      FragB<Tag, wmma::col_major> bf;
      wmma::load_matrix_sync(bf, B + 16 * n * lb + kk, lb);
      wmma::mma_sync(acc[n], a, bf, acc[n]);
    }
  }
}
template <class Tag>
__device__ inline void store_scores(float* S, const FragC<Tag> (&acc)[4], int w) {
#pragma unroll
  for (int n = 0; n < 4; ++n) wmma::store_matrix_sync(S + 16 * w * kLS + 16 * n, acc[n], kLS, wmma::mem_row_major);
}

/// acc[n] (16n < width) += rows [16w, +16) of P (ld lp, row-major, kr columns) times rows [0, kr)
/// of B (ld lb, row-major), columns [16n, 16n + 16).
template <class Tag, int NF>
__device__ inline void accumulate(FragC<Tag> (&acc)[NF], const typename Elem<Tag>::E* P, int lp,
                                  const typename Elem<Tag>::E* B, int lb, int kr, tidx width, int w) {
  constexpr int KS = Elem<Tag>::KS;
  for (int kk = 0; kk < kr; kk += KS) {
    FragA<Tag, wmma::row_major> a;
    wmma::load_matrix_sync(a, P + 16 * w * lp + kk, lp);
#pragma unroll
    for (int n = 0; n < NF; ++n) {
      if (16 * n >= width) break;
      FragB<Tag, wmma::row_major> bf;
      wmma::load_matrix_sync(bf, B + kk * lb + 16 * n, lb);
      wmma::mma_sync(acc[n], a, bf, acc[n]);
    }
  }
}

/// The warp's 16 x DM accumulator rows through the float tile O (ld ldo, rows [16w, +16)).
template <class Tag, int NF>
__device__ inline void store_rows(float* O, int ldo, const FragC<Tag> (&acc)[NF], int w) {
#pragma unroll
  for (int n = 0; n < NF; ++n) wmma::store_matrix_sync(O + 16 * w * ldo + 16 * n, acc[n], ldo, wmma::mem_row_major);
}

/// Adds the warp's rows [16w, +16) of the float tile O (width w_out) to gradient o's rows
/// r0 + row, for rows < nrows whose `keep(row)` holds.
/// acc[n].x[t] *= f[16 w + the row of element t]: a per-row factor on a warp's accumulator rows,
/// the row read from `rid` (an accumulator fragment loaded from a 16 x 16 matrix of its row
/// numbers: load, mma and store of one fragment type agree on the element layout).
template <class Tag, int NF>
__device__ inline void scale_rows(FragC<Tag> (&acc)[NF], const FragC<Tag>& rid, const float* f, int w) {
#pragma unroll
  for (int n = 0; n < NF; ++n)
#pragma unroll
    for (int t = 0; t < acc[n].num_elements; ++t) acc[n].x[t] *= f[16 * w + static_cast<int>(rid.x[t])];
}

/// One tile of the online softmax of row r, held by a lane pair (columns [c0, c0 + 32) each):
/// srow holds the raw scores, score(c, s) the masked, scaled one (-inf: not visible). Writes P to
/// prow in the fragment type, updates the row's running max mx and sum l, and sets Rf[r] (even
/// lane) to the factor that rescales the row's output so far. Every lane takes part in the
/// shuffles (full mask); rows with nothing visible yet keep P = 0 and their statistics.
template <class Tag, class Score>
__device__ inline void online_softmax(float* srow, typename Elem<Tag>::E* prow, int c0, Score score, float& mx,
                                      float& l, float* Rf, int r, int lane) {
  float tmax = -INFINITY;
#pragma unroll 8
  for (int c = c0; c < c0 + 32; ++c) {
    const float sv = score(c, srow[c]);
    srow[c] = sv;
    tmax = fmaxf(tmax, sv);
  }
  const float mnew = fmaxf(mx, fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1)));
  const bool live = mnew != -INFINITY;
  float ps = 0.f;
#pragma unroll 8
  for (int c = c0; c < c0 + 32; ++c) {
    const float p = live ? expf(srow[c] - mnew) : 0.f;
    prow[c] = Elem<Tag>::from(p);
    ps += p;
  }
  ps += __shfl_xor_sync(0xffffffffu, ps, 1);
  float cs = 1.f;
  if (live) {
    cs = expf(mx - mnew);  // 0 while mx is -inf
    l = l * cs + ps;
    mx = mnew;
  }
  if ((lane & 1) == 0) Rf[r] = cs;
}

/// The current device's compute capability as 10 * major + minor (0 when it cannot be read),
/// kept per device (0..31).
inline int device_sm() {
  static int cache[32] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (dev >= 0 && dev < 32) {
    const int c = __atomic_load_n(&cache[dev], __ATOMIC_ACQUIRE);
    if (c) return c;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const int sm = 10 * major + minor;
  if (dev >= 0 && dev < 32) __atomic_store_n(&cache[dev], sm, __ATOMIC_RELEASE);
  return sm;
}

/// True in a device pass below compute capability 8.0 for the bf16 / TF32 kinds: their kernels
/// trap there (the host never launches them: it asks device_sm() first).
template <class Tag>
struct NeedsSm80Here {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  static constexpr bool value = !std::is_same<Tag, HalfTag>::value;
#else
  static constexpr bool value = false;
#endif
};

}  // namespace shard::kernels::tc
