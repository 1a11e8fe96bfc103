#pragma once
/// \file vit.hpp
/// ViT<T, S>: a domain-parallel vision transformer mapping a 2-D (S = 2, [N, C, H, W]) or 3-D
/// (S = 3, [N, C, D, H, W]) field to a field of the same extents. Spatial dims may be sharded over
/// any mesh dims (uneven shards included), N over a data-parallel mesh dim. Tokens stay sharded by
/// spatial domain from input to output: no rank ever holds the whole field or the whole sequence.
///
/// Architecture (P = patch, D = dim, s_d = field_d / P tokens per spatial dim):
///   embed  Conv kernel P, stride P: [N, C_in, S...] -> [N, D, s...]; then channels_last ->
///          token-major [N, s..., D] (a local permute, F::channels_last)
///   pos    + a learned positional embedding [1, s..., D] that is a SHARDED parameter: Shard on
///          the mesh dims that shard the field's spatial dims (balanced blocks of the token grid),
///          Replicate elsewhere; when the tokens' layout differs from those balanced blocks
///          (uneven field shards, patches straddling shard boundaries) it is moved onto the
///          tokens' layout by F::redistribute_like (an all-to-all of embedding blocks; its
///          gradient goes back the same way and stays sharded)
///   blocks `layers` pre-LN transformer blocks: t += MHA(LN(t)); t += fc2(GELU(fc1(LN(t))))
///          (LayerNorm over the channel dim, MLP hidden width mlp_ratio * D)
///   norm   a final LayerNorm
///   head   channels_first -> ConvTranspose kernel P, stride P: [N, D, s...] -> [N, C_out, S...];
///          its output is put back on the input's layout (F::redistribute_like; a no-op when every
///          shard boundary of the input is a multiple of P)
///
/// Patches and shards. Every field extent must be a multiple of P (shard::Error otherwise). Shard
/// boundaries need not be: the patch conv follows the anchor rule (nn/functional/window.hpp), so a
/// patch straddling a boundary belongs to the rank that owns its first cell, which reads the rest
/// through the conv's halo (boundary g maps to token boundary ceil(g / P)); a rank may then own no
/// token. Every rank checks the same specs, so a bad input throws shard::Error on every rank.
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/nn/activation_layers.hpp"
#include "shardtensor/nn/attention_layers.hpp"
#include "shardtensor/nn/norm_layers.hpp"

namespace shard::nn {

/// Hyper-parameters of ViT (designated initialisers: `ViTOptions{.field = {64, 64}, .patch = 4}`).
struct ViTOptions {
  index_t in_channels = 1;          ///< channels of the input field
  index_t out_channels = 1;         ///< channels of the output field
  std::vector<index_t> field;       ///< global spatial extents of the field (S values)
  index_t patch = 4;                ///< patch extent in every spatial dim (divides every field extent)
  index_t dim = 32;                 ///< token embedding width D
  index_t heads = 4;                ///< attention heads (divides D)
  int layers = 2;                   ///< transformer blocks (>= 1)
  index_t mlp_ratio = 4;            ///< MLP hidden width = mlp_ratio * D
  AttentionOptions attention;       ///< attention form and its options
  double ln_eps = 1e-5;             ///< LayerNorm epsilon
};

/// One pre-LN transformer block on token-major [B, S..., D]: t + MHA(LN(t)), then
/// t + fc2(GELU(fc1(LN(t)))). Children: "ln1", "attn", "ln2", "fc1", "fc2".
template <class T, int S>
class TransformerBlock : public UnaryModule<T, S + 2> {
 public:
  static constexpr int R = S + 2;
  TransformerBlock(const DeviceMesh& mesh, index_t dim, index_t heads, index_t hidden, const AttentionOptions& att,
                   double eps, std::uint64_t seed) {
    auto s = [seed](const char* n) { return seed_for(seed, n); };
    ln1_ = this->register_module("ln1", std::make_shared<LayerNorm<T, R>>(mesh, dim, eps, true, -1));
    attn_ = this->register_module("attn", std::make_shared<MultiheadAttention<T, S>>(mesh, dim, heads, att, true, s("attn")));
    ln2_ = this->register_module("ln2", std::make_shared<LayerNorm<T, R>>(mesh, dim, eps, true, -1));
    fc1_ = this->register_module("fc1", std::make_shared<Linear<T, R>>(mesh, dim, hidden, true, s("fc1"), LinearDim::last));
    fc2_ = this->register_module("fc2", std::make_shared<Linear<T, R>>(mesh, hidden, dim, true, s("fc2"), LinearDim::last));
  }
  autograd::Var<T, R> forward(const autograd::Var<T, R>& t) override {
    auto h = F::add(t, attn_->forward(ln1_->forward(t)));
    return F::add(h, fc2_->forward(F::gelu(fc1_->forward(ln2_->forward(h)))));
  }

