// gpusim lane: the row family (kernels/rows.cu, src/cuda/rows_cuda.cpp) against the CPU table,
// exact equality: gather of 1, 2, 4, 8 and 16-byte elements (random bytes) with -1 entries
// (zero rows) and repeated rows; scatter-add of f32, f64 and i64 into a non-zero destination with
// -1 entries and repeated rows. Float sums are compared exactly: with repeated rows the values are
// small multiples of 1/8 (every partial sum is exact, so the atomics' order cannot show), and a
// second case with random values uses distinct rows (one addition per element); scatter (copy)
// of 1, 4 and 8-byte elements with distinct rows, and with rows named twice with the same data.
#include <cstdint>
#include <numeric>

#include "exec/rows_kernels.hpp"
#include "gpusim_support.hpp"

namespace st_gpusim_cuda_sim_rows {

using namespace gpusim;
using exec::RowsGeometry;
using exec::RowsKernels;

namespace {
const RowsKernels& cu() { return exec::kernels_for<RowsKernels>(gpu(), "test"); }
const RowsKernels& cpu() { return exec::kernels_for<RowsKernels>(Device::cpu(), "test"); }

/// n_index entries in [-1, n_rows): about one in six -1, the rest random rows (repeats likely).
std::vector<double> random_index(index_t n_index, index_t n_rows, unsigned seed) {
  std::mt19937_64 g(seed);
  std::vector<double> v(static_cast<std::size_t>(n_index));
  for (auto& x : v) x = g() % 6 == 0 ? -1.0 : static_cast<double>(g() % static_cast<std::uint64_t>(n_rows));
  return v;
}

/// A permutation of [0, n_rows) with every third entry replaced by -1 (distinct rows).
std::vector<double> distinct_index(index_t n_rows, unsigned seed) {
  std::vector<double> v(static_cast<std::size_t>(n_rows));
  std::iota(v.begin(), v.end(), 0.0);
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  for (std::size_t i = 0; i < v.size(); i += 3) v[i] = -1.0;
  return v;
}

void gather_case(int eb, index_t n_src, index_t n_index, index_t width, unsigned seed) {
  INFO("gather elem_bytes " << eb << " n_src " << n_src << " n_index " << n_index << " width " << width);
  std::mt19937_64 g(seed);
  std::vector<double> bytes(static_cast<std::size_t>(n_src * width * eb));
  for (auto& b : bytes) b = static_cast<double>(g() % 256);
  Pair<std::uint8_t> src({n_src, width * eb}, bytes);
  Pair<index_t> index({n_index}, random_index(n_index, n_src, seed + 1));
  // dst starts non-zero, so that the zero rows of -1 entries are written, not left.
  Pair<std::uint8_t> dst({n_index, width * eb}, std::vector<double>{0xAB});
  const RowsGeometry geo{n_src, n_index, width};
  cpu().gather(static_cast<std::size_t>(eb), geo, src.h.data, static_cast<const index_t*>(index.h.data), dst.h.data,
               hctx());
  cu().gather(static_cast<std::size_t>(eb), geo, src.d.data, static_cast<const index_t*>(index.d.data), dst.d.data,
              gctx());
  const auto d = dst.device(), h = dst.host();
  INFO(worst(d, h));
  CHECK(d == h);
}

template <class T>
void scatter_case(index_t n_dst, index_t n_index, index_t width, bool repeats, unsigned seed) {
  INFO("scatter_add " << (std::is_integral_v<T> ? "i64" : sizeof(T) == 4 ? "f32" : "f64") << " n_dst " << n_dst << " n_index " << n_index << " width " << width
                      << (repeats ? " repeated rows" : " distinct rows"));
  std::mt19937_64 g(seed);
  auto vals = [&](std::size_t n) {
    std::vector<double> v(n);
    for (auto& x : v) {
      if (std::is_integral_v<T>)
        x = static_cast<double>(static_cast<std::int64_t>(g() % 2001) - 1000);
      else if (repeats)
        x = static_cast<double>(static_cast<int>(g() % 65) - 32) / 8.0;
      else
        x = std::uniform_real_distribution<double>(-1.0, 1.0)(g);
    }
    return v;
  };
  const std::vector<double> idx = repeats ? random_index(n_index, n_dst, seed + 1) : distinct_index(n_dst, seed + 1);
  if (!repeats) n_index = n_dst;
  Pair<T> src({n_index, width}, vals(static_cast<std::size_t>(n_index * width)));
  Pair<T> dst({n_dst, width}, vals(static_cast<std::size_t>(n_dst * width)));
  Pair<index_t> index({n_index}, idx);
  const RowsGeometry geo{n_dst, n_index, width};
  cpu().scatter_add(dtype_of<T>, geo, src.h.data, static_cast<const index_t*>(index.h.data), dst.h.data, hctx());
  cu().scatter_add(dtype_of<T>, geo, src.d.data, static_cast<const index_t*>(index.d.data), dst.d.data, gctx());
  const auto d = dst.device(), h = dst.host();
  INFO(worst(d, h));
  CHECK(d == h);
}

/// Scatter (copy) of elem_bytes-byte rows: distinct rows with -1 entries, then a list that names
/// some rows twice with the same data (the boundary-query use: a query listed once per box).
void scatter_copy_case(int eb, index_t n_dst, index_t width, bool repeats, unsigned seed) {
  INFO("scatter elem_bytes " << eb << " n_dst " << n_dst << " width " << width << (repeats ? " repeated" : ""));
  std::mt19937_64 g(seed);
  std::vector<double> idx = distinct_index(n_dst, seed + 1);
  if (repeats) {  // every row named by an even position is named again right after it
    std::vector<double> rep;
    for (std::size_t i = 0; i < idx.size(); ++i) {
      rep.push_back(idx[i]);
      if (i % 2 == 0) rep.push_back(idx[i]);
    }
    idx = rep;
  }
  const index_t n_index = static_cast<index_t>(idx.size());
  std::vector<double> bytes(static_cast<std::size_t>(n_index * width * eb));
  for (auto& b : bytes) b = static_cast<double>(g() % 256);
  if (repeats)  // the repeated entries carry the same row data
    for (std::size_t i = 1; i < idx.size(); ++i)
      if (idx[i] == idx[i - 1])
        for (std::size_t c = 0; c < static_cast<std::size_t>(width * eb); ++c)
          bytes[i * static_cast<std::size_t>(width * eb) + c] = bytes[(i - 1) * static_cast<std::size_t>(width * eb) + c];
  Pair<std::uint8_t> src({n_index, width * eb}, bytes);
  Pair<index_t> index({n_index}, idx);
  Pair<std::uint8_t> dst({n_dst, width * eb}, std::vector<double>{0xCD});  // rows not named stay 0xCD
  const RowsGeometry geo{n_dst, n_index, width};
  cpu().scatter(static_cast<std::size_t>(eb), geo, src.h.data, static_cast<const index_t*>(index.h.data), dst.h.data,
                hctx());
  cu().scatter(static_cast<std::size_t>(eb), geo, src.d.data, static_cast<const index_t*>(index.d.data), dst.d.data,
               gctx());
  const auto d = dst.device(), h = dst.host();
  INFO(worst(d, h));
  CHECK(d == h);
}

}  // namespace

TEST_CASE("gpusim rows: scatter (copy) equals the CPU table", "[gpusim][rows]") {
  GPUSIM_REQUIRE_GPU();
  for (const int eb : {4, 8}) {
    scatter_copy_case(eb, 60, 3, false, 400u + static_cast<unsigned>(eb));
    scatter_copy_case(eb, 60, 5, true, 410u + static_cast<unsigned>(eb));
  }
  scatter_copy_case(1, 33, 1, true, 420u);
}

TEST_CASE("gpusim rows: gather by element size equals the CPU table", "[gpusim][rows]") {
  GPUSIM_REQUIRE_GPU();
  for (const int eb : {1, 2, 4, 8, 16}) gather_case(eb, 50, 120, 3, 100u + static_cast<unsigned>(eb));
  gather_case(4, 7, 300, 1, 200u);   // width 1, many repeats
  gather_case(8, 64, 64, 17, 201u);  // odd width
}

TEST_CASE("gpusim rows: scatter-add (atomics) equals the CPU table", "[gpusim][rows]") {
  GPUSIM_REQUIRE_GPU();
  SECTION("repeated rows and -1 entries") {
    scatter_case<float>(40, 200, 3, true, 300u);
    scatter_case<double>(40, 200, 3, true, 301u);
    scatter_case<std::int64_t>(40, 200, 3, true, 302u);
    scatter_case<double>(5, 150, 1, true, 303u);  // few rows: many atomics on one address
  }
  SECTION("distinct rows, random values") {
    scatter_case<float>(90, 0, 4, false, 310u);
    scatter_case<double>(90, 0, 4, false, 311u);
    scatter_case<std::int64_t>(64, 0, 9, false, 312u);
  }
}

}  // namespace st_gpusim_cuda_sim_rows
