#pragma once
/// \file attention_layers.hpp
/// MultiheadAttention<T, S>: domain-parallel multi-head self-attention on token-major activations
/// x [B, S_1..S_S, C] (S = 1, 2 or 3 token/spatial dims; tokens ordered row-major over them). The
/// spatial dims may be sharded over any mesh dims (uneven shards included), B over a
/// data-parallel mesh dim; C must not be sharded.
///
///   q, k, v = x Wq^T + bq, x Wk^T, x Wv^T + bv           (F::linear, replicated [C, C] weights;
///                                                         no key bias: it would add q.b_k to every
///                                                         score of a query, which softmax cancels,
///                                                         so its gradient is identically zero)
///   each split into heads [B, S..., H, Dh]                (F::unflatten, Dh = C / H)
///   o = attention(q, k, v)                                (the chosen AttentionForm)
///   y = merge_heads(o) Wo^T + bo                          (F::flatten, F::linear)
///
/// AttentionForm picks the domain-parallel attention op (nn/functional/attention.hpp,
/// neighborhood_attention.hpp): `ring` (K/V blocks travel around the ring over the product of the
/// mesh dims that shard the tokens; global attention, optionally causal), `ulysses` (all-to-all
/// from token-sharded to head-sharded, local attention, and back; optionally causal) and
/// `neighborhood` (each query attends to a window around its position; halo exchange of K/V).
/// Every form gives the unsharded result, forward and gradients; weights are replicated and their
/// gradients are reduced like those of every other replicated parameter.
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/nn/conv_layers.hpp"
#include "shardtensor/nn/functional/layout.hpp"
#include "shardtensor/nn/functional/neighborhood_attention.hpp"
#include "shardtensor/nn/functional/attention.hpp"

namespace shard::nn {

/// Which domain-parallel attention a MultiheadAttention uses.
enum class AttentionForm { ring, ulysses, neighborhood };

/// "ring", "ulysses" or "neighborhood".
inline const char* attention_form_name(AttentionForm f) {
  switch (f) {
    case AttentionForm::ring: return "ring";
    case AttentionForm::ulysses: return "ulysses";
    case AttentionForm::neighborhood: return "neighborhood";
  }
  return "?";
}

/// The attention form and its options (designated initialisers:
/// `AttentionOptions{.form = AttentionForm::neighborhood, .window = {7}}`).
struct AttentionOptions {
  AttentionForm form = AttentionForm::ring;
  bool causal = false;             ///< ring / ulysses: query i attends to keys j <= i (global token order)
  std::vector<index_t> window;     ///< neighborhood: per spatial dim, or one value for every dim (>= 1)
  std::vector<index_t> dilation;   ///< neighborhood: per spatial dim or one value (default 1)
  std::vector<bool> periodic;      ///< neighborhood: per spatial dim or one value (default false: zero boundary)
  double scale = 0;                ///< softmax scale; 0 -> 1 / sqrt(Dh)
};

namespace detail {
/// `v` (empty, one value, or S values) expanded to S values (`fill` when empty).
template <class V>
std::vector<V> per_dim(const std::vector<V>& v, int S, V fill, const char* op, const char* what) {
  if (v.empty()) return std::vector<V>(static_cast<std::size_t>(S), fill);
  if (v.size() == 1) return std::vector<V>(static_cast<std::size_t>(S), v[0]);
  SHARD_CHECK(static_cast<int>(v.size()) == S, op, "{} has {} entries for {} spatial dims (give 1 or {})", what,
              v.size(), S, S);
  return v;
}
}  // namespace detail

/// Multi-head self-attention on token-major x [B, S..., C] (see the file comment). Children:
/// "q", "k", "v", "out" (Linear over the last dim, [C, C] weights; biases on q, v, out if `bias`).
template <class T, int S>
class MultiheadAttention : public UnaryModule<T, S + 2> {
  static_assert(S >= 1 && S <= 3, "MultiheadAttention: 1, 2 or 3 token dims");

