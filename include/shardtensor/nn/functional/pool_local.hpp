#pragma once
/// \file pool_local.hpp
/// Local average and max pooling (on the tensor's device, through the pool kernel family of
/// exec/pool.hpp), forward and backward, for S = 1, 2, 3 spatial dims on
/// Tensor<T, S + 2> in N, C, spatial layout (T = float or double). Padding is explicit per side
/// (pad_lo / pad_hi), as for conv.hpp, so the domain-parallel layer can pool halo-extended
/// blocks: the padded cells are zeros for avg (counted in the divisor only with
/// count_include_pad) and are never selected by max. Output extent per dim (pool_output_extent):
///   floor mode: out = floor((in + pad_lo + pad_hi - kernel) / stride) + 1   (must be >= 1);
///   ceil mode (PyTorch's ceil_mode=True): out = ceil((in + pad_lo + pad_hi - kernel) / stride) + 1,
///     less one if the last window would start at or beyond in + pad_lo (PyTorch's "the last
///     pooling starts inside the image"); that last window may run past the high padding: avg's
///     divisor is then the window clipped to [-pad_lo, in + pad_hi) with count_include_pad, and
///     to [0, in) without; max ignores the cells outside [0, in).
/// Every window must overlap the input: pad_lo < kernel and pad_hi < kernel; ceil mode also
/// needs PyTorch's pad <= kernel / 2 per side.
#include <cstdint>

#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/exec/pool.hpp"
#include "shardtensor/tensor/tensor.hpp"
#include "shardtensor/tensor/tensor_block.hpp"

namespace shard {

/// Hyper-parameters of S-dimensional pooling. A stride left at 0 means "= kernel".
template <int S>
struct PoolParams {
  static_assert(S >= 1 && S <= 3, "PoolParams: 1, 2 or 3 spatial dims");
  Shape<S> kernel{};               ///< window extent per dim (>= 1)
  Shape<S> stride{};               ///< step per dim (>= 1; 0 = kernel)
  Shape<S> pad_lo{};               ///< padding before the input, per dim (0 <= pad_lo < kernel)
  Shape<S> pad_hi{};               ///< padding after the input, per dim (0 <= pad_hi < kernel)
  bool count_include_pad = true;   ///< avg: divide by the full window (true) or by its input cells
  bool ceil_mode = false;          ///< output extent rounded up (PyTorch's ceil_mode; see the file comment)

