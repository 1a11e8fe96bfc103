#pragma once
// Attention kernel family (private interface; see include/shardtensor/exec/attention.hpp for the
// contract). Sizes and dtypes are checked by the front.
#include "shardtensor/exec/attention.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct AttentionKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::attention;
  virtual ~AttentionKernels() = default;
  virtual void forward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, const AttnMask& m, AttnOut out,
                       void* lse, ExecContext& ctx) const = 0;
  virtual void backward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, AttnIn out, AttnIn dout,
                        const void* lse, const AttnMask& m, AttnOut dq, AttnOut dk, AttnOut dv,
                        ExecContext& ctx) const = 0;
  virtual void merge(DType dt, const AttnGeom& g, AttnOut out, void* lse, AttnIn out_b, const void* lse_b,
                     ExecContext& ctx) const = 0;
};


}  // namespace shard::exec
