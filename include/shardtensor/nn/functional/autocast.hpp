#pragma once
/// \file autocast.hpp
/// Autocast: a scoped compute-precision policy for models held in f32 (torch.autocast's role).
///
///   {
///     shard::Autocast ac(DType::bf16);   // this thread, until the scope ends
///     auto loss = F::mse_loss(model.forward(x), y);   // model: Var<float, R> in, Var<float, R> out
///   }
///   loss.backward();                        // backward follows the recorded casts
///
/// Inside the scope, the autocast op families (conv, conv_transpose, linear, channel_linear,
/// ring / Ulysses / neighbourhood attention) given f32 operands cast them to the policy's dtype on
/// the tape, compute there with f32 accumulation (bf16 conv on AMX tiles where the CPU has them),
/// and cast the result back to f32 on the tape: gradients come back in f32 to the f32 operands and
/// parameters. Every other op (norms, softmax statistics inside attention, reductions, losses,
/// pointwise, the spectral multiply, optimisers) runs in f32 as before. f64 operands are never
/// autocast (as in PyTorch). docs/architecture.md, "Mixed precision", has the table op by op.
///
/// Two ways to use low precision, then: a model templated on bf16 / f16 (storage precision:
/// activations and communication in 2 bytes, f32 masters; the memory saving), or an f32 model
/// under Autocast (compute precision: the speed of the bf16 kernels and their numerics; the
/// activations between ops stay f32, so memory does not shrink beyond the saved bf16 operands).
#include <optional>
#include <type_traits>

#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/nn/functional/cast.hpp"

namespace shard {

namespace detail {
inline thread_local DType t_autocast = DType::f32;
}  // namespace detail

/// The calling thread's autocast compute dtype (f32: autocast off).
inline DType autocast_dtype() noexcept { return detail::t_autocast; }

/// Sets the calling thread's autocast compute dtype for the scope (restored on exit; scopes
/// nest). bf16 or f16; f32 turns autocast off inside an outer scope. Any other dtype is a
/// shard::Error.
class Autocast {
 public:
  explicit Autocast(DType compute) : prev_(detail::t_autocast) {
    SHARD_CHECK(compute == DType::bf16 || compute == DType::f16 || compute == DType::f32, "Autocast",
                "autocast computes in bf16 or f16 (f32 turns it off); {} is not a dtype it can compute in", compute);
    detail::t_autocast = compute;
  }
  ~Autocast() { detail::t_autocast = prev_; }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  DType prev_;
};

}  // namespace shard

namespace shard::nn::functional::detail {

/// Runs f(U{}) with U the policy's dtype (bf16 or f16), autocast off inside, and casts its Var
/// result back to f32 on the tape. A family front calls it first thing, for f32 operands only:
///   if constexpr (std::is_same_v<T, float>)
///     if (shard::autocast_dtype() != DType::f32)
///       return detail::autocast_run([&](auto u) { using U = decltype(u); return op(cast<U>(x), ...); });
template <class Fn>
auto autocast_run(Fn&& f) {
  const DType dt = shard::autocast_dtype();
  const shard::Autocast off(DType::f32);
  if (dt == DType::bf16) return cast<float>(f(shard::bf16{}));
  return cast<float>(f(shard::f16{}));
}

/// An optional operand cast to U on the tape.
template <class U, class T, int R>
std::optional<Var<U, R>> cast_optional(const std::optional<Var<T, R>>& b) {
  if (!b) return std::nullopt;
  return cast<U>(*b);
}

}  // namespace shard::nn::functional::detail
