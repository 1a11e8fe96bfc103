// Collective watchdog, the no-stall side (the stall side aborts the job, so it runs as the separate
// ctests watchdog_abort_*, tests/comm/watchdog/): with a timeout set on the communicator, or only
// on the call's ExecContext, every blocking and non-blocking call gives exactly the results of the
// unwatched calls; split() inherits the timeout; DeviceMesh names its sub-communicators; a
// context's comm_timeout of 0 turns the watchdog off for a call.
#include <catch2/catch_test_macros.hpp>

#include "comm/collective_suite.hpp"
#include "support/mpi_harness.hpp"

namespace st_comm_mpi_watchdog {

using namespace shard;
using namespace shard::test;

TEST_CASE("watchdog on: every collective gives the unwatched results", "[comm][mpi][watchdog]") {
  for_each_comm_size([](CommPtr c) {
    c->set_timeout(0);  // whatever SHARDTENSOR_COMM_TIMEOUT says
    const auto plain = run_all(*c, nullptr);
    REQUIRE(!plain.empty());
    c->set_timeout(60);
    CHECK(c->timeout() == 60.0);
    CHECK(run_all(*c, nullptr) == plain);
    ExecContext off;
    off.settings().comm_timeout = 0;  // the context turns it off for its calls
    CHECK(run_all(*c, &off) == plain);
    c->set_timeout(0);
    ExecContext on;
    on.settings().comm_timeout = 60;  // only the context turns it on
    CHECK(run_all(*c, &on) == plain);
    c->set_timeout(-5);
    CHECK(c->timeout() == 0.0);
  });
}

TEST_CASE("watchdog: split inherits the timeout; DeviceMesh names its sub-communicators", "[comm][mpi][watchdog]") {
  for_each_comm_size([](CommPtr c) {
    c->set_timeout(45);
    auto sub = c->split(c->rank() % 2, c->rank());
    REQUIRE(sub);
    CHECK(sub->timeout() == 45.0);
    double v = 1;
    sub->allreduce(&v, &v, 1, DType::f64, ReduceOp::sum);
    CHECK(v == static_cast<double>(sub->size()));
    const int p = c->size();
    DeviceMesh mesh(c, {1, p});
    CHECK(mesh.dim_comm(0)->name() == "mesh [1, " + std::to_string(p) + "] dims [0]");
    CHECK(mesh.dim_comm(0)->timeout() == 45.0);
    if (p > 1) CHECK(mesh.dim_comm(1)->name() == "mesh [1, " + std::to_string(p) + "] dims [1]");
    c->set_timeout(0);
  });
}

TEST_CASE("watchdog: a timeout set after the mesh exists reaches its sub-communicators", "[comm][mpi][watchdog]") {
  for_each_comm_size([](CommPtr c) {
    c->set_timeout(0);
    const int p = c->size();
    DeviceMesh mesh(c, {1, p});  // sub-communicators made now, while the watchdog is off
    const auto both = mesh.dims_comm({0, 1});
    const auto lazy_before = p > 1 ? mesh.dims_comm({0}) : mesh.dim_comm(0);
    CHECK(mesh.dim_comm(0)->timeout() == 0.0);
    CHECK(mesh.dim_comm(1)->timeout() == 0.0);
    c->set_timeout(30);  // the embedding code turns it on later, on the mesh's communicator
    CHECK(mesh.dim_comm(0)->timeout() == 30.0);
    CHECK(mesh.dim_comm(1)->timeout() == 30.0);
    CHECK(both->timeout() == 30.0);
    CHECK(lazy_before->timeout() == 30.0);
    // A sub-communicator's own setting wins for it and for what is split from it ...
    mesh.dim_comm(1)->set_timeout(7);
    CHECK(mesh.dim_comm(1)->timeout() == 7.0);
    auto grand = mesh.dim_comm(1)->split(0, mesh.dim_comm(1)->rank());
    REQUIRE(grand);
    CHECK(grand->timeout() == 7.0);
    CHECK(mesh.dim_comm(0)->timeout() == 30.0);
    // ... and a watched collective on it still runs.
    double v = 1;
    mesh.dim_comm(1)->allreduce(&v, &v, 1, DType::f64, ReduceOp::sum);
    CHECK(v == static_cast<double>(p));
    // Off on the parent: children without their own setting follow.
    c->set_timeout(0);
    CHECK(mesh.dim_comm(0)->timeout() == 0.0);
    CHECK(mesh.dim_comm(1)->timeout() == 7.0);
    mesh.dim_comm(1)->set_timeout(0);
    CHECK(grand->timeout() == 0.0);
  });
}

}  // namespace st_comm_mpi_watchdog
