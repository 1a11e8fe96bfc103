// MPI tests of the point-cloud <-> grid operators (nn/functional/point_grid.hpp): forward values
// and every gradient (grid, points, features) equal the unsharded computation at 1..4 ranks on
// 1-D and 2-D meshes (uneven, one-cell and empty grid shards, halos wider than a shard), D = 2
// and 3, fp32 and fp64; fp64 finite differences; bad input refused on every rank.
//
// The point sets are routed like a user would route them: the global points (deterministic,
// generated on every rank alike) are given to the owner of their grid box
// (F::grid_partition(grid spec, domain).owner), keeping the global order within each rank; the
// sharded results are put back in global point order before they are compared.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_nn_mpi_point_grid {

using namespace shard;
using namespace shard::test;

namespace {

using autograd::Var;
using fn::Result;

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double uniform01(std::uint64_t& s) { return static_cast<double>(splitmix(s) >> 11) * 0x1.0p-53; }

/// How the grid lies on the mesh.
struct GridLayout {
  std::string name;
  std::vector<int> mesh_shape;
  std::vector<Placement> pl;
  ShardSizes sizes;
};

GridLayout reference_layout() { return {"reference", {1}, {Replicate()}, {}}; }

/// Grid layouts at P ranks: each spatial dim sharded over a 1-D mesh (balanced: uneven at 3
/// ranks), dim 2 with a one-cell shard and an empty one, 2-D meshes (both orders of mesh dims).
std::vector<GridLayout> grid_layouts(int P, const std::vector<index_t>& shape) {
  const int R = static_cast<int>(shape.size());
  std::vector<GridLayout> out;
  for (int d = 2; d < R; ++d) out.push_back({fmt::format("1d-Shard({})", d), {P}, {Shard(d)}, {}});
  if (P >= 2) {
    std::vector<index_t> s(static_cast<std::size_t>(P), 0);
    const index_t n = shape[2];
    if (P == 2) s = {1, n - 1};
    if (P == 3) s = {1, 0, n - 1};
    if (P == 4) s = {0, 1, n - 3, 2};
    ShardSizes sz(static_cast<std::size_t>(R));
    sz[2] = s;
    out.push_back({"1d-Shard(2)-ragged", {P}, {Shard(2)}, sz});
  }
  if (P == 4) {
    out.push_back({"2x2", {2, 2}, {Shard(2), Shard(3)}, {}});
    out.push_back({"2x2-last-first", {2, 2}, {Shard(R - 1), Shard(2)}, {}});
  }
  if (P == 2) {
    out.push_back({"1x2", {1, 2}, {Shard(2), Shard(3)}, {}});
    out.push_back({"2x1", {2, 1}, {Shard(3), Shard(2)}, {}});
  }
  return out;
}

/// One problem: the grid, its domain, the points and the points_to_grid variants to run.
struct Case {
  std::vector<index_t> shape;  ///< [1, C, n...]
  F::GridDomain dom;
  index_t np = 40;
  std::vector<double> radii;  ///< in units of the smallest cell width
  bool smooth = false;        ///< points away from every kink (finite differences)
  std::uint64_t seed = 7;

