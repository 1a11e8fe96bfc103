// CPU implementation of the resize kernel family (exec/resize.hpp): nearest / (bi,tri)linear /
// cubic resampling on blocks of a global grid (with resize_input_range and the geometry checks, shared
// with the front), for f32, f64 and the bf16 / f16 storage dtypes read and written in place
// (native_storage: values widen exactly, the arithmetic is the f32 kernel's double arithmetic, each
// result rounds double -> float -> storage: bit for bit the f32 working-copy route).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "exec/resize_kernels.hpp"
#include "exec/storage_cpu.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/exec/resize.hpp"

namespace shard {
namespace exec {
namespace {

using storage::from_double;
using storage::to_double;
using Tap = ResizeTap;
inline Tap source_tap(ResizeMode mode, const ResizeGeometry& g, int d, index_t o) {
  return resize_source_tap(mode, g, d, o);
}

void check_out_range(const char* op, const ResizeGeometry& g, int d) {
  const index_t Go = resize_axis_out(g, d);
  SHARD_CHECK(g.scale[d] >= 0 && g.global_in[d] >= 1 && Go >= 1, op,
              "spatial dim {}: scale {}, global input extent {} and output extent {} must be >= 1 (scale 0: the "
              "general map)",
              d, g.scale[d], g.global_in[d], Go);
  SHARD_CHECK(g.scale[d] > 0 || g.align_corners || (g.ratio[d] > 0 && std::isfinite(g.ratio[d])), op,
              "spatial dim {}: the general map needs a positive finite source scale, not {}", d, g.ratio[d]);
  SHARD_CHECK(g.out_lo[d] >= 0 && g.out_len[d] >= 0 && g.out_lo[d] + g.out_len[d] <= Go, op,
              "spatial dim {}: output range [{}, {}) outside the global output [0, {})", d, g.out_lo[d],
              g.out_lo[d] + g.out_len[d], Go);
}

void check_block_holds(const char* op, const ResizeGeometry& g, int d) {
  check_out_range(op, g, d);
  if (g.out_len[d] == 0) return;
  const auto [a, b] = resize_input_range(g, d, g.out_lo[d], g.out_len[d]);
  SHARD_CHECK(g.in_lo[d] <= a && b <= g.in_lo[d] + g.in_len[d], op,
              "spatial dim {}: outputs [{}, {}) need global inputs [{}, {}) but the block holds [{}, {}) "
              "(scale {}, global input extent {}, output extent {})",
              d, g.out_lo[d], g.out_lo[d] + g.out_len[d], a, b, g.in_lo[d], g.in_lo[d] + g.in_len[d], g.scale[d],
              g.global_in[d], resize_axis_out(g, d));
}

/// Per-dim tap tables relative to the block start; checks the block holds the inputs needed.
std::array<std::vector<Tap>, 3> tap_tables(const char* op, ResizeMode mode, const ResizeGeometry& g0) {
  std::array<std::vector<Tap>, 3> t;
  ResizeGeometry g = g0;
  g.mode = mode;
  for (int d = 0; d < 3; ++d) {
    check_block_holds(op, g, d);
    for (index_t o = 0; o < g.out_len[d]; ++o) {
      Tap tp = source_tap(mode, g, d, g.out_lo[d] + o);
      tp.i0 -= g.in_lo[d];
      tp.i1 -= g.in_lo[d];
      t[d].push_back(tp);
    }
  }
  return t;
}

/// Cubic tap tables relative to the block start (checked as tap_tables).
std::array<std::vector<ResizeCubicTap>, 3> cubic_tables(const char* op, const ResizeGeometry& g0) {
  std::array<std::vector<ResizeCubicTap>, 3> t;
  ResizeGeometry g = g0;
  g.mode = ResizeMode::cubic;
  for (int d = 0; d < 3; ++d) {
    check_block_holds(op, g, d);
    for (index_t o = 0; o < g.out_len[d]; ++o) {
      ResizeCubicTap c = resize_cubic_tap(g, d, g.out_lo[d] + o);
      for (auto& i : c.i) i -= g.in_lo[d];
      t[d].push_back(c);
    }
  }
  return t;
}

/// Cubic forward: y = sum over the 4 x 4 x 4 taps (zero weights skipped: unit dims read one),
/// in double, each output rounded once.
template <class T>
void cubic_forward_impl(const ResizeGeometry& g, const T* x, T* y) {
  const auto t = cubic_tables("resize_forward", g);
  const index_t pin = g.in_len[0] * g.in_len[1] * g.in_len[2], pout = g.out_len[0] * g.out_len[1] * g.out_len[2];
  const index_t rows = g.planes * g.out_len[0] * g.out_len[1];
  const index_t C = g.x_strided ? g.channels : 1, sn = g.x_strided ? g.x_strides[0] : pin,
                sc = g.x_strided ? g.x_strides[1] : 0, s0 = g.x_strided ? g.x_strides[2] : g.in_len[1] * g.in_len[2],
                s1 = g.x_strided ? g.x_strides[3] : g.in_len[2], s2 = g.x_strided ? g.x_strides[4] : 1;
#pragma omp parallel for schedule(static) if (g.planes * pout > (1 << 12))
  for (index_t r = 0; r < rows; ++r) {
    const index_t pl = r / (g.out_len[0] * g.out_len[1]), o0 = (r / g.out_len[1]) % g.out_len[0],
                  o1 = r % g.out_len[1];
    const T* xp = x + (pl / C) * sn + (pl % C) * sc;
    T* yr = y + pl * pout + (o0 * g.out_len[1] + o1) * g.out_len[2];
    const ResizeCubicTap& a = t[0][static_cast<std::size_t>(o0)];
    const ResizeCubicTap& b = t[1][static_cast<std::size_t>(o1)];
    for (index_t o2 = 0; o2 < g.out_len[2]; ++o2) {
      const ResizeCubicTap& c = t[2][static_cast<std::size_t>(o2)];
      double s = 0;
      for (int ka = 0; ka < 4; ++ka) {
        if (a.w[ka] == 0.0) continue;
        for (int kb = 0; kb < 4; ++kb) {
          if (b.w[kb] == 0.0) continue;
          const T* xr = xp + a.i[ka] * s0 + b.i[kb] * s1;
          double row = 0;
          for (int kc = 0; kc < 4; ++kc) row += c.w[kc] * to_double(xr[c.i[kc] * s2]);
          s += a.w[ka] * b.w[kb] * row;
        }
      }
      yr[o2] = from_double<T>(s);
    }
  }
}

/// Cubic adjoint: scatter per plane (planes in parallel) in double, outputs in increasing order.
template <class T>
void cubic_backward_impl(const ResizeGeometry& g, const T* gy, T* gx) {
  const auto t = cubic_tables("resize_backward", g);
  const index_t pin = g.in_len[0] * g.in_len[1] * g.in_len[2], pout = g.out_len[0] * g.out_len[1] * g.out_len[2];
  const index_t n1 = g.in_len[1], n2 = g.in_len[2];
#pragma omp parallel if (g.planes > 1 && g.planes * pout > (1 << 12))
  {
    std::vector<double> acc(static_cast<std::size_t>(pin));
#pragma omp for schedule(static)
    for (index_t pl = 0; pl < g.planes; ++pl) {
      std::fill(acc.begin(), acc.end(), 0.0);
      const T* gp = gy + pl * pout;
      for (index_t o0 = 0; o0 < g.out_len[0]; ++o0)
        for (index_t o1 = 0; o1 < g.out_len[1]; ++o1) {
          const ResizeCubicTap& a = t[0][static_cast<std::size_t>(o0)];
          const ResizeCubicTap& b = t[1][static_cast<std::size_t>(o1)];
          const T* gr = gp + (o0 * g.out_len[1] + o1) * g.out_len[2];
          for (int ka = 0; ka < 4; ++ka) {
            if (a.w[ka] == 0.0) continue;
            for (int kb = 0; kb < 4; ++kb) {
              if (b.w[kb] == 0.0) continue;
              const double wab = a.w[ka] * b.w[kb];
              double* ar = acc.data() + (a.i[ka] * n1 + b.i[kb]) * n2;
              for (index_t o2 = 0; o2 < g.out_len[2]; ++o2) {
                const ResizeCubicTap& c = t[2][static_cast<std::size_t>(o2)];
                const double v = wab * to_double(gr[o2]);
                for (int kc = 0; kc < 4; ++kc) ar[c.i[kc]] += c.w[kc] * v;
              }
            }
          }
        }
      T* xp = gx + pl * pin;
      for (index_t i = 0; i < pin; ++i) xp[i] = from_double<T>(acc[static_cast<std::size_t>(i)]);
    }
  }
}

template <class T>
void forward_impl(ResizeMode mode, const ResizeGeometry& g, const T* x, T* y) {
  if (mode == ResizeMode::cubic) return cubic_forward_impl<T>(g, x, y);
  const auto t = tap_tables("resize_forward", mode, g);
  const index_t pin = g.in_len[0] * g.in_len[1] * g.in_len[2], pout = g.out_len[0] * g.out_len[1] * g.out_len[2];
  const index_t rows = g.planes * g.out_len[0] * g.out_len[1];
  // x's element strides: plane (sample, channel), the 3 spatial dims. A strided x (a view of user
  // memory) is read in place with the same arithmetic: bitwise the result of its contiguous copy.
  const index_t C = g.x_strided ? g.channels : 1, sn = g.x_strided ? g.x_strides[0] : pin,
                sc = g.x_strided ? g.x_strides[1] : 0, s0 = g.x_strided ? g.x_strides[2] : g.in_len[1] * g.in_len[2],
                s1 = g.x_strided ? g.x_strides[3] : g.in_len[2], s2 = g.x_strided ? g.x_strides[4] : 1;
  // bf16 / f16: the four input rows an output row reads are widened once into float rows (exact),
  // so each tap converts no element (an output row reads each input element about four times).
  using W = storage::work_t<T>;
  constexpr bool narrow = storage::is_narrow_v<T>;
  const index_t n2 = g.in_len[2];
#pragma omp parallel if (g.planes * pout > (1 << 14))
  {
    std::vector<W> wide(narrow && mode == ResizeMode::linear ? static_cast<std::size_t>(4 * n2) : 0);
    auto widen_row = [&](const T* p, int k) {
      W* w = wide.data() + k * n2;
      for (index_t i = 0; i < n2; ++i) w[i] = storage::to_work(p[i * s2]);
      return static_cast<const W*>(w);
    };
#pragma omp for schedule(static)
    for (index_t r = 0; r < rows; ++r) {
      const index_t pl = r / (g.out_len[0] * g.out_len[1]), o0 = (r / g.out_len[1]) % g.out_len[0],
                    o1 = r % g.out_len[1];
      const T* xp = x + (pl / C) * sn + (pl % C) * sc;
      T* yr = y + pl * pout + (o0 * g.out_len[1] + o1) * g.out_len[2];
      const Tap a = t[0][o0], b = t[1][o1];
      const T* r00 = xp + a.i0 * s0 + b.i0 * s1;
      if (mode == ResizeMode::nearest) {
        if (s2 == 1)
          for (index_t o2 = 0; o2 < g.out_len[2]; ++o2) yr[o2] = r00[t[2][o2].i0];
        else
          for (index_t o2 = 0; o2 < g.out_len[2]; ++o2) yr[o2] = r00[t[2][o2].i0 * s2];
        continue;
      }
      const T* r01 = xp + a.i0 * s0 + b.i1 * s1;
      const T* r10 = xp + a.i1 * s0 + b.i0 * s1;
      const T* r11 = xp + a.i1 * s0 + b.i1 * s1;
      const W *w00, *w01, *w10, *w11;
      index_t ws;
      if constexpr (narrow) {
        w00 = widen_row(r00, 0), w01 = widen_row(r01, 1), w10 = widen_row(r10, 2), w11 = widen_row(r11, 3), ws = 1;
      } else {
        w00 = r00, w01 = r01, w10 = r10, w11 = r11, ws = s2;
      }
      const double c00 = a.w0 * b.w0, c01 = a.w0 * b.w1, c10 = a.w1 * b.w0, c11 = a.w1 * b.w1;
      for (index_t o2 = 0; o2 < g.out_len[2]; ++o2) {
        const Tap c = t[2][o2];
        const index_t i0 = c.i0 * ws, i1 = c.i1 * ws;
        const double v0 = c.w0 * (c00 * w00[i0] + c01 * w01[i0] + c10 * w10[i0] + c11 * w11[i0]);
        const double v1 = c.w1 * (c00 * w00[i1] + c01 * w01[i1] + c10 * w10[i1] + c11 * w11[i1]);
        yr[o2] = from_double<T>(v0 + v1);
      }
    }
  }
}

template <class T>
void backward_impl(ResizeMode mode, const ResizeGeometry& g, const T* gy, T* gx) {
  if (mode == ResizeMode::cubic) return cubic_backward_impl<T>(g, gy, gx);
  const auto t = tap_tables("resize_backward", mode, g);
  const index_t pin = g.in_len[0] * g.in_len[1] * g.in_len[2], pout = g.out_len[0] * g.out_len[1] * g.out_len[2];
  const auto& n1 = g.in_len[1];
  const auto& n2 = g.in_len[2];
  // Scatter per plane (planes in parallel), accumulated in double for the fp32 case.
#pragma omp parallel if (g.planes > 1 && g.planes * pout > (1 << 14))
  {
    std::vector<double> acc(static_cast<std::size_t>(pin));
#pragma omp for schedule(static)
    for (index_t pl = 0; pl < g.planes; ++pl) {
      std::fill(acc.begin(), acc.end(), 0.0);
      const T* gp = gy + pl * pout;
      for (index_t o0 = 0; o0 < g.out_len[0]; ++o0)
        for (index_t o1 = 0; o1 < g.out_len[1]; ++o1) {
          const Tap a = t[0][o0], b = t[1][o1];
          const T* gr = gp + (o0 * g.out_len[1] + o1) * g.out_len[2];
          for (int ka = 0; ka < 2; ++ka)
            for (int kb = 0; kb < 2; ++kb) {
              const double wab = (ka ? a.w1 : a.w0) * (kb ? b.w1 : b.w0);
              if (wab == 0.0) continue;
              double* ar = acc.data() + ((ka ? a.i1 : a.i0) * n1 + (kb ? b.i1 : b.i0)) * n2;
              for (index_t o2 = 0; o2 < g.out_len[2]; ++o2) {
                const Tap c = t[2][o2];
                const double v = wab * to_double(gr[o2]);
                ar[c.i0] += c.w0 * v;
                if (c.w1 != 0.0) ar[c.i1] += c.w1 * v;
              }
            }
        }
      T* xp = gx + pl * pin;
      for (index_t i = 0; i < pin; ++i) xp[i] = from_double<T>(acc[static_cast<std::size_t>(i)]);
    }
  }
}

struct CpuResize final : ResizeKernels {
  bool takes_strided_input() const override { return true; }
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void forward(DType dt, ResizeMode mode, const ResizeGeometry& g, const void* x, void* y,
               ExecContext&) const override {
    SHARD_STORAGE_DISPATCH("resize_forward", dt, forward_impl<T>(mode, g, static_cast<const T*>(x), static_cast<T*>(y)));
  }
  void backward(DType dt, ResizeMode mode, const ResizeGeometry& g, const void* gy, void* gx,
                ExecContext&) const override {
    SHARD_STORAGE_DISPATCH("resize_backward", dt,
                           backward_impl<T>(mode, g, static_cast<const T*>(gy), static_cast<T*>(gx)));
  }
};

const CpuResize g_cpu_resize;

}  // namespace

SHARD_CPU_TABLE(resize, g_cpu_resize);

void check_resize_geometry(const char* op, ResizeMode mode, const ResizeGeometry& g0) {
  ResizeGeometry g = g0;
  g.mode = mode;
  for (int d = 0; d < 3; ++d) check_block_holds(op, g, d);
}

}  // namespace exec

index_t resize_output_extent(const exec::ResizeGeometry& g, int d) { return exec::resize_axis_out(g, d); }

std::pair<index_t, index_t> resize_input_range(const exec::ResizeGeometry& g, int d, index_t out_lo, index_t out_len) {
  exec::ResizeGeometry r = g;
  r.out_lo[d] = out_lo;
  r.out_len[d] = out_len;
  exec::check_out_range("resize_input_range", r, d);
  if (out_len == 0) return {0, 0};
  if (g.mode == ResizeMode::cubic) {
    const exec::ResizeCubicTap first = exec::resize_cubic_tap(g, d, out_lo);
    const exec::ResizeCubicTap last = exec::resize_cubic_tap(g, d, out_lo + out_len - 1);
    return {first.i[0], last.i[3] + 1};
  }
  const exec::Tap first = exec::source_tap(g.mode, g, d, out_lo);
  const exec::Tap last = exec::source_tap(g.mode, g, d, out_lo + out_len - 1);
  return {first.i0, (g.mode == ResizeMode::nearest ? last.i0 : last.i1) + 1};
}

std::pair<index_t, index_t> resize_input_range(ResizeMode mode, index_t scale, index_t global_in, index_t out_lo,
                                               index_t out_len) {
  exec::ResizeGeometry g;
  g.mode = mode;
  g.scale[0] = scale;
  g.global_in[0] = global_in;
  SHARD_CHECK(scale >= 1, "resize_input_range", "scale {} must be >= 1", scale);
  return resize_input_range(g, 0, out_lo, out_len);
}

index_t resize_owner(const exec::ResizeGeometry& g, int d, index_t o) {
  const index_t G = g.global_in[d];
  if (g.mode == ResizeMode::nearest) return exec::resize_source_tap(g.mode, g, d, o).i0;
  if (g.scale[d] > 0 && !g.align_corners) return std::min(o / g.scale[d], G - 1);
  const double c = std::floor(exec::resize_source_coord(g, d, o) + 0.5);
  return std::clamp<index_t>(static_cast<index_t>(c), 0, G - 1);
}

}  // namespace shard
