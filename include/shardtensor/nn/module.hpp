#pragma once
/// \file module.hpp
/// Module<T>: a tree of named parameters and submodules with deterministic initialisation,
/// train/eval mode, and save/load of parameters. Concrete modules define their own forward().
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/nn/functional/cast.hpp"
#include "shardtensor/nn/parameter.hpp"

namespace shard::nn {

/// 64-bit FNV-1a of a string, mixed with a seed: per-parameter seeds from names.
std::uint64_t seed_for(std::uint64_t seed, const std::string& name) noexcept;

/// Base of all modules. T is the compute (activation) dtype; parameters are held in
/// `param_type` = master_t<T>: f32 masters for a bf16 / f16 model, T otherwise. A layer reads a
/// parameter through compute_copy(), which casts it to T on the tape (the gradient comes back in
/// f32 to the master; optimisers, gradient reductions and checkpoints see f32 only).
template <class T>
class Module {
 public:
  using value_type = T;
  using param_type = master_t<T>;
  virtual ~Module() = default;

  /// All parameters of this module and its submodules, named "sub.sub.param", in registration order.
  std::vector<NamedParameter<param_type>> named_parameters() const {
    std::vector<NamedParameter<param_type>> out;
    collect("", out);
    return out;
  }
  /// All parameters (unnamed).
  std::vector<std::shared_ptr<ParameterBase<param_type>>> parameters() const {
    std::vector<std::shared_ptr<ParameterBase<param_type>>> out;
    for (auto& np : named_parameters()) out.push_back(np.param);
    return out;
  }
  /// Total number of scalar parameters.
  index_t num_parameters() const {
    index_t n = 0;
    for (auto& p : parameters()) n += p->numel();
    return n;
  }
  void zero_grad() const {
    for (auto& p : parameters()) p->zero_grad();
  }
  /// Moves every parameter to `dev` (collective-free; gradients are dropped). Optimisers made
  /// before the move hold state for the old device: create them after moving the model.
  void to(Device dev) const {
    for (auto& p : parameters()) p->to(dev);
    clear_cast_caches();
  }
  /// The device of the first parameter (CPU for a module without parameters).
  Device device() const {
    auto ps = parameters();
    return ps.empty() ? Device::cpu() : ps.front()->device();
  }
  /// Turns the per-step cache of compute_copy() off (every use converts again) or back on, for
  /// this module and its submodules.
  void cache_compute_copies(bool on) const {
    cache_casts_ = on;
    cast_cache_.clear();
    for (auto& [n, m] : children_) m->cache_compute_copies(on);
  }
  /// Drops the cached low-precision copies of this module's and its submodules' parameters.
  void clear_cast_caches() const {
    cast_cache_.clear();
    for (auto& [n, m] : children_) m->clear_cast_caches();
  }
  /// Training mode (norms use batch statistics) or evaluation mode.
  void train(bool on = true) {
    training_ = on;
    for (auto& [n, m] : children_) m->train(on);
  }
  void eval() { train(false); }
  bool is_training() const { return training_; }

  /// Writes every parameter to `path` (rank 0 of the parameters' mesh writes; collective).
  void save(const std::string& path) const;
  /// Reads parameters written by save(); names and shapes must match (collective; rank 0 reads and
  /// broadcasts; a mismatch throws shard::Error on every rank).
  void load(const std::string& path) const;

