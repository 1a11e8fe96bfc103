#pragma once
// cuDNN's fused attention (SDPA through cudnn-frontend) as the CUDA attention table's kernel for
// bf16 / f16 (src/cuda/attention_cudnn.cpp; the choice: src/cuda/attention_cudnn_select.hpp).
// src/cuda/attention_cuda.cpp asks it first and runs its own kernels when it declines. Built
// without cudnn-frontend (SHARDTENSOR_HAVE_CUDNN_FRONTEND unset) it always declines.
#include <cstdint>
#include <string>

#include "shardtensor/core/dtype.hpp"
#include "shardtensor/exec/attention.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec::cudnn_attention {

/// True when this build has the cuDNN path (cudnn-frontend found at configure time).
bool compiled();

/// Runs the forward (out, lse; contract of exec/attention.hpp) on cuDNN and returns true, or
/// returns false having done nothing (not eligible, switched off, or the graph is unsupported).
bool try_forward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, const AttnMask& m, AttnOut out, void* lse,
                 ExecContext& ctx);

/// Runs the backward on cuDNN, ADDING to dq, dk, dv (each may be null), and returns true, or
/// returns false having done nothing.
bool try_backward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, AttnIn out, AttnIn dout,
                  const void* lse, const AttnMask& m, AttnOut dq, AttnOut dk, AttnOut dv, ExecContext& ctx);

/// Counters since the process started (or reset_counters()), for tests and benchmarks.
struct Counters {
  std::uint64_t forward_cudnn = 0, backward_cudnn = 0;        ///< calls run on cuDNN
  std::uint64_t forward_declined = 0, backward_declined = 0;  ///< calls left to the own kernels
  std::uint64_t graphs_built = 0;                             ///< graphs built (cache misses that succeeded)
  std::uint64_t graphs_unsupported = 0;                       ///< shapes cuDNN refused at build time
  std::string last_reason;                                    ///< why the last declined call was declined
};
Counters counters();
void reset_counters();

}  // namespace shard::exec::cudnn_attention
