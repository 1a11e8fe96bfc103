#pragma once
/// \file unet.hpp
/// UNet<T,S>: a domain-parallel U-Net for 2-D (S = 2, activations [N, C, H, W]) and 3-D (S = 3,
/// [N, C, D, H, W]) fields. Spatial dims may be sharded over any mesh dims (uneven shards
/// included), N over a data-parallel mesh dim; parameters are Replicate, initialised
/// deterministically from the seed (identical on every rank and at every rank count).
///
/// Architecture (w_l = base_width * channel_mult^l, `depth` down/up steps):
///   stem   Conv k x k, in_channels -> w_0
///   enc_l  (l < depth) blocks_per_level ResidualBlocks, the first w_{l-1} -> w_l (w_0 -> w_0 at
///          l = 0); its output is the skip s_l; then down_l: avg-pool 2 (Downsample::avg_pool,
///          extent n -> floor(n / 2)) or a stride-2 k3 p1 conv w_l -> w_l (strided_conv,
///          n -> ceil(n / 2))
///   mid    blocks_per_level ResidualBlocks, the first w_{depth-1} -> w_depth
///   dec_l  (l = depth-1 .. 0) up_l: nearest x2 upsampling + k x k conv (Upsample::nearest_conv)
///          or a 2x2 stride-2 transposed conv (transposed_conv), w_{l+1} -> w_l, sized exactly to
///          the skip's extents (odd extents: the conv pads / crops one cell at the high end);
///          then concat(up, s_l) along channels and blocks_per_level ResidualBlocks, the first
///          2 w_l -> w_l
///   head   1x1 channel Linear w_0 -> out_channels (with bias)
/// ResidualBlocks use `norm` (GroupNorm by default), `activation` (SiLU by default) and
/// `padding_mode` (periodic for periodic domains).
///
/// Layouts: pooling / strided convs map shard boundaries g to ceil(g / 2) and upsampling doubles
/// them, so with uneven shards the upsampled tensor and the skip can be laid out differently
/// (extent 10 over 3 ranks: 4,3,3 -> 2,2,1 -> 4,4,2). Before each concat the upsampled tensor is
/// moved onto the skip's layout with the differentiable F::redistribute_like (an all-to-all of
/// the boxes that changed owner; nothing is gathered on one rank, forward or backward).
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/nn/functional/concat.hpp"
#include "shardtensor/nn/functional/pool.hpp"
#include "shardtensor/nn/functional/upsample.hpp"
#include "shardtensor/nn/sequential.hpp"

namespace shard::nn {

/// How a U-Net halves the resolution.
enum class Downsample { avg_pool, strided_conv };
/// How a U-Net doubles the resolution.
enum class Upsample { nearest_conv, transposed_conv };

/// Hyper-parameters of UNet (designated initialisers: `UNetOptions{.in_channels = 2, .depth = 3}`).
struct UNetOptions {
  index_t in_channels = 1;                 ///< channels of the input field
  index_t out_channels = 1;                ///< channels of the output field
  int depth = 2;                           ///< number of down (and up) steps (>= 0)
  index_t base_width = 16;                 ///< channels at full resolution (w_0)
  index_t channel_mult = 2;                ///< w_{l+1} = w_l * channel_mult
  int blocks_per_level = 1;                ///< ResidualBlocks per level (>= 1)
  index_t kernel = 3;                      ///< odd conv kernel extent
  NormType norm = NormType::group;         ///< normalisation in the ResidualBlocks
  index_t norm_groups = 8;                 ///< GroupNorm: largest divisor of the width <= this
  Activation activation = Activation::silu;
  Downsample down = Downsample::avg_pool;
  Upsample up = Upsample::nearest_conv;
  Boundary padding_mode = Boundary::zero;  ///< padding of the 'same' convs

