// Meshes with 32 and more dims (issue 8, item 7): the sub-communicator cache of DeviceMesh was
// keyed by a 32-bit mask (`1u << m`), so dim 32 aliased dim 0 (wrong full_tensor, 2-3x weight
// gradients) and a 40-dim mesh hung. Meshes of 33 and 40 dims, most of extent 1 and the ranks on
// dims at or beyond bit 32 (and on a dim that bit 32 would alias): dim_comm / dims_comm
// membership, full_tensor, redistribute round trips, and conv + max_pool forward and every
// gradient against the unsharded computation at 1..4 ranks.
#include <catch2/catch_test_macros.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_mesh_mpi_many_dim_mesh {

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;
using fn::Layout;

namespace {

/// A mesh of `nd` dims, all of extent 1 except `big` (dim -> extent).
std::vector<int> sparse_shape(int nd, const std::vector<std::pair<int, int>>& big) {
  std::vector<int> s(static_cast<std::size_t>(nd), 1);
  for (auto [m, n] : big) s[static_cast<std::size_t>(m)] = n;
  return s;
}

/// The mesh shapes of one communicator size p: the ranks on dim 0, on dim 32 (which a 32-bit mask
/// aliases with dim 0), on the last dim, and (p = 4) split 2 x 2 over dims 0 and 32 / 3 and 37.
std::vector<std::vector<int>> many_dim_shapes(int p) {
  std::vector<std::vector<int>> out;
  for (int nd : {33, 40}) {
    out.push_back(sparse_shape(nd, {{0, p}}));
    out.push_back(sparse_shape(nd, {{32, p}}));
    out.push_back(sparse_shape(nd, {{nd - 1, p}}));
    if (p == 4) {
      out.push_back(sparse_shape(nd, {{0, 2}, {32, 2}}));
      out.push_back(sparse_shape(nd, {{3, 2}, {nd - 3, 2}}));
    }
  }
  return out;
}

/// Checks `sub` holds the mesh ranks sharing this rank's coordinates outside `dims`, ordered
/// row-major over `dims` (ascending).
void check_group(const DeviceMesh& mesh, const CommPtr& sub, std::vector<int> dims) {
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  int want_size = 1, want_rank = 0;
  for (int m : dims) {
    want_size *= mesh.size(m);
    want_rank = want_rank * mesh.size(m) + mesh.coord(m);
  }
  REQUIRE(sub->size() == want_size);
  CHECK(sub->rank() == want_rank);
  const auto members = sub->allgather_value<int>(mesh.rank());
  for (int g = 0; g < want_size; ++g) {
    auto c = mesh.coords();
    int rem = g;
    for (int k = static_cast<int>(dims.size()) - 1; k >= 0; --k) {
      const int m = dims[static_cast<std::size_t>(k)];
      c[static_cast<std::size_t>(m)] = rem % mesh.size(m);
      rem /= mesh.size(m);
    }
    CHECK(members[static_cast<std::size_t>(g)] == mesh.rank_of(c));
  }
}

/// Placements sharding tensor dims 2 and 3 over the mesh dims of extent > 1 (in order), Replicate
/// elsewhere; dims of extent 1 alternate Replicate / Shard(2) (a one-rank shard is the whole dim).
std::vector<Placement> act_placements(const std::vector<int>& shape) {
  std::vector<Placement> pl;
  int next = 2;
  for (std::size_t m = 0; m < shape.size(); ++m) {
    if (shape[m] > 1) pl.push_back(Shard(next++ == 2 ? 2 : 3));
    else pl.push_back(m % 2 ? Placement(Shard(2)) : Placement(Replicate()));
  }
  return pl;
}

/// conv (weight, bias) then max_pool: a weight gradient that sums over the ranks.
template <class T>
Body<T> conv_pool_body() {
  return [](Ctx<T>& c) {
    auto x = c.template act<4>({2, 3, 9, 7});
    auto y = F::conv(x, c.template param<4>({4, 3, 3, 3}), c.template param<1>({4}), F::ConvOptions<2>::symmetric(1));
    c.output(y);
    PoolParams<2> pp;
    pp.kernel = {2, 2};
    c.output(F::max_pool(y, pp));
  };
}

}  // namespace

