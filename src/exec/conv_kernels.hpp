#pragma once
// The convolution kernel family (private): one table per device kind, looked up by
// exec/conv.cpp through the registry. CPU: src/exec/conv_cpu.cpp (the im2col engine of
// conv_cpu_engine.cpp and the direct SIMD path of conv_cpu_direct.cpp). CUDA: src/cuda/conv_cuda.cpp (cuDNN; bias kernels
// and the padded-copy kernel in kernels/conv.cu behind src/kernels_api/conv.hpp).
//
// Every pointer is a contiguous N, C, spatial array (except x where takes_input_strides(): then
// g.x_strides may describe a view with unit innermost stride) on the context's device, of dtype `dt`
// (f32 or f64, or bf16 / f16 where native_storage says so); the front has checked shapes, devices and dtypes. Work is ordered on ctx's
// stream; the CPU implementation reads ctx.settings() (conv_kernel, conv_threading,
// conv_column_budget), the CUDA one deterministic, allow_tf32 and ctx.workspace().
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/exec/conv.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct ConvKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::conv;
  virtual ~ConvKernels() = default;

  /// True when forward and backward_weight read x through g.x_strides (innermost stride 1);
  /// otherwise the front hands them a contiguous x (and g.x_strides all zero).
  virtual bool takes_input_strides() const { return false; }
  // native_storage (KernelTable), asked with the conv's geometry (StorageQuery::conv; null for
  // backward_bias): forward (KernelPass::forward), backward_input (backward_data), backward_weight
  // (backward_weight) and backward_bias (backward_bias) with every operand in bf16 / f16, f32
  // arithmetic and accumulation, results rounded once. CUDA: always; CPU: the bias gradient always,
  // the others where the direct path applies (stride 1, a direct-path ISA level and kernel).
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