  int D() const { return static_cast<int>(shape.size()) - 2; }
  index_t C() const { return shape[1]; }
  double h(int d) const {
    const auto u = static_cast<std::size_t>(d);
    return (dom.hi[u] - dom.lo[u]) / static_cast<double>(shape[u + 2]);
  }
  double hmin() const {
    double m = h(0);
    for (int d = 1; d < D(); ++d) m = std::min(m, h(d));
    return m;
  }
  index_t cells() const {
    index_t n = 1;
    for (int d = 0; d < D(); ++d) n *= shape[static_cast<std::size_t>(d) + 2];
    return n;
  }
};

std::vector<F::PointGridOptions> all_options() {
  return {{F::PointReduce::sum, F::PointWeight::none},
          {F::PointReduce::sum, F::PointWeight::linear},
          {F::PointReduce::mean, F::PointWeight::none},
          {F::PointReduce::mean, F::PointWeight::linear}};
}

/// The global data of a case (doubles; the same on every rank and rank count).
struct Data {
  std::vector<double> grid, points, features, wy;
  std::vector<std::vector<double>> wz;  ///< loss weights of each points_to_grid output
};

/// True if p is within `eps` (relative to the cell width) of a kink of any op of the case.
bool near_kink(const Case& k, const double* p) {
  const double eps = 1e-3;
  for (int d = 0; d < k.D(); ++d) {
    const auto u = static_cast<std::size_t>(d);
    const double x = (p[d] - k.dom.lo[u]) / k.h(d);  // faces at integers, centres at half-integers
    if (std::abs(x - std::round(x)) < eps) return true;                 // box cuts (ownership)
    if (std::abs(x - 0.5 - std::round(x - 0.5)) < eps) return true;   // interpolation kinks
  }
  for (double rr : k.radii) {
    const double r = rr * k.hmin();
    std::vector<index_t> i(static_cast<std::size_t>(k.D()), 0);
    for (index_t c = 0; c < k.cells(); ++c) {
      index_t rem = c;
      double d2 = 0;
      for (int d = k.D() - 1; d >= 0; --d) {
        const auto u = static_cast<std::size_t>(d);
        const index_t n = k.shape[u + 2];
        const double ctr = k.dom.lo[u] + (static_cast<double>(rem % n) + 0.5) * k.h(d);
        rem /= n;
        d2 += (p[d] - ctr) * (p[d] - ctr);
      }
      const double dist = std::sqrt(d2);
      if (std::abs(dist - r) < eps * k.hmin() || dist < eps * k.hmin()) return true;
    }
  }
  return false;
}

Data make_data(const Case& k) {
  Data v;
  std::uint64_t s = k.seed;
  const int D = k.D();
  const index_t C = k.C();
  v.grid.resize(static_cast<std::size_t>(C * k.cells()));
  for (auto& x : v.grid) x = 2 * uniform01(s) - 1;
  std::vector<double> p(static_cast<std::size_t>(D));
  if (!k.smooth) {
    // special points: the domain's corners, cell centres and faces (shard cuts are faces)
    for (int corner = 0; corner < (1 << D); ++corner)
      for (int d = 0; d < D; ++d)
        v.points.push_back((corner >> d) & 1 ? k.dom.hi[static_cast<std::size_t>(d)] : k.dom.lo[static_cast<std::size_t>(d)]);
    for (int j = 0; j < 6; ++j)
      for (int d = 0; d < D; ++d) {
        const auto u = static_cast<std::size_t>(d);
        const index_t n = k.shape[u + 2];
        const double cell = static_cast<double>(splitmix(s) % static_cast<std::uint64_t>(n));
        v.points.push_back(k.dom.lo[u] + (cell + (j % 2 ? 0.5 : 0.0)) * k.h(d));
      }
  }
  while (static_cast<index_t>(v.points.size()) < k.np * D) {
    for (int d = 0; d < D; ++d) {
      const auto u = static_cast<std::size_t>(d);
      p[u] = k.dom.lo[u] + uniform01(s) * (k.dom.hi[u] - k.dom.lo[u]);
    }
    if (k.smooth && near_kink(k, p.data())) continue;
    v.points.insert(v.points.end(), p.begin(), p.end());
  }
  const index_t np = static_cast<index_t>(v.points.size()) / D;
  v.features.resize(static_cast<std::size_t>(np * C));
  for (auto& x : v.features) x = 2 * uniform01(s) - 1;
  v.wy.resize(static_cast<std::size_t>(np * C));
  for (auto& x : v.wy) x = 2 * uniform01(s) - 1;
  for (std::size_t j = 0; j < k.radii.size() * all_options().size(); ++j) {
    v.wz.emplace_back(static_cast<std::size_t>(C * k.cells()));
    for (auto& x : v.wz.back()) x = 2 * uniform01(s) - 1;
  }
  return v;
}

/// One perturbed element: input 0 = grid, 1 = points, 2 = features (global flat index).
struct Perturb {
  int input = -1;
  index_t index = 0;
  double delta = 0;
};

template <class T, int R>
Tensor<T, R> full_of(const std::vector<index_t>& shape, const std::vector<double>& v, const Perturb* pp, int input) {
  Shape<R> s{};
  for (int d = 0; d < R; ++d) s[d] = shape[static_cast<std::size_t>(d)];
  auto t = Tensor<T, R>::empty(s);
  for (std::size_t i = 0; i < v.size(); ++i) t.data()[i] = static_cast<T>(v[i]);
  if (pp && pp->input == input) t.data()[pp->index] = static_cast<T>(v[static_cast<std::size_t>(pp->index)] + pp->delta);
  return t;
}

/// Rows `order[lo, hi)` of a global [n, w] array as a local tensor.
template <class T>
Tensor<T, 2> rows_of(const std::vector<double>& v, index_t w, const std::vector<index_t>& order, index_t lo, index_t hi,
                     const Perturb* pp, int input) {
  auto t = Tensor<T, 2>::empty({hi - lo, w});
  for (index_t k = lo; k < hi; ++k)
    for (index_t j = 0; j < w; ++j) {
      const index_t g = order[static_cast<std::size_t>(k)] * w + j;
      double x = v[static_cast<std::size_t>(g)];
      if (pp && pp->input == input && pp->index == g) x += pp->delta;
      t.data()[(k - lo) * w + j] = static_cast<T>(x);
    }
  return t;
}

/// A full [n, w] tensor whose rows are in `order` back in global order.
template <class T>
std::vector<double> unpermute(const Tensor<T, 2>& t, const std::vector<index_t>& order) {
  const index_t n = t.size(0), w = t.size(1);
  std::vector<double> out(static_cast<std::size_t>(n * w));
  for (index_t k = 0; k < n; ++k)
    for (index_t j = 0; j < w; ++j)
      out[static_cast<std::size_t>(order[static_cast<std::size_t>(k)] * w + j)] = static_cast<double>(t.data()[k * w + j]);
  return out;
}

/// Runs every op of the case on `mesh` with the grid laid out by `L`: outputs and gradients
/// (grid, points, features) in global order, and the loss sum of <output, weights>.
template <class T, int R>
Result run_case(const DeviceMesh& mesh, const GridLayout& L, const Case& k, const Data& v, bool grads = true,
                const Perturb* pp = nullptr) {
  constexpr int D = R - 2;
  const index_t C = k.C();
  std::optional<autograd::NoGradGuard> ng;
  if (!grads) ng.emplace();
  Result res;
  Var<T, R> grid(DistTensor<T, R>::distribute(full_of<T, R>(k.shape, v.grid, pp, 0), mesh, L.pl, -1, L.sizes), true);
  const DistSpec gs = grid.value().spec();
  const BoxPartition part = F::grid_partition(gs, k.dom);
  // route the (T-rounded) global points to the owners of their boxes, global order kept per rank
  const index_t np = static_cast<index_t>(v.points.size()) / D;
  std::vector<int> owner(static_cast<std::size_t>(np));
  for (index_t i = 0; i < np; ++i) {
    double p[3];
    for (int d = 0; d < D; ++d) {
      const index_t g = i * D + d;
      double x = v.points[static_cast<std::size_t>(g)];
      if (pp && pp->input == 1 && pp->index == g) x += pp->delta;
      p[d] = static_cast<double>(static_cast<T>(x));
    }
    owner[static_cast<std::size_t>(i)] = part.owner(p);
    REQUIRE(owner[static_cast<std::size_t>(i)] >= 0);
  }
  std::vector<index_t> order(static_cast<std::size_t>(np));
  std::iota(order.begin(), order.end(), index_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](index_t a, index_t b) { return owner[static_cast<std::size_t>(a)] < owner[static_cast<std::size_t>(b)]; });
  std::vector<index_t> counts(static_cast<std::size_t>(mesh.size()), 0);
  for (int o : owner) ++counts[static_cast<std::size_t>(o)];
  const DistSpec ps = point_spec(mesh, counts, D), fs = point_spec(mesh, counts, C);
  const index_t lo = point_offset(ps, mesh.rank()), hi = point_offset(ps, mesh.rank() + 1);
  Var<T, 2> points(DistTensor<T, 2>(ps, rows_of<T>(v.points, D, order, lo, hi, pp, 1)), true);
  Var<T, 2> feats(DistTensor<T, 2>(fs, rows_of<T>(v.features, C, order, lo, hi, pp, 2)), true);

