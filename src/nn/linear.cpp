// Schedule of channel_linear / linear (see include/shardtensor/nn/functional/linear.hpp): which
// GEMMs and bias epilogues of the gemm kernel family run, on Blocks, for one rank's local block.
// Replicated weights: no communication here (the parameter gradients' Partial(sum) is reduced by
// Var's leaf finalisation).
#include <algorithm>
#include <optional>
#include <vector>

#include "shardtensor/exec/conv.hpp"
#include "shardtensor/exec/gemm.hpp"
#include "shardtensor/exec/precision.hpp"
#include "shardtensor/nn/functional/linear.hpp"

namespace shard::nn::functional::detail {
namespace {

/// x's local block read in place by the GEMMs: `offsets.size()` panels in element order. linear
/// (cdim = R - 1): panel g is a [panel, cin] matrix of tokens (row stride ld, unit column stride)
/// whose result rows are y[g * panel .. +panel, :]; channel_linear (cdim = 1): panel g is a
/// [cin, panel] matrix (row stride ld = x's channel stride, unit column stride) of sample g / Q and
/// spatial points (g % Q) * panel .. +panel, Q = S / panel. A user view of the interior of a
/// halo-padded array is typically one panel per padded row.
struct MixPanels {
  index_t ld = 0;                ///< BLAS leading dimension of each panel
  index_t panel = 0;             ///< tokens (linear) or spatial points (channel_linear) per panel
  std::vector<index_t> offsets;  ///< element offset in x of each panel's first element
};

/// The panels of a strided x for channel dim cdim (1 or rank - 1), or nullopt when BLAS cannot
/// read x in place (the unit-stride dim is not the channel dim (linear) or the innermost spatial
/// dim (channel_linear)).
std::optional<MixPanels> mix_panels(const Block& x, int cdim) {
  const int R = x.rank;
  const auto& shape = x.shape;
  const auto& strides = x.strides;
  const bool tokens = cdim == R - 1;
  const int first = tokens ? 0 : 2, last = tokens ? R - 2 : R - 1;
  const index_t cin = shape[static_cast<std::size_t>(cdim)];
  // The longest run of dims [k, last] that collapses into one dim of stride `step`.
  index_t run = 1, step = 0;
  bool found = false;
  int k = last + 1;
  for (int d = last; d >= first; --d) {
    const auto u = static_cast<std::size_t>(d);
    if (shape[u] == 1) {
      k = d;
      continue;
    }
    if (found && strides[u] != step * run) break;
    if (!found) step = strides[u], found = true;
    run *= shape[u];
    k = d;
  }
  MixPanels p;
  p.panel = run;
  if (tokens) {
    if (cin != 1 && strides[static_cast<std::size_t>(cdim)] != 1) return std::nullopt;
    p.ld = found ? step : std::max<index_t>(cin, 1);
    if (p.ld < std::max<index_t>(cin, 1)) return std::nullopt;
  } else {
    if (found && step != 1) return std::nullopt;
    p.ld = cin == 1 ? std::max<index_t>(run, 1) : strides[1];
    if (p.ld < std::max<index_t>(run, 1)) return std::nullopt;
  }
  // Outer dims, enumerated in row-major order: the leading dims before k (linear), or N and the
  // spatial dims before k (channel_linear).
  std::vector<int> outer;
  if (!tokens) outer.push_back(0);
  for (int d = first; d < k; ++d) outer.push_back(d);
  index_t groups = 1;
  for (int d : outer) groups *= shape[static_cast<std::size_t>(d)];
  p.offsets.reserve(static_cast<std::size_t>(groups));
  for (index_t g = 0; g < groups; ++g) {
    index_t rem = g, off = 0;
    for (auto it = outer.rbegin(); it != outer.rend(); ++it) {
      const auto u = static_cast<std::size_t>(*it);
      off += (rem % shape[u]) * strides[u];
      rem /= shape[u];
    }
    p.offsets.push_back(off);
  }
  return p;
}

/// The [A, C, S] extents of a block along channel dim cdim.
exec::BiasGeometry mix_extents(const Block& x, int cdim) {
  exec::BiasGeometry e{1, x.shape[static_cast<std::size_t>(cdim)], 1};
  for (int d = 0; d < cdim; ++d) e.A *= x.shape[static_cast<std::size_t>(d)];
  for (int d = cdim + 1; d < x.rank; ++d) e.S *= x.shape[static_cast<std::size_t>(d)];
  return e;
}

/// A [rows, cols] matrix (row stride ld) starting `offset` elements into `base`.
Block mat(const Block& base, index_t offset, index_t rows, index_t cols, index_t ld) {
  const index_t shape[2] = {rows, cols}, strides[2] = {ld, 1};
  return Block::view(base.dtype, base.device,
                     static_cast<char*>(base.data) + offset * static_cast<index_t>(base.element_bytes()), shape, 2,
                     strides);
}
/// `batch` contiguous [rows, cols] matrices, one every `rows * cols` elements, from `base`.
Block batch_mat(const Block& base, index_t batch, index_t rows, index_t cols) {
  const index_t shape[3] = {batch, rows, cols};
  return Block::view(base.dtype, base.device, base.data, shape, 3);
}

constexpr exec::GemmGeometry kNN{Trans::no, Trans::no, 1.0, 0.0}, kNT{Trans::no, Trans::yes, 1.0, 0.0},
    kTN{Trans::yes, Trans::no, 1.0, 0.0};
exec::GemmGeometry accumulate(exec::GemmGeometry g) {
  g.beta = 1.0;
  return g;
}

/// True when the GEMMs of a bf16 / f16 channel mixing would run on whole-tensor f32 working
/// copies: the gemm table of ctx's device does not compute the storage dtype itself (the CPU's;
/// exec::native_storage, the one precision question), and ExecSettings::native_low_precision lets
/// the schedule take a route that avoids them (mix_conv, token_chunk_rows).
bool gemm_widens(const Block& x, const ExecContext& ctx) {
  return exec::detail::is_low_precision(x.dtype) && ctx.settings().native_low_precision &&
         !exec::native_storage(exec::KernelFamily::gemm, x.dtype, exec::KernelPass::forward, ctx, "linear");
}

/// bf16 / f16 channel mixing of a contiguous field (S > 1) where the GEMMs would widen
/// (gemm_widens): the op is a 1 x 1 conv over [A, cin, S], whose CPU table reads the storage dtype
/// in place (AMX tiles for bf16), so no whole-tensor f32 copies of x, y or gy are made. nullopt
/// when it does not apply (the GEMM route then runs on f32 working copies).
std::optional<ConvGeometry> mix_conv(const Block& x, int cdim, index_t cout, const ExecContext& ctx) {
  if (!x.is_contiguous() || !gemm_widens(x, ctx)) return std::nullopt;
  const auto e = mix_extents(x, cdim);
  if (e.S <= 1 || e.A == 0) return std::nullopt;
  ConvGeometry g;
  g.spatial_dims = 1;
  g.batch = e.A;
  g.in_channels = e.channels;
  g.out_channels = cout;
  g.in = g.out = {1, 1, e.S};
  return g;
}
/// Rows per chunk of the bf16 / f16 token route (S == 1, contiguous x, gemm_widens): the
/// GEMMs run on f32 working copies of row chunks of x, y and gy (about kF32Chunk elements each)
/// instead of whole tensors; 0 when the route does not apply.
index_t token_chunk_rows(const Block& x, int cdim, index_t cout, const ExecContext& ctx) {
  // Where the GEMMs widen (the CPU: measured and tested there); where the gemm table computes the
  // storage dtype (cuBLAS) the whole-tensor route stays until the chunked one has run on a GPU.
  if (!x.is_contiguous() || !gemm_widens(x, ctx)) return 0;
  const auto e = mix_extents(x, cdim);
  if (e.S != 1) return 0;
  const index_t rows = std::max<index_t>(1, exec::detail::kF32Chunk / std::max<index_t>(1, std::max(e.channels, cout)));
  return rows < e.A ? rows : 0;  // one chunk: the whole-tensor route is the same
}
/// Rows [a0, a0 + n) of a contiguous [A, cols] matrix.
Block rows_of(const Block& b, index_t a0, index_t n, index_t cols) {
  const index_t shape[2] = {n, cols};
  return Block::view(b.dtype, b.device, static_cast<char*>(b.data) + a0 * cols * static_cast<index_t>(b.element_bytes()),
                     shape, 2, nullptr, b.owner);
}

/// b viewed as [A, channels, S] (contiguous).
Block field3(const Block& b, index_t A, index_t channels, index_t S) {
  const index_t shape[3] = {A, channels, S};
  return Block::view(b.dtype, b.device, b.data, shape, 3, nullptr, b.owner);
}

}  // namespace

bool mix_reads_in_place(const Block& x, int cdim) { return x.is_contiguous() || mix_panels(x, cdim).has_value(); }

void mix_forward(const Block& x, const Block& w, const Block* b, int cdim, const Block& y, ExecContext& ctx) {
  // bf16 / f16 storage: the whole op (GEMMs and bias) on f32 working copies, rounded once
  // (exec/precision.hpp); per-call conversion inside gemm / add_bias would round twice.
  if (exec::detail::F32Work::needed(x.dtype, w.dtype, y.dtype)) {
    exec::detail::F32Work::check_same("linear", {x.dtype, w.dtype, y.dtype, b ? b->dtype : y.dtype});
    if (const auto g = mix_conv(x, cdim, w.shape[0], ctx)) {
      SHARD_CHECK(y.is_contiguous(), "linear", "output must be contiguous");
      exec::conv_forward(*g, field3(x, g->batch, g->in_channels, g->in[2]), w, b,
                         field3(y, g->batch, g->out_channels, g->in[2]), ctx);
      return;
    }
    if (const index_t rows = token_chunk_rows(x, cdim, w.shape[0], ctx); rows > 0 && y.is_contiguous()) {
      const index_t A = mix_extents(x, cdim).A, cin = w.shape[1], cout = w.shape[0];
      exec::detail::F32Work fw(ctx);
      const Block wf = fw.in(w);
      const Block* bf = fw.in(b);
      for (index_t a0 = 0; a0 < A; a0 += rows) {
        const index_t n = std::min(rows, A - a0);
        exec::detail::F32Work f(ctx);
        mix_forward(f.in(rows_of(x, a0, n, cin)), wf, bf, 1, f.out(rows_of(y, a0, n, cout)), ctx);
        f.finish();
      }
      return;
    }
    exec::detail::F32Work f(ctx);
    mix_forward(f.in(x), f.in(w), f.in(b), cdim, f.out(y), ctx);
    return f.finish();
  }
  const auto e = mix_extents(x, cdim);
  const index_t A = e.A, cin = e.channels, S = e.S, cout = w.shape[0];
  if (A == 0 || S == 0) return;
  if (x.is_contiguous()) {
    if (S == 1)  // tokens: Y[A, cout] = X[A, cin] W^T
      exec::gemm(kNT, mat(x, 0, A, cin, cin), w, mat(y, 0, A, cout, cout), ctx);
    else  // per sample: Y_a[cout, S] = W[cout, cin] X_a[cin, S]
      exec::gemm(kNN, w, batch_mat(x, A, cin, S), batch_mat(y, A, cout, S), ctx);
  } else {
    const auto p = mix_panels(x, cdim);
    SHARD_CHECK(p.has_value(), "linear", "strided input of shape {} (strides {}) cannot be read in place",
                x.shape_vec(), x.strides_vec());
    const bool tokens = cdim == x.rank - 1;
    const index_t Q = tokens ? 1 : S / p->panel;
    for (std::size_t g = 0; g < p->offsets.size(); ++g) {
      const auto gi = static_cast<index_t>(g);
      if (tokens)
        exec::gemm(kNT, mat(x, p->offsets[g], p->panel, cin, p->ld), w,
                   mat(y, gi * p->panel * cout, p->panel, cout, cout), ctx);
      else
        exec::gemm(kNN, w, mat(x, p->offsets[g], cin, p->panel, p->ld),
                   mat(y, (gi / Q) * cout * S + (gi % Q) * p->panel, cout, p->panel, S), ctx);
    }
  }
  if (b) exec::add_bias({A, cout, S}, *b, y, ctx);
}

void mix_backward(const Block& x, const Block& w, const Block& gy, int cdim, const Block* dx, const Block* dw,
                  const Block* db, ExecContext& ctx) {
  // bf16 / f16: one f32 pass, so the per-sample weight-gradient GEMMs accumulate in f32 and
  // round once (dw arrives zeroed: it is read first).
  if (exec::detail::F32Work::needed(x.dtype, w.dtype, gy.dtype)) {
    exec::detail::F32Work::check_same("linear backward", {x.dtype, w.dtype, gy.dtype});
    if (const auto g = mix_conv(x, cdim, w.shape[0], ctx); g && gy.is_contiguous()) {
      const index_t A = g->batch, cin = g->in_channels, cout = g->out_channels, S = g->in[2];
      const Block gy3 = field3(gy, A, cout, S);
      if (dx) exec::conv_backward_input(*g, gy3, w, nullptr, field3(*dx, A, cin, S), ctx);
      if (dw) exec::conv_backward_weight(*g, field3(x, A, cin, S), gy3, *dw, ctx);  // dw arrives zeroed
      if (db) exec::conv_backward_bias(gy3, *db, ctx);
      return;
    }
    if (const index_t rows = token_chunk_rows(x, cdim, w.shape[0], ctx); rows > 0 && gy.is_contiguous()) {
      // dx rows chunk by chunk; dw accumulates over the chunks in one f32 block (rounded once);
      // db through the conv family's bias gradient, which reads the storage dtype in place.
      const index_t A = mix_extents(x, cdim).A, cin = w.shape[1], cout = w.shape[0];
      exec::detail::F32Work fw(ctx);
      const Block wf = fw.in(w);
      const Block* dwf = fw.out(dw, true);
      for (index_t a0 = 0; a0 < A; a0 += rows) {
        const index_t n = std::min(rows, A - a0);
        exec::detail::F32Work f(ctx);
        const Block gyc = f.in(rows_of(gy, a0, n, cout));
        if (dx) exec::gemm(kNN, gyc, wf, f.out(rows_of(*dx, a0, n, cin)), ctx);
        if (dwf) exec::gemm(accumulate(kTN), gyc, f.in(rows_of(x, a0, n, cin)), *dwf, ctx);
        f.finish();
      }
      fw.finish();
      if (db) exec::conv_backward_bias(field3(gy, A, cout, 1), *db, ctx);
      return;
    }
    exec::detail::F32Work f(ctx);
    const Block xf = f.in(x), wf = f.in(w), gf = f.in(gy);
    mix_backward(xf, wf, gf, cdim, f.out(dx), f.out(dw, true), f.out(db), ctx);
    return f.finish();
  }
  const auto e = mix_extents(x, cdim);
  const index_t A = e.A, cin = e.channels, S = e.S, cout = w.shape[0];
  if (db) exec::bias_grad({A, cout, S}, gy, *db, ctx);
  if (A == 0 || S == 0) return;
  // dx and db read no x; the weight gradient reads x through its panels when strided.
  const bool strided = !x.is_contiguous();
  if (S == 1) {
    if (dx) exec::gemm(kNN, mat(gy, 0, A, cout, cout), w, mat(*dx, 0, A, cin, cin), ctx);
    if (dw && !strided) exec::gemm(kTN, mat(gy, 0, A, cout, cout), mat(x, 0, A, cin, cin), *dw, ctx);
  } else {
    if (dx) exec::gemm(kTN, w, batch_mat(gy, A, cout, S), batch_mat(*dx, A, cin, S), ctx);
    if (dw && !strided)  // one GEMM per sample, accumulated in sample order (as a sum over the batch)
      for (index_t a = 0; a < A; ++a)
        exec::gemm(accumulate(kNT), mat(gy, a * cout * S, cout, S, S), mat(x, a * cin * S, cin, S, S), *dw, ctx);
  }
  if (!dw || !strided) return;
  const auto p = mix_panels(x, cdim);
  SHARD_CHECK(p.has_value(), "linear", "strided input of shape {} (strides {}) cannot be read in place",
              x.shape_vec(), x.strides_vec());
  const bool tokens = cdim == x.rank - 1;
  const index_t Q = tokens ? 1 : S / p->panel;
  for (std::size_t i = 0; i < p->offsets.size(); ++i) {  // accumulated into dw in panel order
    const auto gi = static_cast<index_t>(i);
    if (tokens)
      exec::gemm(accumulate(kTN), mat(gy, gi * p->panel * cout, p->panel, cout, cout),
                 mat(x, p->offsets[i], p->panel, cin, p->ld), *dw, ctx);
    else
      exec::gemm(accumulate(kNT), mat(gy, (gi / Q) * cout * S + (gi % Q) * p->panel, cout, p->panel, S),
                 mat(x, p->offsets[i], cin, p->panel, p->ld), *dw, ctx);
  }
}

}  // namespace shard::nn::functional::detail
