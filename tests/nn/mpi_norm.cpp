// MPI tests of the normalisations with global statistics: sharded forward, running statistics and
// every gradient (input, weight, bias) equal the unsharded computation at 1..4 ranks on 1-D and 2-D
// meshes (spatial sharding, data x domain, empty shards), 2-D and 3-D fields, fp64 finite
// differences on sharded layouts, and bad input failing on every rank; with and without a fused
// activation.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_nn_mpi_norm {

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;

namespace {

template <class T, int R>
Body<T> norm_body(const Shape<R>& s, index_t groups, bool stats_outputs = true) {
  return [s, groups, stats_outputs](Ctx<T>& c) {
    auto x = c.template act<R>(s, true, RandomInit::uniform(-1, 2));
    auto w = c.template param<1>({s[1]});
    auto b = c.template param<1>({s[1]});
    std::vector<Placement> rep(static_cast<std::size_t>(c.mesh().ndim()), Replicate());
    auto rm = DistTensor<T, 1>::random({s[1]}, c.mesh(), rep, 5);
    auto rv = DistTensor<T, 1>::random({s[1]}, c.mesh(), rep, 6, RandomInit::uniform(0.5, 1.5));
    c.output(F::batch_norm(x, &rm, &rv, w, b, false));  // eval: running statistics
    c.output(F::batch_norm(x, &rm, &rv, w, b, true, 0.3));
    if (stats_outputs) {  // updated running statistics (values only: not differentiable, so not for FD)
      c.output(autograd::Var<T, 1>(rm));
      c.output(autograd::Var<T, 1>(rv));
    }
    c.output(F::batch_norm(x, nullptr, nullptr, std::nullopt, std::nullopt, true));
    c.output(F::group_norm(x, groups, w, b));
    c.output(F::group_norm(x, 1));
    c.output(F::instance_norm(x, w, b));
    c.output(F::layer_norm(x, w, b));
    // Fused activations (the norm's own passes apply act and its derivative).
    c.output(F::group_norm(x, groups, w, b, 1e-5, F::NormAct::silu));
    c.output(F::batch_norm(x, nullptr, nullptr, w, b, true, 0.1, 1e-5, F::NormAct::gelu));
    c.output(F::instance_norm(x, w, b, 1e-5, F::NormAct::tanh));
    c.output(F::layer_norm(x, w, b, 1e-5, 1, F::NormAct::sigmoid));
    // ... and a residual added before it (the residual's gradient too).
    auto r = c.template act<R>(s, true, RandomInit::uniform(-1, 1));
    c.output(F::group_norm(x, groups, w, b, 1e-5, F::NormAct::silu, r));
    c.output(F::batch_norm(x, nullptr, nullptr, w, b, true, 0.1, 1e-5, F::NormAct::none, r));
  };
}

}  // namespace

TEMPLATE_TEST_CASE("sharded norms on 2-D fields equal the unsharded computation", "[nn][norm][mpi]", float, double) {
  for (Shape<4> s : {Shape<4>{2, 4, 7, 9}, Shape<4>{3, 2, 9, 4}}) {
    INFO("global shape " << fmt::format("{}", s));
    fn::check_sharded<TestType, 4>(norm_body<TestType, 4>(s, 2), s);
  }
}

TEMPLATE_TEST_CASE("sharded norms on 3-D fields equal the unsharded computation", "[nn][norm][mpi]", float, double) {
  const Shape<5> s{2, 4, 5, 7, 3};
  fn::check_sharded<TestType, 5>(norm_body<TestType, 5>(s, 2), s);
}

TEST_CASE("sharded norm gradients match finite differences", "[nn][norm][fd][mpi]") {
  const Shape<4> s{2, 4, 5, 3};
  fn::check_fd_sharded<4>(norm_body<double, 4>(s, 2, false), s,
                          {"1d-Shard(2)", "1d-Shard(2)-empty-first", "2x2-spatial", "2x2-data-domain"});
}

TEST_CASE("sharded norms refuse bad input on every rank", "[nn][norm][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    using V = autograd::Var<double, 4>;
    const Shape<4> s{2, 4, 7, 9};
    V x(DistTensor<double, 4>::random(s, mesh, {Shard(2)}, 1), true);
    V xc(DistTensor<double, 4>::random(s, mesh, {Shard(1)}, 1), true);
    autograd::Var<double, 1> w3(DistTensor<double, 1>::random({3}, mesh, {Replicate()}, 2), true);
    autograd::Var<double, 1> w4(DistTensor<double, 1>::random({4}, mesh, {Replicate()}, 3), true);
    autograd::Var<double, 1> w4s(DistTensor<double, 1>::random({4}, mesh, {Shard(0)}, 3), true);
    CHECK_THROWS_AS(F::batch_norm(x, nullptr, nullptr, w3, w4, true), shard::Error);  // channel counts
    CHECK_THROWS_AS(F::group_norm(x, 3, w4, w4), shard::Error);
    CHECK_THROWS_AS(F::group_norm(xc, 2, w4, w4), shard::Error);  // sharded channels
    CHECK_THROWS_AS(F::layer_norm(x, w4s, w4), shard::Error);     // sharded parameter
    CHECK_THROWS_AS(F::batch_norm(x, nullptr, nullptr, w4, w4, false), shard::Error);
    auto y = F::batch_norm(x, nullptr, nullptr, w4, w4, true);  // still works afterwards
    CHECK_NOTHROW(F::sum(y).backward());
  });
}

}  // namespace st_nn_mpi_norm
