#pragma once
/// \file parameter.hpp
/// Parameter handles: a rank-erased view of a replicated trainable Var, for optimisers and I/O.
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/autograd/variable.hpp"

namespace shard::nn {

/// Rank-erased access to one trainable parameter (a Replicate Var): its local block is the whole
/// parameter and is identical on every rank.
template <class T>
class ParameterBase {
 public:
  virtual ~ParameterBase() = default;
  /// Element count.
  virtual index_t numel() const = 0;
  /// Global shape.
  virtual std::vector<index_t> shape() const = 0;
  /// The device the value and gradient live on.
  virtual Device device() const = 0;
  /// Contiguous data of the value on device() (updated in place by optimisers).
  virtual T* data() const = 0;
  /// Contiguous data of the gradient on device(), or nullptr if backward did not reach it.
  virtual const T* grad() const = 0;
  virtual void zero_grad() const = 0;
  /// The mesh the parameter is replicated over.
  virtual const DeviceMesh& mesh() const = 0;
  /// Moves the value (and drops any gradient) to `dev`.
  virtual void to(Device dev) const = 0;
  /// The value as a flat rank-1 view on its device.
  virtual Tensor<T, 1> value_flat() const = 0;
  /// The gradient as a flat rank-1 tensor on its device (empty when backward did not reach it).
  virtual Tensor<T, 1> grad_flat() const = 0;
};

/// A parameter of rank R.
template <class T, int R>
class Parameter final : public ParameterBase<T> {
 public:
  explicit Parameter(autograd::Var<T, R> v) : var_(std::move(v)) {
    for (auto& p : var_.value().placements())
      SHARD_CHECK(p.is_replicate(), "Parameter", "parameters must be Replicate on every mesh dim, got {}", p);
    SHARD_CHECK(var_.local().is_contiguous(), "Parameter", "parameters must be contiguous tensors");
  }
  index_t numel() const override { return var_.local().numel(); }
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
  const autograd::Var<T, R>& var() const { return var_; }

 private:
  autograd::Var<T, R> var_;
};

/// A named parameter.
template <class T>
struct NamedParameter {
  std::string name;
  std::shared_ptr<ParameterBase<T>> param;
};

}  // namespace shard::nn
