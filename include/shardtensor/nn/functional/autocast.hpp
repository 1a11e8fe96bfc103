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

template <class A> inline constexpr bool is_f32_var_v = false;
template <int R> inline constexpr bool is_f32_var_v<Var<float, R>> = true;
template <int R> inline constexpr bool is_f32_var_v<std::optional<Var<float, R>>> = true;

/// An operand of an autocast op cast to U on the tape: a Var<float> or an optional one is cast,
/// anything else (options, plans) passes through as it is.
template <class U, class A>
const A& autocast_operand(const A& a) {
  return a;
}
template <class U, int R>
Var<U, R> autocast_operand(const Var<float, R>& a) {
  return cast<U>(a);
}
template <class U, int R>
std::optional<Var<U, R>> autocast_operand(const std::optional<Var<float, R>>& a) {
  if (!a) return std::nullopt;
  return cast<U>(*a);
}

/// The one point where shard::Autocast applies. Every autocast family front (conv,
/// conv_transpose, linear, channel_linear, ring / Ulysses / neighbourhood attention) starts with
///   if (auto y = detail::autocast([](const auto&... a) { return op(a...); }, x, w, b, opt)) return *y;
/// With f32 operands inside an Autocast scope, this reads the policy's dtype (bf16 or f16), casts
/// every Var operand to it on the tape, runs op there with autocast off, and returns its result cast
/// back to f32 on the tape (gradients come back in f32). Otherwise (f64 / bf16 / f16 operands, or
/// no scope) it returns nullopt and the front runs as it is. Only here is the policy read.
template <class Op, class... Args>
auto autocast(Op&& op, const Args&... args) {
  using Y = decltype(op(args...));
  std::optional<Y> r;
  if constexpr ((is_f32_var_v<Args> || ...)) {
    const DType dt = shard::autocast_dtype();
    if (dt != DType::f32) {
      const shard::Autocast off(DType::f32);
      if (dt == DType::bf16) r.emplace(cast<float>(op(autocast_operand<shard::bf16>(args)...)));
      else r.emplace(cast<float>(op(autocast_operand<shard::f16>(args)...)));
    }
  }
  return r;
}

}  // namespace shard::nn::functional::detail