TEST_CASE("DeviceMesh with 33 and 40 dims: dim_comm and dims_comm groups", "[mesh][mpi][manydims]") {
  for_each_comm_size([](CommPtr comm) {
    for (const auto& shape : many_dim_shapes(comm->size())) {
      INFO(fmt::format("mesh {} over {} ranks", shape, comm->size()));
      DeviceMesh mesh(comm, shape);
      REQUIRE(mesh.ndim() == static_cast<int>(shape.size()));
      for (int m = 0; m < mesh.ndim(); ++m) check_group(mesh, mesh.dim_comm(m), {m});
      const int nd = mesh.ndim();
      // sets that a 32-bit mask would alias: {0, 32}, {32} vs {0}, {31, 32, 33}, every dim; and
      // unsorted input with duplicates.
      for (const auto& dims : std::vector<std::vector<int>>{
               {0, 32}, {32}, {0}, {31, 32}, {nd - 1, 0}, {nd - 1, nd - 1, 32}, {1, nd - 2, 31, 0}}) {
        INFO(fmt::format("dims {}", dims));
        check_group(mesh, mesh.dims_comm(dims), dims);
      }
      std::vector<int> all(static_cast<std::size_t>(nd));
      for (int m = 0; m < nd; ++m) all[static_cast<std::size_t>(m)] = m;
      CHECK(mesh.dims_comm(all) == mesh.comm());
      CHECK(mesh.dims_comm({0, 32}) == mesh.dims_comm({32, 0}));  // cached by the set
    }
  });
}

TEST_CASE("DeviceMesh with 33 and 40 dims: full_tensor and redistribute round trips", "[mesh][mpi][manydims]") {
  for_each_comm_size([](CommPtr comm) {
    for (const auto& shape : many_dim_shapes(comm->size())) {
      INFO(fmt::format("mesh {} over {} ranks", shape, comm->size()));
      DeviceMesh mesh(comm, shape);
      auto full = Tensor<double, 4>::empty({2, 3, 9, 7});
      full.fill_random(17);
      const auto pl = act_placements(shape);
      // uneven explicit sizes on the dim the ranks shard first
      auto x = DistTensor<double, 4>::distribute(full, mesh, pl);
      auto check_full = [&](const DistTensor<double, 4>& t) {
        const auto got = t.full_tensor();
        REQUIRE(got.shape() == full.shape());
        double err = 0;
        for (index_t i = 0; i < full.numel(); ++i) err = std::max(err, std::abs(got.data()[i] - full.data()[i]));
        CHECK(err == 0.0);
      };
      check_full(x);
      std::vector<Placement> rep(shape.size(), Replicate());
      std::vector<Placement> other(shape.size(), Replicate());
      for (std::size_t m = 0; m < shape.size(); ++m)
        if (shape[m] > 1) other[m] = Shard(1);
      auto r = x.redistribute(rep);
      check_full(r);
      auto o = r.redistribute(other);
      check_full(o);
      auto back = o.redistribute(pl);
      check_full(back);
      // Partial(sum) on every extent-1 dim and on the ranks' dims: parts sum to the tensor.
      std::vector<Placement> part(shape.size(), Replicate());
      for (std::size_t m = 0; m < shape.size(); ++m) part[m] = Partial();
      auto local = full.clone();
      const int p = comm->size();
      scale(local, comm->rank() == 0 ? 1.0 - (p - 1) * 0.25 : 0.25);
      auto partial = DistTensor<double, 4>(DistSpec(mesh, part, {2, 3, 9, 7}), local);
      const auto sum = partial.redistribute(pl).full_tensor();
      double err = 0;
      for (index_t i = 0; i < full.numel(); ++i) err = std::max(err, std::abs(sum.data()[i] - full.data()[i]));
      CHECK(err <= 1e-12);
    }
  });
}

TEST_CASE("DeviceMesh with 33 and 40 dims: conv + max_pool forward and gradients equal the unsharded ones",
          "[mesh][mpi][manydims]") {
  const auto body = conv_pool_body<double>();
  const fn::Result ref = fn::reference<double>(body);
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& shape : many_dim_shapes(comm->size())) {
      const Layout L{fmt::format("{}-D", shape.size()), shape, act_placements(shape), {}};
      INFO(fmt::format("mesh {} over {} ranks, activations {}", shape, comm->size(), L.act));
      DeviceMesh mesh(comm, shape);
      fn::require_match(fn::run_case<double>(mesh, L, body), ref, tol<double>());
    }
  });
}

}  // namespace st_mesh_mpi_many_dim_mesh
