#pragma once
// Neighbourhood-attention kernel family (private interface; see
// include/shardtensor/exec/neighborhood.hpp for the contract). Sizes and dtypes are checked by
// the front.
#include "shardtensor/exec/neighborhood.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct NbhdAttentionKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::nbhd_attention;
  virtual ~NbhdAttentionKernels() = default;
  virtual void forward(DType dt, const NbhdGeom& g, NbhdIn q, NbhdIn k, NbhdIn v, NbhdOut out, void* lse,
                       ExecContext& ctx) const = 0;
  virtual void backward(DType dt, const NbhdGeom& g, NbhdIn q, NbhdIn k, NbhdIn v, NbhdIn out, NbhdIn dout,
                        const void* lse, NbhdOut dq, NbhdOut dk, NbhdOut dv, ExecContext& ctx) const = 0;
};


}  // namespace shard::exec
