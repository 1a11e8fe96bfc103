#pragma once
/// \file conv_layers.hpp
/// Parametrised layers on N, C, spatial... activations: Conv<T,S> and ConvTranspose<T,S>
/// (S = 1, 2, 3 spatial dims; tensor rank S + 2), and Linear<T,R> (1x1 channel mixing, or the
/// last dim of token tensors). Spatial dims (and N) may be sharded; C must not be.
///
/// Initialisation (PyTorch defaults, deterministic from (seed, parameter name) and identical on
/// every rank and at every rank count, Module::make_parameter): weight and bias ~ U(-b, b) with
/// b = 1 / sqrt(fan_in) (kaiming-uniform with a = sqrt(5)); fan_in = C_in / groups * prod(kernel)
/// for Conv, C_out / groups * prod(kernel) for ConvTranspose (PyTorch's weight.size(1) rule),
/// in_features for Linear. Composite modules give each child the seed seed_for(seed, child name).
/// Channel counts are checked in forward() from specs alone, so a mismatch throws shard::Error on
/// every rank before any communication.
#include <cmath>
#include <optional>

#include "shardtensor/nn/functional/conv.hpp"
#include "shardtensor/nn/functional/linear.hpp"
#include "shardtensor/nn/module.hpp"

namespace shard::nn {

namespace detail {

/// Shape<S> with every entry `v`.
template <int S>
constexpr Shape<S> filled(index_t v) {
  Shape<S> s{};
  for (auto& e : s) e = v;
  return s;
}

/// Throws unless x (rank R) has `channels` channels along dim 1 (spec-only: every rank throws).
template <class T, int R>
void check_in_channels(const autograd::Var<T, R>& x, index_t channels, const char* module) {
  const auto g = x.value().global_shape();
  SHARD_CHECK(g[1] == channels, module, "input of global shape {} has {} channels, the module expects {}", g, g[1],
              channels);
}

/// "Conv2d"-style module names.
template <int S>
constexpr const char* conv_name(bool transpose) {
  if (transpose) return S == 1 ? "ConvTranspose1d" : S == 2 ? "ConvTranspose2d" : "ConvTranspose3d";
  return S == 1 ? "Conv1d" : S == 2 ? "Conv2d" : "Conv3d";
}

}  // namespace detail

/// S-d convolution module: weight [C_out, C_in / groups, kernel...], optional bias [C_out]
/// (Replicate); forward = F::conv with the stored options (stride, padding per side, dilation,
/// groups, padding mode per dim; F::ConvOptions<S>::same(kernel) gives 'same' padding).
template <class T, int S>
class Conv : public UnaryModule<T, S + 2> {
 public:
  using P = master_t<T>;  ///< the parameters' dtype
  static constexpr int R = S + 2;
  using Options = F::ConvOptions<S>;

  /// in_channels -> out_channels with a kernel of extents `kernel`.
  Conv(const DeviceMesh& mesh, index_t in_channels, index_t out_channels, const Shape<S>& kernel,
       const Options& opt = {}, bool bias = true, std::uint64_t seed = 0)
      : in_(in_channels), out_(out_channels), kernel_(kernel), opt_(opt) {
    const char* op = detail::conv_name<S>(false);
    SHARD_CHECK(in_channels >= 1 && out_channels >= 1, op, "channel counts must be >= 1 (got {} -> {})", in_channels,
                out_channels);
    SHARD_CHECK(opt.groups >= 1 && in_channels % opt.groups == 0 && out_channels % opt.groups == 0, op,
                "groups {} must divide the input channels {} and the output channels {}", opt.groups, in_channels,
                out_channels);
    Shape<R> ws{};
    ws[0] = out_channels;
    ws[1] = in_channels / opt.groups;
    index_t fan_in = ws[1];
    for (int d = 0; d < S; ++d) {
      SHARD_CHECK(kernel[d] >= 1, op, "kernel {} has an empty extent", kernel);
      ws[2 + d] = kernel[d];
      fan_in *= kernel[d];
    }
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    weight_ = this->template make_parameter<R>("weight", mesh, ws, seed, bound);
    if (bias) bias_ = this->template make_parameter<1>("bias", mesh, Shape<1>{out_channels}, seed, bound);
  }
  /// Same with a cubic kernel of extent `kernel`.
  Conv(const DeviceMesh& mesh, index_t in_channels, index_t out_channels, index_t kernel, const Options& opt = {},
       bool bias = true, std::uint64_t seed = 0)
      : Conv(mesh, in_channels, out_channels, detail::filled<S>(kernel), opt, bias, seed) {}

  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override { return forward(x, opt_); }
  /// Convolution with other options (e.g. padding adjusted to a target extent); same weights.
  autograd::Var<T, R> forward(const autograd::Var<T, R>& x, const Options& opt) {
    detail::check_in_channels(x, in_, detail::conv_name<S>(false));
    return F::conv(x, this->compute_copy(weight_), compute_bias(), opt);
  }