  /// Stride with zeros replaced by the kernel extent.
  Shape<S> effective_stride() const {
    Shape<S> s = stride;
    for (int d = 0; d < S; ++d)
      if (s[d] == 0) s[d] = kernel[d];
    return s;
  }
};

/// Max-pooling result: values and the argmax of each window as a flat spatial index into the
/// input plane (row-major over the input's spatial dims); ties pick the first maximum in
/// row-major window order, NaN wins over numbers.
template <class T, int R>
struct MaxPoolResult {
  Tensor<T, R> values;              ///< [N, C, out...]
  Tensor<std::int64_t, R> indices;  ///< [N, C, out...] flat input-plane index of each max
};

/// Output extent of pooling one dim of extent `in` (the file comment's rule; no checks).
inline index_t pool_output_extent(index_t in, index_t kernel, index_t stride, index_t pad_lo, index_t pad_hi,
                                  bool ceil_mode) {
  const index_t span = in + pad_lo + pad_hi - kernel;
  if (!ceil_mode) return span / stride + 1;
  index_t out = (span + stride - 1) / stride + 1;
  if ((out - 1) * stride >= in + pad_lo) --out;
  return out;
}

namespace detail {
/// Pooling as seen by the type-erased kernels (see exec/pool.hpp).
using PoolGeometry = exec::PoolGeometry;

template <int S>
PoolGeometry pool_geometry(index_t planes, const Shape<S>& in, const Shape<S>& out, const PoolParams<S>& p) {
  PoolGeometry g;
  g.planes = planes;
  g.count_include_pad = p.count_include_pad;
  const auto st = p.effective_stride();
  for (int d = 0; d < S; ++d) {
    const int e = 3 - S + d;
    g.in[e] = in[d];
    g.out[e] = out[d];
    g.kernel[e] = p.kernel[d];
    g.stride[e] = st[d];
    g.pad_lo[e] = p.pad_lo[d];
    if (p.ceil_mode) g.pad_end[e] = in[d] + p.pad_hi[d];
  }
  return g;
}
}  // namespace detail

/// Spatial output shape of pooling `in` with `p`; throws shard::Error naming the shapes.
template <int S>
Shape<S> pool_output_shape(const Shape<S>& in, const PoolParams<S>& p, const char* op = "pool_output_shape") {
  const auto st = p.effective_stride();
  Shape<S> out{};
  for (int d = 0; d < S; ++d) {
    SHARD_CHECK(p.kernel[d] >= 1 && st[d] >= 1, op, "kernel {} and stride {} must be >= 1", p.kernel, p.stride);
    SHARD_CHECK(p.pad_lo[d] >= 0 && p.pad_hi[d] >= 0 && p.pad_lo[d] < p.kernel[d] && p.pad_hi[d] < p.kernel[d], op,
                "padding lo {} hi {} must be >= 0 and smaller than the kernel {}", p.pad_lo, p.pad_hi, p.kernel);
    const index_t span = in[d] + p.pad_lo[d] + p.pad_hi[d] - p.kernel[d];
    SHARD_CHECK(in[d] >= 1 && span >= 0, op, "input {} with padding lo {} hi {} is smaller than the kernel {}", in,
                p.pad_lo, p.pad_hi, p.kernel);
    SHARD_CHECK(!p.ceil_mode || (2 * p.pad_lo[d] <= p.kernel[d] && 2 * p.pad_hi[d] <= p.kernel[d]), op,
                "ceil_mode: padding lo {} hi {} must be at most half the kernel {} (PyTorch's rule)", p.pad_lo,
                p.pad_hi, p.kernel);
    out[d] = pool_output_extent(in[d], p.kernel[d], st[d], p.pad_lo[d], p.pad_hi[d], p.ceil_mode);
  }
  return out;
}

namespace detail {
template <class T, int R>
Shape<R> pooled_shape(const char* op, const Tensor<T, R>& x, const PoolParams<R - 2>& p) {
  static_assert(is_float_type<T>, "pooling supports float, double, bf16 and f16");
  static_assert(R >= 3 && R <= 5, "pooling needs rank 3, 4 or 5 (N, C, 1-3 spatial dims)");
  Shape<R - 2> in{};
  for (int d = 0; d < R - 2; ++d) in[d] = x.size(2 + d);
  const auto out = pool_output_shape<R - 2>(in, p, op);
  Shape<R> ys = x.shape();
  for (int d = 0; d < R - 2; ++d) ys[2 + d] = out[d];
  return ys;
}
template <int R>
Shape<R - 2> spatial_shape(const Shape<R>& s) {
  Shape<R - 2> r{};
  for (int d = 0; d < R - 2; ++d) r[d] = s[2 + d];
  return r;
}
}  // namespace detail

/// y = average pooling of x[N, C, in...].
template <class T, int R>
Tensor<T, R> avg_pool_forward(const Tensor<T, R>& x, const PoolParams<R - 2>& p) {
  const auto ys = detail::pooled_shape("avg_pool_forward", x, p);
  auto y = Tensor<T, R>::empty(ys, x.device());
  const auto xc = x.contiguous();
  exec::avg_pool_forward(
      detail::pool_geometry<R - 2>(ys[0] * ys[1], detail::spatial_shape<R>(x.shape()), detail::spatial_shape<R>(ys), p),
      as_block(xc), as_block(y), current_context(x.device()));
  return y;
}

/// gx[N, C, in...] = gradient of <avg_pool_forward(x, p), gy> with respect to x (`in` = x's spatial shape).
template <class T, int R>
Tensor<T, R> avg_pool_backward(const Tensor<T, R>& gy, const Shape<R - 2>& in, const PoolParams<R - 2>& p) {
  Shape<R> xs = gy.shape();
  for (int d = 0; d < R - 2; ++d) xs[2 + d] = in[d];
  auto gx = Tensor<T, R>::empty(xs, gy.device());
  const auto ys = detail::pooled_shape("avg_pool_backward", gx, p);
  SHARD_CHECK(ys == gy.shape(), "avg_pool_backward", "output gradient {} does not match input extent {} (expected {})",
              gy.shape(), in, ys);
  const auto gc = gy.contiguous();
  exec::avg_pool_backward(detail::pool_geometry<R - 2>(ys[0] * ys[1], in, detail::spatial_shape<R>(ys), p),
                          as_block(gc), as_block(gx), current_context(gy.device()));
  return gx;
}

/// Max pooling of x[N, C, in...] with argmax indices (see MaxPoolResult).
template <class T, int R>
MaxPoolResult<T, R> max_pool_forward(const Tensor<T, R>& x, const PoolParams<R - 2>& p) {
  const auto ys = detail::pooled_shape("max_pool_forward", x, p);
  MaxPoolResult<T, R> r{Tensor<T, R>::empty(ys, x.device()), Tensor<std::int64_t, R>::empty(ys, x.device())};
  const auto xc = x.contiguous();
  exec::max_pool_forward(
      detail::pool_geometry<R - 2>(ys[0] * ys[1], detail::spatial_shape<R>(x.shape()), detail::spatial_shape<R>(ys), p),
      as_block(xc), as_block(r.values), as_block(r.indices), current_context(x.device()));
  return r;
}

/// gx[N, C, in...]: gy scattered (added) to the argmax positions `indices` of max_pool_forward.
template <class T, int R>
Tensor<T, R> max_pool_backward(const Tensor<T, R>& gy, const Tensor<std::int64_t, R>& indices, const Shape<R - 2>& in,
                               const PoolParams<R - 2>& p) {
  Shape<R> xs = gy.shape();
  for (int d = 0; d < R - 2; ++d) xs[2 + d] = in[d];
  auto gx = Tensor<T, R>::empty(xs, gy.device());
  const auto ys = detail::pooled_shape("max_pool_backward", gx, p);
  SHARD_CHECK(ys == gy.shape() && indices.shape() == ys, "max_pool_backward",
              "output gradient {} / indices {} do not match input extent {} (expected {})", gy.shape(),
              indices.shape(), in, ys);
  SHARD_CHECK(indices.device() == gy.device(), "max_pool_backward",
              "operands on different devices: output gradient on {}, indices on {}", gy.device(), indices.device());
  const auto gc = gy.contiguous();
  const auto ic = indices.contiguous();
  exec::max_pool_backward(detail::pool_geometry<R - 2>(ys[0] * ys[1], in, detail::spatial_shape<R>(ys), p),
                          as_block(gc), as_block(ic), as_block(gx), current_context(gy.device()));
  return gx;
}

}  // namespace shard
