#pragma once
/// \file cast.hpp
/// Dtype casts of DistTensors and, on the tape, of Vars: the storage-precision boundary of mixed
/// precision (docs/architecture.md, "Mixed precision"). A cast keeps the spec (mesh, placements,
/// global shape, layout) and converts the local block elementwise (exec::convert: round to nearest
/// even, overflow to inf, NaN stays NaN; f64 -> bf16/f16 through f32). On the tape its gradient is
/// the incoming gradient cast back to the input's dtype, so a parameter held in f32 and cast to
/// bf16 for compute receives an f32 gradient. No communication.
#include <type_traits>

#include "shardtensor/exec/pointwise.hpp"
#include "shardtensor/nn/functional/common.hpp"

namespace shard {

/// x converted to U (a new local block; the same spec). U == T: a contiguous copy.
template <class U, class T, int R>
DistTensor<U, R> cast(const DistTensor<T, R>& x) {
  static_assert(exec::is_float_dtype(dtype_of<T>) && exec::is_float_dtype(dtype_of<U>),
                "cast: between float, double, bf16 and f16");
  const auto xl = x.local().contiguous();
  auto y = Tensor<U, R>::empty(xl.shape(), xl.device());
  exec::convert(as_block(xl), as_block(y), current_context(xl.device()));
  return DistTensor<U, R>(x.spec(), y);
}

}  // namespace shard

namespace shard::nn::functional {

/// x cast to U on the tape (U == T returns x itself). Backward: the gradient cast back to T.
template <class U, class T, int R>
Var<U, R> cast(const Var<T, R>& x) {
  if constexpr (std::is_same_v<U, T>) {
    return x;
  } else {
    auto y = shard::cast<U>(x.value());
    return Var<U, R>::make(std::move(y), "cast", {x.ref()}, [x](const DistTensor<U, R>& gin) {
      x.accumulate_grad(shard::cast<T>(gin));
    });
  }
}

}  // namespace shard::nn::functional
