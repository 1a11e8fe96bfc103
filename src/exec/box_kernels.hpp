#pragma once
// The `box` kernel family (private): copy, add and fill over strided boxes of Blocks on one
// device. The front (src/exec/box.cpp, declared in include/shardtensor/exec/box.hpp) checks the
// operands and handles host <-> device copies; a backend only ever sees blocks on its own device
// with equal shapes and dtypes and at least one element.
//   CPU:  src/exec/box_cpu.cpp  (registered for DeviceKind::cpu)
//   CUDA: kernels/box.cu + src/cuda/box_cuda.cpp  (registered for DeviceKind::cuda)
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

/// One backend's box kernels. Strides may be negative; dst and src must not overlap.
struct BoxKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::box;
  virtual ~BoxKernels() = default;
  /// dst = src.
  virtual void copy(const Block& dst, const Block& src, ExecContext& ctx) const = 0;
  /// dst += src (dtype checked by the front: f32, f64, c64, c128, i32, i64).
  virtual void add(const Block& dst, const Block& src, ExecContext& ctx) const = 0;
  /// Every element of dst = the element at `value` (host memory, dtype_size(dst.dtype) bytes).
  virtual void fill(const Block& dst, const void* value, ExecContext& ctx) const = 0;
};


/// A box with its size-1 dims dropped and adjacent dims merged where both operands' strides
/// allow (row-major order kept): the innermost dim is as long as possible. Used by every backend.
struct BoxShape {
  int rank = 0;                              ///< 0: a single element
  index_t len[kMaxBlockRank]{};
  index_t dst_stride[kMaxBlockRank]{};
  index_t src_stride[kMaxBlockRank]{};
};

/// Normalises (dst, src) boxes of equal shape; pass src = nullptr for a fill (src strides unused).
inline BoxShape normalize_box(const Block& dst, const Block* src) {
  BoxShape b;
  // Walk from the innermost dim outwards, building the merged dims innermost-first.
  index_t len[kMaxBlockRank], ds[kMaxBlockRank], ss[kMaxBlockRank];
  int n = 0;
  for (int d = dst.rank - 1; d >= 0; --d) {
    const auto u = static_cast<std::size_t>(d);
    const index_t e = dst.shape[u];
    if (e == 1) continue;
    const index_t sd = dst.strides[u], sv = src ? src->strides[u] : 0;
    if (n > 0 && ds[n - 1] * len[n - 1] == sd && ss[n - 1] * len[n - 1] == sv) {
      len[n - 1] *= e;
      continue;
    }
    len[n] = e;
    ds[n] = sd;
    ss[n] = sv;
    ++n;
  }
  b.rank = n;
  for (int k = 0; k < n; ++k) {  // back to outermost-first
    b.len[k] = len[n - 1 - k];
    b.dst_stride[k] = ds[n - 1 - k];
    b.src_stride[k] = ss[n - 1 - k];
  }
  return b;
}

/// True for the dtypes `add` accepts.
constexpr bool box_addable(DType dt) {
  return dt == DType::f32 || dt == DType::f64 || dt == DType::bf16 || dt == DType::f16 || dt == DType::c64 ||
         dt == DType::c128 || dt == DType::i32 || dt == DType::i64;
}

}  // namespace shard::exec