 private:
  std::shared_ptr<LayerNorm<T, R>> ln1_, ln2_;
  std::shared_ptr<MultiheadAttention<T, S>> attn_;
  std::shared_ptr<Linear<T, R>> fc1_, fc2_;
};

/// Domain-parallel ViT (see the file comment). `field_placements` are the placements (one per
/// mesh dim) of the input fields it will see: Shard(0) (data parallel), Shard(2 + d) (spatial) or
/// Replicate; they fix the positional embedding's placements. forward: [N, in_channels, field...]
/// -> [N, out_channels, field...] with the input's layout.
template <class T, int S>
class ViT : public UnaryModule<T, S + 2> {
  static_assert(S == 2 || S == 3, "ViT: 2-D or 3-D fields");

 public:
  static constexpr int R = S + 2;

  ViT(const DeviceMesh& mesh, const ViTOptions& opt, std::vector<Placement> field_placements, std::uint64_t seed = 0)
      : opt_(opt), field_placements_(std::move(field_placements)) {
    const char* op = "ViT";
    SHARD_CHECK(static_cast<int>(opt.field.size()) == S, op, "field has {} extents for a {}-D ViT", opt.field.size(), S);
    SHARD_CHECK(opt.in_channels >= 1 && opt.out_channels >= 1, op, "channel counts must be >= 1 (in {}, out {})",
                opt.in_channels, opt.out_channels);
    SHARD_CHECK(opt.patch >= 1, op, "patch {} must be >= 1", opt.patch);
    for (int d = 0; d < S; ++d)
      SHARD_CHECK(opt.field[static_cast<std::size_t>(d)] >= opt.patch && opt.field[static_cast<std::size_t>(d)] % opt.patch == 0,
                  op, "field extents {} must be positive multiples of the patch {}", opt.field, opt.patch);
    SHARD_CHECK(opt.dim >= 1 && opt.heads >= 1 && opt.dim % opt.heads == 0, op,
                "dim {} must be a positive multiple of heads {}", opt.dim, opt.heads);
    SHARD_CHECK(opt.layers >= 1 && opt.mlp_ratio >= 1, op, "need layers >= 1 (got {}) and mlp_ratio >= 1 (got {})",
                opt.layers, opt.mlp_ratio);
    SHARD_CHECK(static_cast<int>(field_placements_.size()) == mesh.ndim(), op,
                "{} field placements for a {}-D mesh", field_placements_.size(), mesh.ndim());
    std::vector<Placement> pos_pl;
    for (const auto& p : field_placements_) {
      SHARD_CHECK(!p.is_partial() && !(p.is_shard() && (p.dim == 1 || p.dim < 0 || p.dim >= R)), op,
                  "field placement {} is not Shard(0), Shard(2..{}) or Replicate", p, R - 1);
      pos_pl.push_back(p.is_shard() && p.dim >= 2 ? Placement(Shard(p.dim - 1)) : Placement(Replicate()));
    }
    auto s = [seed](const std::string& n) { return seed_for(seed, n); };
    embed_ = this->register_module(
        "embed", std::make_shared<Conv<T, S>>(mesh, opt.in_channels, opt.dim, opt.patch,
                                              F::ConvOptions<S>::symmetric(0, opt.patch), true, s("embed")));
    Shape<R> ps{};
    ps[0] = 1;
    for (int d = 0; d < S; ++d) ps[1 + d] = opt.field[static_cast<std::size_t>(d)] / opt.patch;
    ps[R - 1] = opt.dim;
    pos_ = this->template make_sharded_parameter<R>("pos", mesh, ps, pos_pl, seed, 0.02);
    for (int l = 0; l < opt.layers; ++l) {
      const std::string n = "block" + std::to_string(l);
      blocks_.push_back(this->register_module(
          n, std::make_shared<TransformerBlock<T, S>>(mesh, opt.dim, opt.heads, opt.mlp_ratio * opt.dim, opt.attention,
                                                      opt.ln_eps, s(n))));
    }
    norm_ = this->register_module("norm", std::make_shared<LayerNorm<T, R>>(mesh, opt.dim, opt.ln_eps, true, -1));
    head_ = this->register_module(
        "head", std::make_shared<ConvTranspose<T, S>>(mesh, opt.dim, opt.out_channels, opt.patch,
                                                      F::ConvTransposeOptions<S>::symmetric(0, opt.patch), true,
                                                      s("head")));
  }

  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override {
    check_input(x.value().spec());
    auto t = F::channels_last(embed_->forward(x));  // [N, s..., D], sharded like the field
    t = F::add(t, pos_on(t.value().spec()));
    for (auto& b : blocks_) t = b->forward(t);
    auto y = head_->forward(F::channels_first(norm_->forward(t)));
    return F::redistribute_like(y, x.value().spec());
  }

