// Placement: the closed set Shard | Replicate | Partial — equality, predicates, printing.
#include <catch2/catch_test_macros.hpp>

#include <shardtensor/shardtensor.hpp>

namespace st_mesh_test_placement {

using namespace shard;

static_assert(Shard(1).is_shard(1) && !Shard(1).is_shard(0));
static_assert(Shard(0) == Shard(0) && !(Shard(0) == Shard(1)));
static_assert(Partial(ReduceOp::max) == Partial(ReduceOp::max) && !(Partial(ReduceOp::max) == Partial()));

TEST_CASE("Placement equality and predicates", "[mesh][placement]") {
  const std::vector<Placement> all = {Shard(0),         Shard(1),
                                      Shard(2),         Replicate(),
                                      Partial(),        Partial(ReduceOp::avg),
                                      Partial(ReduceOp::max), Partial(ReduceOp::min)};
  for (std::size_t i = 0; i < all.size(); ++i)
    for (std::size_t j = 0; j < all.size(); ++j) {
      INFO(fmt::format("{} vs {}", all[i], all[j]));
      CHECK((all[i] == all[j]) == (i == j));
    }
  CHECK(Shard(2).is_shard());
  CHECK_FALSE(Shard(2).is_replicate());
  CHECK(Replicate().is_replicate());
  CHECK_FALSE(Replicate().is_shard(0));
  CHECK(Partial().is_partial());
  CHECK(Partial().op == ReduceOp::sum);
  // Fields that do not belong to the kind do not take part in equality.
  Placement r1 = Replicate(), r2 = Replicate();
  r2.op = ReduceOp::max;
  CHECK(r1 == r2);
  Placement s1 = Shard(1), s2 = Shard(1);
  s2.op = ReduceOp::min;
  CHECK(s1 == s2);
}

TEST_CASE("Placement and ReduceOp print with fmt", "[mesh][placement]") {
  CHECK(fmt::format("{}", Shard(1)) == "Shard(1)");
  CHECK(fmt::format("{}", Replicate()) == "Replicate()");
  CHECK(fmt::format("{}", Partial()) == "Partial(sum)");
  CHECK(fmt::format("{}", Partial(ReduceOp::avg)) == "Partial(avg)");
  CHECK(fmt::format("{}", Partial(ReduceOp::max)) == "Partial(max)");
  CHECK(fmt::format("{}", Partial(ReduceOp::min)) == "Partial(min)");
  CHECK(fmt::format("{}", ReduceOp::max) == "max");
  CHECK(fmt::format("{:>5}", ReduceOp::sum) == "  sum");
}

}  // namespace st_mesh_test_placement