 protected:
  /// Registers a trainable parameter (a Replicate Var with requires_grad).
  template <int R>
  autograd::Var<param_type, R> register_parameter(const std::string& name, autograd::Var<param_type, R> v) {
    params_.push_back({name, std::make_shared<Parameter<param_type, R>>(v)});
    return v;
  }
  /// The parameter `p` in the compute dtype T: p itself when T is param_type, else a cast on the
  /// tape (its gradient arrives in f32 at p). The converted value is cached per parameter and
  /// version: every use until the master changes (an optimiser step, a load, a copy_from: each
  /// bumps its version) shares one low-precision copy, converted once per step; each use records
  /// its own cast node, so gradients and freed graphs are unaffected.
  template <int R>
  autograd::Var<T, R> compute_copy(const autograd::Var<param_type, R>& p) const;
  /// A new Replicate parameter with values U(-bound, bound) from (seed, name): identical on every rank
  /// and at every rank count.
  template <int R>
  autograd::Var<param_type, R> make_parameter(const std::string& name, const DeviceMesh& mesh, const Shape<R>& shape,
                                     std::uint64_t seed, double bound) {
    std::vector<Placement> rep(static_cast<std::size_t>(mesh.ndim()), Replicate());
    auto value =
        DistTensor<param_type, R>::random(shape, mesh, rep, seed_for(seed, name), RandomInit::uniform(-bound, bound));
    return register_parameter(name, autograd::Var<param_type, R>(value, true));
  }
  /// A new parameter laid out by `placements` (Replicate or Shard per mesh dim; balanced blocks)
  /// with values U(-bound, bound) from (seed, name) as a function of the global index: the same
  /// global parameter at every rank count and mesh shape.
  template <int R>
  autograd::Var<param_type, R> make_sharded_parameter(const std::string& name, const DeviceMesh& mesh, const Shape<R>& shape,
                                             std::vector<Placement> placements, std::uint64_t seed, double bound) {
    auto value = DistTensor<param_type, R>::random(shape, mesh, std::move(placements), seed_for(seed, name),
                                                   RandomInit::uniform(-bound, bound));
    return register_parameter(name, autograd::Var<param_type, R>(value, true));
  }
  /// A new Replicate parameter filled with `v`.
  template <int R>
  autograd::Var<param_type, R> make_constant_parameter(const std::string& name, const DeviceMesh& mesh,
                                                       const Shape<R>& shape, param_type v) {
    std::vector<Placement> rep(static_cast<std::size_t>(mesh.ndim()), Replicate());
    auto value = DistTensor<param_type, R>::zeros(shape, mesh, rep);
    value.local().fill(v);
    return register_parameter(name, autograd::Var<param_type, R>(value, true));
  }
  /// Registers a child module.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, std::vector<NamedParameter<param_type>>& out) const {
    for (auto& np : params_) out.push_back({prefix + np.name, np.param});
    for (auto& [n, m] : children_) m->collect(prefix + n + ".", out);
  }
  std::vector<NamedParameter<param_type>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module<T>>>> children_;
  bool training_ = true;
  /// compute_copy()'s cache: per master storage (the entry holds the master's block, so the
  /// address cannot be reused while it exists), its version and the converted value.
  struct CastEntry {
    std::shared_ptr<void> master;  // the master's local Tensor (keeps its storage alive)
    std::uint64_t version = 0;
    std::shared_ptr<void> value;   // DistTensor<T, R> of the converted value
  };
  mutable std::map<const void*, CastEntry> cast_cache_;
  mutable bool cache_casts_ = true;
};

/// A module mapping Var<T,R> -> Var<T,R> (what Sequential chains).
template <class T, int R>
class UnaryModule : public Module<T> {
 public:
  virtual autograd::Var<T, R> forward(const autograd::Var<T, R>& x) = 0;
  autograd::Var<T, R> operator()(const autograd::Var<T, R>& x) { return forward(x); }
};

/// Writes/reads a list of named parameters (the format behind Module::save/load):
/// "SHTP" magic, u32 version, u64 count, then per parameter: u32 name length, name, u8 dtype,
/// u32 rank, i64 extents, raw little-endian data.
template <class T>
void save_parameters(const std::vector<NamedParameter<T>>& params, const std::string& path);
template <class T>
void load_parameters(const std::vector<NamedParameter<T>>& params, const std::string& path);

template <class T>
template <int R>
autograd::Var<T, R> Module<T>::compute_copy(const autograd::Var<param_type, R>& p) const {
  if constexpr (std::is_same_v<T, param_type>) {
    return p;
  } else {
    if (!cache_casts_) return nn::functional::cast<T>(p);
    const DistTensor<param_type, R>& master = p.value();
    const auto& ml = master.local();
    CastEntry& e = cast_cache_[static_cast<const void*>(ml.data())];
    const auto* held = static_cast<const Tensor<param_type, R>*>(e.master.get());
    if (!e.value || !held || held->data() != ml.data() || e.version != ml.version() ||
        static_cast<const DistTensor<T, R>*>(e.value.get())->spec() != master.spec()) {
      e.master = std::make_shared<Tensor<param_type, R>>(ml);
      e.version = ml.version();
      e.value = std::make_shared<DistTensor<T, R>>(shard::cast<T>(master));
    }
    const DistTensor<T, R>& v = *static_cast<const DistTensor<T, R>*>(e.value.get());
    return autograd::Var<T, R>::make(v, "cast", {p.ref()}, [p](const DistTensor<T, R>& gin) {
      p.accumulate_grad(shard::cast<param_type>(gin));
    });
  }
}

template <class T>
void Module<T>::save(const std::string& path) const {
  save_parameters(named_parameters(), path);
}
template <class T>
void Module<T>::load(const std::string& path) const {
  load_parameters(named_parameters(), path);
}

}  // namespace shard::nn
