#pragma once
/// \file layout.hpp
/// Differentiable layout changes of sharded tensors that need no communication:
///  - permute(x, perm): y's dim i is x's dim perm[i] (torch.permute). Placements follow their dims
///    (Shard(perm[i]) becomes Shard(i)), shard sizes too; Replicate and Partial are kept. Each rank
///    permutes its own block (a strided copy on the block's device, Tensor::copy_from); gradient:
///    the inverse permutation. channels_last / channels_first move the channel dim of
///    [N, C, S...] activations to the end and back (conv layout <-> token-major [N, S..., C]).
///  - unflatten(x, d, a, b): splits dim d of extent a*b into (a, b) (torch.unflatten), e.g. the
///    channels C of tokens into heads [H, Dh]; flatten(x, d): merges dims d and d+1 back. The dims
///    involved must not be sharded; the local block is reshaped (a view when contiguous).
/// Nothing here moves data between ranks, so the results keep the inputs' layouts exactly.
#include <array>
#include <type_traits>

#include "shardtensor/nn/functional/common.hpp"

namespace shard::nn::functional {

namespace detail {

/// The spec of permute(x, perm) for x with spec `xs` (placements and sizes follow their dims).
template <int R>
DistSpec permuted_spec(const DistSpec& xs, const std::array<int, R>& perm) {
  std::array<int, R> inv{};
  for (int i = 0; i < R; ++i) inv[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] = i;
  auto p = xs.placements();
  for (auto& pl : p)
    if (pl.is_shard()) pl = Shard(inv[static_cast<std::size_t>(pl.dim)]);
  std::vector<index_t> g(R);
  ShardSizes sizes(R);
  const bool has_sizes = !xs.sizes().empty();
  for (int i = 0; i < R; ++i) {
    const auto u = static_cast<std::size_t>(i), src = static_cast<std::size_t>(perm[u]);
    g[u] = xs.global_shape()[src];
    if (has_sizes && src < xs.sizes().size()) sizes[u] = xs.sizes()[src];
  }
  return DistSpec(xs.mesh(), std::move(p), std::move(g), sizes);
}

/// Local block of x permuted into a new contiguous tensor on the block's device.
template <class T, int R>
Tensor<T, R> permute_local(const Tensor<T, R>& xl, const std::type_identity_t<std::array<int, R>>& perm) {
  Shape<R> shape{}, strides{};
  for (int i = 0; i < R; ++i) {
    shape[i] = xl.size(perm[static_cast<std::size_t>(i)]);
    strides[i] = xl.stride(perm[static_cast<std::size_t>(i)]);
  }
  auto view = Tensor<T, R>::adopt(xl.storage(), xl.data(), shape, strides, xl.device());
  return view.contiguous();
}

/// Inserts the rank-R spec `xs` with dim d split into (a, b) (rank R + 1), or with dims d, d+1
/// merged (rank R - 1, a and b unused).
inline DistSpec reshaped_spec(const DistSpec& xs, int d, bool split, index_t a, index_t b) {
  const int R = xs.ndim();
  auto p = xs.placements();
  for (auto& pl : p)
    if (pl.is_shard() && pl.dim > d) pl = Shard(pl.dim + (split ? 1 : -1));
  std::vector<index_t> g;
  ShardSizes sizes;
  const auto& xz = xs.sizes();
  auto sz = [&](int e) { return xz.empty() || e >= static_cast<int>(xz.size()) ? std::vector<index_t>{} : xz[static_cast<std::size_t>(e)]; };
  for (int e = 0; e < R; ++e) {
    const auto u = static_cast<std::size_t>(e);
    if (e == d && split) {
      g.push_back(a);
      g.push_back(b);
      sizes.emplace_back();
      sizes.emplace_back();
    } else if (e == d) {
      g.push_back(xs.global_shape()[u] * xs.global_shape()[u + 1]);
      sizes.emplace_back();
      ++e;
    } else {
      g.push_back(xs.global_shape()[u]);
      sizes.push_back(sz(e));
    }
  }
  return DistSpec(xs.mesh(), std::move(p), std::move(g), sizes);
}

}  // namespace detail

/// y = x with its dims reordered: y's dim i is x's dim perm[i] (a permutation of 0..R-1).
/// Communication-free; the gradient is permuted back.
template <class T, int R>
Var<T, R> permute(const Var<T, R>& x, const std::type_identity_t<std::array<int, R>>& perm) {
  const char* op = "permute";
  std::array<bool, R> seen{};
  for (int i = 0; i < R; ++i) {
    const int p = perm[static_cast<std::size_t>(i)];
    SHARD_CHECK(p >= 0 && p < R && !seen[static_cast<std::size_t>(p)], op, "{} is not a permutation of 0..{}", perm,
                R - 1);
    seen[static_cast<std::size_t>(p)] = true;
  }
  std::array<int, R> inv{};
  for (int i = 0; i < R; ++i) inv[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] = i;
  const DistSpec xs = x.value().spec();
  const DistSpec ys = detail::permuted_spec<R>(xs, perm);
  auto y = detail::permute_local(x.local(), perm);
  return Var<T, R>::make(DistTensor<T, R>(ys, std::move(y)), op, {x.ref()}, [x, xs, ys, inv](const DistTensor<T, R>& g) {
    const auto ga = autograd::gradient_as(ys, g, autograd::PartialGrad::resolve);
    x.accumulate_grad(DistTensor<T, R>(detail::grad_spec(xs), detail::permute_local(ga.local(), inv)));
  });
}

/// [N, C, S_1..S_k] -> [N, S_1..S_k, C] (conv layout to token-major).
template <class T, int R>
Var<T, R> channels_last(const Var<T, R>& x) {
  static_assert(R >= 3, "channels_last needs N, C, spatial... inputs");
  std::array<int, R> perm{};
  perm[0] = 0;
  for (int i = 1; i < R - 1; ++i) perm[static_cast<std::size_t>(i)] = i + 1;
  perm[R - 1] = 1;
  return permute(x, perm);
}

/// [N, S_1..S_k, C] -> [N, C, S_1..S_k] (token-major to conv layout).
template <class T, int R>
Var<T, R> channels_first(const Var<T, R>& x) {
  static_assert(R >= 3, "channels_first needs N, spatial..., C inputs");
  std::array<int, R> perm{};
  perm[0] = 0;
  perm[1] = R - 1;
  for (int i = 2; i < R; ++i) perm[static_cast<std::size_t>(i)] = i - 1;
  return permute(x, perm);
}

/// Splits the unsharded dim d (extent a * b) into dims (a, b): [.., a*b, ..] -> [.., a, b, ..].
template <class T, int R>
Var<T, R + 1> unflatten(const Var<T, R>& x, int d, index_t a, index_t b) {
  const char* op = "unflatten";
  const DistSpec xs = x.value().spec();
  SHARD_CHECK(d >= 0 && d < R, op, "dim {} out of range for rank {}", d, R);
  detail::check_unsharded(xs, d, op, "input");
  SHARD_CHECK(a >= 1 && b >= 1 && a * b == xs.global_shape()[static_cast<std::size_t>(d)], op,
              "cannot split dim {} of {} (extent {}) into {} x {}", d, xs.global_shape(),
              xs.global_shape()[static_cast<std::size_t>(d)], a, b);
  const DistSpec ys = detail::reshaped_spec(xs, d, true, a, b);
  const auto xl = x.local().contiguous();
  auto y = xl.template reshape<R + 1>(DistTensor<T, R + 1>::from_vec(ys.local_box().len));
  return Var<T, R + 1>::make(DistTensor<T, R + 1>(ys, std::move(y)), op, {x.ref()},
                             [x, xs, ys](const DistTensor<T, R + 1>& g) {
                               const auto gl = autograd::gradient_as(ys, g, autograd::PartialGrad::resolve).local().contiguous();
                               const DistSpec gs = detail::grad_spec(xs);
                               x.accumulate_grad(DistTensor<T, R>(
                                   gs, gl.template reshape<R>(DistTensor<T, R>::from_vec(gs.local_box().len))));
                             });
}

/// Merges the unsharded dims d and d + 1: [.., a, b, ..] -> [.., a*b, ..] (inverse of unflatten).
template <class T, int R>
Var<T, R - 1> flatten(const Var<T, R>& x, int d) {
  static_assert(R >= 2, "flatten needs two dims to merge");
  const char* op = "flatten";
  const DistSpec xs = x.value().spec();
  SHARD_CHECK(d >= 0 && d + 1 < R, op, "cannot merge dims {} and {} of a rank-{} tensor", d, d + 1, R);
  detail::check_unsharded(xs, d, op, "input");
  detail::check_unsharded(xs, d + 1, op, "input");
  const DistSpec ys = detail::reshaped_spec(xs, d, false, 0, 0);
  const auto xl = x.local().contiguous();
  auto y = xl.template reshape<R - 1>(DistTensor<T, R - 1>::from_vec(ys.local_box().len));
  return Var<T, R - 1>::make(DistTensor<T, R - 1>(ys, std::move(y)), op, {x.ref()},
                             [x, xs, ys](const DistTensor<T, R - 1>& g) {
                               const auto gl = autograd::gradient_as(ys, g, autograd::PartialGrad::resolve).local().contiguous();
                               const DistSpec gs = detail::grad_spec(xs);
                               x.accumulate_grad(DistTensor<T, R>(
                                   gs, gl.template reshape<R>(DistTensor<T, R>::from_vec(gs.local_box().len))));
                             });
}

}  // namespace shard::nn::functional
