// autograd::redistribute: for every transition pair (Shard(0), Shard(1), Replicate, Partial(sum),
// Partial(avg) on 1-D meshes; all pairs of the first four on a 2x2 mesh) and upstream gradients
// given as Shard, Replicate or Partial(sum):
//  - the gradient's placements follow the rule in comm_ops.hpp (sharded stays sharded with the same
//    layout, Partial gets Replicate, Replicate keeps an upstream Partial(sum) deferred);
//  - the dot-product identity <A x, g> == <x, A^T g> with global inner products;
//  - the gradient equals the analytic one and finite differences through a nonlinear scalar loss.
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/autograd/comm_ops.hpp>

#include "support/mpi_harness.hpp"

namespace st_autograd_mpi_redistribute_grad {

using namespace shard;
using autograd::Var;
using shard::test::for_each_comm_size;

namespace {

constexpr int R = 2;
const Shape<R> kShape{7, 5};

/// Weight of this rank's part on the Partial mesh dims of `pl`: parts of a value X are
/// X * weight; the weights sum to 1 over a Partial(sum) dim and average to 1 over Partial(avg).
double part_weight(const DeviceMesh& mesh, const std::vector<Placement>& pl) {
  double w = 1;
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (!pl[static_cast<std::size_t>(m)].is_partial()) continue;
    const int n = mesh.size(m), c = mesh.coord(m);
    const double share = (c + 1.0) / (n * (n + 1) / 2.0);
    w *= pl[static_cast<std::size_t>(m)].op == ReduceOp::avg ? share * n : share;
  }
  return w;
}

/// The global tensor `full` represented under (mesh, placements, sizes), Partial parts unequal.
template <class T>
DistTensor<T, R> represent(const Tensor<T, R>& full, const DeviceMesh& mesh, const std::vector<Placement>& pl,
                           const ShardSizes& sizes = {}) {
  DistSpec spec(mesh, pl, {kShape[0], kShape[1]}, sizes);
  const Box b = spec.local_box();
  auto local = full.slice({b.lo[0], b.lo[1]}, {b.len[0], b.len[1]}).clone();
  const T w = static_cast<T>(part_weight(mesh, pl));
  scale(local, w);
  return DistTensor<T, R>(spec, local);
}

/// Scalar loss 0.5 * sum(c * Y^2) over the global Y; its backward hands y the gradient c*Y
/// represented under `up` (Partial parts unequal) and records it in *seen.
template <class T>
Var<T, R> square_loss(const Var<T, R>& y, const Tensor<T, R>& c, const std::vector<Placement>& up,
                      std::optional<DistTensor<T, R>>* seen) {
  const auto Y = y.value().full_tensor();
  double L = 0;
  for (index_t i = 0; i < Y.size(0); ++i)
    for (index_t j = 0; j < Y.size(1); ++j) L += 0.5 * double(c(i, j)) * double(Y(i, j)) * double(Y(i, j));
  const auto& mesh = y.value().mesh();
  DistSpec sspec(mesh, std::vector<Placement>(static_cast<std::size_t>(mesh.ndim()), Replicate()), {1, 1});
  DistTensor<T, R> value(sspec, Tensor<T, R>::full({1, 1}, static_cast<T>(L)));
  return Var<T, R>::make(value, "square_loss", {y.ref()}, [y, c, up, Y, seen](const DistTensor<T, R>& g) {
    auto G = mul(c, Y);
    scale(G, g.local()(0, 0));
    auto gy = represent(G, y.value().mesh(), up);
    if (seen) *seen = gy;
    y.accumulate_grad(gy);
  });
}

/// Expected gradient placements (the rule of comm_ops.hpp, written out again).
std::vector<Placement> expected_grad(const std::vector<Placement>& x, const std::vector<Placement>& up) {
  std::vector<Placement> e;
  for (std::size_t m = 0; m < x.size(); ++m) {
    if (x[m].is_shard()) e.push_back(x[m]);
    else if (x[m].is_partial()) e.push_back(Replicate());
    else e.push_back(up[m] == Partial(ReduceOp::sum) ? Partial(ReduceOp::sum) : Replicate());
  }
  return e;
}

template <class T>
void check_transition(const DeviceMesh& mesh, const std::vector<Placement>& src, const std::vector<Placement>& dst,
                      const std::vector<Placement>& up, std::uint64_t seed, bool fd, const ShardSizes& dst_sizes = {}) {
  INFO(fmt::format("src {} -> dst {} (sizes {}), upstream {}", src, dst, dst_sizes, up));
  auto X = Tensor<T, R>::empty(kShape), c = Tensor<T, R>::empty(kShape);
  X.fill_random(seed);
  c.fill_random(seed + 1, RandomInit::uniform(0.5, 1.5));
  auto loss_of = [&](const DistTensor<T, R>& xv) {
    autograd::NoGradGuard ng;
    auto y = autograd::redistribute(Var<T, R>(xv), dst, dst_sizes);
    return double(square_loss<T>(y, c, up, nullptr).local()(0, 0));
  };

  // x is a non-leaf (a pass-through node records the gradient redistribute's adjoint produced).
  Var<T, R> x0(represent(X, mesh, src), true);
  std::optional<DistTensor<T, R>> gx_seen, gy_seen;
  auto x = Var<T, R>::make(x0.value(), "capture", {x0.ref()}, [&gx_seen](const DistTensor<T, R>& g) { gx_seen = g; });
  auto y = autograd::redistribute(x, dst, dst_sizes);
  REQUIRE(y.value().placements() == dst);
    auto L = square_loss(y, c, up, &gy_seen);
  L.backward();
  REQUIRE(gx_seen.has_value());
  REQUIRE(gy_seen.has_value());
  const auto& gx = *gx_seen;

  // Placements and layouts of the gradient.
  CHECK(gx.placements() == expected_grad(src, gy_seen->placements()));
  for (int d = 0; d < R; ++d) CHECK(gx.layout(d) == x.value().layout(d));
  // Global value: dL/dX = c * X (y = x globally), and <A x, g> == <x, A^T g>.
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  CHECK(max_rel_diff(y.value().full_tensor(), X) <= tol);
  auto gfull = gx.full_tensor();
  CHECK(max_rel_diff(gfull, mul(c, X)) <= tol);
  const double lhs = dot(y.value().full_tensor(), gy_seen->full_tensor()), rhs = dot(X, gfull);
  CHECK(std::abs(lhs - rhs) <= tol * std::abs(lhs));

  if (!fd) return;
  // Finite differences on the representation: a change of eps at global index i.
  for (index_t lin : {index_t{0}, index_t{17}, index_t{34}}) {
    const auto gi = unravel(lin, kShape);
    auto perturbed = [&](double eps) {
      const Box b = x.value().spec().local_box();
      auto local = x.value().local().clone();
      bool mine = gi[0] >= b.lo[0] && gi[0] < b.lo[0] + b.len[0] && gi[1] >= b.lo[1] && gi[1] < b.lo[1] + b.len[1];
      for (int m = 0; m < mesh.ndim(); ++m)
        if (src[static_cast<std::size_t>(m)] == Partial(ReduceOp::sum) && mesh.coord(m) != 0) mine = false;
      if (mine) local(gi[0] - b.lo[0], gi[1] - b.lo[1]) += static_cast<T>(eps);
      return DistTensor<T, R>(x.value().spec(), local);
    };
    const double eps = 1e-4;
    const double fdv = (loss_of(perturbed(eps)) - loss_of(perturbed(-eps))) / (2 * eps);
    CHECK(std::abs(fdv - double(gfull.at(gi))) <= 1e-7 * std::max(1.0, std::abs(fdv)));
  }
}

std::vector<std::vector<Placement>> upstreams(const DeviceMesh& mesh, const std::vector<Placement>& dst) {
  const auto n = static_cast<std::size_t>(mesh.ndim());
  return {dst, std::vector<Placement>(n, Replicate()), std::vector<Placement>(n, Partial(ReduceOp::sum))};
}

}  // namespace

