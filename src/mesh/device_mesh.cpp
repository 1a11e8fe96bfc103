#include "shardtensor/mesh/device_mesh.hpp"

#include "shardtensor/core/error.hpp"

namespace shard {

DeviceMesh::DeviceMesh(CommPtr comm, std::vector<int> shape, std::vector<std::string> names)
    : impl_(std::make_shared<Impl>()) {
  SHARD_CHECK(comm != nullptr, "DeviceMesh", "null communicator");
  if (shape.empty()) shape = {comm->size()};
  long prod = 1;
  bool positive = true;
  for (int s : shape) {
    positive = positive && s >= 1;
    prod *= s;
  }
  if (names.empty())
    for (std::size_t i = 0; i < shape.size(); ++i) names.push_back(fmt::format("d{}", i));
  // Every check is collective (one allgather + check_all), so that a rank whose arguments are bad
  // while the others' are fine cannot leave the others blocked in a later collective.
  std::string err;
  if (!positive) {
    err = fmt::format("mesh shape {} has a non-positive extent", shape);
  } else if (prod != comm->size()) {
    err = fmt::format("mesh shape {} holds {} ranks but the communicator has {} (the mesh must match the communicator)",
                      shape, prod, comm->size());
  } else if (names.size() != shape.size()) {
    err = fmt::format("{} dim names for a {}-D mesh {}", names.size(), shape.size(), shape);
  }
  // Gather (locally ok?, shape...) so that a rank with a bad shape reports its own error rather
  // than the others reporting a disagreement.
  std::vector<index_t> mine = {err.empty() ? 1 : 0};
  mine.insert(mine.end(), shape.begin(), shape.end());
  const auto all = comm->allgather_vectors(mine);
  bool all_ok = true;
  for (const auto& v : all) all_ok = all_ok && v[0] == 1;
  for (std::size_t r = 0; r < all.size() && err.empty() && all_ok; ++r)
    if (all[r] != mine)
      err = fmt::format("mesh shape {} differs from rank {}'s {} (every rank must pass the same shape)", shape, r,
                        std::vector<index_t>(all[r].begin() + 1, all[r].end()));
  comm->check_all(err.empty(), "DeviceMesh", err);

  impl_->comm = std::move(comm);
  impl_->shape = std::move(shape);
  impl_->names = std::move(names);
  impl_->coords = coords_of(impl_->comm->rank());
  for (int m = 0; m < ndim(); ++m) impl_->dim_comms.push_back(dims_comm({m}));
}

DeviceMesh DeviceMesh::world(std::vector<int> shape, std::vector<std::string> names) {
  return DeviceMesh(default_comm(), std::move(shape), std::move(names));
}

int DeviceMesh::dim_index(const std::string& name) const {
  for (int m = 0; m < ndim(); ++m)
    if (impl_->names[static_cast<std::size_t>(m)] == name) return m;
  SHARD_FAIL("DeviceMesh::dim_index", "no mesh dim named '{}' (dims are {})", name, impl_->names);
}

std::vector<int> DeviceMesh::coords_of(int r) const {
  SHARD_CHECK(r >= 0 && r < size(), "DeviceMesh::coords_of", "rank {} out of range for {} ranks", r, size());
  std::vector<int> c(impl_->shape.size());
  for (int m = ndim() - 1; m >= 0; --m) {
    c[static_cast<std::size_t>(m)] = r % size(m);
    r /= size(m);
  }
  return c;
}

int DeviceMesh::rank_of(const std::vector<int>& c) const {
  SHARD_CHECK(static_cast<int>(c.size()) == ndim(), "DeviceMesh::rank_of", "{} coords for a {}-D mesh", c.size(),
              ndim());
  int r = 0;
  for (int m = 0; m < ndim(); ++m) {
    SHARD_CHECK(c[static_cast<std::size_t>(m)] >= 0 && c[static_cast<std::size_t>(m)] < size(m),
                "DeviceMesh::rank_of", "coords {} outside mesh {}", c, shape());
    r = r * size(m) + c[static_cast<std::size_t>(m)];
  }
  return r;
}

CommPtr DeviceMesh::dims_comm(std::vector<int> dims) const {
  // The cache key is the sorted set of mesh dims (any number of dims: no bit masks, which would
  // overflow at 32+ mesh dims and alias dim m with dim m mod 32).
  std::vector<char> in_set(static_cast<std::size_t>(ndim()), 0);
  for (int m : dims) {
    SHARD_CHECK(m >= 0 && m < ndim(), "DeviceMesh::dims_comm", "mesh dim {} out of range for {}-D mesh", m, ndim());
    in_set[static_cast<std::size_t>(m)] = 1;
  }
  std::vector<int> key_dims;
  for (int m = 0; m < ndim(); ++m)
    if (in_set[static_cast<std::size_t>(m)]) key_dims.push_back(m);
  // Held across the split too: two first uses racing on one rank must not both split.
  std::lock_guard<std::mutex> lock(impl_->set_comms_mutex);
  auto it = impl_->set_comms.find(key_dims);
  if (it != impl_->set_comms.end()) return it->second;
  int color = 0, key = 0;
  for (int m = 0; m < ndim(); ++m) {
    const int c = impl_->coords[static_cast<std::size_t>(m)];
    if (in_set[static_cast<std::size_t>(m)]) key = key * size(m) + c;
    else color = color * size(m) + c;
  }
  const bool whole = static_cast<int>(key_dims.size()) == ndim();
  CommPtr sub = whole ? impl_->comm : impl_->comm->split(color, key);
  if (!whole) sub->set_name(fmt::format("mesh {} dims {}", impl_->shape, key_dims));
  impl_->set_comms.emplace(std::move(key_dims), sub);
  return sub;
}

}  // namespace shard