  Var<T, 1> loss;
  bool have = false;
  auto add = [&](Var<T, 1> term) {
    loss = have ? F::add(loss, term) : term;
    have = true;
  };
  {
    auto y = F::grid_to_points(grid, points, k.dom);
    Var<T, 2> w(DistTensor<T, 2>(fs, rows_of<T>(v.wy, C, order, lo, hi, nullptr, -1)), false);
    add(F::resolve(F::sum(F::mul(y, w))));
    res.outputs.push_back(unpermute(y.value().full_tensor(), order));
  }
  std::size_t j = 0;
  for (double rr : k.radii)
    for (const auto& o : all_options()) {
      auto z = F::points_to_grid<R>(points, feats, gs, k.dom, rr * k.hmin(), o);
      Var<T, R> w(DistTensor<T, R>::distribute(full_of<T, R>(k.shape, v.wz[j++], nullptr, -1), mesh, L.pl, -1,
                                               L.sizes),
                  false);
      add(F::resolve(F::sum(F::mul(z, w))));
      res.outputs.push_back(fn::flatten(z.value().full_tensor()));
    }
  res.loss = static_cast<double>(loss.local().data()[0]);
  if (grads) {
    loss.backward();
    res.grad_names = {"grad of the grid", "grad of the points", "grad of the features"};
    res.grads.push_back(fn::flatten(grid.grad().full_tensor()));
    res.grads.push_back(unpermute(points.grad().full_tensor(), order));
    res.grads.push_back(unpermute(feats.grad().full_tensor(), order));
    res.grad_specs_ok = grid.grad().spec() == gs && points.grad().spec() == ps && feats.grad().spec() == fs;
  }
  return res;
}

