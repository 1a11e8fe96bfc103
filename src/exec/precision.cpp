// exec::native_storage (exec/precision.hpp): the precision question for callers above exec (the
// op schedules in src/nn), asked of the family's table for the context's device through the one
// helper the fronts use (detail::native_storage, front_util.hpp).
#include "shardtensor/exec/precision.hpp"

#include "exec/attention_kernels.hpp"
#include "exec/box_kernels.hpp"
#include "exec/conv_kernels.hpp"
#include "exec/fft_kernels.hpp"
#include "exec/front_util.hpp"
#include "exec/gemm_kernels.hpp"
#include "exec/neighborhood_kernels.hpp"
#include "exec/neighbors_kernels.hpp"
#include "exec/norm_kernels.hpp"
#include "exec/optim_kernels.hpp"
#include "exec/points_kernels.hpp"
#include "exec/pointwise_kernels.hpp"
#include "exec/pool_kernels.hpp"
#include "exec/reduce_kernels.hpp"
#include "exec/resize_kernels.hpp"
#include "exec/rows_kernels.hpp"
#include "exec/spectral_kernels.hpp"
#include "exec/tensor_kernels.hpp"

namespace shard::exec {

namespace {
/// The family's table for dev, as its KernelTable base.
const KernelTable& table_of(KernelFamily family, Device dev, const char* op) {
  switch (family) {
    case KernelFamily::box: return kernels_for<BoxKernels>(dev, op);
    case KernelFamily::pointwise: return kernels_for<PointwiseKernels>(dev, op);
    case KernelFamily::reduce: return kernels_for<ReduceKernels>(dev, op);
    case KernelFamily::norm: return kernels_for<NormKernels>(dev, op);
    case KernelFamily::pool: return kernels_for<PoolKernels>(dev, op);
    case KernelFamily::resize: return kernels_for<ResizeKernels>(dev, op);
    case KernelFamily::conv: return kernels_for<ConvKernels>(dev, op);
    case KernelFamily::gemm: return kernels_for<GemmKernels>(dev, op);
    case KernelFamily::optim: return kernels_for<OptimKernels>(dev, op);
    case KernelFamily::attention: return kernels_for<AttentionKernels>(dev, op);
    case KernelFamily::fft: return kernels_for<FftKernels>(dev, op);
    case KernelFamily::tensor: return kernels_for<TensorDeviceKernels>(dev, op);
    case KernelFamily::nbhd_attention: return kernels_for<NbhdAttentionKernels>(dev, op);
    case KernelFamily::spectral: return kernels_for<SpectralKernels>(dev, op);
    case KernelFamily::neighbors: return kernels_for<NeighborsKernels>(dev, op);
    case KernelFamily::rows: return kernels_for<RowsKernels>(dev, op);
    case KernelFamily::points: return kernels_for<PointsKernels>(dev, op);
    case KernelFamily::runtime:
    case KernelFamily::comm:
    case KernelFamily::count_: break;
  }
  SHARD_FAIL(op, "kernel family {} has no kernel table to ask about precision", static_cast<int>(family));
}
}  // namespace

bool native_storage(KernelFamily family, DType dt, KernelPass pass, const ExecContext& ctx, const char* op,
                    const ConvGeometry* conv) {
  if (!detail::is_low_precision(dt)) return true;
  return detail::native_storage(table_of(family, ctx.device(), op), dt, pass, ctx, conv);
}

}  // namespace shard::exec
