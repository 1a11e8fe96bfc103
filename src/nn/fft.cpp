// Schedule of the spectral multiply (include/shardtensor/nn/functional/fft.hpp): the block of W
// matching this rank's modes is gathered into a contiguous complex block (a strided box copy of
// the Replicate weight, no communication), the spectral exec family mixes the channels; the
// weight gradient is this rank's contribution written into a zero block of W's shape (its spec
// is Partial(sum) over the mesh dims that shard X: the tape reduces it).
// The distributed transforms themselves have no schedule here: their plan (dist/fft.hpp) is the
// schedule, executed by the tape node in the header.
#include "shardtensor/nn/functional/fft.hpp"

#include "shardtensor/exec/box.hpp"

namespace shard::nn::functional::detail {
namespace {

DType complex_of(DType real) { return real == DType::f32 ? DType::c64 : DType::c128; }

/// W's real [Cin, Cout, k..., 2] block seen as complex [Cin, Cout, k...], restricted to the
/// modes this rank holds (lo/len of X's local box on dims 2..).
Block weight_box(const Block& w_real, const DistSpec& xs) {
  const int R = w_real.rank - 1;
  std::vector<index_t> shape(w_real.shape.begin(), w_real.shape.begin() + R);
  Block wc = Block::view(complex_of(w_real.dtype), w_real.device, w_real.data, shape.data(), R, nullptr, w_real.owner);
  std::vector<index_t> lo(static_cast<std::size_t>(R), 0), len = shape;
  const Box& xb = xs.local_box();
  for (int d = 2; d < R; ++d) {
    lo[static_cast<std::size_t>(d)] = xb.lo[static_cast<std::size_t>(d)];
    len[static_cast<std::size_t>(d)] = xb.len[static_cast<std::size_t>(d)];
  }
  return exec::sub_box(wc, lo, len);
}

Block contiguous_copy(const Block& b, ExecContext& ctx) {
  if (b.is_contiguous()) return b;
  Block c = Block::allocate(b.dtype, b.device, b.shape_vec());
  if (c.numel() > 0) exec::box_copy(c, b, ctx);
  return c;
}

exec::SpectralGeometry geometry(const DistSpec& xs, const DistSpec& ys) {
  const Box& xb = xs.local_box();
  exec::SpectralGeometry g;
  g.batch = xb.len[0];
  g.cin = xb.len[1];
  g.cout = ys.global_shape()[1];
  g.modes = 1;
  for (std::size_t d = 2; d < xb.len.size(); ++d) g.modes *= xb.len[d];
  return g;
}

}  // namespace

DistSpec spectral_mul_spec(const DistSpec& xs, const DistSpec& ws, DType xdt, DType wdt) {
  const char* op = "spectral_mul";
  SHARD_CHECK(xdt == complex_of(wdt), op, "X of dtype {} with W of dtype {} (c64 pairs with f32, c128 with f64)", xdt,
              wdt);
  SHARD_CHECK(xs.mesh() == ws.mesh(), op, "X and W live on different meshes: {}", mesh_mismatch(xs.mesh(), ws.mesh()));
  check_replicated(ws, op, "W");
  check_unsharded(xs, 1, op, "X (channels)");
  const auto& xg = xs.global_shape();
  const auto& wg = ws.global_shape();
  const int R = xs.ndim();
  SHARD_CHECK(static_cast<int>(wg.size()) == R + 1 && wg.back() == 2 && wg[0] == xg[1], op,
              "W of shape {} for X of shape {}: W must be [Cin={}, Cout, modes..., 2]", wg, xg, xg[1]);
  for (int d = 2; d < R; ++d)
    SHARD_CHECK(wg[static_cast<std::size_t>(d)] == xg[static_cast<std::size_t>(d)], op,
                "W of shape {} does not match the modes of X {} along dim {}", wg, xg, d);
  auto yg = xg;
  yg[1] = wg[1];
  return derived_spec(xs, xs.placements(), yg);
}

void spectral_mul_forward(const DistSpec& xs, const DistSpec& ys, const Block& x, const Block& w_real, const Block& y,
                          ExecContext& ctx) {
  const auto g = geometry(xs, ys);
  const Block xc = contiguous_copy(x, ctx);
  const Block wc = contiguous_copy(weight_box(w_real, xs), ctx);
  exec::spectral_mul_forward(g, xc, wc, y, ctx);
}

void spectral_mul_backward(const DistSpec& xs, const DistSpec& ys, const Block& x, const Block& w_real,
                           const Block& gy, const Block* gx, const Block* gw_real, ExecContext& ctx) {
  const auto g = geometry(xs, ys);
  const Block xc = contiguous_copy(x, ctx);
  const Block wc = contiguous_copy(weight_box(w_real, xs), ctx);
  const Block gyc = contiguous_copy(gy, ctx);
  Block gwc;
  if (gw_real) {
    exec::box_zero(*gw_real, ctx);
    const Block target = weight_box(*gw_real, xs);
    gwc = target.is_contiguous() ? target : Block::allocate(target.dtype, target.device, target.shape_vec());
  }
  exec::spectral_mul_backward(g, xc, wc, gyc, gx, gw_real ? &gwc : nullptr, ctx);
  if (gw_real) {
    const Block target = weight_box(*gw_real, xs);
    if (target.data != gwc.data && gwc.numel() > 0) exec::box_copy(target, gwc, ctx);
  }
}

}  // namespace shard::nn::functional::detail
