// DeviceMesh over a SelfComm (one rank, no MPI): shapes of ones, names, coords, sub-communicators.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <thread>
#include <vector>

#include <shardtensor/shardtensor.hpp>

namespace st_mesh_test_device_mesh {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("DeviceMesh over SelfComm: default 1-D mesh", "[mesh][device_mesh]") {
  DeviceMesh mesh(std::make_shared<SelfComm>());
  CHECK(mesh.ndim() == 1);
  CHECK(mesh.shape() == std::vector<int>{1});
  CHECK(mesh.size() == 1);
  CHECK(mesh.size(0) == 1);
  CHECK(mesh.rank() == 0);
  CHECK(mesh.coords() == std::vector<int>{0});
  CHECK(mesh.dim_names() == std::vector<std::string>{"d0"});
  CHECK(mesh.dim_comm(0)->size() == 1);
  CHECK(mesh.dim_comm(0)->backend() == "self");
  CHECK(mesh.comm()->backend() == "self");
}

TEST_CASE("DeviceMesh over SelfComm: 3-D mesh of ones with names", "[mesh][device_mesh]") {
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1, 1, 1}, {"dp", "x", "y"});
  CHECK(mesh.ndim() == 3);
  CHECK(mesh.dim_index("x") == 1);
  CHECK(mesh.dim_index("y") == 2);
  CHECK(mesh.coords() == std::vector<int>{0, 0, 0});
  CHECK(mesh.coords_of(0) == std::vector<int>{0, 0, 0});
  CHECK(mesh.rank_of({0, 0, 0}) == 0);
  for (int m = 0; m < 3; ++m) {
    CHECK(mesh.dim_comm(m)->size() == 1);
    CHECK(mesh.coord(m) == 0);
  }
  const auto c12 = mesh.dims_comm({1, 2});
  CHECK(c12->size() == 1);
  CHECK(mesh.dims_comm({1, 2}) == c12);  // cached
  CHECK(mesh.dims_comm({0, 1, 2}) == mesh.comm());
  DeviceMesh copy = mesh;
  CHECK(copy == mesh);
  CHECK_FALSE(DeviceMesh(std::make_shared<SelfComm>()) == mesh);
  CHECK(fmt::format("{}", mesh) == "DeviceMesh(shape=[1, 1, 1], names=[\"dp\", \"x\", \"y\"], rank=0, coords=[0, 0, 0])");
}

TEST_CASE("DeviceMesh rejects bad input with messages naming the op", "[mesh][device_mesh][errors]") {
  auto self = std::make_shared<SelfComm>();
  CHECK_THROWS_WITH(DeviceMesh(self, {2}), ContainsSubstring("DeviceMesh") && ContainsSubstring("holds 2 ranks"));
  CHECK_THROWS_WITH(DeviceMesh(self, {1, 0}), ContainsSubstring("non-positive"));
  CHECK_THROWS_WITH(DeviceMesh(self, {1, 1}, {"a"}), ContainsSubstring("dim names"));
  CHECK_THROWS_WITH(DeviceMesh(nullptr), ContainsSubstring("null communicator"));
  DeviceMesh mesh(self, {1, 1}, {"a", "b"});
  CHECK_THROWS_WITH(mesh.dim_index("c"), ContainsSubstring("DeviceMesh::dim_index") && ContainsSubstring("'c'"));
  CHECK_THROWS_WITH(mesh.rank_of({0}), ContainsSubstring("DeviceMesh::rank_of"));
  CHECK_THROWS_WITH(mesh.rank_of({0, 1}), ContainsSubstring("outside mesh"));
  CHECK_THROWS_WITH(mesh.coords_of(1), ContainsSubstring("DeviceMesh::coords_of"));
  CHECK_THROWS_WITH(mesh.dims_comm({2}), ContainsSubstring("DeviceMesh::dims_comm"));
}

TEST_CASE("DeviceMesh: concurrent first uses of dims_comm make one communicator per set", "[mesh][device_mesh]") {
  // Over a SelfComm a split is local, so threads may race on first uses; the cache must hand
  // every thread the same communicator for a set (an unlocked map made two, or corrupted itself).
  for (int round = 0; round < 20; ++round) {
    DeviceMesh mesh(std::make_shared<SelfComm>(), {1, 1, 1, 1, 1});
    constexpr int kThreads = 8;
    std::vector<std::vector<const Communicator*>> got(kThreads);
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        for (unsigned set = 1; set < 32; ++set) {
          std::vector<int> dims;
          for (int m = 0; m < 5; ++m)
            if (set & (1u << m)) dims.push_back(m);
          got[static_cast<std::size_t>(t)].push_back(mesh.dims_comm(dims).get());
        }
      });
    for (auto& th : ts) th.join();
    for (int t = 1; t < kThreads; ++t) REQUIRE(got[static_cast<std::size_t>(t)] == got[0]);
    for (unsigned set = 1; set < 32; ++set) {
      std::vector<int> dims;
      for (int m = 0; m < 5; ++m)
        if (set & (1u << m)) dims.push_back(m);
      CHECK(mesh.dims_comm(dims).get() == got[0][set - 1]);
    }
  }
}

}  // namespace st_mesh_test_device_mesh
