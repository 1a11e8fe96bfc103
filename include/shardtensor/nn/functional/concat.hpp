#pragma once
/// \file concat.hpp
/// Differentiable concatenation along an unsharded dim (default 1: channels, as in U-Net skip
/// connections). Every input must have the same mesh, placements and global extents and layouts
/// on all other dims (so each rank's blocks line up); no communication. Backward splits the
/// gradient into per-input slices. Partial(sum) inputs are allowed when all inputs share them.
/// Runs on any device (strided Tensor copies; no loops here); all inputs on one device.
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "shardtensor/nn/functional/common.hpp"

namespace shard::nn::functional {

/// Concatenates `xs` along `dim` (default 1, the channels). See the file comment for the rules.
template <class T, int R>
Var<T, R> concat(const std::vector<Var<T, R>>& xs, int dim = 1) {
  const char* op = "concat";
  SHARD_CHECK(!xs.empty(), op, "no inputs");
  SHARD_CHECK(dim >= -R && dim < R, op, "dim {} out of range for rank-{} inputs", dim, R);
  if (dim < 0) dim += R;
  const DistSpec& s0 = xs[0].value().spec();
  index_t total = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const DistSpec& si = xs[i].value().spec();
    SHARD_CHECK(xs[i].value().device() == xs[0].value().device(), op,
                "operands on different devices: input {} is on {}, input 0 on {}", i, xs[i].value().device(),
                xs[0].value().device());
    detail::check_unsharded(si, dim, op, "input");
    SHARD_CHECK(si.mesh() == s0.mesh(), op, "input {} lives on a different mesh than input 0", i);
    SHARD_CHECK(si.placements() == s0.placements(), op, "input {} has placements {} but input 0 has {}", i, si, s0);
    for (int d = 0; d < R; ++d) {
      if (d == dim) continue;
      SHARD_CHECK(si.global_shape()[static_cast<std::size_t>(d)] == s0.global_shape()[static_cast<std::size_t>(d)] &&
                      si.layout(d) == s0.layout(d),
                  op, "input {} ({}, sizes {}) and input 0 ({}, sizes {}) differ along dim {} (only dim {} may differ)",
                  i, si, si.sizes(), s0, s0.sizes(), d, dim);
    }
    total += si.global_shape()[static_cast<std::size_t>(dim)];
  }
  auto og = s0.global_shape();
  og[static_cast<std::size_t>(dim)] = total;
  const DistSpec out_spec = detail::derived_spec(s0, s0.placements(), og);
  auto out = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(out_spec.local_box().len), xs[0].value().device());
  std::vector<index_t> offsets;
  std::vector<autograd::VarRef> refs;
  index_t off = 0;
  for (const auto& x : xs) {
    const index_t n = x.local().size(dim);
    out.narrow(dim, off, n).copy_from(x.local());
    offsets.push_back(off);
    refs.push_back(x.ref());
    off += n;
  }
  return detail::make_var_n<T, R>(DistTensor<T, R>(out_spec, out), op, refs,
                                  [xs, offsets, out_spec, dim](const DistTensor<T, R>& gin) {
                                    const auto g = autograd::gradient_as(out_spec, gin, autograd::PartialGrad::resolve).local();
                                    for (std::size_t i = 0; i < xs.size(); ++i) {
                                      if (!xs[i].requires_grad()) continue;
                                      const auto& v = xs[i].value();
                                      auto gi = g.narrow(dim, offsets[i], v.local().size(dim)).clone();
                                      xs[i].accumulate_grad(DistTensor<T, R>(detail::grad_spec(v.spec()), gi));
                                    }
                                  });
}

/// Concatenates a braced list of tensors along `dim` (default 1): F::concat({a, b, c}).
template <class T, int R>
Var<T, R> concat(std::initializer_list<Var<T, R>> xs, int dim = 1) {
  return concat(std::vector<Var<T, R>>(xs), dim);
}

/// Concatenates two tensors along `dim` (default 1).
template <class T, int R>
Var<T, R> concat(const Var<T, R>& a, const Var<T, R>& b, int dim = 1) {
  return concat(std::vector<Var<T, R>>{a, b}, dim);
}

}  // namespace shard::nn::functional