template <class T, int R>
Result reference(const Case& k, const Data& v) {
  DeviceMesh m1(std::make_shared<SelfComm>(), {1});
  return run_case<T, R>(m1, reference_layout(), k, v);
}

template <class T, int R>
void check_sharded(const Case& k) {
  const Data v = make_data(k);
  const Result ref = reference<T, R>(k, v);
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& L : grid_layouts(comm->size(), k.shape)) {
      INFO("layout " << L.name << " on " << comm->size() << " ranks");
      DeviceMesh mesh(comm, L.mesh_shape);
      fn::require_match(run_case<T, R>(mesh, L, k, v), ref, tol<T>());
    }
  });
}

/// Central differences of the loss (fp64) against the backward gradients, for `count` elements
/// of the grid, the points and the features, on `mesh` / `L`.
template <int R>
void check_fd(const DeviceMesh& mesh, const GridLayout& L, const Case& k, int count = 10) {
  const Data v = make_data(k);
  const Result base = run_case<double, R>(mesh, L, k, v);
  const double h = 1e-6;
  for (int input = 0; input < 3; ++input) {
    const auto& g = base.grads[static_cast<std::size_t>(input)];
    double gmax = 0;
    for (double x : g) gmax = std::max(gmax, std::abs(x));
    const index_t n = static_cast<index_t>(g.size());
    for (int c = 0; c < count; ++c) {
      const index_t idx = (static_cast<index_t>(c) * n) / count + (c % 3) % std::max<index_t>(n, 1);
      const Perturb pp{input, std::min(idx, n - 1), h}, pm{input, std::min(idx, n - 1), -h};
      const double fd = (run_case<double, R>(mesh, L, k, v, false, &pp).loss -
                         run_case<double, R>(mesh, L, k, v, false, &pm).loss) /
                        (2 * h);
      INFO(base.grad_names[static_cast<std::size_t>(input)] << " element " << pp.index << " on " << L.name << ": fd "
                                                            << fd << " vs backward "
                                                            << g[static_cast<std::size_t>(pp.index)]);
      CHECK(std::abs(fd - g[static_cast<std::size_t>(pp.index)]) <= 1e-6 * std::max(1.0, gmax));
    }
  }
}