  /// The parameters (f32 masters for a bf16 / f16 module; see Module::param_type).
  const autograd::Var<P, R>& weight() const { return weight_; }
  const std::optional<autograd::Var<P, 1>>& bias() const { return bias_; }
  const Options& options() const { return opt_; }
  index_t in_channels() const { return in_; }
  index_t out_channels() const { return out_; }
  const Shape<S>& kernel() const { return kernel_; }

 private:
  index_t in_, out_;
  Shape<S> kernel_;
  Options opt_;
  std::optional<autograd::Var<T, 1>> compute_bias() const {
    if (!bias_) return std::nullopt;
    return this->compute_copy(*bias_);
  }
  autograd::Var<P, R> weight_;
  std::optional<autograd::Var<P, 1>> bias_;
};

/// S-d transposed convolution module: weight [C_in, C_out / groups, kernel...] (PyTorch layout),
/// optional bias [C_out]; forward = F::conv_transpose. forward(x, output_size) picks the
/// output_padding that gives the requested spatial extents (as PyTorch's output_size argument).
template <class T, int S>
class ConvTranspose : public UnaryModule<T, S + 2> {
 public:
  using P = master_t<T>;  ///< the parameters' dtype
  static constexpr int R = S + 2;
  using Options = F::ConvTransposeOptions<S>;

  ConvTranspose(const DeviceMesh& mesh, index_t in_channels, index_t out_channels, const Shape<S>& kernel,
                const Options& opt = {}, bool bias = true, std::uint64_t seed = 0)
      : in_(in_channels), out_(out_channels), kernel_(kernel), opt_(opt) {
    const char* op = detail::conv_name<S>(true);
    SHARD_CHECK(in_channels >= 1 && out_channels >= 1, op, "channel counts must be >= 1 (got {} -> {})", in_channels,
                out_channels);
    SHARD_CHECK(opt.groups >= 1 && in_channels % opt.groups == 0 && out_channels % opt.groups == 0, op,
                "groups {} must divide the input channels {} and the output channels {}", opt.groups, in_channels,
                out_channels);
    Shape<R> ws{};
    ws[0] = in_channels;
    ws[1] = out_channels / opt.groups;
    index_t fan_in = ws[1];
    for (int d = 0; d < S; ++d) {
      SHARD_CHECK(kernel[d] >= 1, op, "kernel {} has an empty extent", kernel);
      ws[2 + d] = kernel[d];
      fan_in *= kernel[d];
    }
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    weight_ = this->template make_parameter<R>("weight", mesh, ws, seed, bound);
    if (bias) bias_ = this->template make_parameter<1>("bias", mesh, Shape<1>{out_channels}, seed, bound);
  }
  ConvTranspose(const DeviceMesh& mesh, index_t in_channels, index_t out_channels, index_t kernel,
                const Options& opt = {}, bool bias = true, std::uint64_t seed = 0)
      : ConvTranspose(mesh, in_channels, out_channels, detail::filled<S>(kernel), opt, bias, seed) {}

  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override { return forward_with(x, opt_); }
  /// Output with spatial extents `output_size`: output_padding chosen per dim (must lie in
  /// [0, max(stride, dilation)), else shard::Error).
  autograd::Var<T, R> forward(const autograd::Var<T, R>& x, const Shape<S>& output_size) {
    Options o = opt_;
    const auto g = x.value().global_shape();
    for (int d = 0; d < S; ++d) {
      const index_t base = (g[2 + d] - 1) * o.stride[d] - o.pad_lo[d] - o.pad_hi[d] + o.dilation[d] * (kernel_[d] - 1) + 1;
      o.output_padding[d] = output_size[d] - base;
      SHARD_CHECK(o.output_padding[d] >= 0 && o.output_padding[d] < std::max(o.stride[d], o.dilation[d]),
                  detail::conv_name<S>(true), "output size {} is unreachable from input {} (extents {} .. {} per dim)",
                  output_size, g, base, base + std::max(o.stride[d], o.dilation[d]) - 1);
    }
    return forward_with(x, o);
  }
  /// Transposed convolution with other options; same weights.
  autograd::Var<T, R> forward_with(const autograd::Var<T, R>& x, const Options& opt) {
    detail::check_in_channels(x, in_, detail::conv_name<S>(true));
    return F::conv_transpose(x, this->compute_copy(weight_), compute_bias(), opt);
  }