  /// Width w_l of level l.
  index_t width(int level) const {
    index_t w = base_width;
    for (int i = 0; i < level; ++i) w *= channel_mult;
    return w;
  }
  /// The ResidualBlock options these options imply.
  ResidualBlockOptions block() const { return {kernel, norm, norm_groups, activation, padding_mode}; }
};

/// One U-Net upsampling step w_in -> w_out to a given spatial size (see the UNet file comment).
/// Children: "conv" (nearest_conv: Conv k x k) or "tconv" (transposed_conv: ConvTranspose 2x2).
template <class T, int S>
class UpBlock : public Module<T> {
 public:
  static constexpr int R = S + 2;
  UpBlock(const DeviceMesh& mesh, index_t in_channels, index_t out_channels, Upsample mode, index_t kernel,
          Boundary padding_mode, std::uint64_t seed)
      : mode_(mode) {
    if (mode == Upsample::nearest_conv) {
      conv_ = this->register_module(
          "conv", std::make_shared<Conv<T, S>>(mesh, in_channels, out_channels, kernel,
                                               F::ConvOptions<S>::same(detail::filled<S>(kernel), 1, padding_mode),
                                               true, seed_for(seed, "conv")));
    } else {
      typename ConvTranspose<T, S>::Options o = ConvTranspose<T, S>::Options::symmetric(0, 2);
      tconv_ = this->register_module("tconv", std::make_shared<ConvTranspose<T, S>>(
                                                  mesh, in_channels, out_channels, 2, o, true, seed_for(seed, "tconv")));
    }
  }
  /// x at half resolution (extents m) -> spatial extents `size` (each within 2m - 1 .. 2m + 1).
  autograd::Var<T, R> forward(const autograd::Var<T, R>& x, const Shape<S>& size) {
    const auto g = x.value().global_shape();
    for (int d = 0; d < S; ++d)
      SHARD_CHECK(size[d] >= 2 * g[2 + d] - 1 && size[d] <= 2 * g[2 + d] + 1, "UNet::up",
                  "cannot upsample extents {} to {} (x2 within one cell)", g, size);
    if (mode_ == Upsample::nearest_conv) {
      auto u = F::upsample_nearest(x, detail::filled<S>(2));
      auto o = conv_->options();
      for (int d = 0; d < S; ++d) o.pad_hi[d] += size[d] - 2 * g[2 + d];  // pad or crop at the high end
      for (int d = 0; d < S; ++d)
        SHARD_CHECK(o.pad_hi[d] >= 0, "UNet::up", "kernel {} is too small to crop extents {} to {}", conv_->kernel(),
                    g, size);
      return conv_->forward(u, o);
    }
    auto o = tconv_->options();
    for (int d = 0; d < S; ++d) {
      const index_t extra = size[d] - 2 * g[2 + d];
      o.pad_hi[d] = extra < 0 ? -extra : 0;
      o.output_padding[d] = extra > 0 ? extra : 0;
    }
    return tconv_->forward_with(x, o);
  }

 private:
  Upsample mode_;
  std::shared_ptr<Conv<T, S>> conv_;
  std::shared_ptr<ConvTranspose<T, S>> tconv_;
};

/// Domain-parallel U-Net (see the file comment). forward: [N, in_channels, spatial...] ->
/// [N, out_channels, spatial...] with the input's layout.
template <class T, int S>
class UNet : public UnaryModule<T, S + 2> {
  static_assert(S == 1 || S == 2 || S == 3, "UNet: 1, 2 or 3 spatial dims");

