// dist::fill_ghosts: the library's halo exchange filling a simulation's ghosted array in place,
// against a hand-written simulation-style exchange (neighbour face swaps, dim by dim, the second
// dim's faces including the first dim's ghost rows: corners), on 1-D and 2-D meshes with uneven
// shards, zero and periodic boundaries, fp64 and fp32, at 1..4 ranks; and against the oracle
// (the padded global field). Bad input throws on every rank.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <shardtensor/dist/halo.hpp>

#include "support/mpi_harness.hpp"

namespace st_dist_mpi_fill_ghosts {

using namespace shard;
using Catch::Matchers::ContainsSubstring;
using shard::test::error_of;
using shard::test::for_each_comm_size;

namespace {

/// The global field's value at (i, j) (any integers: the oracle wraps or zeroes first).
template <class T>
T field(index_t i, index_t j) {
  return static_cast<T>(0.25 + 1.5 * static_cast<double>(i) + 0.01 * static_cast<double>(j * j % 97));
}

/// Uneven part sizes of n (11 or 9) over p (not the balanced rule: a simulation's own
/// decomposition), every part at least 2 cells (the hand-written exchange is one hop).
std::vector<index_t> uneven(index_t n, int p) {
  if (n == 11) return p == 2 ? std::vector<index_t>{7, 4} : p == 3 ? std::vector<index_t>{5, 2, 4} : std::vector<index_t>{4, 2, 3, 2};
  return p == 2 ? std::vector<index_t>{3, 6} : p == 3 ? std::vector<index_t>{2, 4, 3} : std::vector<index_t>{2, 3, 2, 2};
}

/// The simulation's own exchange of a (nx + 2g) x (ny + 2g) row-major array on a px x py grid of
/// ranks (rank = cx * py + cy, as DeviceMesh lays out {px, py}): dim 0 faces first (interior
/// columns), then dim 1 faces over all rows (corners). Beyond the domain edge: zeros, or the
/// wrapped neighbour (periodic). Assumes g <= every part's extent (one hop, as simulations do).
template <class T>
void hand_exchange(Communicator& comm, std::vector<T>& a, index_t nx, index_t ny, index_t g, int px, int py,
                   bool periodic) {
  const int r = comm.rank(), cx = r / py, cy = r % py;
  const index_t W = ny + 2 * g;
  auto at = [&](index_t i, index_t j) -> T& { return a[static_cast<std::size_t>(i * W + j)]; };
  for (int dim = 0; dim < 2; ++dim) {
    const int c = dim == 0 ? cx : cy, n = dim == 0 ? px : py;
    auto rank_at = [&](int cc) { return dim == 0 ? cc * py + cy : cx * py + cc; };
    const int lo_nb = c > 0 ? rank_at(c - 1) : (periodic ? rank_at(n - 1) : -1);
    const int hi_nb = c < n - 1 ? rank_at(c + 1) : (periodic ? rank_at(0) : -1);
    // The face box along `dim`: rows (dim 0) or columns (dim 1) [f0, f0 + g), across the other
    // dim's interior (dim 0) or its full extent including ghosts (dim 1: corners).
    const index_t other0 = dim == 0 ? g : 0, other1 = dim == 0 ? g + ny : nx + 2 * g;
    auto pack = [&](index_t f0) {
      std::vector<T> buf;
      for (index_t k = f0; k < f0 + g; ++k)
        for (index_t o = other0; o < other1; ++o) buf.push_back(dim == 0 ? at(k, o) : at(o, k));
      return buf;
    };
    auto unpack = [&](index_t f0, const std::vector<T>* buf) {
      std::size_t q = 0;
      for (index_t k = f0; k < f0 + g; ++k)
        for (index_t o = other0; o < other1; ++o) (dim == 0 ? at(k, o) : at(o, k)) = buf ? (*buf)[q++] : T(0);
    };
    const index_t ext = dim == 0 ? nx : ny;
    const auto count = static_cast<std::size_t>(g * (other1 - other0));
    std::vector<T> send_lo = pack(g), send_hi = pack(ext), recv_lo(count), recv_hi(count);
    const DType dt = dtype_of<T>;
    std::vector<Request> reqs;
    const auto cnt = static_cast<index_t>(count);
    if (lo_nb >= 0) reqs.push_back(comm.irecv(recv_lo.data(), cnt, dt, lo_nb, 900 + 2 * dim));
    if (hi_nb >= 0) reqs.push_back(comm.irecv(recv_hi.data(), cnt, dt, hi_nb, 901 + 2 * dim));
    if (lo_nb >= 0) reqs.push_back(comm.isend(send_lo.data(), cnt, dt, lo_nb, 901 + 2 * dim));
    if (hi_nb >= 0) reqs.push_back(comm.isend(send_hi.data(), cnt, dt, hi_nb, 900 + 2 * dim));
    wait_all(reqs);
    unpack(0, lo_nb >= 0 ? &recv_lo : nullptr);
    unpack(ext + g, hi_nb >= 0 ? &recv_hi : nullptr);
  }
}

template <class T>
void check_fill(CommPtr comm, int px, int py, index_t g, bool periodic, bool explicit_sizes) {
  const index_t NX = 11, NY = 9;
  DeviceMesh mesh(comm, {px, py});
  ShardSizes sizes;
  if (explicit_sizes) sizes = {px > 1 ? uneven(NX, px) : std::vector<index_t>{},
                               py > 1 ? uneven(NY, py) : std::vector<index_t>{}};
  const DistSpec spec(mesh, {Shard(0), Shard(1)}, {NX, NY}, sizes);
  const Box box = spec.local_box();
  const index_t nx = box.len[0], ny = box.len[1];
  INFO(fmt::format("mesh {}x{} g={} {} sizes {} block {}x{} at ({}, {})", px, py, g, periodic ? "periodic" : "zero",
                   explicit_sizes ? "explicit" : "balanced", nx, ny, box.lo[0], box.lo[1]));
  // The simulation's arrays: interior from the global field, ghosts garbage.
  const index_t W = ny + 2 * g;
  std::vector<T> mine(static_cast<std::size_t>((nx + 2 * g) * W), T(-777)), ref = mine;
  for (index_t i = 0; i < nx; ++i)
    for (index_t j = 0; j < ny; ++j)
      mine[static_cast<std::size_t>((i + g) * W + j + g)] = ref[static_cast<std::size_t>((i + g) * W + j + g)] =
          field<T>(box.lo[0] + i, box.lo[1] + j);
  // Zero-copy: the ghosted array and the interior view with the padded array's strides.
  auto ghosted = Tensor<T, 2>::view(mine.data(), Shape<2>{nx + 2 * g, W});
  auto interior = Tensor<T, 2>::view(mine.data() + g * W + g, Shape<2>{nx, ny}, Shape<2>{W, 1});
  auto x = DistTensor<T, 2>::from_local(interior, mesh, {Shard(0), Shard(1)}, sizes);
  fill_ghosts(x, ghosted, g, periodic ? Boundary::periodic : Boundary::zero, {0, 1});
  hand_exchange(*mesh.comm(), ref, nx, ny, g, px, py, periodic);
  // Equal to the hand-written exchange, cell by cell (interior untouched), and to the oracle.
  index_t bad = 0, bad_oracle = 0;
  for (index_t i = 0; i < nx + 2 * g; ++i)
    for (index_t j = 0; j < W; ++j) {
      const T v = mine[static_cast<std::size_t>(i * W + j)];
      bad += v != ref[static_cast<std::size_t>(i * W + j)];
      index_t gi = box.lo[0] + i - g, gj = box.lo[1] + j - g;
      const bool outside = gi < 0 || gi >= NX || gj < 0 || gj >= NY;
      gi = (gi % NX + NX) % NX;
      gj = (gj % NY + NY) % NY;
      bad_oracle += v != (outside && !periodic ? T(0) : field<T>(gi, gj));
    }
  CHECK(bad == 0);
  CHECK(bad_oracle == 0);
}

}  // namespace

TEST_CASE("fill_ghosts fills a simulation's ghosted array like its own hand-written exchange",
          "[dist][halo][fill_ghosts][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    std::vector<std::pair<int, int>> meshes = {{P, 1}, {1, P}};
    if (P == 4) meshes.emplace_back(2, 2);
    for (auto [px, py] : meshes)
      for (index_t g : {1, 2})
        for (bool periodic : {false, true})
          for (bool explicit_sizes : {false, true}) {
            check_fill<double>(comm, px, py, g, periodic, explicit_sizes);
            check_fill<float>(comm, px, py, g, periodic, explicit_sizes);
          }
  });
}

