// Saved-tensor safety across ranks (issue 8): a saved tensor modified on ONE rank between forward
// and backward makes backward throw the same shard::Error on every rank (the version check is
// agreed on before any node runs, so no rank is left waiting in the graph's halo exchanges or
// reductions), at 1..4 ranks on 1-D and 2-D meshes with uneven shards. Also: the snapshot default
// for user views gives the gradient of the unmodified data when every rank overwrites its array.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <vector>

#include <shardtensor/nn/functional.hpp>

#include "support/mpi_harness.hpp"

namespace st_autograd_mpi_saved_versions {

using namespace shard;
using autograd::Var;
using Catch::Matchers::ContainsSubstring;
using shard::test::error_of;
using shard::test::for_each_comm_size;
using V4 = Var<double, 4>;
using D4 = DistTensor<double, 4>;

namespace {
const Shape<4> xshape{1, 2, 11, 7};  // 11 rows over 3 or 4 ranks: uneven shards

struct Layout {
  std::vector<int> mesh_shape;
  std::vector<Placement> placements;
};
std::vector<Layout> layouts(int P) {
  std::vector<Layout> ls{{{P}, {Shard(2)}}};
  if (P == 4) ls.push_back({{2, 2}, {Shard(2), Shard(3)}});
  return ls;
}

/// loss = sum(conv(x, w) * t) on the mesh; x saved by conv (for dw), w saved (for dx).
Var<double, 1> conv_loss(const V4& x, const V4& w, const V4& t) {
  F::ConvOptions<2> o;
  o.pad_lo = {1, 1};
  o.pad_hi = {1, 1};
  return F::sum(F::mul(F::conv(x, w, std::nullopt, o), t));
}
}  // namespace

TEST_CASE("a saved input modified on one rank makes backward throw on every rank, without a hang",
          "[autograd][versions][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    for (const auto& L : layouts(P)) {
      for (int culprit = 0; culprit < P; ++culprit) {
        INFO(P << " ranks, mesh of " << L.mesh_shape.size() << " dims, rank " << culprit << " modifies its shard");
        DeviceMesh mesh(comm, L.mesh_shape);
        std::vector<Placement> rep(L.mesh_shape.size(), Replicate());
        V4 x(D4::random(xshape, mesh, L.placements, 3), false);
        V4 w(D4::random({3, 2, 3, 3}, mesh, rep, 4), true);
        V4 t(D4::random({1, 3, 11, 7}, mesh, L.placements, 5), false);
        auto loss = conv_loss(x, w, t);
        if (comm->rank() == culprit) x.value().local().fill(0.5);  // a library in-place write, one rank
        const std::string err = error_of([&] { loss.backward(); });
        CHECK_THAT(err, ContainsSubstring("conv2d") && ContainsSubstring("modified in place"));
        if (P > 1) CHECK_THAT(err, ContainsSubstring(fmt::format("detected on rank {} of {}", culprit, P)));
        CHECK_FALSE(w.has_grad());
        // The same data, unmodified, still trains (the communicator is healthy after the error).
        auto again = conv_loss(x, w, t);
        REQUIRE(error_of([&] { again.backward(); }).empty());
        CHECK(w.has_grad());
      }
    }
  });
}

TEST_CASE("a user write with mark_modified on one rank's stable view is refused on every rank",
          "[autograd][versions][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, {P});
    const DistSpec spec(mesh, {Shard(2)}, {1, 2, 11, 7});
    const auto len = spec.local_box().len;
    std::vector<double> field(static_cast<std::size_t>(std::max<index_t>(1, numel(D4::from_vec(len)))));
    auto view = Tensor<double, 4>::view(field.data(), D4::from_vec(len)).declare_stable();
    view.fill_random(3, D4::from_vec(spec.local_box().lo), xshape);
    V4 x(D4::from_local(view, mesh, {Shard(2)}), false);
    V4 w(D4::random({3, 2, 3, 3}, mesh, {Replicate()}, 4), true);
    V4 t(D4::random({1, 3, 11, 7}, mesh, {Shard(2)}, 5), false);
    auto loss = conv_loss(x, w, t);
    const int culprit = P - 1;
    if (comm->rank() == culprit) {
      field[0] += 1.0;
      mark_modified(view);
    }
    const std::string err = error_of([&] { loss.backward(); });
    CHECK_THAT(err, ContainsSubstring("modified in place"));
    if (P > 1) CHECK_THAT(err, ContainsSubstring(fmt::format("detected on rank {} of {}", culprit, P)));
  });
}

TEST_CASE("user views are snapshotted by default: overwriting them after forward leaves the gradient exact",
          "[autograd][versions][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    for (const auto& L : layouts(P)) {
      INFO(P << " ranks, mesh of " << L.mesh_shape.size() << " dims");
      DeviceMesh mesh(comm, L.mesh_shape);
      std::vector<Placement> rep(L.mesh_shape.size(), Replicate());
      const D4 xd = D4::random(xshape, mesh, L.placements, 3);
      V4 t(D4::random({1, 3, 11, 7}, mesh, L.placements, 5), false);
      // Oracle: the same sharded computation from library memory, nothing modified.
      V4 w0(D4::random({3, 2, 3, 3}, mesh, rep, 4), true);
      conv_loss(V4(xd, false), w0, t).backward();
      // The user's array (a copy of the same shard), viewed zero-copy and overwritten after forward.
      const auto shp = xd.local().shape();
      std::vector<double> field(static_cast<std::size_t>(std::max<index_t>(1, numel(shp))));
      auto view = Tensor<double, 4>::view(field.data(), shp);
      view.copy_from(xd.local());
      V4 x(D4::from_local(view, mesh, L.placements, xd.spec().sizes()), false);
      V4 w(D4::random({3, 2, 3, 3}, mesh, rep, 4), true);
      auto loss = conv_loss(x, w, t);
      for (auto& v : field) v = 1e3;
      REQUIRE(error_of([&] { loss.backward(); }).empty());
      CHECK(max_rel_diff(w.grad().local(), w0.grad().local()) == 0.0);
    }
  });
}

}  // namespace st_autograd_mpi_saved_versions