Case case2d() { return {{1, 2, 9, 7}, {{-1.0, 0.5}, {2.0, 2.25}}, 40, {0.7, 2.6}}; }
Case case3d() { return {{1, 2, 6, 5, 4}, {{0.0, -1.0, 0.25}, {1.5, 1.5, 1.25}}, 30, {1.3}}; }

}  // namespace

TEMPLATE_TEST_CASE("sharded point <-> grid ops equal the unsharded ops (D = 2)", "[nn][point_grid][mpi]", float,
                   double) {
  check_sharded<TestType, 4>(case2d());
  Case wide = case2d();  // radius wider than several shards (multi-hop halos)
  wide.radii = {3.4};
  wide.seed = 11;
  check_sharded<TestType, 4>(wide);
}

TEMPLATE_TEST_CASE("sharded point <-> grid ops equal the unsharded ops (D = 3)", "[nn][point_grid][mpi]", float,
                   double) {
  check_sharded<TestType, 5>(case3d());
}

TEST_CASE("point <-> grid gradients match finite differences", "[nn][point_grid][fd][mpi]") {
  Case k2 = case2d();
  k2.smooth = true;
  k2.np = 24;
  Case k3 = case3d();
  k3.smooth = true;
  k3.np = 12;
  const DeviceMesh self(std::make_shared<SelfComm>(), {1});
  check_fd<4>(self, reference_layout(), k2);
  check_fd<5>(self, reference_layout(), k3, 6);
  for_each_comm_size(
      [&](CommPtr comm) {
        for (const auto& L : grid_layouts(comm->size(), k2.shape))
          if (L.name == "2x2" || L.name == "1d-Shard(2)-ragged" || L.name == "1d-Shard(3)")
            check_fd<4>(DeviceMesh(comm, L.mesh_shape), L, k2, 6);
      },
      world_size());
}