 public:
  static constexpr int R = S + 2;
  UNet(const DeviceMesh& mesh, const UNetOptions& opt, std::uint64_t seed = 0) : opt_(opt) {
    const char* op = "UNet";
    SHARD_CHECK(opt.in_channels >= 1 && opt.out_channels >= 1 && opt.base_width >= 1 && opt.channel_mult >= 1, op,
                "channel counts must be >= 1 (in {}, out {}, base width {}, multiplier {})", opt.in_channels,
                opt.out_channels, opt.base_width, opt.channel_mult);
    SHARD_CHECK(opt.depth >= 0 && opt.depth <= 16 && opt.blocks_per_level >= 1, op,
                "need 0 <= depth <= 16 (got {}) and blocks_per_level >= 1 (got {})", opt.depth, opt.blocks_per_level);
    SHARD_CHECK(opt.kernel >= 1 && opt.kernel % 2 == 1, op, "kernel {} must be odd", opt.kernel);
    auto s = [seed](const std::string& n) { return seed_for(seed, n); };
    const auto blk = opt.block();
    const auto same = F::ConvOptions<S>::same(detail::filled<S>(opt.kernel), 1, opt.padding_mode);
    stem_ = this->register_module(
        "stem", std::make_shared<Conv<T, S>>(mesh, opt.in_channels, opt.width(0), opt.kernel, same, true, s("stem")));
    auto level = [&](const std::string& name, index_t cin, index_t cout) {
      auto q = std::make_shared<Sequential<T, R>>();
      for (int b = 0; b < opt.blocks_per_level; ++b)
        q->add(std::make_shared<ResidualBlock<T, S>>(mesh, b == 0 ? cin : cout, cout, blk,
                                                     s(name + "." + std::to_string(b))));
      return this->register_module(name, q);
    };
    for (int l = 0; l < opt.depth; ++l) {
      const std::string n = std::to_string(l);
      enc_.push_back(level("enc" + n, l == 0 ? opt.width(0) : opt.width(l - 1), opt.width(l)));
      if (opt.down == Downsample::strided_conv)
        down_.push_back(this->register_module(
            "down" + n, std::make_shared<Conv<T, S>>(mesh, opt.width(l), opt.width(l), 3,
                                                     F::ConvOptions<S>::symmetric(1, 2, 1, 1, opt.padding_mode), true,
                                                     s("down" + n))));
    }
    mid_ = level("mid", opt.depth == 0 ? opt.width(0) : opt.width(opt.depth - 1), opt.width(opt.depth));
    up_.resize(static_cast<std::size_t>(opt.depth));
    dec_.resize(static_cast<std::size_t>(opt.depth));
    for (int l = opt.depth - 1; l >= 0; --l) {
      const std::string n = std::to_string(l);
      const auto u = static_cast<std::size_t>(l);
      up_[u] = this->register_module("up" + n, std::make_shared<UpBlock<T, S>>(mesh, opt.width(l + 1), opt.width(l), opt.up,
                                                                             opt.kernel, opt.padding_mode, s("up" + n)));
      dec_[u] = level("dec" + n, 2 * opt.width(l), opt.width(l));
    }
    head_ = this->register_module(
        "head", std::make_shared<Linear<T, R>>(mesh, opt.width(0), opt.out_channels, true, s("head")));
  }

  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override {
    detail::check_in_channels(x, opt_.in_channels, "UNet");
    check_extents(x.value().global_shape());
    auto h = stem_->forward(x);
    std::vector<autograd::Var<T, R>> skips;
    for (int l = 0; l < opt_.depth; ++l) {
      const auto u = static_cast<std::size_t>(l);
      h = enc_[u]->forward(h);
      skips.push_back(h);
      if (opt_.down == Downsample::avg_pool) {
        PoolParams<S> p;
        p.kernel = detail::filled<S>(2);
        p.stride = detail::filled<S>(2);
        h = F::avg_pool(h, p);
      } else {
        h = down_[u]->forward(h);
      }
    }
    h = mid_->forward(h);
    for (int l = opt_.depth - 1; l >= 0; --l) {
      const auto u = static_cast<std::size_t>(l);
      const auto& skip = skips[u];
      const auto sg = skip.value().global_shape();
      Shape<S> size{};
      for (int d = 0; d < S; ++d) size[d] = sg[2 + d];
      auto up = F::redistribute_like(up_[u]->forward(h, size), skip.value().spec());
      h = dec_[u]->forward(F::concat(up, skip));
    }
    return head_->forward(h);
  }

  const UNetOptions& options() const { return opt_; }

 private:
  /// Refuses fields too small for `depth` halvings (spec-only: every rank throws).
  void check_extents(const Shape<R>& g) const {
    for (int d = 0; d < S; ++d) {
      index_t n = g[2 + d];
      for (int l = 0; l < opt_.depth; ++l) {
        SHARD_CHECK(n >= 2, "UNet", "spatial dim {} of the input {} is too small for {} halvings (extent {} at level {})",
                    d, g, opt_.depth, n, l);
        n = opt_.down == Downsample::avg_pool ? n / 2 : (n + 1) / 2;
      }
    }
  }

  UNetOptions opt_;
  std::shared_ptr<Conv<T, S>> stem_;
  std::vector<std::shared_ptr<Sequential<T, R>>> enc_, dec_;
  std::vector<std::shared_ptr<Conv<T, S>>> down_;
  std::shared_ptr<Sequential<T, R>> mid_;
  std::vector<std::shared_ptr<UpBlock<T, S>>> up_;
  std::shared_ptr<Linear<T, R>> head_;
};

/// 2-D and 3-D U-Nets.
template <class T> using UNet2d = UNet<T, 2>;
template <class T> using UNet3d = UNet<T, 3>;

}  // namespace shard::nn
