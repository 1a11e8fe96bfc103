// CPU implementation of the conv kernel family (exec/conv_kernels.hpp): sets up gather-conv
// problems for the engine (conv_cpu_engine.hpp: im2col + BLAS in conv_cpu_engine.cpp, direct
// AVX-512/AVX2 kernels in conv_cpu_direct.cpp) for the forward conv, the phase-decomposed input gradient and the weight gradient; the
// bias gradient. Reads the engine settings from the context.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "exec/conv_kernels.hpp"
#include "shardtensor/core/error.hpp"
#include "exec/conv_cpu_engine.hpp"

namespace shard::exec {
namespace {

using ::shard::detail::conv_engine::EngineSettings;
using ::shard::detail::conv_engine::Ext3;
using ::shard::detail::conv_engine::Problem;
namespace conv_engine = ::shard::detail::conv_engine;

index_t ext_vol(const Ext3& e) { return e[0] * e[1] * e[2]; }

/// The engine's settings from the context's (the budget range checked here, once per call).
EngineSettings engine_settings(const ExecContext& ctx, const char* op) {
  const ExecSettings& s = ctx.settings();
  SHARD_CHECK(s.conv_column_budget >= conv_engine::kMinColumnBudget && s.conv_column_budget <= conv_engine::kColumnCap,
              op, "ExecSettings::conv_column_budget {} bytes outside [{}, {}]", s.conv_column_budget,
              conv_engine::kMinColumnBudget, conv_engine::kColumnCap);
  return {s.conv_column_budget, s.conv_threading, s.conv_kernel, s.native_low_precision};
}

/// The forward conv as a gather conv: taps k * dilation - pad_lo, dense output.
Problem forward_problem(const ConvGeometry& g, const EngineSettings& cfg) {
  Problem p;
  p.cfg = cfg;
  p.batch = g.batch;
  p.groups = g.groups;
  p.cin_g = g.in_channels / g.groups;
  p.cout_g = g.out_channels / g.groups;
  p.in = g.in;
  p.out = g.out;
  p.y_ext = g.out;
  p.taps.stride = g.stride;
  for (int d = 0; d < 3; ++d)
    for (index_t k = 0; k < g.kernel[d]; ++k) p.taps.off[d].push_back(k * g.dilation[d] - g.pad_lo[d]);
  p.x_batch_stride = g.in_channels * ext_vol(g.in);
  p.y_batch_stride = g.out_channels * ext_vol(g.out);
  if (g.x_strides != std::array<index_t, 5>{}) {  // a strided view of x, read in place
    p.x_batch_stride = g.x_strides[0];
    p.x_channel_stride = g.x_strides[1];
    p.x_spatial_stride = {g.x_strides[2], g.x_strides[3]};
  }
  return p;
}

template <class T>
void forward(const ConvGeometry& g, const EngineSettings& cfg, const T* x, const T* w, const T* bias, T* y) {
  conv_engine::gather_conv<T>(forward_problem(g, cfg), x, w, bias, y);
}

/// Input gradient, one stride phase r (per dim) at a time. Input positions i with
/// (i + lo) mod s == r receive from the taps k with k*d == r (mod s), at output o = m - q_k
/// where m = (i + lo - r) / s and q_k = (k*d - r) / s: a stride-1 gather over gy whose result
/// lands on the strided sub-grid i = i_first + s * j. Every input position is written once.
template <class T>
void backward_input(const ConvGeometry& g, const EngineSettings& cfg, const T* gy, const T* w, const T* bias, T* gx) {
  const index_t cin_g = g.in_channels / g.groups, cout_g = g.out_channels / g.groups;
  const index_t kvol = ext_vol(g.kernel);
  Ext3 r{0, 0, 0};
  std::vector<T> wp;
  for (r[0] = 0; r[0] < g.stride[0]; ++r[0]) {
    for (r[1] = 0; r[1] < g.stride[1]; ++r[1]) {
      for (r[2] = 0; r[2] < g.stride[2]; ++r[2]) {
        Problem p;
        p.cfg = cfg;
        p.batch = g.batch;
        p.groups = g.groups;
        p.cin_g = cout_g;
        p.cout_g = cin_g;
        p.in = g.out;
        p.y_ext = g.in;
        p.x_batch_stride = g.out_channels * ext_vol(g.out);
        p.y_batch_stride = g.in_channels * ext_vol(g.in);
        std::array<std::vector<index_t>, 3> ks;  // kernel index of each tap
        bool empty = false;
        for (int d = 0; d < 3; ++d) {
          const index_t s = g.stride[d];
          const index_t first = ((r[d] - g.pad_lo[d]) % s + s) % s;
          p.out[d] = g.in[d] > first ? (g.in[d] - first + s - 1) / s : 0;
          empty = empty || p.out[d] == 0;
          p.y_step[d] = s;
          p.y_base[d] = first;
          const index_t m0 = (first + g.pad_lo[d] - r[d]) / s;
          for (index_t k = 0; k < g.kernel[d]; ++k) {
            const index_t kd = k * g.dilation[d] - r[d];
            if (kd >= 0 && kd % s == 0) {
              ks[d].push_back(k);
              p.taps.off[d].push_back(m0 - kd / s);
            }
          }
        }
        if (empty) continue;
        // wp[g][ci][co][t] = w[g*cout_g + co][ci][k(t)]
        const index_t nt = p.taps.count();
        wp.assign(static_cast<std::size_t>(g.groups * cin_g * cout_g * nt), T(0));
        for (index_t gi = 0; gi < g.groups; ++gi)
          for (index_t ci = 0; ci < cin_g; ++ci)
            for (index_t co = 0; co < cout_g; ++co) {
              const T* wsrc = w + ((gi * cout_g + co) * cin_g + ci) * kvol;
              T* wdst = wp.data() + ((gi * cin_g + ci) * cout_g + co) * nt;
              for (index_t k0 : ks[0])
                for (index_t k1 : ks[1])
                  for (index_t k2 : ks[2]) *wdst++ = wsrc[(k0 * g.kernel[1] + k1) * g.kernel[2] + k2];
            }
        conv_engine::gather_conv<T>(p, gy, wp.data(), bias, gx);
      }
    }
  }
}

// ---- bf16 / f16 storage (native_storage): the direct path widens x / gy as it fills its blocks and
// rounds y once; weights and bias (small) are widened here. Bit-identical to the f32 working-copy
// route of the front: same plan, same micro-kernels, same rounding.

/// The small operands (weights, bias) in f32.
template <class S>
std::vector<float> widened(const S* v, index_t n) {
  std::vector<float> r(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) r[static_cast<std::size_t>(i)] = static_cast<float>(v[i]);
  return r;
}

/// True when the direct path takes this pass with bf16 / f16 storage: stride 1 (one input-gradient
/// phase), both channel counts non-zero, a direct-path ISA level and kernel setting.
bool storage_applies(const ConvGeometry& g, const EngineSettings& cfg) {
  if (g.stride != Ext3{1, 1, 1} || g.in_channels == 0 || g.out_channels == 0 || g.batch == 0) return false;
  for (int d = 0; d < 3; ++d)
    if (g.in[d] == 0 || g.out[d] == 0) return false;
  return conv_engine::storage_path_applies(forward_problem(g, cfg));
}

template <class S>
void forward_storage(const ConvGeometry& g, const EngineSettings& cfg, const S* x, const S* w, const S* bias, S* y) {
  const Problem p = forward_problem(g, cfg);
  const auto wf = widened(w, g.out_channels * p.cin_g * ext_vol(g.kernel));
  const auto bf = bias ? widened(bias, g.out_channels) : std::vector<float>{};
  const bool ran = conv_engine::fast_gather_conv<S, float>(p, x, wf.data(), bias ? bf.data() : nullptr, y);
  SHARD_CHECK(ran, "conv_forward", "the bf16/f16 direct path does not apply to this geometry");
}

/// Stride 1: the input gradient is one gather over gy with the flipped taps and the weights
/// transposed per group (backward_input's single phase).
template <class S>
void backward_input_storage(const ConvGeometry& g, const EngineSettings& cfg, const S* gy, const S* w, const S* bias,
                            S* gx) {
  const index_t cin_g = g.in_channels / g.groups, cout_g = g.out_channels / g.groups, kvol = ext_vol(g.kernel);
  Problem p;
  p.cfg = cfg;
  p.batch = g.batch;
  p.groups = g.groups;
  p.cin_g = cout_g;
  p.cout_g = cin_g;
  p.in = g.out;
  p.out = g.in;
  p.y_ext = g.in;
  p.x_batch_stride = g.out_channels * ext_vol(g.out);
  p.y_batch_stride = g.in_channels * ext_vol(g.in);
  for (int d = 0; d < 3; ++d)
    for (index_t k = 0; k < g.kernel[d]; ++k) p.taps.off[d].push_back(g.pad_lo[d] - k * g.dilation[d]);
  std::vector<float> wp(static_cast<std::size_t>(g.groups * cin_g * cout_g * kvol));
  for (index_t gi = 0; gi < g.groups; ++gi)
    for (index_t ci = 0; ci < cin_g; ++ci)
      for (index_t co = 0; co < cout_g; ++co) {
        const S* wsrc = w + ((gi * cout_g + co) * cin_g + ci) * kvol;
        float* wdst = wp.data() + ((gi * cin_g + ci) * cout_g + co) * kvol;
        for (index_t t = 0; t < kvol; ++t) wdst[t] = static_cast<float>(wsrc[t]);
      }
  const auto bf = bias ? widened(bias, g.in_channels) : std::vector<float>{};
  const bool ran = conv_engine::fast_gather_conv<S, float>(p, gy, wp.data(), bias ? bf.data() : nullptr, gx);
  SHARD_CHECK(ran, "conv_backward_input", "the bf16/f16 direct path does not apply to this geometry");
}

template <class S>
void weight_grad_storage(const ConvGeometry& g, const EngineSettings& cfg, const S* x, const S* gy, S* gw) {
  const Problem p = forward_problem(g, cfg);
  std::vector<float> gf(static_cast<std::size_t>(g.out_channels * p.cin_g * ext_vol(g.kernel)));
  const bool ran = conv_engine::fast_weight_grad<S, float>(p, x, gy, gf.data());
  SHARD_CHECK(ran, "conv_backward_weight", "the bf16/f16 direct path does not apply to this geometry");
  for (std::size_t i = 0; i < gf.size(); ++i) gw[i] = S(gf[i]);
}

/// An element as double: bf16 widened from its bits (exact, and vectorisable, which the struct's
/// conversion operator is not), the others by their conversion.
template <class T>
inline double wide(const T& v) {
  if constexpr (std::is_same_v<T, bf16>) {
    const std::uint32_t u = static_cast<std::uint32_t>(v.bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return static_cast<double>(f);
  } else {
    return static_cast<double>(v);
  }
}
template <class T>
T from_sum(double s) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) return T(static_cast<float>(s));  // as f32, then rounded
  else return static_cast<T>(s);
}

template <class T>
void bias_grad(index_t batch, index_t channels, index_t positions, const T* gy, T* gb) {
  const bool parallel = batch * channels * positions > (1 << 16);
  if (positions < 16) {
    // Few positions per (sample, channel): a token linear's bias gradient ([A, C, 1]) would pay
    // a reduction per element below. Blocks of channels instead, vectorised across channels, each
    // channel's sum taken in the same order (samples, then positions).
    constexpr index_t kBlock = 64;
#pragma omp parallel for schedule(static) if (parallel && channels > kBlock)
    for (index_t c0 = 0; c0 < channels; c0 += kBlock) {
      const index_t nc = std::min(kBlock, channels - c0);
      double acc[kBlock] = {};
      for (index_t n = 0; n < batch; ++n)
        for (index_t q = 0; q < positions; ++q) {
          const T* col = gy + (n * channels + c0) * positions + q;
#pragma omp simd
          for (index_t c = 0; c < nc; ++c) acc[c] += wide(col[c * positions]);
        }
      for (index_t c = 0; c < nc; ++c) gb[c0 + c] = from_sum<T>(acc[c]);
    }
    return;
  }
#pragma omp parallel for schedule(static) if (channels > 1 && parallel)
  for (index_t c = 0; c < channels; ++c) {
    double s = 0;
    for (index_t n = 0; n < batch; ++n) {
      const T* row = gy + (n * channels + c) * positions;
#pragma omp simd reduction(+ : s)
      for (index_t i = 0; i < positions; ++i) s += wide(row[i]);
    }
    gb[c] = from_sum<T>(s);
  }
}

/// f(S{}) for the storage dtype dt (bf16 or f16).
template <class F>
void by_storage(DType dt, F&& f) {
  if (dt == DType::bf16) f(bf16{});
  else f(f16{});
}

/// The CPU table: today's engine behind the family interface.
struct CpuConvKernels final : ConvKernels {
  bool takes_input_strides() const override { return true; }
  bool native_storage(const StorageQuery& q) const override {
    if (q.dtype != DType::bf16 && q.dtype != DType::f16) return false;
    if (q.pass == KernelPass::backward_bias) return true;
    return q.conv && storage_applies(*q.conv, engine_settings(q.ctx, "conv"));
  }
  void forward(DType dt, const ConvGeometry& g, const void* x, const void* w, const void* bias, void* y,
               ExecContext& ctx) const override {
    const EngineSettings cfg = engine_settings(ctx, "conv_forward");
    if (dt == DType::bf16 || dt == DType::f16)
      return by_storage(dt, [&](auto s) {
        using S = decltype(s);
        forward_storage<S>(g, cfg, static_cast<const S*>(x), static_cast<const S*>(w), static_cast<const S*>(bias),
                           static_cast<S*>(y));
      });
    if (dt == DType::f32)
      exec::forward<float>(g, cfg, static_cast<const float*>(x), static_cast<const float*>(w),
                           static_cast<const float*>(bias), static_cast<float*>(y));
    else
      exec::forward<double>(g, cfg, static_cast<const double*>(x), static_cast<const double*>(w),
                            static_cast<const double*>(bias), static_cast<double*>(y));
  }
  void backward_input(DType dt, const ConvGeometry& g, const void* gy, const void* w, const void* bias, void* gx,
                      ExecContext& ctx) const override {
    const EngineSettings cfg = engine_settings(ctx, "conv_backward_input");
    if (dt == DType::bf16 || dt == DType::f16)
      return by_storage(dt, [&](auto s) {
        using S = decltype(s);
        backward_input_storage<S>(g, cfg, static_cast<const S*>(gy), static_cast<const S*>(w),
                                  static_cast<const S*>(bias), static_cast<S*>(gx));
      });
    if (dt == DType::f32)
      exec::backward_input<float>(g, cfg, static_cast<const float*>(gy), static_cast<const float*>(w),
                            static_cast<const float*>(bias), static_cast<float*>(gx));
    else
      exec::backward_input<double>(g, cfg, static_cast<const double*>(gy), static_cast<const double*>(w),
                             static_cast<const double*>(bias), static_cast<double*>(gx));
  }
  void backward_weight(DType dt, const ConvGeometry& g, const void* x, const void* gy, void* gw,
                       ExecContext& ctx) const override {
    const EngineSettings cfg = engine_settings(ctx, "conv_backward_weight");
    if (dt == DType::bf16 || dt == DType::f16)
      return by_storage(dt, [&](auto s) {
        using S = decltype(s);
        weight_grad_storage<S>(g, cfg, static_cast<const S*>(x), static_cast<const S*>(gy), static_cast<S*>(gw));
      });
    const Problem p = forward_problem(g, cfg);
    if (dt == DType::f32)
      conv_engine::weight_grad<float>(p, static_cast<const float*>(x), static_cast<const float*>(gy),
                                      static_cast<float*>(gw));
    else
      conv_engine::weight_grad<double>(p, static_cast<const double*>(x), static_cast<const double*>(gy),
                                       static_cast<double*>(gw));
  }
  void backward_bias(DType dt, index_t batch, index_t channels, index_t positions, const void* gy, void* gb,
                     ExecContext&) const override {
    if (dt == DType::bf16 || dt == DType::f16)
      return by_storage(dt, [&](auto s) {
        using S = decltype(s);
        bias_grad<S>(batch, channels, positions, static_cast<const S*>(gy), static_cast<S*>(gb));
      });
    if (dt == DType::f32)
      bias_grad<float>(batch, channels, positions, static_cast<const float*>(gy), static_cast<float*>(gb));
    else
      bias_grad<double>(batch, channels, positions, static_cast<const double*>(gy), static_cast<double*>(gb));
  }
};

const CpuConvKernels g_cpu_conv;

}  // namespace

SHARD_CPU_TABLE(conv, g_cpu_conv);

}  // namespace shard::exec