TEST_CASE("point <-> grid ops refuse bad input on every rank", "[nn][point_grid][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size(), me = comm->rank();
    DeviceMesh mesh(comm, {P});
    const F::GridDomain dom{{0.0, 0.0}, {1.0, 2.0}};
    Var<double, 4> grid(DistTensor<double, 4>::random({1, 3, 8, 6}, mesh, {Shard(2)}, 1), true);
    const DistSpec gs = grid.value().spec();
    const BoxPartition part = F::grid_partition(gs, dom);
    // one point per rank, in the rank's own box, or (bad) in the next rank's box / outside
    auto points_at = [&](bool bad_here) {
      const int r = bad_here ? (me + 1) % P : me;
      std::vector<index_t> counts(static_cast<std::size_t>(P), 1);
      if (gs.layout(2).size(r) == 0) counts[static_cast<std::size_t>(me)] = 0;
      auto t = Tensor<double, 2>::empty({counts[static_cast<std::size_t>(me)], 2});
      if (t.size(0) == 1) {
        t.data()[0] = 0.5 * (part.lo(r, 0) + part.hi(r, 0));
        t.data()[1] = P == 1 && bad_here ? 2.5 : 1.0;  // one rank: outside the domain
      }
      std::vector<index_t> all = comm->allgather_value(counts[static_cast<std::size_t>(me)]);
      return Var<double, 2>(DistTensor<double, 2>(point_spec(mesh, all, 2), t), true);
    };
    auto ok = points_at(false);
    const index_t nloc = ok.local().size(0);
    std::vector<index_t> all = comm->allgather_value(nloc);
    auto feats = [&](index_t C) {
      return Var<double, 2>(DistTensor<double, 2>(point_spec(mesh, all, C), Tensor<double, 2>::zeros({nloc, C})), true);
    };
    CHECK(error_of([&] { F::grid_to_points(grid, ok, dom); }).empty());
    CHECK(error_of([&] { F::points_to_grid<4>(ok, feats(3), gs, dom, 0.3); }).empty());
    // points outside their boxes: on every rank, and on rank 0 only
    for (bool only0 : {false, true}) {
      auto bad = points_at(!only0 || me == 0);
      const std::string e = error_of([&] { F::grid_to_points(grid, bad, dom); });
      CHECK(e.find("outside") != std::string::npos);
      CHECK(!error_of([&] { F::points_to_grid<4>(bad, feats(3), gs, dom, 0.3); }).empty());
    }
    if (P > 1) {  // misplaced points routed to their grid boxes by partition_by_box are accepted
      auto routed = F::partition_by_box(points_at(true), part);
      CHECK(error_of([&] { F::grid_to_points(grid, routed.points, dom); }).empty());
    }
    // wrong coordinate count
    Var<double, 2> p3(DistTensor<double, 2>(point_spec(mesh, all, 3), Tensor<double, 2>::zeros({nloc, 3})), true);
    CHECK(error_of([&] { F::grid_to_points(grid, p3, dom); }).find("coordinates") != std::string::npos);
    CHECK(!error_of([&] { F::points_to_grid<4>(p3, feats(3), gs, dom, 0.3); }).empty());
    // radius < 0, NaN, infinite; linear weight with radius 0
    for (double r : {-0.1, std::nan(""), std::numeric_limits<double>::infinity()})
      CHECK(error_of([&] { F::points_to_grid<4>(ok, feats(3), gs, dom, r); }).find("radius") != std::string::npos);
    CHECK(!error_of([&] {
             F::points_to_grid<4>(ok, feats(3), gs, dom, 0.0, {F::PointReduce::sum, F::PointWeight::linear});
           }).empty());
    CHECK(error_of([&] { F::points_to_grid<4>(ok, feats(3), gs, dom, 0.0); }).empty());
    // wrong channel count; wrong grid rank
    CHECK(error_of([&] { F::points_to_grid<4>(ok, feats(2), gs, dom, 0.3); }).find("channels") != std::string::npos);
    CHECK(!error_of([&] { F::points_to_grid<5>(ok, feats(3), gs, dom, 0.3); }).empty());
    // batch != 1
    Var<double, 4> g2(DistTensor<double, 4>::random({2, 3, 8, 6}, mesh, {Shard(2)}, 1), true);
    CHECK(error_of([&] { F::grid_to_points(g2, ok, dom); }).find("batch") != std::string::npos);
    CHECK(!error_of([&] { F::points_to_grid<4>(ok, feats(3), g2.value().spec(), dom, 0.3); }).empty());
    // a domain of the wrong dimension or empty
    CHECK(!error_of([&] { F::grid_to_points(grid, ok, F::GridDomain{{0.0}, {1.0}}); }).empty());
    CHECK(!error_of([&] { F::grid_to_points(grid, ok, F::GridDomain{{0.0, 1.0}, {1.0, 1.0}}); }).empty());
    if (P > 1) {
      // channels sharded; not a spatial decomposition (replicated over the mesh)
      Var<double, 4> gc(DistTensor<double, 4>::random({1, 4, 8, 6}, mesh, {Shard(1)}, 1), true);
      CHECK(!error_of([&] { F::grid_to_points(gc, ok, dom); }).empty());
      Var<double, 4> gr(DistTensor<double, 4>::random({1, 3, 8, 6}, mesh, {Replicate()}, 1), true);
      CHECK(!error_of([&] { F::grid_to_points(gr, ok, dom); }).empty());
    }
    if (P == 4) {
      // two mesh dims sharding one grid dim: not a box partition
      DeviceMesh m2(comm, {2, 2});
      Var<double, 4> gs2(DistTensor<double, 4>::random({1, 3, 8, 6}, m2, {Shard(2), Shard(2)}, 1), true);
      CHECK(error_of([&] { F::grid_partition(gs2.value().spec(), dom); }).find("mesh dims") != std::string::npos);
    }
    // a Partial grid (not a spatial decomposition once resolved)
    Var<double, 4> gp(DistTensor<double, 4>(gs.with_placements({Partial(ReduceOp::sum)}),
                                            grid.value().full_tensor().contiguous()),
                      true);
    CHECK(error_of([&] { F::grid_to_points(gp, ok, dom); }).find("Partial") != std::string::npos);
    // the communicator is still in step
    double one = 1;
    comm->allreduce(&one, &one, 1, DType::f64, ReduceOp::sum);
    CHECK(one == P);
  });
}

}  // namespace st_nn_mpi_point_grid