  /// The parameters (f32 masters for a bf16 / f16 module; see Module::param_type).
  const autograd::Var<P, R>& weight() const { return weight_; }
  const std::optional<autograd::Var<P, 1>>& bias() const { return bias_; }
  const Options& options() const { return opt_; }
  index_t in_channels() const { return in_; }
  index_t out_channels() const { return out_; }
  const Shape<S>& kernel() const { return kernel_; }

 private:
  index_t in_, out_;
  Shape<S> kernel_;
  Options opt_;
  std::optional<autograd::Var<T, 1>> compute_bias() const {
    if (!bias_) return std::nullopt;
    return this->compute_copy(*bias_);
  }
  autograd::Var<P, R> weight_;
  std::optional<autograd::Var<P, 1>> bias_;
};

/// Which dim Linear mixes: the channels (dim 1 of N, C, spatial...: a 1x1 convolution) or the
/// last dim (tokens [..., C], as torch.nn.Linear).
enum class LinearDim { channels, last };

/// Linear map of one unsharded dim with weight [out, in] and optional bias [out] (Replicate).
template <class T, int R>
class Linear : public UnaryModule<T, R> {
 public:
  using P = master_t<T>;  ///< the parameters' dtype
  Linear(const DeviceMesh& mesh, index_t in_features, index_t out_features, bool bias = true, std::uint64_t seed = 0,
         LinearDim dim = LinearDim::channels)
      : in_(in_features), out_(out_features), dim_(dim) {
    SHARD_CHECK(dim == LinearDim::last || R >= 2, "Linear", "channel mixing needs N, C, ... inputs (rank {})", R);
    SHARD_CHECK(in_features >= 1 && out_features >= 1, "Linear", "feature counts must be >= 1 (got {} -> {})",
                in_features, out_features);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    weight_ = this->template make_parameter<2>("weight", mesh, Shape<2>{out_features, in_features}, seed, bound);
    if (bias) bias_ = this->template make_parameter<1>("bias", mesh, Shape<1>{out_features}, seed, bound);
  }

  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override {
    const int d = dim_ == LinearDim::channels ? 1 : R - 1;
    const auto g = x.value().global_shape();
    SHARD_CHECK(g[static_cast<std::size_t>(d)] == in_, "Linear",
                "input of global shape {} has {} features along dim {}, the module expects {}", g,
                g[static_cast<std::size_t>(d)], d, in_);
    if constexpr (R >= 2) {
      if (dim_ == LinearDim::channels) return F::channel_linear(x, this->compute_copy(weight_), compute_bias());
    }
    return F::linear(x, this->compute_copy(weight_), compute_bias());
  }

  /// The parameters (f32 masters for a bf16 / f16 module; see Module::param_type).
  const autograd::Var<P, 2>& weight() const { return weight_; }
  const std::optional<autograd::Var<P, 1>>& bias() const { return bias_; }
  index_t in_features() const { return in_; }
  index_t out_features() const { return out_; }

 private:
  index_t in_, out_;
  LinearDim dim_;
  std::optional<autograd::Var<T, 1>> compute_bias() const {
    if (!bias_) return std::nullopt;
    return this->compute_copy(*bias_);
  }
  autograd::Var<P, 2> weight_;
  std::optional<autograd::Var<P, 1>> bias_;
};

/// PyTorch-style aliases.
template <class T> using Conv1d = Conv<T, 1>;
template <class T> using Conv2d = Conv<T, 2>;
template <class T> using Conv3d = Conv<T, 3>;
template <class T> using ConvTranspose1d = ConvTranspose<T, 1>;
template <class T> using ConvTranspose2d = ConvTranspose<T, 2>;
template <class T> using ConvTranspose3d = ConvTranspose<T, 3>;

}  // namespace shard::nn
