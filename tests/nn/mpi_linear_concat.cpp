// MPI tests of channel mixing (channel_linear on N, C, spatial...; linear on tokens) and concat:
// sharded forward and every gradient (input, weight, bias) equal the unsharded computation at 1..4
// ranks on 1-D and 2-D meshes, fp64 finite differences on sharded layouts, bad input on every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_nn_mpi_linear_concat {

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;

namespace {

// Token placements [N, L, C] derived from the activation layout: spatial shards become Shard(1).
std::vector<Placement> token_placements(const fn::Layout& L) {
  auto p = L.act;
  for (auto& x : p)
    if (x.is_shard() && x.dim >= 2) x = Shard(1);
  return p;
}

template <class T>
Body<T> linear_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    auto w = c.template param<2>({5, s[1]});
    auto w2 = c.template param<2>({s[1], 5});
    auto b = c.template param<1>({5});
    c.output(F::channel_linear(x, w, b));
    c.output(F::channel_linear(F::gelu(F::channel_linear(x, w)), w2));
    auto tok = c.template input<3>({s[0], s[2] * 2, s[1]}, token_placements(c.layout()), {}, true);
    c.output(F::linear(tok, w, b));
    c.output(F::layer_norm(F::linear(tok, w), b, std::nullopt, 1e-5, -1));
  };
}

template <class T>
Body<T> concat_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    auto y = c.template act<4>({s[0], 2, s[2], s[3]});
    auto z = c.template act<4>({s[0], 1, s[2], s[3]}, false);
    c.output(F::concat({x, y, z, F::relu(x)}));
    c.output(F::concat(F::sum(x, {2}), F::sum(y, {2})));  // Partial(sum) inputs on spatial-H layouts
  };
}

}  // namespace

TEMPLATE_TEST_CASE("sharded channel mixing equals the unsharded computation", "[nn][linear][mpi]", float, double) {
  for (Shape<4> s : {Shape<4>{2, 3, 7, 9}, Shape<4>{3, 4, 9, 5}}) {
    INFO("global shape " << fmt::format("{}", s));
    fn::check_sharded<TestType, 4>(linear_body<TestType>(s), s);
  }
}

TEMPLATE_TEST_CASE("sharded concat equals the unsharded computation", "[nn][concat][mpi]", float, double) {
  const Shape<4> s{2, 3, 7, 9};
  fn::check_sharded<TestType, 4>(concat_body<TestType>(s), s);
}

TEST_CASE("sharded channel mixing and concat gradients match finite differences", "[nn][linear][concat][fd][mpi]") {
  const Shape<4> s{2, 2, 5, 3};
  const std::vector<std::string> names{"1d-Shard(2)", "1d-Shard(2)-empty-first", "2x2-spatial", "2x2-data-domain"};
  fn::check_fd_sharded<4>(linear_body<double>(s), s, names);
  fn::check_fd_sharded<4>(concat_body<double>(s), s, names);
}

TEST_CASE("sharded channel mixing and concat refuse bad input on every rank", "[nn][linear][concat][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    using V = autograd::Var<double, 4>;
    const Shape<4> s{2, 3, 7, 9};
    V x(DistTensor<double, 4>::random(s, mesh, {Shard(2)}, 1), true);
    V xw(DistTensor<double, 4>::random(s, mesh, {Shard(3)}, 1), true);
    V other(DistTensor<double, 4>::random({2, 3, 8, 9}, mesh, {Shard(2)}, 1), true);
    autograd::Var<double, 2> w_bad(DistTensor<double, 2>::random({5, 4}, mesh, {Replicate()}, 2), true);
    autograd::Var<double, 2> w(DistTensor<double, 2>::random({5, 3}, mesh, {Replicate()}, 2), true);
    autograd::Var<double, 1> b_bad(DistTensor<double, 1>::random({4}, mesh, {Replicate()}, 3), true);
    CHECK_THROWS_AS(F::channel_linear(x, w_bad), shard::Error);  // channel counts
    CHECK_THROWS_AS(F::channel_linear(x, w, b_bad), shard::Error);
    CHECK_THROWS_AS(F::concat(x, other), shard::Error);          // spatial extents
    CHECK_THROWS_AS(F::concat(x, xw), shard::Error);             // placements
    CHECK_THROWS_AS(F::concat(x, x, 2), shard::Error);           // along a sharded dim
    auto y = F::concat(x, F::channel_linear(x, w));              // still works afterwards
    CHECK_NOTHROW(F::sum(y).backward());
  });
}

}  // namespace st_nn_mpi_linear_concat
