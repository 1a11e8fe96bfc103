// MPI tests of the pointwise ops and activations: sharded forward and every gradient equal the
// unsharded computation at 1..4 ranks on 1-D and 2-D meshes (uneven and empty shards), fp64
// finite differences on a sharded layout, and bad input failing on every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_nn_mpi_pointwise_activation {

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;

namespace {

// Every broadcasting form: same spec, per-channel [1,C,1,1] and [C] (as_channel), a rank-1 [W]
// right-aligned, a Replicate [1,1,H,W] (sliced to each rank's box), a full-size Replicate operand,
// scalars, and add of two Partial(sum) reductions.
template <class T>
Body<T> pointwise_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    auto y = c.template act<4>(s, true, RandomInit::uniform(0.5, 1.5));
    auto b = c.template param<4>({1, s[1], 1, 1});
    auto v = c.template param<1>({s[1]});
    auto w = c.template param<1>({s[3]}, true, RandomInit::uniform(0.5, 1.5));
    auto m = c.template param<4>({1, 1, s[2], s[3]});
    auto full = c.template param<4>(s);
    c.output(F::add(x, y));
    c.output(F::sub(b, x));
    c.output(F::mul(x, F::as_channel<4>(v)));
    c.output(F::div(x, w));
    c.output(F::mul(m, y));
    c.output(F::sub(x, full));
    c.output(F::div(x, y));
    c.output(F::mul(F::sub(F::div(T(2), y), F::neg(F::add(x, T(1.5)))), T(0.5)));
    c.output(F::add(F::sum(x, {2}), F::sum(y, {2})));
    c.output(F::mul(b, F::as_channel<4>(v)));  // both Replicate
  };
}

template <class T>
Body<T> activation_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s, true, RandomInit::uniform(-3, 3));
    c.output(F::relu(x));
    c.output(F::leaky_relu(x, 0.1));
    c.output(F::gelu(x));
    c.output(F::gelu(x, F::GeluApprox::tanh));
    c.output(F::silu(x));
    c.output(F::tanh(x));
    c.output(F::sigmoid(x));
  };
}

}  // namespace

TEMPLATE_TEST_CASE("sharded pointwise ops equal the unsharded computation", "[nn][pointwise][mpi]", float, double) {
  for (Shape<4> s : {Shape<4>{2, 3, 7, 9}, Shape<4>{2, 2, 9, 4}}) {
    INFO("global shape " << fmt::format("{}", s));
    fn::check_sharded<TestType, 4>(pointwise_body<TestType>(s), s);
  }
}

TEMPLATE_TEST_CASE("sharded activations equal the unsharded computation", "[nn][activation][mpi]", float, double) {
  const Shape<4> s{2, 3, 7, 9};
  fn::check_sharded<TestType, 4>(activation_body<TestType>(s), s);
}

TEST_CASE("sharded pointwise and activation gradients match finite differences", "[nn][pointwise][activation][fd][mpi]") {
  const Shape<4> s{2, 2, 5, 3};
  const std::vector<std::string> names{"1d-Shard(2)", "1d-Shard(2)-empty-first", "2x2-spatial", "2x2-data-domain"};
  fn::check_fd_sharded<4>(pointwise_body<double>(s), s, names);
  fn::check_fd_sharded<4>(activation_body<double>(s), s, names);
}

TEST_CASE("sharded pointwise ops refuse bad operands on every rank", "[nn][pointwise][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    const Shape<4> s{2, 3, 7, 9};
    using V = autograd::Var<double, 4>;
    V x(DistTensor<double, 4>::random(s, mesh, {Shard(2)}, 1), true);
    V xw(DistTensor<double, 4>::random(s, mesh, {Shard(3)}, 2), true);
    V other(DistTensor<double, 4>::random({2, 3, 8, 9}, mesh, {Shard(2)}, 3), true);
    V rep_c(DistTensor<double, 4>::random({1, 4, 1, 1}, mesh, {Replicate()}, 4), true);
    V sharded_one(DistTensor<double, 4>::random({2, 3, 1, 9}, mesh, {Shard(2)}, 5), true);
    CHECK_THROWS_AS(F::add(x, other), shard::Error);  // 7 vs 8
    CHECK_THROWS_AS(F::mul(x, rep_c), shard::Error);  // 3 vs 4 channels
    CHECK_THROWS_AS(F::add(x, xw), shard::Error);           // placements differ
    CHECK_THROWS_AS(F::mul(x, sharded_one), shard::Error);  // sharded size-1 dim broadcast
    if (comm->size() > 1) {
      const ShardSizes uneven{{}, {}, [&] {
                                std::vector<index_t> v(static_cast<std::size_t>(comm->size()), 0);
                                v[0] = 7;
                                return v;
                              }(),
                              {}};
      V xu(DistTensor<double, 4>::random(s, mesh, {Shard(2)}, 1, {}, uneven), true);
      CHECK_THROWS_AS(F::add(x, xu), shard::Error);  // same placements, different layouts
    }
    auto part = F::sum(x, {2});
    CHECK_THROWS_AS(F::gelu(part), shard::Error);  // Partial input to a nonlinear op
  });
}

}  // namespace st_nn_mpi_pointwise_activation