TEST_CASE("autograd::redistribute on a 1-D mesh: every transition pair, every upstream kind", "[autograd][redistribute][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm);
    const std::vector<Placement> set = {Shard(0), Shard(1), Replicate(), Partial(ReduceOp::sum), Partial(ReduceOp::avg)};
    std::uint64_t seed = 1;
    for (const auto& s : set)
      for (const auto& d : set)
        for (const auto& up : upstreams(mesh, {d})) {
          check_transition<double>(mesh, {s}, {d}, up, seed, true);
          check_transition<float>(mesh, {s}, {d}, up, seed, false);
          seed += 3;
        }
    // Uneven explicit target sizes with an empty shard.
    if (comm->size() >= 2) {
      std::vector<index_t> sz(static_cast<std::size_t>(comm->size()), 1);
      sz[0] = 0;
      sz.back() = 7 - (comm->size() - 2);
      for (const auto& s : set)
        check_transition<double>(mesh, {s}, {Shard(0)}, {Partial(ReduceOp::sum)}, seed++, true, {sz, {}});
    }
  });
}

TEST_CASE("autograd::redistribute on 2-D meshes: every pair of placements", "[autograd][redistribute][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        const int P = comm->size();
        const std::vector<Placement> set = {Shard(0), Shard(1), Replicate(), Partial(ReduceOp::sum)};
        std::vector<std::vector<Placement>> pls;
        for (const auto& a : set)
          for (const auto& b : set) pls.push_back({a, b});
        // All 256 pairs on 2x2 (4 ranks) and 2x1 (2 ranks); every 4th pair on 1x2 and 3x1.
        std::vector<std::vector<int>> shapes;
        if (P == 4) shapes = {{2, 2}};
        if (P == 2) shapes = {{2, 1}, {1, 2}};
        if (P == 3) shapes = {{3, 1}};
        for (const auto& shape : shapes) {
          DeviceMesh mesh(comm, shape);
          const bool all_pairs = shape[0] == 2;
          std::uint64_t seed = 500;
          std::size_t k = 0;
          for (const auto& s : pls)
            for (const auto& d : pls) {
              if (!all_pairs && (k++ % 4) != 0) continue;
              const auto ups = upstreams(mesh, d);
              check_transition<double>(mesh, s, d, ups[seed % 3], seed, seed % 5 == 0);
              ++seed;
            }
        }
      },
      2);
}

}  // namespace st_autograd_mpi_redistribute_grad
