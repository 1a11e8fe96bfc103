// MPI tests of the split-phase ring shift (dist/ring.hpp): every rank receives exactly the previous
// rank's block (uneven sizes, empty blocks), on one mesh dim and on the flattened product of two
// mesh dims of a 2-D mesh, at 1..4 ranks; the backward shift is its adjoint (<S x, y> = <x, S^T y>);
// several segments and two shifts in flight at once; exchange_counts.
#include <catch2/catch_test_macros.hpp>

#include <numeric>

#include "support/mpi_harness.hpp"

namespace st_dist_mpi_ring {

using namespace shard;
using namespace shard::test;

namespace {

/// Block length of ring position j (uneven, position 1 empty when the ring has >= 3 ranks).
index_t block_len(int j, int P) { return P >= 3 && j == 1 ? 0 : 3 + 2 * j; }

/// Value of element i of the block of the rank with mesh rank `mr`.
double value_of(int mr, index_t i, int salt) { return 1000.0 * mr + i + 0.25 * salt; }

/// <a, b> summed over the ranks of `comm`.
double global_dot(const CommPtr& comm, const Tensor<double, 1>& a, const Tensor<double, 1>& b) {
  double d = dot(a, b);
  comm->allreduce(&d, &d, 1, DType::f64, ReduceOp::sum);
  return d;
}

Tensor<double, 1> random_block(index_t n, std::uint64_t seed) {
  auto t = Tensor<double, 1>::empty({n});
  t.fill_random(seed, RandomInit::uniform(-1, 1));
  return t;
}

void check_ring(const DeviceMesh& mesh, const std::vector<int>& dims) {
  RingShift ring(mesh, dims);
  const int P = ring.size(), r = ring.index();
  INFO("mesh " << fmt::format("{}", mesh.shape()) << " ring dims " << fmt::format("{}", dims) << " ring " << r << "/"
               << P);
  CHECK(ring.mesh_rank_of(r) == mesh.rank());
  const int prev = ring.neighbor(-1), next = ring.neighbor(1);
  // forward: receive the previous ring rank's block, element by element
  {
    auto x = Tensor<double, 1>::empty({block_len(r, P)});
    for (index_t i = 0; i < x.numel(); ++i) x.data()[i] = value_of(mesh.rank(), i, 0);
    auto y = ring_shift_start(ring, x, Shape<1>{block_len(prev, P)}).finish();
    REQUIRE(y.numel() == block_len(prev, P));
    bool ok = true;
    for (index_t i = 0; i < y.numel(); ++i) ok = ok && y.data()[i] == value_of(ring.mesh_rank_of(prev), i, 0);
    CHECK(ok);
  }
  // adjoint: <S x, y> = <x, S^T y> with x_r of length n_r and y_r of length n_{r-1}
  {
    const auto x = random_block(block_len(r, P), 11 + static_cast<std::uint64_t>(mesh.rank()));
    const auto y = random_block(block_len(prev, P), 101 + static_cast<std::uint64_t>(mesh.rank()));
    const auto sx = ring_shift_start(ring, x, Shape<1>{block_len(prev, P)}, RingDirection::forward).finish();
    const auto sty = ring_shift_start(ring, y, Shape<1>{block_len(r, P)}, RingDirection::backward).finish();
    const CommPtr& c = mesh.comm();
    const double lhs = global_dot(c, sx, y), rhs = global_dot(c, x, sty);
    CHECK(std::abs(lhs - rhs) <= 1e-12 * std::max(1.0, std::abs(lhs)));
    if (P > 1) CHECK(lhs != 0.0);
  }
  // two segments, two shifts in flight at once (forward tag 0 and backward tag 1), P steps = identity
  {
    auto a = Tensor<double, 1>::empty({block_len(r, P)});
    auto b = Tensor<double, 1>::empty({block_len(r, P) + 1});
    for (index_t i = 0; i < a.numel(); ++i) a.data()[i] = value_of(mesh.rank(), i, 1);
    for (index_t i = 0; i < b.numel(); ++i) b.data()[i] = value_of(mesh.rank(), i, 2);
    auto ca = a.clone(), cb = b.clone();
    for (int s = 0; s < P; ++s) {
      const int from = ring.neighbor(-(s + 1));
      auto na = Tensor<double, 1>::empty({block_len(from, P)});
      auto nb = Tensor<double, 1>::empty({block_len(from, P) + 1});
      const RingSegment seg[2] = {{ca.data(), ca.numel(), na.data(), na.numel()},
                                  {cb.data(), cb.numel(), nb.data(), nb.numel()}};
      auto back = random_block(block_len(r, P), 7);
      auto back_in = Tensor<double, 1>::empty({block_len(next, P)});
      const RingSegment bseg{back.data(), back.numel(), back_in.data(), back_in.numel()};
      auto t1 = ring.start(seg, DType::f64);
      auto t2 = ring.start(std::span<const RingSegment>(&bseg, 1), DType::f64, RingDirection::backward, nullptr, 1);
      t2.finish();
      t1.finish();
      ca = na;
      cb = nb;
    }
    CHECK(max_rel_diff(ca, a) == 0.0);
    CHECK(max_rel_diff(cb, b) == 0.0);
  }
  CHECK(ring.exchange_counts(block_len(r, P)) == block_len(prev, P));
  CHECK(ring.exchange_counts(block_len(r, P), RingDirection::backward) == block_len(next, P));
}

}  // namespace

TEST_CASE("ring shift moves uneven blocks and its adjoint is the backward shift", "[dist][ring][attention][mpi]") {
  for_each_comm([](CommPtr comm) {
    const int P = comm->size();
    check_ring(DeviceMesh(comm, {P}), {0});
    if (P == 4) {
      DeviceMesh m(comm, {2, 2});
      check_ring(m, {0});
      check_ring(m, {1});
      check_ring(m, {0, 1});
      check_ring(m, {1, 0});  // order given does not matter: row-major over ascending dims
    }
    if (P == 2) {
      DeviceMesh m(comm, {1, 2});
      check_ring(m, {0, 1});
      check_ring(m, {0});
    }
    if (P == 3) check_ring(DeviceMesh(comm, {3, 1}), {0, 1});
  });
}

TEST_CASE("ring_shift of a sharded tensor delivers the previous rank's block", "[dist][ring][attention][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, {P});
    const Shape<2> g{7, 3};
    auto full = Tensor<double, 2>::empty(g);
    full.fill_random(5);
    auto x = DistTensor<double, 2>::distribute(full, mesh, {Shard(0)});
    auto y = ring_shift(x, {0});
    const int prev = (comm->rank() + P - 1) % P;
    const Box& b = x.spec().box_of(prev);
    auto want = full.narrow(0, b.lo[0], b.len[0]).contiguous();
    REQUIRE(y.shape() == want.shape());
    CHECK(max_rel_diff(y, want) == 0.0);
    auto back = ring_shift(x, {0}, RingDirection::backward);
    const Box& bn = x.spec().box_of((comm->rank() + 1) % P);
    CHECK(max_rel_diff(back, full.narrow(0, bn.lo[0], bn.len[0]).contiguous()) == 0.0);
  });
}

}  // namespace st_dist_mpi_ring
