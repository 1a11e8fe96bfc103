#pragma once
/// \file norm_layers.hpp
/// Normalisation modules over rank-R activations N, C, spatial... with global statistics
/// (nn/functional/norm.hpp): BatchNorm (running statistics, eval mode), GroupNorm, InstanceNorm,
/// LayerNorm (over the channels, or any unsharded dim). Affine weight (init 1) and bias (init 0)
/// [C] are Replicate parameters. BatchNorm's running_mean / running_var are registered as
/// parameters that do NOT require grad, so Module::save / load carry them (and optimisers skip
/// them: they never get a gradient). The NormType enum and make_norm serve configurable models.
#include <cstdlib>
#include <memory>
#include <optional>
#include <string_view>
#include <typeinfo>

#include "shardtensor/nn/activation_layers.hpp"
#include "shardtensor/nn/functional/norm.hpp"
#include "shardtensor/nn/module.hpp"

namespace shard::nn {

namespace detail {

/// Replicate [C] tensor filled with `v`.
template <class T>
DistTensor<T, 1> channel_constant(const DeviceMesh& mesh, index_t c, T v) {
  std::vector<Placement> rep(static_cast<std::size_t>(mesh.ndim()), Replicate());
  auto t = DistTensor<T, 1>::zeros({c}, mesh, rep);
  t.local().fill(v);
  return t;
}

/// The norm-fused form of an activation (identity: none).
constexpr F::NormAct norm_act(Activation a) {
  switch (a) {
    case Activation::relu: return F::NormAct::relu;
    case Activation::gelu: return F::NormAct::gelu;
    case Activation::gelu_tanh: return F::NormAct::gelu_tanh;
    case Activation::silu: return F::NormAct::silu;
    case Activation::tanh: return F::NormAct::tanh;
    case Activation::sigmoid: return F::NormAct::sigmoid;
    default: return F::NormAct::none;
  }
}

/// Throws unless `c` >= 1.
inline void check_channels(index_t c, const char* op) {
  SHARD_CHECK(c >= 1, op, "number of channels must be >= 1 (got {})", c);
}

}  // namespace detail

/// Base of the norms with an optional affine weight and bias [C].
template <class T, int R>
class AffineNorm : public UnaryModule<T, R> {
 public:
  /// Number of channels normalised.
  index_t channels() const { return c_; }
  /// act(forward(x) + residual) as one op: the residual add and the activation fused into the
  /// norm's passes (F's `act` and `residual` arguments), equal to activate(a, forward(x) [+
  /// residual]) (on the CPU bit for bit); saves one activation tensor of memory and passes each
  /// way. The residual must have x's shape and layout.
  autograd::Var<T, R> forward_act(const autograd::Var<T, R>& x, Activation a,
                                  const std::optional<autograd::Var<T, R>>& residual = std::nullopt) {
    return forward_fused(x, detail::norm_act(a), residual);
  }
  /// forward_act with the kernel-level activation code (F::NormAct: also gelu_tanh).
  virtual autograd::Var<T, R> forward_fused(const autograd::Var<T, R>& x, F::NormAct act,
                                            const std::optional<autograd::Var<T, R>>& residual) = 0;
  /// The affine weight / bias (empty when affine = false).
  using P = master_t<T>;  ///< the parameters' dtype (f32 masters for a bf16 / f16 module)
  const std::optional<autograd::Var<P, 1>>& weight() const { return w_; }
  const std::optional<autograd::Var<P, 1>>& bias() const { return b_; }

