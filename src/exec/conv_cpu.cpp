// CPU implementation of the conv kernel family (exec/conv_kernels.hpp): sets up gather-conv
// problems for the engine (conv_cpu_engine.hpp: im2col + BLAS in conv_cpu_engine.cpp, direct
// AVX-512/AVX2 kernels in conv_cpu_direct.cpp) for the forward conv, the phase-decomposed input gradient and the weight gradient; the
// bias gradient. Reads the engine settings from the context.
#include <omp.h>

#include "exec/conv_kernels.hpp"
#include "shardtensor/core/error.hpp"
#include "exec/conv_cpu_engine.hpp"

namespace shard::exec {
namespace {

using detail::conv_engine::EngineSettings;
using detail::conv_engine::Ext3;
using detail::conv_engine::Problem;
namespace conv_engine = detail::conv_engine;

index_t vol(const Ext3& e) { return e[0] * e[1] * e[2]; }

/// The engine's settings from the context's (the budget range checked here, once per call).
EngineSettings engine_settings(const ExecContext& ctx, const char* op) {
  const ExecSettings& s = ctx.settings();
  SHARD_CHECK(s.conv_column_budget >= conv_engine::kMinColumnBudget && s.conv_column_budget <= conv_engine::kColumnCap,
              op, "ExecSettings::conv_column_budget {} bytes outside [{}, {}]", s.conv_column_budget,
              conv_engine::kMinColumnBudget, conv_engine::kColumnCap);
  return {s.conv_column_budget, s.conv_threading, s.conv_kernel};
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
  p.x_batch_stride = g.in_channels * vol(g.in);
  p.y_batch_stride = g.out_channels * vol(g.out);
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
  const index_t kvol = vol(g.kernel);
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
        p.x_batch_stride = g.out_channels * vol(g.out);
        p.y_batch_stride = g.in_channels * vol(g.in);
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

template <class T>
void bias_grad(index_t batch, index_t channels, index_t positions, const T* gy, T* gb) {
#pragma omp parallel for schedule(static) if (channels > 1 && batch * channels * positions > (1 << 16))
  for (index_t c = 0; c < channels; ++c) {
    double s = 0;
    for (index_t n = 0; n < batch; ++n) {
      const T* row = gy + (n * channels + c) * positions;
#pragma omp simd reduction(+ : s)
      for (index_t i = 0; i < positions; ++i) s += static_cast<double>(row[i]);
    }
    gb[c] = static_cast<T>(s);
  }
}

/// The CPU table: today's engine behind the family interface.
struct CpuConvKernels final : ConvKernels {
  bool takes_input_strides() const override { return true; }
  void forward(DType dt, const ConvGeometry& g, const void* x, const void* w, const void* bias, void* y,
               ExecContext& ctx) const override {
    const EngineSettings cfg = engine_settings(ctx, "conv_forward");
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
    if (dt == DType::f32)
      exec::backward_input<float>(g, cfg, static_cast<const float*>(gy), static_cast<const float*>(w),
                            static_cast<const float*>(bias), static_cast<float*>(gx));
    else
      exec::backward_input<double>(g, cfg, static_cast<const double*>(gy), static_cast<const double*>(w),
                             static_cast<const double*>(bias), static_cast<double*>(gx));
  }
  void backward_weight(DType dt, const ConvGeometry& g, const void* x, const void* gy, void* gw,
                       ExecContext& ctx) const override {
    const Problem p = forward_problem(g, engine_settings(ctx, "conv_backward_weight"));
    if (dt == DType::f32)
      conv_engine::weight_grad<float>(p, static_cast<const float*>(x), static_cast<const float*>(gy),
                                      static_cast<float*>(gw));
    else
      conv_engine::weight_grad<double>(p, static_cast<const double*>(x), static_cast<const double*>(gy),
                                       static_cast<double*>(gw));
  }
  void backward_bias(DType dt, index_t batch, index_t channels, index_t positions, const void* gy, void* gb,
                     ExecContext&) const override {
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
