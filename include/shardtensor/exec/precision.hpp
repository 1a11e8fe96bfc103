#pragma once
/// \file precision.hpp
/// f32 working copies of bf16/f16 operands (namespace detail: for the exec fronts and the op
/// schedules in src/nn, not for users; public only so that nn/ does not include exec's private
/// headers).
// Mixed precision at the kernel-family fronts. bf16 and f16 are storage dtypes: a front
// whose table computes in f32 only takes f32 working copies of its bf16/f16 operands here, calls
// the f32 table, and converts its results back, so every such family accepts bf16/f16 tensors
// with f32 arithmetic and f32 accumulation (docs/architecture.md, "Mixed precision"). The copies
// live for one call: what a tape saves for backward stays in the storage dtype. A bf16 x bf16
// product is exact in f32, so "convert, then the f32 kernel" IS bf16 compute with f32
// accumulation; a table with native bf16 kernels (tensor cores, AVX-512 BF16) skips this. Which
// route a front takes is decided in one place: exec::native_storage below, the question every
// kernel table answers (src/exec/kernel_table.hpp).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <vector>

#include "shardtensor/core/error.hpp"
#include "shardtensor/exec/pointwise.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"
#include "shardtensor/runtime/registry.hpp"

namespace shard {
struct ConvGeometry;  // exec/conv.hpp
}  // namespace shard

namespace shard::exec {

/// The passes of a kernel family, for the precision question. Every family maps its entry points
/// onto these: forward (and the statistics / apply / copy passes of a forward), backward_data (the
/// gradient of the data operand: dx, dq / dk / dv, an activation's backward), backward_weight (the
/// gradient of a weight: conv's filter gradient) and backward_bias (a bias gradient).
enum class KernelPass : unsigned char { forward, backward_data, backward_weight, backward_bias };

/// THE precision decision of every op (docs/architecture.md, "The op recipe", step "precision"):
/// true when the `family` table of ctx's device computes `pass` itself on operands stored in `dt`
/// (f32 and f64: always; bf16 / f16: what the table answers, KernelTable::native_storage, for the
/// problem `conv` where the family is conv). False: the front widens the operands to f32 working
/// copies (detail::F32Work), computes in f32 and narrows the results back. Throws shard::Error
/// naming `op` when no table of the family is registered for the device.
bool native_storage(KernelFamily family, DType dt, KernelPass pass, const ExecContext& ctx, const char* op,
                    const ConvGeometry* conv = nullptr);

}  // namespace shard::exec

namespace shard::exec::detail {

/// Working blocks F32Work has made on this thread (inputs and outputs, whole or in chunks): a
/// counter for tests that check a table's precision answer against what its front does.
inline thread_local std::uint64_t t_f32_work_blocks = 0;

/// True for the storage-only dtypes (bf16, f16).
constexpr bool is_low_precision(DType dt) { return dt == DType::bf16 || dt == DType::f16; }

/// The number of elements a view with non-negative strides spans from its first element.
inline index_t span_of(const Block& b) {
  index_t span = 1;
  for (int d = 0; d < b.rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    if (b.shape[u] == 0) return 0;
    SHARD_CHECK(b.strides[u] >= 0, "mixed precision", "negative stride {} in dim {}", b.strides[u], d);
    span += (b.shape[u] - 1) * b.strides[u];
  }
  return span;
}

/// f32 working copies of one front call's bf16/f16 operands. Operands of other dtypes pass through
/// unchanged (the f32/f64 path costs one branch per operand).
class F32Work {
 public:
  explicit F32Work(ExecContext& ctx) : ctx_(ctx) {}
  F32Work(const F32Work&) = delete;
  F32Work& operator=(const F32Work&) = delete;

  /// True when any of `dts` is bf16/f16 (the front then routes through this object).
  template <class... D> static bool needed(D... dts) { return (is_low_precision(dts) || ...); }

  /// Throws shard::Error naming `op` unless every operand has one dtype: a bf16 tensor meeting an
  /// f16 or f32 one is a missing cast, never converted silently.
  static void check_same(const char* op, std::initializer_list<DType> dts) {
    const DType first = *dts.begin();
    for (DType d : dts)
      SHARD_CHECK(d == first, op,
                  "operands of dtypes {} and {}: mixed-precision operands must share one storage dtype (cast one "
                  "with F::cast<U>(x): a DistTensor or a Var)",
                  first, d);
  }