 protected:
  AffineNorm(const DeviceMesh& mesh, index_t c, bool affine, double eps, const char* op) : c_(c), eps_(eps) {
    detail::check_channels(c, op);
    SHARD_CHECK(eps >= 0, op, "eps must be >= 0 (got {})", eps);
    if (affine) {
      w_ = this->template make_constant_parameter<1>("weight", mesh, Shape<1>{c}, P(1));
      b_ = this->template make_constant_parameter<1>("bias", mesh, Shape<1>{c}, P(0));
    }
  }
  /// Throws unless x has c_ channels along `dim` (spec-only).
  void check_input(const autograd::Var<T, R>& x, int dim, const char* op) const {
    const auto g = x.value().global_shape();
    SHARD_CHECK(g[static_cast<std::size_t>(dim)] == c_, op,
                "input of global shape {} has {} channels along dim {}, the module expects {}", g,
                g[static_cast<std::size_t>(dim)], dim, c_);
  }
  /// The affine parameters in the compute dtype (casts on the tape for a bf16 / f16 module).
  std::optional<autograd::Var<T, 1>> cw() const {
    if (!w_) return std::nullopt;
    return this->compute_copy(*w_);
  }
  std::optional<autograd::Var<T, 1>> cb() const {
    if (!b_) return std::nullopt;
    return this->compute_copy(*b_);
  }
  index_t c_;
  double eps_;
  std::optional<autograd::Var<P, 1>> w_, b_;
};

/// Batch normalisation (statistics over N and every spatial dim, global). Training mode: batch
/// statistics, running statistics updated with `momentum` (PyTorch rule); eval mode: running
/// statistics (with track_running_stats = false, batch statistics in both modes).
template <class T, int R>
class BatchNorm : public AffineNorm<T, R> {
 public:
  using P = typename AffineNorm<T, R>::P;  ///< the parameters' and running statistics' dtype
  BatchNorm(const DeviceMesh& mesh, index_t channels, double eps = 1e-5, double momentum = 0.1, bool affine = true,
            bool track_running_stats = true)
      : AffineNorm<T, R>(mesh, channels, affine, eps, "BatchNorm"), momentum_(momentum) {
    SHARD_CHECK(momentum >= 0 && momentum <= 1, "BatchNorm", "momentum {} outside [0, 1]", momentum);
    if (track_running_stats) {
      // Running statistics in the parameters' dtype (f32 for a bf16 / f16 model).
      mean_ = detail::channel_constant<P>(mesh, channels, P(0));
      var_ = detail::channel_constant<P>(mesh, channels, P(1));
      this->template register_parameter<1>("running_mean", autograd::Var<P, 1>(*mean_, false));
      this->template register_parameter<1>("running_var", autograd::Var<P, 1>(*var_, false));
    }
  }
  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override {
    return forward_fused(x, F::NormAct::none, std::nullopt);
  }
  autograd::Var<T, R> forward_fused(const autograd::Var<T, R>& x, F::NormAct act,
                                    const std::optional<autograd::Var<T, R>>& residual) override {
    this->check_input(x, 1, "BatchNorm");
    const bool use_batch = this->is_training() || !mean_;
    return F::batch_norm(x, mean_ ? &*mean_ : nullptr, mean_ ? &*var_ : nullptr, this->cw(), this->cb(), use_batch,
                         momentum_, this->eps_, act, residual);
  }
  /// Running statistics (shared storage with the registered buffers; absent without tracking).
  const std::optional<DistTensor<P, 1>>& running_mean() const { return mean_; }
  const std::optional<DistTensor<P, 1>>& running_var() const { return var_; }

 private:
  double momentum_;
  std::optional<DistTensor<P, 1>> mean_, var_;
};

/// Group normalisation: `groups` groups of channels, statistics per (sample, group) (global).
template <class T, int R>
class GroupNorm : public AffineNorm<T, R> {
 public:
  GroupNorm(const DeviceMesh& mesh, index_t groups, index_t channels, double eps = 1e-5, bool affine = true)
      : AffineNorm<T, R>(mesh, channels, affine, eps, "GroupNorm"), groups_(groups) {
    SHARD_CHECK(groups >= 1 && channels % groups == 0, "GroupNorm", "{} channels cannot be split into {} groups",
                channels, groups);
  }
  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override {
    return forward_fused(x, F::NormAct::none, std::nullopt);
  }
  autograd::Var<T, R> forward_fused(const autograd::Var<T, R>& x, F::NormAct act,
                                    const std::optional<autograd::Var<T, R>>& residual) override {
    this->check_input(x, 1, "GroupNorm");
    return F::group_norm(x, groups_, this->cw(), this->cb(), this->eps_, act, residual);
  }
  index_t groups() const { return groups_; }

 private:
  index_t groups_;
};

/// Instance normalisation: statistics per (sample, channel) over the spatial dims (global);
/// affine off by default (as PyTorch).
template <class T, int R>
class InstanceNorm : public AffineNorm<T, R> {
 public:
  InstanceNorm(const DeviceMesh& mesh, index_t channels, double eps = 1e-5, bool affine = false)
      : AffineNorm<T, R>(mesh, channels, affine, eps, "InstanceNorm") {}
  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override {
    return forward_fused(x, F::NormAct::none, std::nullopt);
  }
  autograd::Var<T, R> forward_fused(const autograd::Var<T, R>& x, F::NormAct act,
                                    const std::optional<autograd::Var<T, R>>& residual) override {
    this->check_input(x, 1, "InstanceNorm");
    return F::instance_norm(x, this->cw(), this->cb(), this->eps_, act, residual);
  }
};

/// Layer normalisation over one unsharded dim: the channels (dim 1, default) of N, C, spatial...,
/// or e.g. dim -1 for tokens [..., C]. Purely local.
template <class T, int R>
class LayerNorm : public AffineNorm<T, R> {
 public:
  LayerNorm(const DeviceMesh& mesh, index_t channels, double eps = 1e-5, bool affine = true, int dim = 1)
      : AffineNorm<T, R>(mesh, channels, affine, eps, "LayerNorm"), dim_(dim < 0 ? dim + R : dim) {
    SHARD_CHECK(dim_ >= 0 && dim_ < R, "LayerNorm", "dim {} out of range for rank-{} inputs", dim, R);
  }
  autograd::Var<T, R> forward(const autograd::Var<T, R>& x) override {
    return forward_fused(x, F::NormAct::none, std::nullopt);
  }
  autograd::Var<T, R> forward_fused(const autograd::Var<T, R>& x, F::NormAct act,
                                    const std::optional<autograd::Var<T, R>>& residual) override {
    this->check_input(x, dim_, "LayerNorm");
    return F::layer_norm(x, this->cw(), this->cb(), this->eps_, dim_, act, residual);
  }