  const ViTOptions& options() const { return opt_; }
  /// The positional embedding parameter [1, s..., D] (sharded).
  const autograd::Var<master_t<T>, R>& pos_embedding() const { return pos_; }

 private:
  /// Spec-only checks of an input (every rank throws alike).
  void check_input(const DistSpec& xs) const {
    const char* op = "ViT";
    const auto& g = xs.global_shape();
    bool ok = g[1] == opt_.in_channels;
    for (int d = 0; d < S; ++d) ok = ok && g[static_cast<std::size_t>(2 + d)] == opt_.field[static_cast<std::size_t>(d)];
    SHARD_CHECK(ok, op, "input of global shape {} does not match [N, {}, {}]", g, opt_.in_channels, opt_.field);
    SHARD_CHECK(xs.placements() == field_placements_, op,
                "input placements {} differ from the placements {} the ViT was built for", xs.placements(),
                field_placements_);
  }
  /// The positional embedding laid out like the tokens with spec `ts` (its spatial blocks).
  autograd::Var<T, R> pos_on(const DistSpec& ts) const {
    const DistSpec& ps = pos_.value().spec();
    ShardSizes sizes(static_cast<std::size_t>(R));
    for (int d = 1; d < R - 1; ++d)
      if (ts.layout(d).parts() > 1) sizes[static_cast<std::size_t>(d)] = ts.layout(d).sizes();
    DistSpec want(ps.mesh(), ps.placements(), ps.global_shape(), sizes);
    return F::redistribute_like(this->compute_copy(pos_), want);
  }

  ViTOptions opt_;
  std::vector<Placement> field_placements_;
  std::shared_ptr<Conv<T, S>> embed_;
  autograd::Var<master_t<T>, R> pos_;
  std::vector<std::shared_ptr<TransformerBlock<T, S>>> blocks_;
  std::shared_ptr<LayerNorm<T, R>> norm_;
  std::shared_ptr<ConvTranspose<T, S>> head_;
};

/// 2-D and 3-D ViTs.
template <class T> using ViT2d = ViT<T, 2>;
template <class T> using ViT3d = ViT<T, 3>;

}  // namespace shard::nn
