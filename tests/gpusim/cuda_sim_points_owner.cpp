// gpusim lane: the box-ownership kernels of the points family (kernels/points.cu owner_k,
// bucket_rows_k; src/cuda/points_cuda.cpp) through the exec front (exec/points.hpp
// points_owner / points_bucket_rows) against the CPU table, EXACT equality: owners, per-rank
// counts (integer atomics) and the stable bucketing, with points on the cuts, on the domain's
// upper faces, outside and NaN, an empty slab, an unsplit dim, n = 0, f32 and f64. And the halo
// selections of the distributed neighbour queries (points_near_boxes_count / _rows with box
// thresholds and with per-point bounds, points_list_filter, points_remap), EXACT equality with
// the CPU table, several chunks of the block-wide compaction (n = 700 > 256).
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
  if (n == 5) CHECK(c[static_cast<std::size_t>(part.ranks)] == 2);  // the special points: outside + NaN
}


template <class T>
void selection_case(index_t n, unsigned seed) {
  INFO("n " << n << " seed " << seed);
  // 4 boxes of [-1, 1]^3 split in x and y; box 2 selects nothing
  exec::PointBoxes boxes;
  boxes.dims = 3;
  for (int b = 0; b < 4; ++b) {
    const double x0 = (b & 1) ? 0.0 : -1.0, y0 = (b & 2) ? 0.0 : -1.0;
    boxes.lo.insert(boxes.lo.end(), {x0, y0, -1.0});
    boxes.hi.insert(boxes.hi.end(), {x0 + 1.0, y0 + 1.0, 1.0});
  }
  boxes.threshold = {0.09, 0.25, -1.0, 0.0};
  auto vals = rand_vals(static_cast<std::size_t>(n) * 3, seed, -1.3, 1.3);
  if (n > 3) vals[7] = std::numeric_limits<double>::quiet_NaN();
  Pair<T> pts({n, 3}, vals);
  Pair<T> bound({n, 3}, rand_vals(static_cast<std::size_t>(n) * 3, seed + 1, 0.0, 0.3));
  const exec::PointBoundScale sc{1.0 + 1e-6, 1e-300};
  for (bool per_point : {false, true}) {
    INFO("per-point bounds " << per_point);
    const Block* hb = per_point ? &bound.h : nullptr;
    const Block* db = per_point ? &bound.d : nullptr;
    Pair<index_t> counts({4});
    exec::points_near_boxes_count(boxes, pts.h, hb, sc, counts.h, hctx());
    exec::points_near_boxes_count(boxes, pts.d, db, sc, counts.d, gctx());
    CHECK(counts.device() == counts.host());
    const auto c = counts.host();
    CHECK(c[2] == 0);
    std::vector<double> off{0};
    for (int b = 0; b < 3; ++b) off.push_back(off.back() + c[static_cast<std::size_t>(b)]);
    const auto m = static_cast<index_t>(off.back() + c[3]);
    Pair<index_t> offsets({4}, off), rows({m});
    exec::points_near_boxes_rows(boxes, pts.h, hb, sc, offsets.h, rows.h, hctx());
    exec::points_near_boxes_rows(boxes, pts.d, db, sc, offsets.d, rows.d, gctx());
    CHECK(rows.device() == rows.host());
  }
  // a neighbour list cut at per-row bounds, then mapped through an ascending table
  const index_t k = 3;
  Pair<T> d2({n, k}, rand_vals(static_cast<std::size_t>(n * k), seed + 2, 0.0, 1.0));
  Pair<T> rb({n}, rand_vals(static_cast<std::size_t>(n), seed + 3, 0.0, 1.0));
  std::vector<double> iv(static_cast<std::size_t>(n * k));
  for (std::size_t i = 0; i < iv.size(); ++i) iv[i] = i % 5 == 4 ? -1.0 : static_cast<double>((i * 7) % 11);
  Pair<index_t> idx({n, k}, iv);
  exec::points_list_filter(exec::PointListGeometry{n, k, 1}, d2.h, rb.h, idx.h, hctx());
  exec::points_list_filter(exec::PointListGeometry{n, k, 1}, d2.d, rb.d, idx.d, gctx());
  CHECK(idx.device() == idx.host());
  std::vector<double> tv(11);
  for (std::size_t i = 0; i < tv.size(); ++i) tv[i] = static_cast<double>(100 + 3 * i);
  Pair<index_t> table({11}, tv);
  exec::points_remap(table.h, idx.h, hctx());
  exec::points_remap(table.d, idx.d, gctx());
  CHECK(idx.device() == idx.host());
}
}  // namespace

TEMPLATE_TEST_CASE("gpusim points: box owners, counts and bucketed rows equal the CPU table", "[gpusim][points]",
                   float, double) {
  GPUSIM_REQUIRE_GPU();
  owner_case<TestType>(0, 1);
  owner_case<TestType>(5, 2);
  owner_case<TestType>(700, 3);  // several thread blocks
}

TEMPLATE_TEST_CASE("gpusim points: halo selections, list filter and remap equal the CPU table", "[gpusim][points]",
                   float, double) {
  GPUSIM_REQUIRE_GPU();
  selection_case<TestType>(0, 4);
  selection_case<TestType>(5, 5);
  selection_case<TestType>(700, 6);  // several chunks of the compaction
}

}  // namespace st_gpusim_cuda_sim_points_owner