 private:
  int dim_;
};

/// Which normalisation a configurable model uses.
enum class NormType { none, batch, group, instance, layer };

/// Name of a normalisation ("group", ...).
constexpr const char* norm_name(NormType n) {
  switch (n) {
    case NormType::none: return "none";
    case NormType::batch: return "batch";
    case NormType::group: return "group";
    case NormType::instance: return "instance";
    default: return "layer";
  }
}

/// The largest divisor of `channels` that is <= max_groups (GroupNorm's group count for a width).
inline index_t group_count(index_t channels, index_t max_groups) {
  for (index_t g = std::min(channels, std::max<index_t>(max_groups, 1)); g > 1; --g)
    if (channels % g == 0) return g;
  return 1;
}

/// A norm module of type `n` over `channels` (affine; GroupNorm with group_count(channels,
/// max_groups) groups; InstanceNorm affine as well; none: Identity).
template <class T, int R>
std::shared_ptr<UnaryModule<T, R>> make_norm(NormType n, const DeviceMesh& mesh, index_t channels,
                                             index_t max_groups = 8) {
  switch (n) {
    case NormType::none: return std::make_shared<Identity<T, R>>();
    case NormType::batch: return std::make_shared<BatchNorm<T, R>>(mesh, channels);
    case NormType::group:
      return std::make_shared<GroupNorm<T, R>>(mesh, group_count(channels, max_groups), channels);
    case NormType::instance: return std::make_shared<InstanceNorm<T, R>>(mesh, channels, 1e-5, true);
    case NormType::layer: return std::make_shared<LayerNorm<T, R>>(mesh, channels);
  }
  SHARD_FAIL("make_norm", "unknown norm type {}", static_cast<int>(n));
}

/// Whether models fuse a norm and the activation after it (nn::norm_then_activate; with the skip
/// add, nn::norm_add_activate), from SHARDTENSOR_FUSED_NORM_ACT (read once): "1" everywhere, "0"
/// nowhere (separate ops: the A/B switch), unset or anything else: on CUDA tensors only. On a GPU the norm kernels are memory-bound and
/// the fused activation saves a tensor of memory and a pass each way; on the CPU the activation
/// is compute-bound and the fused backward evaluates its derivative twice (the sums pass and the
/// dx pass), which measured slower than the two ops (docs/performance.md), so the CPU default
/// keeps them apart.
inline bool fused_norm_act_on(const Device& d) {
  static const int mode = [] {
    const char* v = std::getenv("SHARDTENSOR_FUSED_NORM_ACT");
    if (v && std::string_view(v) == "1") return 1;
    if (v && std::string_view(v) == "0") return 0;
    return -1;
  }();
  return mode == 1 || (mode == -1 && d.is_cuda());
}

/// The norm-fused form of activation module m when m is one of the library's own activation
/// modules (whose forward is exactly the activation: ActivationModule, ReLU, GELU, SiLU, Tanh,
/// Sigmoid; not a subclass that might override forward), else none.
template <class T, int R>
F::NormAct fusable_activation(const UnaryModule<T, R>& m) {
  const std::type_info& t = typeid(m);
  if (t == typeid(ActivationModule<T, R>) || t == typeid(ReLU<T, R>) || t == typeid(SiLU<T, R>) ||
      t == typeid(Tanh<T, R>) || t == typeid(Sigmoid<T, R>))
    return detail::norm_act(static_cast<const ActivationModule<T, R>&>(m).kind());
  if (t == typeid(GELU<T, R>))
    return static_cast<const GELU<T, R>&>(m).approx() == F::GeluApprox::tanh ? F::NormAct::gelu_tanh
                                                                              : F::NormAct::gelu;
  return F::NormAct::none;
}

/// act(norm(x) + residual) (residual: x's shape and layout): one fused op when `norm` is one of
/// the norms above and the fusion is on for x's device, else the module, F::add and the activation
/// as separate ops. Both give the same values (on the CPU bit for bit).
template <class T, int R>
autograd::Var<T, R> norm_add_activate(UnaryModule<T, R>& norm, Activation a, const autograd::Var<T, R>& x,
                                      const autograd::Var<T, R>& residual) {
  if (fused_norm_act_on(x.value().device()))
    if (auto* n = dynamic_cast<AffineNorm<T, R>*>(&norm)) return n->forward_act(x, a, residual);
  return activate(a, F::add(norm.forward(x), residual));
}

/// act(norm(x)): one fused op when `norm` is one of the norms above and the fusion is on for x's
/// device (fused_norm_act_on), else the module followed by the activation (e.g. Identity for
/// NormType::none). Both give the same values (on the CPU bit for bit).
template <class T, int R>
autograd::Var<T, R> norm_then_activate(UnaryModule<T, R>& norm, Activation a, const autograd::Var<T, R>& x) {
  if (a != Activation::identity && fused_norm_act_on(x.value().device()))
    if (auto* n = dynamic_cast<AffineNorm<T, R>*>(&norm)) return n->forward_act(x, a);
  return activate(a, norm.forward(x));
}

}  // namespace shard::nn
