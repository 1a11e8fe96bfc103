#pragma once
/// \file sequential.hpp
/// Composition: Sequential<T,R> (a chain of UnaryModule<T,R>, children named "0", "1", ...) and
/// ResidualBlock<T,S> (conv-norm-act-conv-norm plus a skip, with a 1x1 projection when the
/// channel count changes; tensor rank S + 2).
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/nn/activation_layers.hpp"
#include "shardtensor/nn/conv_layers.hpp"
#include "shardtensor/nn/functional/pointwise.hpp"
#include "shardtensor/nn/functional/window.hpp"
#include "shardtensor/nn/norm_layers.hpp"

namespace shard::nn {

/// Applies its modules in order (an empty Sequential is the identity). A norm (BatchNorm,
/// GroupNorm, InstanceNorm, LayerNorm) directly followed by one of the library's activation modules
/// runs as one fused op where the fusion is on (nn::fused_norm_act_on: CUDA tensors by default):
/// the same values, one tensor less kept for the backward.
template <class T, int R>
class Sequential : public UnaryModule<T, R> {
 public:
  Sequential() = default;
  /// A chain of `modules` (named "0", "1", ...).
  explicit Sequential(std::vector<std::shared_ptr<UnaryModule<T, R>>> modules) {
    for (auto& m : modules) add(std::move(m));
  }
  /// Appends `m` under the name of its position; returns it.
  template <class M>
  std::shared_ptr<M> add(std::shared_ptr<M> m) {
    return add(std::to_string(mods_.size()), std::move(m));
  }
  /// Appends `m` under `name` (parameters are then named "name.weight", ...); returns it.
  template <class M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    SHARD_CHECK(m != nullptr, "Sequential::add", "null module '{}'", name);
    mods_.push_back(m);
    return this->register_module(name, std::move(m));
  }
  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override {
    autograd::Var<T, R> h = x;
    for (std::size_t i = 0; i < mods_.size(); ++i) {
      if (i + 1 < mods_.size() && fused_norm_act_on(h.value().device()))
        if (auto* n = dynamic_cast<AffineNorm<T, R>*>(mods_[i].get()))
          if (const F::NormAct act = fusable_activation(*mods_[i + 1]); act != F::NormAct::none) {
            h = n->forward_fused(h, act, std::nullopt);
            ++i;
            continue;
          }
      h = mods_[i]->forward(h);
    }
    return h;
  }
  std::size_t size() const { return mods_.size(); }
  const std::shared_ptr<UnaryModule<T, R>>& operator[](std::size_t i) const { return mods_.at(i); }

 private:
  std::vector<std::shared_ptr<UnaryModule<T, R>>> mods_;
};

/// Hyper-parameters of a ResidualBlock.
struct ResidualBlockOptions {
  index_t kernel = 3;                    ///< odd kernel extent of both convs ('same' padding, stride 1)
  NormType norm = NormType::group;       ///< normalisation after each conv
  index_t norm_groups = 8;               ///< GroupNorm: largest divisor of the width <= this
  Activation activation = Activation::silu;
  Boundary padding_mode = Boundary::zero;  ///< padding of the convs (periodic for periodic domains)
};

/// y = act(norm2(conv2(act(norm1(conv1(x))))) + skip(x)), skip = identity, or a 1x1 channel
/// projection (Linear with bias) when in_channels != out_channels. The convs are 'same' and keep
/// the input's layout; they carry a bias only without normalisation (a bias before a norm has no
/// effect). Children: conv1, norm1, conv2, norm2[, proj].
template <class T, int S>
class ResidualBlock : public UnaryModule<T, S + 2> {
 public:
  static constexpr int R = S + 2;
  ResidualBlock(const DeviceMesh& mesh, index_t in_channels, index_t out_channels,
                const ResidualBlockOptions& opt = {}, std::uint64_t seed = 0)
      : in_(in_channels), out_(out_channels), act_(opt.activation) {
    SHARD_CHECK(opt.kernel >= 1 && opt.kernel % 2 == 1, "ResidualBlock", "kernel {} must be odd", opt.kernel);
    auto co = F::ConvOptions<S>::same(detail::filled<S>(opt.kernel), 1, opt.padding_mode);
    const bool bias = opt.norm == NormType::none;
    conv1_ = this->register_module(
        "conv1", std::make_shared<Conv<T, S>>(mesh, in_channels, out_channels, opt.kernel, co, bias, seed_for(seed, "conv1")));
    norm1_ = this->register_module("norm1", make_norm<T, R>(opt.norm, mesh, out_channels, opt.norm_groups));
    conv2_ = this->register_module(
        "conv2", std::make_shared<Conv<T, S>>(mesh, out_channels, out_channels, opt.kernel, co, bias, seed_for(seed, "conv2")));
    norm2_ = this->register_module("norm2", make_norm<T, R>(opt.norm, mesh, out_channels, opt.norm_groups));
    if (in_channels != out_channels)
      proj_ = this->register_module(
          "proj", std::make_shared<Linear<T, R>>(mesh, in_channels, out_channels, true, seed_for(seed, "proj")));
  }
  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override {
    detail::check_in_channels(x, in_, "ResidualBlock");
    // The norms take the activation (and the second one the skip add) into their own passes where
    // the fusion is on (nn::fused_norm_act_on: CUDA tensors by default).
    auto h = norm_then_activate(*norm1_, act_, conv1_->forward(x));
    h = conv2_->forward(h);
    auto s = proj_ ? proj_->forward(x) : x;
    // 'same' convs keep x's layout; realign defensively should a conv ever choose another one.
    s = F::redistribute_like(s, h.value().spec());
    return norm_add_activate(*norm2_, act_, h, s);
  }
  index_t in_channels() const { return in_; }
  index_t out_channels() const { return out_; }

 private:
  index_t in_, out_;
  Activation act_;
  std::shared_ptr<Conv<T, S>> conv1_, conv2_;
  std::shared_ptr<UnaryModule<T, R>> norm1_, norm2_;
  std::shared_ptr<Linear<T, R>> proj_;
};

}  // namespace shard::nn
