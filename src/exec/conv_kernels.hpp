#pragma once
// The convolution kernel family (private): one table per device kind, looked up by
// exec/conv.cpp through the registry. CPU: src/exec/conv_cpu.cpp (the im2col engine of
// conv_cpu_engine.cpp and the direct SIMD path of conv_cpu_direct.cpp). CUDA: src/cuda/conv_cuda.cpp (cuDNN; bias kernels
// and the padded-copy kernel in kernels/conv.cu behind src/kernels_api/conv.hpp).
//
// Every pointer is a contiguous N, C, spatial array (except x where takes_input_strides(): then
// g.x_strides may describe a view with unit innermost stride) on the context's device, of dtype `dt`
// (f32 or f64, or bf16 / f16 where takes_storage says so); the front has checked shapes, devices and dtypes. Work is ordered on ctx's
// stream; the CPU implementation reads ctx.settings() (conv_kernel, conv_threading,
// conv_column_budget), the CUDA one deterministic, allow_tf32 and ctx.workspace().
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/exec/conv.hpp"
#include "shardtensor/runtime/registry.hpp"

namespace shard::exec {

struct ConvKernels {
  static constexpr KernelFamily id = KernelFamily::conv;
  virtual ~ConvKernels() = default;

  /// True when forward and backward_weight read x through g.x_strides (innermost stride 1);
  /// otherwise the front hands them a contiguous x (and g.x_strides all zero).
  virtual bool takes_input_strides() const { return false; }
  /// The passes of one conv, for takes_storage.
  enum class PassKind : unsigned char { forward, backward_input, backward_weight, backward_bias };
  /// True when the table runs this pass itself with bf16 / f16 operands `dt` (every operand in
  /// `dt`, f32 arithmetic and accumulation, results rounded once). Otherwise the front makes f32
  /// working copies (exec/precision.hpp) and calls the table in f32.
  virtual bool takes_storage(DType /*dt*/, PassKind /*pass*/, const ConvGeometry& /*g*/, const ExecContext& /*ctx*/) const {
    return false;
  }
  /// y = conv(x, w) (+ bias[Cout]).
  virtual void forward(DType dt, const ConvGeometry& g, const void* x, const void* w, const void* bias, void* y,
                       ExecContext& ctx) const = 0;
  /// gx = conv^T(gy, w) (+ bias[Cin]); writes every element of gx.
  virtual void backward_input(DType dt, const ConvGeometry& g, const void* gy, const void* w, const void* bias,
                              void* gx, ExecContext& ctx) const = 0;
  /// gw = d<conv(x, w), gy>/dw (overwritten).
  virtual void backward_weight(DType dt, const ConvGeometry& g, const void* x, const void* gy, void* gw,
                               ExecContext& ctx) const = 0;
  /// gb[c] = sum over n and p of gy[n, c, p] (overwritten); gy is [batch, channels, positions].
  virtual void backward_bias(DType dt, index_t batch, index_t channels, index_t positions, const void* gy, void* gb,
                             ExecContext& ctx) const = 0;
};

}  // namespace shard::exec
