#pragma once
// Private to src/dist: the per-process cache of communication plans (redistribute plans in
// redistribute.cpp, halo plans in halo_plan.cpp). A plan is keyed by a vector of integers that
// starts with mesh_key(mesh) (the mesh's communicator, this rank, the mesh shape) followed by
// whatever the plan depends on. An entry whose communicator has been destroyed is stale (a new
// communicator may reuse its address) and is rebuilt; at capacity stale entries are dropped
// first, then everything (plans are cheap to rebuild, the bound only caps memory).
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "shardtensor/dist/dist_spec.hpp"
#include "shardtensor/mesh/device_mesh.hpp"

namespace shard::detail {

/// The key prefix of every plan on `mesh`: communicator identity, this rank, mesh shape.
inline std::vector<index_t> mesh_key(const DeviceMesh& mesh) {
  std::vector<index_t> key;
  key.reserve(64);
  key.push_back(static_cast<index_t>(reinterpret_cast<std::uintptr_t>(mesh.comm().get())));
  key.push_back(mesh.rank());
  key.insert(key.end(), mesh.shape().begin(), mesh.shape().end());
  return key;
}

/// Appends what identifies `s` inside a key: global shape, placements and every part size.
inline void append_spec_key(std::vector<index_t>& k, const DistSpec& s) {
  k.push_back(s.ndim());
  k.insert(k.end(), s.global_shape().begin(), s.global_shape().end());
  for (const auto& p : s.placements()) {
    k.push_back(static_cast<index_t>(p.kind));
    k.push_back(p.is_shard() ? p.dim : -1);
    k.push_back(p.is_partial() ? static_cast<index_t>(p.op) : -1);
  }
  for (const auto& l : s.layouts()) {
    k.push_back(l.parts());
    for (index_t q = 0; q < l.parts(); ++q) k.push_back(l.size(q));
  }
}

template <class Plan>
class PlanCache {
 public:
  explicit PlanCache(std::size_t capacity) : capacity_(capacity) {}

  /// The cached plan of `key` on `mesh`, or build() (returning shared_ptr<const Plan> or
  /// convertible) stored and returned. build() runs outside the lock.
  template <class Build>
  std::shared_ptr<const Plan> get(std::vector<index_t> key, const DeviceMesh& mesh, Build&& build) {
    {
      std::lock_guard lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end() && !it->second.comm.expired()) return it->second.plan;
    }
    std::shared_ptr<const Plan> plan = build();
    std::lock_guard lock(mu_);
    if (map_.size() >= capacity_) {
      std::erase_if(map_, [](const auto& kv) { return kv.second.comm.expired(); });
      if (map_.size() >= capacity_) map_.clear();
    }
    map_[std::move(key)] = Entry{mesh.comm(), plan};
    return plan;
  }

  std::size_t size() {
    std::lock_guard lock(mu_);
    return map_.size();
  }

 private:
  struct Entry {
    std::weak_ptr<Communicator> comm;  // the mesh's; an expired entry is stale
    std::shared_ptr<const Plan> plan;
  };
  std::mutex mu_;
  std::map<std::vector<index_t>, Entry> map_;
  std::size_t capacity_;
};

}  // namespace shard::detail
