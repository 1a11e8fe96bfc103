#pragma once
/// \file parameter.hpp
/// Parameter handles: a rank-erased view of a trainable Var, for optimisers and I/O. Parameters
/// are Replicate on every mesh dim (weights), or sharded like the activations they meet (e.g. a
/// ViT's positional embedding, Shard on the mesh dims that shard the tokens' spatial dims):
/// each rank then holds and updates only its block, and its gradient arrives laid out like the
/// value (Var's leaf finalisation), so element-wise optimisers need no communication.
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/autograd/variable.hpp"

namespace shard::nn {

/// Rank-erased access to one trainable parameter. For a Replicate parameter the local block is
/// the whole parameter and is identical on every rank; for a sharded one it is this rank's block.
template <class T>
class ParameterBase {
 public:
  virtual ~ParameterBase() = default;
  /// Element count of this rank's block (the whole parameter unless sharded()).
  virtual index_t numel() const = 0;
  /// Element count of the whole parameter.
  virtual index_t global_numel() const = 0;
  /// True when some mesh dim shards the parameter (each rank holds a block).
  virtual bool sharded() const = 0;
  /// Global shape.
  virtual std::vector<index_t> shape() const = 0;
  /// The device the value and gradient live on.
  virtual Device device() const = 0;
  /// Contiguous data of the value on device() (updated in place by optimisers).
  virtual T* data() const = 0;
  /// Contiguous data of the gradient on device(), or nullptr if backward did not reach it.
  virtual const T* grad() const = 0;
  virtual void zero_grad() const = 0;
  /// The mesh the parameter is replicated over (or sharded on).
  virtual const DeviceMesh& mesh() const = 0;
  /// The layout: mesh, placements, global shape and per-rank sizes (this rank's block is
  /// spec().local_box()). For checkpoints of sharded parameters and their optimiser state.
  virtual const DistSpec& spec() const = 0;
  /// Moves the value (and drops any gradient) to `dev`.
  virtual void to(Device dev) const = 0;
  /// The value as a flat rank-1 view on its device.
  virtual Tensor<T, 1> value_flat() const = 0;
  /// The gradient as a flat rank-1 tensor on its device (empty when backward did not reach it).
  virtual Tensor<T, 1> grad_flat() const = 0;
  /// The whole value, flat, on the host. Collective over the mesh when sharded() (an allgather of
  /// the parameter: for I/O and tests, not for training steps).
  virtual Tensor<T, 1> full_value_host() const = 0;
  /// The whole gradient, flat, on the host (empty when backward did not reach it; collective when
  /// sharded(), and then every rank must agree whether there is a gradient).
  virtual Tensor<T, 1> full_grad_host() const = 0;
  /// Sets the value from the whole parameter `whole` (host memory, global_numel() elements, row
  /// major): each rank copies its own block. Local.
  virtual void assign_from_full(const T* whole) const = 0;
};

/// A parameter of rank R.
template <class T, int R>
class Parameter final : public ParameterBase<T> {
 public:
  explicit Parameter(autograd::Var<T, R> v) : var_(std::move(v)) {
    for (auto& p : var_.value().placements())
      SHARD_CHECK(!p.is_partial(), "Parameter", "parameters must be Replicate or Shard on every mesh dim, got {}", p);
    SHARD_CHECK(var_.local().is_contiguous(), "Parameter", "parameters must be contiguous tensors");
  }
  index_t numel() const override { return var_.local().numel(); }
  index_t global_numel() const override { return shard::numel(var_.value().global_shape()); }
  bool sharded() const override {
    for (auto& p : var_.value().placements())
      if (p.is_shard()) return true;
    return false;
  }
  std::vector<index_t> shape() const override {
    auto s = var_.value().global_shape();
    return {s.begin(), s.end()};
  }
  Device device() const override { return var_.local().device(); }
  T* data() const override { return var_.local().data(); }
  const T* grad() const override {
    if (!var_.has_grad()) return nullptr;
    const auto& g = var_.grad().local();
    SHARD_CHECK(g.is_contiguous(), "Parameter::grad", "non-contiguous gradient");
    SHARD_CHECK(g.device() == var_.local().device(), "Parameter::grad", "gradient on {} but the parameter on {}",
                g.device(), var_.local().device());
    return g.data();
  }
  void zero_grad() const override { var_.zero_grad(); }
  const DeviceMesh& mesh() const override { return var_.value().mesh(); }
  const DistSpec& spec() const override { return var_.value().spec(); }
  void to(Device dev) const override {
    if (dev == device()) return;
    var_.zero_grad();
    var_.replace_value(var_.value().to(dev));
  }
  Tensor<T, 1> value_flat() const override { return var_.local().template reshape<1>({numel()}); }
  Tensor<T, 1> grad_flat() const override {
    if (!var_.has_grad()) return {};
    return var_.grad().local().contiguous().template reshape<1>({numel()});
  }
  Tensor<T, 1> full_value_host() const override { return flat_host(var_.value()); }
  Tensor<T, 1> full_grad_host() const override {
    if (!var_.has_grad()) return {};
    return flat_host(var_.grad());
  }
  void assign_from_full(const T* whole) const override {
    const auto& spec = var_.value().spec();
    const auto g = DistTensor<T, R>::from_vec(spec.global_shape());
    const auto& box = spec.local_box();
    auto all = Tensor<T, R>::view(const_cast<T*>(whole), g, Device::cpu());
    var_.local().copy_from(all.slice(DistTensor<T, R>::from_vec(box.lo), DistTensor<T, R>::from_vec(box.len)));
  }
  const autograd::Var<T, R>& var() const { return var_; }

 private:
  static Tensor<T, 1> flat_host(const DistTensor<T, R>& v) {
    Tensor<T, R> full = v.full_tensor();
    if (!full.device().is_cpu()) full = full.to(Device::cpu());
    full = full.contiguous();
    return full.template reshape<1>({full.numel()});
  }
  autograd::Var<T, R> var_;
};

/// A named parameter.
template <class T>
struct NamedParameter {
  std::string name;
  std::shared_ptr<ParameterBase<T>> param;
};

}  // namespace shard::nn