 public:
  static constexpr int R = S + 2;  ///< rank of the activations [B, S..., C]

  MultiheadAttention(const DeviceMesh& mesh, index_t dim, index_t heads, const AttentionOptions& opt = {},
                     bool bias = true, std::uint64_t seed = 0)
      : dim_(dim), heads_(heads), opt_(opt) {
    const char* op = "MultiheadAttention";
    SHARD_CHECK(dim >= 1 && heads >= 1 && dim % heads == 0, op,
                "the embedding dim {} must be a positive multiple of the head count {}", dim, heads);
    SHARD_CHECK(opt.scale >= 0, op, "scale {} must be >= 0 (0: 1/sqrt(head dim))", opt.scale);
    if (opt.form == AttentionForm::neighborhood) {
      SHARD_CHECK(!opt.causal, op, "causal masking applies to ring and ulysses attention, not neighborhood");
      nb_.window = detail::per_dim<index_t>(opt.window, S, 0, op, "window");
      SHARD_CHECK(!opt.window.empty(), op, "neighborhood attention needs a window");
      for (auto w : nb_.window) SHARD_CHECK(w >= 1, op, "window {} must be >= 1 in every dim", nb_.window);
      nb_.dilation = detail::per_dim<index_t>(opt.dilation, S, 1, op, "dilation");
      for (auto d : nb_.dilation) SHARD_CHECK(d >= 1, op, "dilation {} must be >= 1 in every dim", nb_.dilation);
      nb_.periodic = detail::per_dim<bool>(opt.periodic, S, false, op, "periodic");
      nb_.scale = opt.scale;
    } else {
      SHARD_CHECK(opt.window.empty() && opt.dilation.empty() && opt.periodic.empty(), op,
                  "window / dilation / periodic apply to neighborhood attention, not {}", attention_form_name(opt.form));
    }
    auto lin = [&](const char* n, bool b) {
      return this->register_module(
          n, std::make_shared<Linear<T, R>>(mesh, dim, dim, b, seed_for(seed, n), LinearDim::last));
    };
    q_ = lin("q", bias);
    k_ = lin("k", false);  // a key bias adds q.b_k to every score of a query: softmax cancels it
    v_ = lin("v", bias);
    out_ = lin("out", bias);
  }

  /// y [B, S..., C] = attention of x [B, S..., C] with itself; y has x's layout.
  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override {
    const auto g = x.value().global_shape();
    SHARD_CHECK(g[R - 1] == dim_, "MultiheadAttention", "input of global shape {} has {} channels (last dim), the module expects {}",
                g, g[R - 1], dim_);
    const index_t dh = dim_ / heads_;
    auto split = [&](const autograd::Var<T, R>& t) { return F::unflatten(t, R - 1, heads_, dh); };
    auto q = split(q_->forward(x));
    auto k = split(k_->forward(x));
    auto v = split(v_->forward(x));
    autograd::Var<T, R + 1> o;
    switch (opt_.form) {
      case AttentionForm::ring: {
        F::RingAttentionOptions ro;
        ro.scale = opt_.scale;
        ro.causal = opt_.causal;
        o = F::ring_attention(q, k, v, ro);
        break;
      }
      case AttentionForm::ulysses: {
        F::UlyssesOptions uo;
        uo.scale = opt_.scale;
        uo.causal = opt_.causal;
        o = F::ulysses_attention(q, k, v, uo);
        break;
      }
      case AttentionForm::neighborhood: o = F::neighborhood_attention(q, k, v, nb_); break;
    }
    return out_->forward(F::flatten(o, R - 1));
  }

  index_t dim() const { return dim_; }
  index_t heads() const { return heads_; }
  const AttentionOptions& options() const { return opt_; }

 private:
  index_t dim_, heads_;
  AttentionOptions opt_;
  F::NeighborhoodOptions nb_;
  std::shared_ptr<Linear<T, R>> q_, k_, v_, out_;
};

}  // namespace shard::nn
