// Box algebra and DistSpec / DistTensor on one rank (SelfComm): boxes, layouts, printing, errors.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <shardtensor/shardtensor.hpp>

namespace st_dist_test_dist_spec {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("Box::intersect and Box::contains", "[dist][box]") {
  const Box a{{0, 2}, {4, 5}};  // rows [0,4), cols [2,7)
  const Box b{{3, 0}, {3, 4}};  // rows [3,6), cols [0,4)
  const Box i = Box::intersect(a, b);
  CHECK(i == Box{{3, 2}, {1, 2}});
  CHECK(i.numel() == 2);
  CHECK(Box::intersect(b, a) == i);
  CHECK(a.contains(i));
  CHECK(b.contains(i));
  CHECK_FALSE(a.contains(b));
  CHECK(a.contains(a));
  // Disjoint and touching boxes intersect in an empty box.
  CHECK(Box::intersect(a, Box{{4, 0}, {2, 9}}).numel() == 0);
  CHECK(Box::intersect(a, Box{{0, 7}, {4, 1}}).numel() == 0);
  CHECK(Box::intersect(a, Box{{10, 10}, {1, 1}}).numel() == 0);
  // Empty boxes lie inside anything, even far away.
  CHECK(a.contains(Box{{100, 100}, {0, 3}}));
  CHECK(Box{{0}, {0}}.contains(Box{{5}, {0}}));
  CHECK_FALSE(Box{{0}, {0}}.contains(Box{{0}, {1}}));
  CHECK_FALSE(a.contains(Box{{-1, 2}, {1, 1}}));
  // Rank-0 boxes hold one element.
  CHECK(Box{}.numel() == 1);
}

TEST_CASE("DistSpec on a one-rank mesh", "[dist][spec]") {
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1, 1});
  DistSpec s(mesh, {Shard(1), Partial(ReduceOp::max)}, {9, 7});
  CHECK(s.ndim() == 2);
  CHECK(s.sharding_mesh_dims(1) == std::vector<int>{0});
  CHECK(s.sharding_mesh_dims(0).empty());
  CHECK(s.layout(1).parts() == 1);
  CHECK(s.layout(1).extent() == 7);
  CHECK(s.local_box() == Box{{0, 0}, {9, 7}});
  CHECK(s.has_partial());
  CHECK_FALSE(DistSpec(mesh, {Shard(0), Shard(0)}, {9, 7}).has_partial());
  CHECK(fmt::format("{}", s) == "DistSpec(global=[9, 7], mesh=[1, 1], placements=[Shard(1), Partial(max)])");
  // Explicit sizes on a one-part dim must still sum to the extent.
  CHECK_NOTHROW(DistSpec(mesh, {Shard(0), Replicate()}, {9, 7}, {{9}, {}}));
  CHECK(s.with_placements({Replicate(), Replicate()}) == DistSpec(mesh, {Replicate(), Replicate()}, {9, 7}));
  CHECK_FALSE(s.with_placements({Replicate(), Replicate()}) == s);
}

TEST_CASE("DistSpec rejects bad input with messages naming the op", "[dist][spec][errors]") {
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1, 1});
  CHECK_THROWS_WITH(DistSpec(mesh, {Shard(2), Replicate()}, {9, 7}),
                    ContainsSubstring("DistSpec") && ContainsSubstring("Shard(2)") && ContainsSubstring("[9, 7]"));
  CHECK_THROWS_WITH(DistSpec(mesh, {Shard(-1), Replicate()}, {9, 7}), ContainsSubstring("DistSpec"));
  CHECK_THROWS_WITH(DistSpec(mesh, {Replicate()}, {9, 7}),
                    ContainsSubstring("DistSpec") && ContainsSubstring("1 placements for a 2-D mesh"));
  CHECK_THROWS_WITH(DistSpec(mesh, {Replicate(), Replicate()}, {9, -7}), ContainsSubstring("negative"));
  CHECK_THROWS_WITH(DistSpec(mesh, {Shard(0), Replicate()}, {9, 7}, {{8}, {}}),
                    ContainsSubstring("ShardLayout::from_sizes") && ContainsSubstring("sum to 8"));
  CHECK_THROWS_WITH(DistSpec(mesh, {Shard(0), Replicate()}, {9, 7}, {{4, 5}, {}}),
                    ContainsSubstring("DistSpec") && ContainsSubstring("2 sizes"));
  CHECK_THROWS_WITH(DistSpec(mesh, {Shard(0), Replicate()}, {9, 7}, {{9}}),
                    ContainsSubstring("DistSpec") && ContainsSubstring("1 dims"));
}

TEST_CASE("DistTensor on one rank: from_local is zero-copy, every redistribution is the identity on values",
          "[dist][tensor]") {
  DeviceMesh mesh(std::make_shared<SelfComm>());
  std::vector<double> user(9 * 7);
  auto view = Tensor<double, 2>::view(user.data(), {9, 7});
  view.fill_random(5);
  auto dt = DistTensor<double, 2>::from_local(view, mesh, {Shard(0)});
  CHECK(dt.local().data() == user.data());
  CHECK(dt.global_shape() == Shape<2>{9, 7});
  for (Placement p : {Shard(1), Replicate(), Partial(), Partial(ReduceOp::avg), Partial(ReduceOp::min)}) {
    auto r = dt.redistribute({p});
    CHECK(max_rel_diff(r.full_tensor(), view) == 0.0);
    CHECK(max_rel_diff(r.redistribute({Shard(0)}).local(), view) == 0.0);
  }
  auto rnd = DistTensor<double, 2>::random({9, 7}, mesh, {Replicate()}, 5);
  CHECK(max_rel_diff(rnd.local(), view) == 0.0);
  CHECK(detail::redistribute_plan(dt.spec(), dt.spec())->steps.empty());
}

TEST_CASE("local redistribution of a large strided user view (the multithreaded block copy)", "[dist][tensor]") {
  DeviceMesh mesh(std::make_shared<SelfComm>());
  // 600 x 600 interior of a 602 x 605 array: 360000 elements, above the OpenMP threshold.
  std::vector<float> user(602 * 605);
  auto whole = Tensor<float, 2>::view(user.data(), {602, 605});
  whole.fill_random(8);
  auto interior = whole.slice({1, 2}, {600, 600});
  auto dt = DistTensor<float, 2>::from_local(interior, mesh, {Shard(0)});
  CHECK(dt.local().data() == interior.data());
  auto moved = dt.redistribute({Shard(1)});  // a local copy of the whole block on one rank
  CHECK(moved.local().is_contiguous());
  CHECK(moved.local().data() != interior.data());
  CHECK(max_rel_diff(moved.local(), interior) == 0.0);
  CHECK(max_rel_diff(moved.redistribute({Partial(ReduceOp::max)}).full_tensor(), interior) == 0.0);
}

}  // namespace st_dist_test_dist_spec
