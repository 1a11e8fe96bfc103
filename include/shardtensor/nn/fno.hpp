#pragma once
/// \file fno.hpp
/// Fourier Neural Operators, domain-parallel: SpectralConv{1,2,3}d and FNO<T,S> for 1-D, 2-D and
/// 3-D fields [N, C, spatial...] whose spatial dims may be sharded over any mesh dims (slab or
/// pencil, uneven shards), N over a data-parallel mesh dim. Parameters are Replicate and
/// initialised deterministically from the seed (identical at every rank count).
///
/// SpectralConv(in, out, modes): F::spectral_conv (nn/functional/fft.hpp): rfftn over the
/// spatial dims with the spectrum cut to the kept modes as each dim is transformed (so the
/// all-to-all transposes move kept modes only), the per-mode complex channel mix by the weight
/// [in, out, 2 m_0, ..., 2 m_{S-2}, m_{S-1}, 2] ((re, im) pairs; PyTorch's view_as_real), zero
/// padding and the inverse transform back into the input's layout.
///
/// FNO (Li et al. 2021):
///   lift    1x1 channel Linear in_channels -> width
///   block_l (l < layers) y = act(SpectralConv(x) + Linear_1x1(x)); no activation after the last
///   proj    1x1 Linear width -> proj_width, act, 1x1 Linear proj_width -> out_channels
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "shardtensor/nn/activation_layers.hpp"
#include "shardtensor/nn/conv_layers.hpp"
#include "shardtensor/nn/functional/cast.hpp"
#include "shardtensor/nn/functional/fft.hpp"
#include "shardtensor/nn/module.hpp"

namespace shard::nn {

/// A spectral convolution over S spatial dims (see the file comment).
template <class T, int S>
class SpectralConv : public UnaryModule<T, S + 2> {
 public:
  static constexpr int R = S + 2;
  SpectralConv(const DeviceMesh& mesh, index_t in_channels, index_t out_channels, const Shape<S>& modes,
               std::uint64_t seed = 0, FftNorm norm = FftNorm::backward)
      : in_(in_channels), out_(out_channels), modes_(modes), norm_(norm) {
    SHARD_CHECK(in_channels >= 1 && out_channels >= 1, "SpectralConv", "channel counts must be >= 1 (got {} -> {})",
                in_channels, out_channels);
    Shape<R + 1> ws{};
    ws[0] = in_channels;
    ws[1] = out_channels;
    for (int d = 0; d < S; ++d) {
      SHARD_CHECK(modes[d] >= 1, "SpectralConv", "modes {} must be >= 1", modes);
      ws[static_cast<std::size_t>(d + 2)] = d + 1 < S ? 2 * modes[d] : modes[d];
    }
    ws[R] = 2;
    // FNO's initialisation scale 1 / (in * out), here symmetric: U(-s, s) for both parts.
    const double bound = 1.0 / static_cast<double>(in_channels * out_channels);
    weight_ = this->template make_parameter<R + 1>("weight", mesh, ws, seed, bound);
  }

  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override {
    const auto g = x.value().global_shape();
    SHARD_CHECK(g[1] == in_, "SpectralConv", "input of global shape {} has {} channels, the module expects {}", g, g[1],
                in_);
    const std::vector<index_t> modes(modes_.begin(), modes_.end());
    if constexpr (std::is_same_v<T, master_t<T>>) {
      return F::spectral_conv(x, this->compute_copy(weight_), modes, norm_);
    } else {
      // bf16 / f16 model: the FFTs and the spectral multiply run in f32 (as torch.autocast runs
      // its FFTs in float32): the input is widened on the tape, the f32 master weight is used as
      // it is, and the result is rounded once to T (docs/architecture.md, "Mixed precision").
      return F::cast<T>(F::spectral_conv(F::cast<master_t<T>>(x), weight_, modes, norm_));
    }
  }

  const autograd::Var<master_t<T>, R + 1>& weight() const { return weight_; }
  const Shape<S>& modes() const { return modes_; }

 private:
  index_t in_, out_;
  Shape<S> modes_;
  FftNorm norm_;
  autograd::Var<master_t<T>, R + 1> weight_;
};

template <class T> using SpectralConv1d = SpectralConv<T, 1>;
template <class T> using SpectralConv2d = SpectralConv<T, 2>;
template <class T> using SpectralConv3d = SpectralConv<T, 3>;

/// Hyper-parameters of FNO.
template <int S>
struct FNOOptions {
  index_t in_channels = 1;
  index_t out_channels = 1;
  index_t width = 16;       ///< channels of the spectral blocks
  int layers = 4;           ///< spectral blocks
  Shape<S> modes{};         ///< kept modes per spatial dim (all 0: 8 per dim)
  index_t proj_width = 64;  ///< hidden channels of the projection
  Activation activation = Activation::gelu;
  FftNorm norm = FftNorm::backward;
};

/// A Fourier Neural Operator over S spatial dims (see the file comment).
template <class T, int S>
class FNO : public UnaryModule<T, S + 2> {
 public:
  static constexpr int R = S + 2;
  FNO(const DeviceMesh& mesh, FNOOptions<S> o, std::uint64_t seed = 0) : o_(o) {
    SHARD_CHECK(o.layers >= 1, "FNO", "layers must be >= 1 (got {})", o.layers);
    for (int d = 0; d < S; ++d)
      if (o_.modes[d] == 0) o_.modes[d] = 8;
    lift_ = this->register_module("lift", std::make_shared<Linear<T, R>>(mesh, o.in_channels, o.width, true, seed));
    for (int l = 0; l < o.layers; ++l) {
      spectral_.push_back(this->register_module(
          "spectral" + std::to_string(l), std::make_shared<SpectralConv<T, S>>(mesh, o.width, o.width, o_.modes, seed, o.norm)));
      skip_.push_back(this->register_module("skip" + std::to_string(l),
                                            std::make_shared<Linear<T, R>>(mesh, o.width, o.width, true, seed)));
    }
    proj1_ = this->register_module("proj1", std::make_shared<Linear<T, R>>(mesh, o.width, o.proj_width, true, seed));
    proj2_ = this->register_module("proj2", std::make_shared<Linear<T, R>>(mesh, o.proj_width, o.out_channels, true, seed));
  }

  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override {
    auto h = lift_->forward(x);
    for (int l = 0; l < o_.layers; ++l) {
      auto s = spectral_[static_cast<std::size_t>(l)]->forward(h);
      auto k = skip_[static_cast<std::size_t>(l)]->forward(h);
      h = F::add(s, k);
      if (l + 1 < o_.layers) h = activate(o_.activation, h);
    }
    return proj2_->forward(activate(o_.activation, proj1_->forward(h)));
  }

  const FNOOptions<S>& options() const { return o_; }

 private:
  FNOOptions<S> o_;
  std::shared_ptr<Linear<T, R>> lift_, proj1_, proj2_;
  std::vector<std::shared_ptr<SpectralConv<T, S>>> spectral_;
  std::vector<std::shared_ptr<Linear<T, R>>> skip_;
};

}  // namespace shard::nn
