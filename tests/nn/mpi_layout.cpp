// MPI tests of the communication-free layout ops (nn/functional/layout.hpp): permute,
// channels_last / channels_first, unflatten / flatten. Sharded forward and every gradient equal
// the unsharded computation at 1..4 ranks on 1-D and 2-D meshes (uneven and empty shards, data x
// domain, two mesh dims on one tensor dim), fp64 finite differences, bad input on every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_nn_mpi_layout {

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;

namespace {

template <class T>
Body<T> layout_body_4d(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    auto t = F::channels_last(x);  // [N, H, W, C]
    c.output(t);
    c.output(F::channels_first(F::mul(t, t)));
    c.output(F::permute(x, std::array<int, 4>{3, 1, 0, 2}));  // a sharded dim moves to the front
    // tokens -> heads -> back, through a channel-mixing op (the attention module's layout path)
    auto w = c.template param<2>({6, s[1]});
    auto h = F::unflatten(F::linear(t, w), 3, 2, 3);  // [N, H, W, 2, 3]
    c.output(F::mul(h, h));
    c.output(F::channels_first(F::flatten(F::exp(h), 3)));
    c.output(F::flatten(F::unflatten(x, 1, 1, s[1]), 1));  // [N, 1 * C, H, W]: merge of unsharded dims
  };
}

template <class T>
Body<T> layout_body_5d(const Shape<5>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<5>(s);
    auto t = F::channels_last(x);
    c.output(F::add(t, t));
    c.output(F::channels_first(F::tanh(t)));
    c.output(F::unflatten(t, 4, 1, s[1]));
  };
}

}  // namespace

TEMPLATE_TEST_CASE("layout ops: permute, channels_last/first, unflatten/flatten equal the unsharded computation",
                   "[nn][layout][sharded][mpi]", float, double) {
  const Shape<4> s4{2, 3, 7, 5};
  fn::check_sharded<TestType, 4>(layout_body_4d<TestType>(s4), s4);
  const Shape<5> s5{2, 2, 5, 3, 4};
  fn::check_sharded<TestType, 5>(layout_body_5d<TestType>(s5), s5);
}

TEST_CASE("layout op gradients match finite differences", "[nn][layout][fd][mpi]") {
  const Shape<4> s{2, 2, 5, 3};
  const std::vector<std::string> names{"1d-Shard(2)", "1d-Shard(2)-empty-first", "2x2-spatial", "2x2-data-domain"};
  fn::check_fd_sharded<4>(layout_body_4d<double>(s), s, names);
}

TEST_CASE("layout ops keep shard sizes and refuse bad input on every rank", "[nn][layout][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    using V = autograd::Var<double, 4>;
    const Shape<4> s{2, 6, 7, 9};
    V x(DistTensor<double, 4>::random(s, mesh, {Shard(2)}, 1), true);
    auto t = F::channels_last(x);
    CHECK(t.value().placements() == std::vector<Placement>{Shard(1)});
    CHECK(t.value().spec().layout(1) == x.value().spec().layout(2));
    CHECK(t.value().global_shape() == Shape<4>{2, 7, 9, 6});
    CHECK_THROWS_AS(F::permute(x, std::array<int, 4>{0, 1, 1, 2}), shard::Error);  // not a permutation
    CHECK_THROWS_AS(F::unflatten(t, 3, 4, 2), shard::Error);                      // 4 * 2 != 6
    CHECK_THROWS_AS(F::unflatten(t, 1, 7, 1), shard::Error);                      // sharded dim
    CHECK_THROWS_AS(F::flatten(t, 0), shard::Error);                              // merges a sharded dim
    auto h = F::unflatten(t, 3, 2, 3);
    CHECK(h.value().placements() == std::vector<Placement>{Shard(1)});
    CHECK_NOTHROW(F::sum(F::channels_first(F::flatten(h, 3))).backward());
    CHECK(x.grad().spec() == x.value().spec());
  });
}

}  // namespace st_nn_mpi_layout