  /// An input: b itself, or an f32 copy of the memory b spans, viewed with b's shape and strides
  /// (stride-0 broadcasts and strided interiors keep their layout).
  Block in(const Block& b) {
    if (!is_low_precision(b.dtype)) return b;
    ++t_f32_work_blocks;
    const index_t span = span_of(b);
    Block flat = Block::allocate(DType::f32, b.device, &span, 1);
    if (span > 0) convert(Block::view(b.dtype, b.device, b.data, &span, 1), flat, ctx_);
    return Block::view(DType::f32, b.device, flat.data, b.shape.data(), b.rank, b.strides.data(), flat.owner);
  }
  /// `in` for an optional operand (null stays null; the copy lives in this object).
  const Block* in(const Block* b) {
    if (!b) return nullptr;
    keep_.push_back(in(*b));
    return &keep_.back();
  }
  /// An output: b itself, or an f32 block that finish() converts into b. read_first: the table
  /// accumulates into it, so it starts as b's values. A strided b (a GEMM's leading dimension, a
  /// batch stride) gets an f32 copy of the whole span it covers, viewed with its strides; the span
  /// goes back whole, and the gaps survive because bf16/f16 -> f32 -> bf16/f16 is exact.
  Block out(const Block& b, bool read_first = false) {
    if (!is_low_precision(b.dtype)) return b;
    ++t_f32_work_blocks;
    if (b.is_contiguous()) {
      Block w = Block::allocate(DType::f32, b.device, b.shape.data(), b.rank);
      if (read_first && b.numel() > 0) convert(b, w, ctx_);
      outs_.push_back({w, b});
      return w;
    }
    const index_t span = span_of(b);
    const Block whole = Block::view(b.dtype, b.device, b.data, &span, 1, nullptr, b.owner);
    Block flat = Block::allocate(DType::f32, b.device, &span, 1);
    if (span > 0) convert(whole, flat, ctx_);
    outs_.push_back({flat, whole});
    return Block::view(DType::f32, b.device, flat.data, b.shape.data(), b.rank, b.strides.data(), flat.owner);
  }
  /// A view into an output registered by out(base): the same element offset and strides in the f32
  /// working block (view itself when base is not bf16/f16).
  Block view_of(const Block& view, const Block& base) {
    if (!is_low_precision(base.dtype)) return view;
    for (auto it = outs_.rbegin(); it != outs_.rend(); ++it) {
      if (it->dst.data != base.data) continue;
      const auto off = (static_cast<const char*>(view.data) - static_cast<const char*>(base.data)) /
                       static_cast<std::ptrdiff_t>(dtype_size(base.dtype));
      Block v = view;
      v.dtype = DType::f32;
      v.data = static_cast<float*>(it->work.data) + off;
      v.owner = it->work.owner;
      return v;
    }
    SHARD_FAIL("mixed precision", "view_of: the base block was not registered with out()");
  }
  /// `out` for an optional result.
  const Block* out(const Block* b, bool read_first = false) {
    if (!b) return nullptr;
    keep_.push_back(out(*b, read_first));
    return &keep_.back();
  }
  /// Converts every output back to its storage dtype (in registration order).
  void finish() {
    for (auto& o : outs_)
      if (o.dst.numel() > 0) convert(o.work, o.dst, ctx_);
    outs_.clear();
  }

 private:
  struct Out {
    Block work, dst;
  };
  ExecContext& ctx_;
  std::vector<Out> outs_;
  std::deque<Block> keep_;  // a deque: pointers handed out stay valid as it grows
};

/// Elements [lo, lo + len) of a contiguous block, as a flat view sharing its owner.
inline Block flat_piece(const Block& b, index_t lo, index_t len) {
  return Block::view(b.dtype, b.device, static_cast<char*>(b.data) + lo * static_cast<index_t>(dtype_size(b.dtype)),
                     &len, 1, nullptr, b.owner);
}

/// Elements per chunk of chunked_f32 (256 KiB of f32 per operand: the transient copies stay small
/// next to a model's activations, and a chunk is still long enough for the OpenMP kernels).
inline constexpr index_t kF32Chunk = index_t{1} << 16;

/// F32Work in chunks, for elementwise ops whose operands are all contiguous with one element count:
/// fn(in, out) gets f32 working copies of the elements [lo, lo + len) of every operand, as flat
/// blocks, one chunk after another, so the f32 copies never exceed kF32Chunk elements per operand
/// (instead of whole tensors: the difference is the activation memory a bf16 model saves).
/// Returns false, doing nothing, when an operand is strided or of another element count (the
/// caller then takes the whole-tensor F32Work route). Chunk by chunk is safe for in-place ops
/// (an output aliasing an input): each chunk is read before it is written.
template <std::size_t NI, std::size_t NO, class Fn>
bool chunked_f32(ExecContext& ctx, const std::array<const Block*, NI>& ins, const std::array<const Block*, NO>& outs,
                 Fn&& fn) {
  const index_t n = outs[0]->numel();
  for (const Block* b : ins)
    if (!b->is_contiguous() || b->numel() != n) return false;
  for (const Block* b : outs)
    if (!b->is_contiguous() || b->numel() != n) return false;
  if (n <= kF32Chunk) return false;  // one chunk: the plain route is the same
  for (index_t lo = 0; lo < n; lo += kF32Chunk) {
    const index_t len = std::min(kF32Chunk, n - lo);
    F32Work f(ctx);
    std::array<Block, NI> wi;
    std::array<Block, NO> wo;
    for (std::size_t i = 0; i < NI; ++i) wi[i] = f.in(flat_piece(*ins[i], lo, len));
    for (std::size_t i = 0; i < NO; ++i) wo[i] = f.out(flat_piece(*outs[i], lo, len));
    fn(wi, wo);
    f.finish();
  }
  return true;
}

}  // namespace shard::exec::detail
