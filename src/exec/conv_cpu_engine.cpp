// Tiled im2col + GEMM engine of the conv family's CPU table (see conv_cpu_engine.hpp).
#include "conv_cpu_engine.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "shardtensor/exec/conv.hpp"
#include "shardtensor/exec/blas.hpp"
#include "shardtensor/runtime/memory.hpp"

namespace shard {
namespace detail::conv_engine {
namespace {

/// Scratch memory from the host caching allocator (see the users below).
template <class T>
struct Scratch {
  std::shared_ptr<void> mem;
  T* data() const { return static_cast<T*>(mem.get()); }
};
template <class T>
Scratch<T> zeroed_scratch(std::size_t n) {
  Scratch<T> s{allocate_bytes(n * sizeof(T), Device::cpu())};
  if (n) std::memset(s.mem.get(), 0, n * sizeof(T));
  return s;
}

index_t floor_div(index_t a, index_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
index_t ceil_div(index_t a, index_t b) { return -floor_div(-a, b); }
index_t vol(const Ext3& e) { return e[0] * e[1] * e[2]; }

/// A run of output positions with fixed (o0, o1): o2 in [o2_begin, o2_begin + len), stored
/// at column `col` of the tile.
struct Segment {
  index_t o0, o1, o2_begin, len, col;
};

void tile_segments(const Ext3& out, index_t p0, index_t np, std::vector<Segment>& segs) {
  segs.clear();
  for (index_t col = 0, p = p0; col < np;) {
    const index_t o2 = p % out[2], r = p / out[2];
    const index_t len = std::min(out[2] - o2, np - col);
    segs.push_back({r / out[1], r % out[1], o2, len, col});
    p += len;
    col += len;
  }
}

/// col[(c, t0, t1, t2), j] = x[c, i(o_j, t)] (0 outside the input) for the tile's positions.
template <class T>
void im2col(const Problem& p, const T* x, const std::vector<Segment>& segs, index_t np, T* col) {
  const Ext3& in = p.in;
  const Ext3& s = p.taps.stride;
  const auto& off = p.taps.off;
  const XLayout xl = x_layout(p);
  index_t row = 0;
  for (index_t c = 0; c < p.cin_g; ++c) {
    const T* xc = x + c * xl.c;
    for (index_t d0 : off[0]) {
      for (index_t d1 : off[1]) {
        for (index_t d2 : off[2]) {
          T* crow = col + (row++) * np;
          const index_t wa = ceil_div(-d2, s[2]), wb = floor_div(in[2] - 1 - d2, s[2]) + 1;
          for (const Segment& sg : segs) {
            T* dst = crow + sg.col;
            const index_t i0 = sg.o0 * s[0] + d0, i1 = sg.o1 * s[1] + d1;
            if (i0 < 0 || i0 >= in[0] || i1 < 0 || i1 >= in[1]) {
              std::fill_n(dst, sg.len, T(0));
              continue;
            }
            const T* xr = xc + i0 * xl.s0 + i1 * xl.s1;
            const index_t e = sg.o2_begin + sg.len;
            const index_t a = std::clamp(wa, sg.o2_begin, e), b = std::clamp(wb, a, e);
            std::fill_n(dst, a - sg.o2_begin, T(0));
            if (s[2] == 1) {
              std::memcpy(dst + (a - sg.o2_begin), xr + a + d2, sizeof(T) * static_cast<std::size_t>(b - a));
            } else {
              T* o = dst - sg.o2_begin;
              for (index_t w = a; w < b; ++w) o[w] = xr[w * s[2] + d2];
            }
            std::fill_n(dst + (b - sg.o2_begin), e - b, T(0));
          }
        }
      }
    }
  }
}

struct TilePlan {
  index_t tile = 1, ntiles = 0;
};

/// Tiles of the `positions` output positions: each tile's column buffer (krows x tile) within
/// the budget (at least 64 positions), and enough (batch, group, tile) units for the threads.
TilePlan plan_tiles(const EngineSettings& cfg, index_t krows, index_t positions, index_t other_units, std::size_t elem,
                    int threads) {
  TilePlan tp;
  if (positions == 0) return tp;
  const std::size_t row_bytes = std::max<std::size_t>(1, static_cast<std::size_t>(krows) * elem);
  const index_t tmax = std::max<index_t>(64, static_cast<index_t>(cfg.column_budget / row_bytes));
  index_t nt = (positions + tmax - 1) / tmax;
  if (threads > 1) {
    const index_t units = nt * other_units;
    if (units % threads != 0) nt = ((units + threads - 1) / threads * threads + other_units - 1) / other_units;
    nt = std::min(nt, positions);
  }
  tp.tile = (positions + nt - 1) / nt;
  tp.ntiles = (positions + tp.tile - 1) / tp.tile;
  return tp;
}

/// Threads for `units` parallel work units under the current policy.
int plan_threads(const EngineSettings& cfg, index_t units) {
  if (cfg.threading == ConvThreading::blas || omp_in_parallel()) return 1;
  return static_cast<int>(std::max<index_t>(1, std::min<index_t>(omp_get_max_threads(), units)));
}

bool is_direct(const Problem& p) {
  if (p.taps.count() != 1 || p.in != p.out) return false;
  for (int d = 0; d < 3; ++d)
    if (p.taps.stride[d] != 1 || p.taps.off[d][0] != 0) return false;
  return true;
}

}  // namespace

template <class T>
void gather_conv(const Problem& p, const T* x, const T* w, const T* bias, T* y) {
  const index_t krows = p.cin_g * p.taps.count(), pout = vol(p.out), pyx = vol(p.y_ext);
  if (pout == 0 || p.batch == 0 || p.groups == 0) return;
  if (fast_gather_conv(p, x, w, bias, y)) return;
  const bool dense_y = p.y_ext == p.out && p.y_step == Ext3{1, 1, 1} && p.y_base == Ext3{0, 0, 0};
  const XLayout xl = x_layout(p);
  const bool direct = is_direct(p) && xl.dense_positions(p.in);
  const int max_threads = plan_threads(p.cfg, p.batch * p.groups * pout);
  const TilePlan tp = plan_tiles(p.cfg, krows, pout, p.batch * p.groups, sizeof(T), max_threads);
  const index_t units = p.batch * p.groups * tp.ntiles;
  const int nth = plan_threads(p.cfg, units);
  const index_t col_n = direct ? 0 : krows * tp.tile, tmp_n = dense_y ? 0 : p.cout_g * tp.tile;
  // Per-thread scratch from the host caching allocator (not malloc: no heap growth and trim,
  // hence no page faults, per call at steady state), zeroed like the vector it replaces.
  const auto buffers = zeroed_scratch<T>(static_cast<std::size_t>(nth * (col_n + tmp_n)));
  std::optional<BlasThreadsScope> single_blas;
  if (nth > 1) single_blas.emplace(1);
#pragma omp parallel num_threads(nth)
  {
    const int tid = omp_get_thread_num();
    T* col = buffers.data() + tid * (col_n + tmp_n);
    T* tmp = col + col_n;
    std::vector<Segment> segs;
#pragma omp for schedule(static)
    for (index_t u = 0; u < units; ++u) {
      const index_t n = u / (p.groups * tp.ntiles), g = (u / tp.ntiles) % p.groups, t = u % tp.ntiles;
      const index_t p0 = t * tp.tile, np = std::min(tp.tile, pout - p0);
      const T* xg = x + n * p.x_batch_stride + g * p.cin_g * xl.c;
      const T* wg = w + g * p.cout_g * krows;
      T* yg = y + n * p.y_batch_stride + g * p.cout_g * pyx;
      const T* bmat = xg + p0;
      index_t ldb = xl.c;
      if (!direct || !dense_y) tile_segments(p.out, p0, np, segs);
      if (!direct) {
        im2col(p, xg, segs, np, col);
        bmat = col;
        ldb = np;
      }
      T* cmat = dense_y ? yg + p0 : tmp;
      const index_t ldc = dense_y ? pyx : np;
      if (krows == 0) {
        for (index_t co = 0; co < p.cout_g; ++co) std::fill_n(cmat + co * ldc, np, T(0));
      } else {
        gemm<T>(Trans::no, Trans::no, p.cout_g, np, krows, T(1), wg, krows, bmat, ldb, T(0), cmat, ldc);
      }
      if (bias) {
        for (index_t co = 0; co < p.cout_g; ++co) {
          const T b = bias[g * p.cout_g + co];
          T* r = cmat + co * ldc;
          for (index_t j = 0; j < np; ++j) r[j] += b;
        }
      }
      if (!dense_y) {
        for (index_t co = 0; co < p.cout_g; ++co) {
          const T* src = tmp + co * np;
          T* yc = yg + co * pyx;
          for (const Segment& sg : segs) {
            const index_t y0 = sg.o0 * p.y_step[0] + p.y_base[0], y1 = sg.o1 * p.y_step[1] + p.y_base[1];
            T* yr = yc + (y0 * p.y_ext[1] + y1) * p.y_ext[2] + p.y_base[2];
            const index_t st = p.y_step[2];
            for (index_t j = 0; j < sg.len; ++j) yr[(sg.o2_begin + j) * st] = src[sg.col + j];
          }
        }
      }
    }
  }
}

template <class T>
void weight_grad(const Problem& p, const T* x, const T* gy, T* gw) {
  const index_t krows = p.cin_g * p.taps.count(), pout = vol(p.out);
  const index_t wn = p.groups * p.cout_g * krows;
  std::fill_n(gw, wn, T(0));
  if (pout == 0 || p.batch == 0 || wn == 0) return;
  if (fast_weight_grad(p, x, gy, gw)) return;
  const XLayout xl = x_layout(p);
  const bool direct = is_direct(p) && xl.dense_positions(p.in);
  const int max_threads = plan_threads(p.cfg, p.batch * p.groups * pout);
  const TilePlan tp = plan_tiles(p.cfg, krows, pout, p.batch * p.groups, sizeof(T), max_threads);
  const index_t units = p.batch * p.groups * tp.ntiles;
  const int nth = plan_threads(p.cfg, units);
  const index_t col_n = direct ? 0 : krows * tp.tile, tmp_n = p.cout_g * krows;
  // Per-thread scratch from the host caching allocator (not malloc: no heap growth and trim,
  // hence no page faults, per call at steady state), zeroed like the vector it replaces.
  const auto buffers = zeroed_scratch<T>(static_cast<std::size_t>(nth * (col_n + tmp_n)));
  std::vector<double> partial(static_cast<std::size_t>(nth * wn), 0.0);
  std::optional<BlasThreadsScope> single_blas;
  if (nth > 1) single_blas.emplace(1);
#pragma omp parallel num_threads(nth)
  {
    const int tid = omp_get_thread_num();
    T* col = buffers.data() + tid * (col_n + tmp_n);
    T* tmp = col + col_n;
    double* acc = partial.data() + tid * wn;
    std::vector<Segment> segs;
#pragma omp for schedule(static)
    for (index_t u = 0; u < units; ++u) {
      const index_t n = u / (p.groups * tp.ntiles), g = (u / tp.ntiles) % p.groups, t = u % tp.ntiles;
      const index_t p0 = t * tp.tile, np = std::min(tp.tile, pout - p0);
      const T* xg = x + n * p.x_batch_stride + g * p.cin_g * xl.c;
      const T* gyg = gy + n * p.y_batch_stride + g * p.cout_g * pout + p0;
      const T* bmat = xg + p0;
      index_t ldb = xl.c;
      if (!direct) {
        tile_segments(p.out, p0, np, segs);
        im2col(p, xg, segs, np, col);
        bmat = col;
        ldb = np;
      }
      // tmp[co, r] = sum_j gy[co, j] * col[r, j]; accumulated in double across tiles.
      gemm<T>(Trans::no, Trans::yes, p.cout_g, krows, np, T(1), gyg, pout, bmat, ldb, T(0), tmp, krows);
      double* a = acc + g * p.cout_g * krows;
      for (index_t i = 0; i < p.cout_g * krows; ++i) a[i] += static_cast<double>(tmp[i]);
    }
  }
#pragma omp parallel for schedule(static) num_threads(nth) if (wn > 4096)
  for (index_t i = 0; i < wn; ++i) {
    double s = 0;
    for (int t = 0; t < nth; ++t) s += partial[static_cast<std::size_t>(t * wn + i)];
    gw[i] = static_cast<T>(s);
  }
}

template void gather_conv<float>(const Problem&, const float*, const float*, const float*, float*);
template void gather_conv<double>(const Problem&, const double*, const double*, const double*, double*);
template void weight_grad<float>(const Problem&, const float*, const float*, float*);
template void weight_grad<double>(const Problem&, const double*, const double*, double*);

}  // namespace detail::conv_engine
}  // namespace shard