TEST_CASE("fill_ghosts on a 3-D field with wide, asymmetric and multi-hop ghosts equals halo_exchange",
          "[dist][halo][fill_ghosts][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, P == 4 ? std::vector<int>{2, 2} : std::vector<int>{P, 1});
    const Shape<3> gs{2, 7, 6};
    auto x = DistTensor<double, 3>::random(gs, mesh, {Shard(1), Shard(2)}, 3);
    // Widths up to the global extent: several hops; reflect and replicate on dim 2.
    for (auto h : {HaloSpec{{0, 4, 1}, {0, 2, 5}, {Boundary::zero, Boundary::periodic, Boundary::reflect}},
                   HaloSpec{{0, 7, 6}, {0, 7, 6}, {Boundary::zero, Boundary::zero, Boundary::replicate}}}) {
      const auto es = detail::halo_extended_shape(x.spec(), h);
      // A ghosted array inside a larger allocation (strided), its interior holding x's block.
      auto big = Tensor<double, 3>::full(Shape<3>{es[0], es[1] + 3, es[2] + 2}, -5.0);
      auto ghosted = big.slice(Shape<3>{0, 1, 2}, Shape<3>{es[0], es[1], es[2]});
      auto interior = ghosted.slice(Shape<3>{h.lo[0], h.lo[1], h.lo[2]}, x.local().shape());
      interior.copy_from(x.local());
      auto xv = DistTensor<double, 3>::from_local(interior, mesh, {Shard(1), Shard(2)}, x.spec().sizes());
      fill_ghosts(xv, ghosted, h);
      CHECK(max_rel_diff(ghosted, halo_exchange(x, h)) == 0.0);
      CHECK(big.at(Shape<3>{0, 0, 0}) == -5.0);  // nothing outside the ghosted box is written
    }
  });
}

TEST_CASE("fill_ghosts refuses a wrongly shaped ghosted array on every rank", "[dist][halo][fill_ghosts][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, {P});
    auto x = DistTensor<double, 2>::random({8, 5}, mesh, {Shard(0)}, 1);
    const auto len = x.local().shape();
    // Rank 0's array is one row short; every rank must throw (no rank left in the exchange).
    auto ghosted = Tensor<double, 2>::zeros(Shape<2>{len[0] + 2 - (mesh.rank() == 0 ? 1 : 0), len[1]});
    const auto err = error_of([&] { fill_ghosts(x, ghosted, 1, Boundary::zero, {0}); });
    CHECK_THAT(err, ContainsSubstring("fill_ghosts"));
    const auto err2 = error_of([&] { fill_ghosts(x, ghosted, 9, Boundary::zero, {0}); });
    CHECK_THAT(err2, ContainsSubstring("fill_ghosts"));
  });
}

}  // namespace st_dist_mpi_fill_ghosts
