// MPI tests of reductions (Partial results, resolve) and losses: sharded forward and every gradient
// equal the unsharded computation at 1..4 ranks on 1-D and 2-D meshes, max ties across ranks,
// fp64 finite differences on sharded layouts, and bad input failing on every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_nn_mpi_reduction_loss {

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;

namespace {

template <class T>
Body<T> reduction_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    c.output(F::sum(x, {2}));
    c.output(F::sum(x, {2, 3}));
    c.output(F::mean(x, {0, 2, 3}));
    c.output(F::mean(x, {1}));
    c.output(F::max(x, {3}));
    c.output(F::max(x, {0, 2}));
    c.output(F::sum(x));
    c.output(F::mean(x));
    c.output(F::max(x));
    c.output(F::mul(F::resolve(F::mean(x, {2, 3})), x));  // resolved statistic used again
  };
}

// Every position of x tied at the maximum (a constant input): the gradient is split over all
// positions of each reduced region, which lie on several ranks.
template <class T>
Body<T> ties_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s, true, RandomInit::uniform(0.5, 0.5));
    c.output(F::max(x, {2, 3}));
    c.output(F::max(x, {0, 3}));
    c.output(F::max(x));
  };
}

template <class T>
Body<T> loss_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto p = c.template act<4>(s);
    auto t = c.template act<4>(s);
    c.output(F::mse_loss(p, t));
    c.output(F::mse_loss(p, t, F::Reduction::sum));
    c.output(F::rel_l2_loss(p, t));
    c.output(F::rel_l2_loss(p, t, F::RelL2Mode::global));
  };
}

}  // namespace

TEMPLATE_TEST_CASE("sharded reductions equal the unsharded computation", "[nn][reduction][mpi]", float, double) {
  for (Shape<4> s : {Shape<4>{2, 3, 7, 9}, Shape<4>{3, 2, 9, 5}}) {
    INFO("global shape " << fmt::format("{}", s));
    fn::check_sharded<TestType, 4>(reduction_body<TestType>(s), s);
  }
}

TEMPLATE_TEST_CASE("sharded max splits ties across ranks like the unsharded max", "[nn][reduction][mpi]", float,
                   double) {
  const Shape<4> s{2, 2, 7, 5};
  fn::check_sharded<TestType, 4>(ties_body<TestType>(s), s);
}

TEMPLATE_TEST_CASE("sharded losses equal the unsharded computation", "[nn][loss][mpi]", float, double) {
  for (Shape<4> s : {Shape<4>{2, 3, 7, 9}, Shape<4>{4, 1, 9, 4}}) {
    INFO("global shape " << fmt::format("{}", s));
    fn::check_sharded<TestType, 4>(loss_body<TestType>(s), s);
  }
}

TEST_CASE("sharded reduction and loss gradients match finite differences", "[nn][reduction][loss][fd][mpi]") {
  const Shape<4> s{2, 2, 5, 3};
  const std::vector<std::string> names{"1d-Shard(2)", "1d-Shard(2)-empty-first", "2x2-spatial", "2x2-data-domain"};
  fn::check_fd_sharded<4>(reduction_body<double>(s), s, names);
  fn::check_fd_sharded<4>(loss_body<double>(s), s, names);
}

TEST_CASE("sharded reductions and losses refuse bad input on every rank", "[nn][reduction][loss][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    using V = autograd::Var<double, 4>;
    const Shape<4> s{2, 3, 7, 9};
    V x(DistTensor<double, 4>::random(s, mesh, {Shard(2)}, 1), true);
    V xw(DistTensor<double, 4>::random(s, mesh, {Shard(3)}, 2), true);
    V other(DistTensor<double, 4>::random({2, 3, 7, 8}, mesh, {Shard(2)}, 3), true);
    CHECK_THROWS_AS(F::mse_loss(x, xw), shard::Error);        // placements differ
    CHECK_THROWS_AS(F::mse_loss(x, other), shard::Error);     // shapes differ
    CHECK_THROWS_AS(F::rel_l2_loss(x, xw), shard::Error);
    CHECK_THROWS_AS(F::sum(x, {2}).backward(), shard::Error);  // non-scalar loss
    CHECK_THROWS_AS(F::max(F::sum(x, {2})), shard::Error);    // max of a Partial(sum)
    // A good loss after the refusals still works on every rank (nobody was left in a collective).
    auto l = F::mse_loss(x, x.detach());
    CHECK_NOTHROW(l.backward());
  });
}

}  // namespace st_nn_mpi_reduction_loss
