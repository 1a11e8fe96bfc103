// gpusim lane: the box-ownership kernels of the points family (kernels/points.cu owner_k,
// bucket_rows_k; src/cuda/points_cuda.cpp) through the exec front (exec/points.hpp
// points_owner / points_bucket_rows) against the CPU table, EXACT equality: owners, per-rank
// counts (integer atomics) and the stable bucketing, with points on the cuts, on the domain's
// upper faces, outside and NaN, an empty slab, an unsplit dim, n = 0, f32 and f64.
#include <catch2/catch_template_test_macros.hpp>

#include <cstdint>
#include <limits>

#include "gpusim_support.hpp"
#include "shardtensor/exec/points.hpp"

namespace st_gpusim_cuda_sim_points_owner {

using namespace gpusim;

namespace {

exec::PointBoxPartition partition() {
  // ranks 3 (x, the middle slab empty) x 1 (y, unsplit) x 2 (z)
  exec::PointBoxPartition p;
  p.ranks = 6;
  p.cuts = {0.0, 0.5, 0.5, 1.0, -1.0, 2.0, -1.0, 0.25, 1.0};
  p.offsets = {0, 4, 6, 9};
  p.strides = {2, 0, 1};
  return p;
}

template <class T>
void owner_case(index_t n, unsigned seed) {
  INFO("n " << n << " seed " << seed);
  const auto part = partition();
  auto vals = rand_vals(static_cast<std::size_t>(n) * 3, seed, -1.2, 1.2);
  const double special[][3] = {{0.5, 0, 0.25}, {1, 2, 1}, {0, -1, -1}, {1.5, 0, 0},
                               {0.2, 0, std::numeric_limits<double>::quiet_NaN()}};
  for (std::size_t s = 0; s < 5 && s < static_cast<std::size_t>(n); ++s)
    for (std::size_t d = 0; d < 3; ++d) vals[s * 3 + d] = special[s][d];
  Pair<T> pts({n, 3}, vals);
  Pair<index_t> owner({n}), counts({part.ranks + 1});
  exec::points_owner(part, pts.h, &owner.h, counts.h, hctx());
  exec::points_owner(part, pts.d, &owner.d, counts.d, gctx());
  CHECK(owner.device() == owner.host());
  CHECK(counts.device() == counts.host());
  const auto c = counts.host();
  std::vector<double> off{0};
  for (int r = 0; r < part.ranks; ++r) off.push_back(off.back() + c[static_cast<std::size_t>(r)]);
  const auto m = static_cast<index_t>(off.back());
  Pair<index_t> offsets({part.ranks + 1}, off), rows({m});
  exec::points_bucket_rows(part.ranks, owner.h, offsets.h, rows.h, hctx());
  exec::points_bucket_rows(part.ranks, owner.d, offsets.d, rows.d, gctx());
  CHECK(rows.device() == rows.host());
  if (n >= 5) CHECK(c[static_cast<std::size_t>(part.ranks)] == 2);  // outside + NaN
}

}  // namespace

TEMPLATE_TEST_CASE("gpusim points: box owners, counts and bucketed rows equal the CPU table", "[gpusim][points]",
                   float, double) {
  GPUSIM_REQUIRE_GPU();
  owner_case<TestType>(0, 1);
  owner_case<TestType>(5, 2);
  owner_case<TestType>(700, 3);  // several thread blocks
}

}  // namespace st_gpusim_cuda_sim_points_owner
