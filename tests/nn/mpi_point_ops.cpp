// The point-cloud ops of nn/functional/neighbors.hpp at 1-4 ranks on 1-D and 2-D meshes, ragged
// and empty point shards, fp64 and fp32:
//  - gather_neighbors, neighbor_offsets, neighbor_distance, distance_weights and aggregate
//    (sum / mean / max, with and without weights): forward values and every gradient against
//    the unsharded computation (the oracle harness, functional_oracle.hpp), kNN lists and radius
//    lists (padding, empty rows), query == support (distances of 0);
//  - fp64 finite differences of a scalar loss through the whole chain (positions and features);
//  - the dot-product test of the gather: <G f, p> == <f, G^T p> with the tape's backward;
//  - partition_by_box: routed rows in their boxes, in the stable order by owner, features and
//    labels routed alike, uneven counts and an empty box, gradients back to the source rows;
//  - bad input refused on every rank (a different point set, D mismatch, bad indices, points
//    outside the domain or NaN, meshes that differ).
// The neighbour lists are built here from the unsharded brute-force search (exec/neighbors.hpp)
// and sliced like the query set, so the ops are tested independently of shard::knn.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <numeric>
#include <shardtensor/exec/neighbors.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_nn_mpi_point_ops {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;
using autograd::Var;

namespace {

/// Ragged per-rank counts of n points over p ranks: weights (r + shift) % 3 (so empty shards at
/// p >= 2 for some shifts), everything on one rank when p == 1.
std::vector<index_t> ragged(index_t n, int p, int shift) {
  std::vector<index_t> w(static_cast<std::size_t>(p)), c(w.size(), 0);
  for (int r = 0; r < p; ++r) w[static_cast<std::size_t>(r)] = (r + shift) % 3;
  index_t sw = std::accumulate(w.begin(), w.end(), index_t{0});
  if (sw == 0) {
    w.assign(w.size(), 1);
    sw = p;
  }
  index_t left = n;
  for (std::size_t r = 0; r < w.size(); ++r) {
    c[r] = n * w[r] / sw;
    left -= c[r];
  }
  for (std::size_t r = 0; r < w.size(); ++r)
    if (w[r] > 0) {
      c[r] += left;
      break;
    }
  return c;
}

ShardSizes point_sizes(const std::vector<index_t>& counts, std::size_t rank = 2) {
  ShardSizes s(rank);
  s[0] = counts;
  return s;
}

/// The meshes a point set is tested on at p ranks.
std::vector<std::vector<int>> mesh_shapes(int p) {
  std::vector<std::vector<int>> out{{p}};
  if (p == 4) out.push_back({2, 2});
  if (p == 2) {
    out.push_back({1, 2});
    out.push_back({2, 1});
  }
  return out;
}

/// One neighbour-list recipe: kNN (k) or radius (radius, max_neighbours = k).
struct ListKind {
  bool knn = true;
  index_t k = 4;
  double radius = 0;
};

/// Lists of the unsharded query (kNN or radius, brute force, on every rank) sliced like `query`'s rows.
template <class T>
Neighbors<T> make_lists(const DistTensor<T, 2>& query, const DistTensor<T, 2>& support, const ListKind& lk) {
  const auto q = query.full_tensor(), s = support.full_tensor();
  const index_t nq = q.shape()[0], ns = s.shape()[0], D = q.shape()[1], K = lk.k;
  auto idx = Tensor<std::int64_t, 2>::empty({nq, K});
  auto d2 = Tensor<T, 2>::empty({nq, K});
  auto cnt = Tensor<std::int64_t, 1>::empty({nq});
  auto& ctx = current_context();
  if (lk.knn) {
    exec::neighbors_knn(exec::KnnGeometry{nq, ns, static_cast<int>(D), K, 0, exec::NeighborMethod::brute}, as_block(q),
                        as_block(s), as_block(idx), as_block(d2), ctx);
    for (index_t i = 0; i < nq; ++i) {
      index_t c = 0;
      for (index_t k = 0; k < K; ++k) c += idx.data()[i * K + k] >= 0 ? 1 : 0;
      cnt.data()[i] = c;
    }
  } else {
    exec::neighbors_radius(
        exec::RadiusGeometry{nq, ns, static_cast<int>(D), lk.radius, K, 0, exec::NeighborMethod::brute}, as_block(q),
        as_block(s), as_block(idx), as_block(d2), as_block(cnt), ctx);
  }
  Neighbors<T> nb;
  nb.query = query.spec();
  nb.support = support.spec();
  const index_t lo = point_offset(query.spec(), query.mesh().rank()), n = query.spec().local_box().len[0];
  nb.indices = DistTensor<std::int64_t, 2>(point_rows_spec(nb.query, {K}), idx.narrow(0, lo, n).clone());
  nb.dist2 = DistTensor<T, 2>(point_rows_spec(nb.query, {K}), d2.narrow(0, lo, n).clone());
  nb.counts = DistTensor<std::int64_t, 1>(point_rows_spec(nb.query, {}), cnt.narrow(0, lo, n).clone());
  return nb;
}

/// A test case: point counts, the list recipe, and the shifts of the ragged layouts.
struct Case {
  index_t nq = 13, ns = 17, D = 2, C = 3;
  ListKind lists;
  int shift_q = 1, shift_s = 2;
  bool same_set = false;  ///< query == support (self-neighbours at distance 0)
};

/// Every op on one set of lists; outputs and gradients go to the oracle harness.
template <class T>
void all_ops(fn::Ctx<T>& c, const Case& cs) {
  const auto& mesh = c.mesh();
  const int P = mesh.size();
  const auto pl = point_placements(mesh);
  const auto qsz = point_sizes(ragged(cs.nq, P, cs.shift_q));
  const auto ssz = point_sizes(ragged(cs.ns, P, cs.shift_s));
  auto q = c.template input<2>({cs.same_set ? cs.ns : cs.nq, cs.D}, pl, cs.same_set ? ssz : qsz, true);
  auto s = cs.same_set ? q : c.template input<2>({cs.ns, cs.D}, pl, ssz, true);
  auto f = c.template input<2>({cs.ns, cs.C}, pl, ssz, true);
  const Neighbors<T> nb = make_lists(q.value(), s.value(), cs.lists);
  auto v = F::gather_neighbors(f, nb);
  c.output(v);
  c.output(F::neighbor_offsets(q, s, nb));
  auto d = F::neighbor_distance(q, s, nb);
  c.output(d);
  auto wg = F::distance_weights(d, nb, F::WeightFn::gaussian(0.7));
  auto wi = F::distance_weights(d, nb, F::WeightFn::inverse_distance(0.25));
  auto wl = F::distance_weights(d, nb, F::WeightFn::linear(0.9));
  c.output(wg);
  c.output(wi);
  c.output(wl);
  c.output(F::aggregate(v, nb, {F::AggregateReduce::sum}, wg));
  c.output(F::aggregate(v, nb, {F::AggregateReduce::mean}, wl));
  c.output(F::aggregate(v, nb, {F::AggregateReduce::max}, wi));
  c.output(F::aggregate(v, nb, {F::AggregateReduce::max}));
  c.output(F::aggregate(v, nb, {F::AggregateReduce::mean}));
}

std::vector<Case> cases() {
  std::vector<Case> out;
  Case knn;
  out.push_back(knn);
  Case knn_pad = knn;  // k > Ns: padded lists
  knn_pad.ns = 5;
  knn_pad.lists.k = 7;
  knn_pad.shift_q = 0;
  knn_pad.shift_s = 1;
  out.push_back(knn_pad);
  Case rad;  // radius lists: empty rows, capped rows, width-1 features
  rad.lists = {false, 2, 0.35};
  rad.C = 1;
  out.push_back(rad);
  Case self = knn;  // query == support, 3-D
  self.same_set = true;
  self.D = 3;
  self.lists = {true, 3, 0};
  out.push_back(self);
  return out;
}

/// The oracle layouts of a point case at p ranks: each mesh with the case's shifts (the shifts
/// live in the body; the Layout carries the mesh).
std::vector<fn::Layout> point_layouts(int p) {
  std::vector<fn::Layout> out;
  for (const auto& m : mesh_shapes(p)) out.push_back({fmt::format("mesh {}", fmt::join(m, "x")), m, {}, {}});
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("point ops match the unsharded computation (forward and every gradient)", "[point_ops]", double,
                   float) {
  using T = TestType;
  for (const Case& cs : cases()) {
    INFO("case nq " << cs.nq << " ns " << cs.ns << " D " << cs.D << " C " << cs.C << (cs.lists.knn ? " knn" : " radius")
                    << " k " << cs.lists.k << (cs.same_set ? " same set" : ""));
    const fn::Body<T> body = [cs](fn::Ctx<T>& c) { all_ops(c, cs); };
    const fn::Result ref = fn::reference<T>(body);
    for_each_comm_size([&](CommPtr comm) {
      for (const auto& L : point_layouts(comm->size())) {
        INFO("layout " << L.name << " on " << comm->size() << " ranks");
        fn::require_match(fn::run_case<T>(DeviceMesh(comm, L.mesh_shape), L, body), ref, tol<T>());
      }
    });
  }
}

TEST_CASE("point ops: the test lists cover padding, empty and full rows", "[point_ops]") {
  DeviceMesh m1(std::make_shared<SelfComm>(), {1});
  const auto pl = point_placements(m1);
  index_t empty = 0, full = 0, padded = 0;
  for (const Case& cs : cases()) {
    auto q = DistTensor<double, 2>::random({cs.nq, cs.D}, m1, pl, 1);
    auto s = DistTensor<double, 2>::random({cs.ns, cs.D}, m1, pl, 2);
    const auto nb = make_lists(q, s, cs.lists);
    for (index_t i = 0; i < cs.nq; ++i) {
      const auto c = nb.counts.local().data()[i];
      empty += c == 0;
      full += c == cs.lists.k;
      padded += c > 0 && c < cs.lists.k;
    }
  }
  CHECK(empty > 0);
  CHECK(full > 0);
  CHECK(padded > 0);
}

TEST_CASE("point ops: finite differences through the chain (fp64)", "[point_ops]") {
  for (const Case& cs : {cases()[0], cases()[2]}) {
    const fn::Body<double> body = [cs](fn::Ctx<double>& c) {
      const int P = c.mesh().size();
      const auto pl = point_placements(c.mesh());
      auto q = c.template input<2>({cs.nq, cs.D}, pl, point_sizes(ragged(cs.nq, P, cs.shift_q)), true);
      auto s = c.template input<2>({cs.ns, cs.D}, pl, point_sizes(ragged(cs.ns, P, cs.shift_s)), true);
      auto f = c.template input<2>({cs.ns, cs.C}, pl, point_sizes(ragged(cs.ns, P, cs.shift_s)), true);
      const auto nb = make_lists(q.value(), s.value(), cs.lists);
      auto d = F::neighbor_distance(q, s, nb);
      auto v = F::gather_neighbors(f, nb);
      c.output(F::aggregate(v, nb, {F::AggregateReduce::mean}, F::distance_weights(d, nb, F::WeightFn::gaussian(0.6))));
      c.output(F::aggregate(v, nb, {F::AggregateReduce::max}, F::distance_weights(d, nb, F::WeightFn::inverse_distance(0.3))));
      c.output(F::neighbor_offsets(q, s, nb));
    };
    fn::check_finite_differences(DeviceMesh(std::make_shared<SelfComm>(), {1}), fn::reference_layout(), body);
    for_each_comm_size(
        [&](CommPtr comm) {
          for (const auto& L : point_layouts(comm->size()))
            fn::check_finite_differences(DeviceMesh(comm, L.mesh_shape), L, body);
        },
        world_size());
  }
}

TEMPLATE_TEST_CASE("gather_neighbors: dot-product test <G f, p> == <f, G^T p>", "[point_ops]", double, float) {
  using T = TestType;
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& ms : mesh_shapes(comm->size()))
      for (const Case& cs : cases()) {
        if (cs.same_set) continue;
        INFO("mesh " << fmt::format("{}", fmt::join(ms, "x")) << " on " << comm->size() << " ranks, C " << cs.C);
        DeviceMesh mesh(comm, ms);
        const int P = mesh.size();
        const auto pl = point_placements(mesh);
        auto q = DistTensor<T, 2>::random({cs.nq, cs.D}, mesh, pl, 11, {}, point_sizes(ragged(cs.nq, P, cs.shift_q)));
        auto s = DistTensor<T, 2>::random({cs.ns, cs.D}, mesh, pl, 12, {}, point_sizes(ragged(cs.ns, P, cs.shift_s)));
        const auto nb = make_lists(q, s, cs.lists);
        Var<T, 2> f(DistTensor<T, 2>::random({cs.ns, 4}, mesh, pl, 13, {}, s.spec().sizes()), true);
        auto y = F::gather_neighbors(f, nb);
        const auto& ys = y.value().spec();
        Var<T, 3> p(DistTensor<T, 3>::random(y.value().global_shape(), mesh, ys.placements(), 14, {}, ys.sizes()));
        auto loss = F::resolve(F::sum(F::mul(y, p)));
        loss.backward();
        const double lhs = static_cast<double>(loss.local().data()[0]);
        double rhs = 0;
        const auto fl = f.local().contiguous(), gl = f.grad().local().contiguous();
        for (index_t i = 0; i < fl.numel(); ++i) rhs += static_cast<double>(fl.data()[i]) * static_cast<double>(gl.data()[i]);
        comm->allreduce(&rhs, &rhs, 1, DType::f64, ReduceOp::sum);
        CHECK(std::abs(lhs - rhs) <= (std::is_same_v<T, double> ? 1e-12 : 1e-5) * std::max(1.0, std::abs(lhs)));
        CHECK(f.grad().spec() == f.value().spec());
        // the plan is cached on the lists and reused
        const auto plan = nb.gather_plan;
        REQUIRE(plan != nullptr);
        auto y2 = F::gather_neighbors(f.detach(), nb);
        CHECK(nb.gather_plan == plan);
        const auto a = y.local().contiguous(), b = y2.local().contiguous();
        CHECK(std::equal(a.data(), a.data() + a.numel(), b.data()));
      }
  });
}

namespace {

/// Global rows of `pts` (full [N, D]) in the routed order: stable by owner.
std::vector<index_t> routed_order(const Tensor<double, 2>& pts, const BoxPartition& part) {
  const index_t n = pts.shape()[0];
  std::vector<index_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::vector<int> own(order.size());
  for (index_t i = 0; i < n; ++i) own[static_cast<std::size_t>(i)] = part.owner(pts.data() + i * pts.shape()[1]);
  std::stable_sort(order.begin(), order.end(),
                   [&](index_t a, index_t b) { return own[static_cast<std::size_t>(a)] < own[static_cast<std::size_t>(b)]; });
  return order;
}

/// The partitions of a mesh over [-1, 1]^2: every mesh dim of size > 1 splits one coordinate.
BoxPartition square_partition(const DeviceMesh& mesh) {
  if (mesh.ndim() == 1) return BoxPartition::uniform(mesh, {-1, -1}, {1, 1}, {0, -1});
  return BoxPartition::uniform(mesh, {-1, -1}, {1, 1}, {1, 0});
}

}  // namespace

TEST_CASE("partition_by_box: rows in their boxes, stable order by owner, features alike, gradients back",
          "[point_ops][partition]") {
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& ms : mesh_shapes(comm->size()))
      for (int variant = 0; variant < 2; ++variant) {
        INFO("mesh " << fmt::format("{}", fmt::join(ms, "x")) << " on " << comm->size() << " ranks, variant " << variant);
        DeviceMesh mesh(comm, ms);
        const int P = mesh.size();
        const auto part = square_partition(mesh);
        const auto pl = point_placements(mesh);
        const index_t N = 23;
        auto sz = point_sizes(ragged(N, P, variant + 1));
        // variant 1: every x in [-1, -0.2): boxes to the right stay empty
        const RandomInit init = variant == 0 ? RandomInit::uniform(-1, 1) : RandomInit::uniform(-1, -0.2);
        auto full = Tensor<double, 2>::empty({N, 2});
        full.fill_random(77, init);
        for (index_t i = 0; i < N; ++i) full.data()[2 * i + 1] = std::sin(1.0 + static_cast<double>(i));  // y in [-1, 1]
        if (variant == 0) full.data()[0] = 1.0, full.data()[1] = 1.0;  // the closed upper corner
        Var<double, 2> x(DistTensor<double, 2>::distribute(full, mesh, pl, -1, sz), true);
        auto feat_full = Tensor<double, 2>::empty({N, 3});
        feat_full.fill_random(78);
        Var<double, 2> feat(DistTensor<double, 2>::distribute(feat_full, mesh, pl, -1, sz), true);
        auto labels_full = Tensor<std::int64_t, 2>::empty({N, 1});
        for (index_t i = 0; i < N; ++i) labels_full.data()[i] = 1000 + i;
        auto labels = DistTensor<std::int64_t, 2>::distribute(labels_full, mesh, pl, -1, sz);

        auto routed = F::partition_by_box(x, part);
        auto rf = routed.routing.apply(feat);
        auto rl = routed.routing.apply(labels);
        const auto& rs = routed.points.value().spec();
        // in their boxes
        const auto lp = routed.points.local().contiguous();
        CHECK_NOTHROW(check_in_partition(rs, as_block(lp), part, "test"));
        CHECK(rf.value().spec().sizes()[0] == rs.sizes()[0]);
        // the order: stable sort of the global order by owner
        const auto order = routed_order(full, part);
        const auto got = routed.points.value().full_tensor(), gotf = rf.value().full_tensor();
        const auto gotl = rl.full_tensor();
        bool same = true;
        for (index_t j = 0; j < N; ++j) {
          const index_t i = order[static_cast<std::size_t>(j)];
          same = same && got.data()[2 * j] == full.data()[2 * i] && got.data()[2 * j + 1] == full.data()[2 * i + 1];
          for (index_t c = 0; c < 3; ++c) same = same && gotf.data()[3 * j + c] == feat_full.data()[3 * i + c];
          same = same && gotl.data()[j] == 1000 + i;
        }
        CHECK(same);
        // counts: every rank's box population
        const auto counts = point_counts(rs);
        for (int r = 0; r < P; ++r) {
          index_t want = 0;
          for (index_t i = 0; i < N; ++i) want += part.owner(full.data() + 2 * i) == r ? 1 : 0;
          CHECK(counts[static_cast<std::size_t>(r)] == want);
        }
        if (variant == 1 && P > 1 && ms.size() == 1) CHECK(counts.back() == 0);  // an empty box
        // off the tape: the same result
        auto routed2 = F::partition_by_box(x.value(), part);
        const auto got2 = routed2.points.full_tensor();
        CHECK(std::equal(got.data(), got.data() + got.numel(), got2.data()));
        // gradients go back to the source rows: loss = <R x, p1> + <R f, p2>
        Var<double, 2> p1(DistTensor<double, 2>::random({N, 2}, mesh, rs.placements(), 5, {}, rs.sizes()));
        Var<double, 2> p2(DistTensor<double, 2>::random({N, 3}, mesh, rs.placements(), 6, {}, rs.sizes()));
        F::resolve(F::add(F::sum(F::mul(routed.points, p1)), F::sum(F::mul(rf, p2)))).backward();
        const auto g1 = x.grad().full_tensor(), g2 = feat.grad().full_tensor();
        const auto pf1 = p1.value().full_tensor(), pf2 = p2.value().full_tensor();
        bool back = true;
        for (index_t j = 0; j < N; ++j) {
          const index_t i = order[static_cast<std::size_t>(j)];
          for (index_t c = 0; c < 2; ++c) back = back && g1.data()[2 * i + c] == pf1.data()[2 * j + c];
          for (index_t c = 0; c < 3; ++c) back = back && g2.data()[3 * i + c] == pf2.data()[3 * j + c];
        }
        CHECK(back);
        CHECK(x.grad().spec() == x.value().spec());
      }
  });
}

TEST_CASE("point ops refuse bad input on every rank", "[point_ops][errors]") {
  for_each_comm_size([&](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    const int P = mesh.size(), me = mesh.rank();
    const auto pl = point_placements(mesh);
    const auto part = square_partition(mesh);
    // points outside the domain (last rank) and NaN (rank 0)
    {
      auto full = Tensor<double, 2>::empty({9, 2});
      full.fill_random(3);
      full.data()[2 * 8] = 5.0;                                        // row 8: on the last rank
      full.data()[1] = std::numeric_limits<double>::quiet_NaN();  // row 0: on rank 0
      auto x = DistTensor<double, 2>::distribute(full, mesh, pl);
      const auto msg = error_of([&] { F::partition_by_box(x, part); });
      CHECK_THAT(msg, ContainsSubstring("partition_by_box") && ContainsSubstring("outside"));
      CHECK_THAT(msg, ContainsSubstring(fmt::format("rank {}: {} point", P - 1, P == 1 ? 2 : 1)));
      if (P > 1) CHECK_THAT(msg, ContainsSubstring("rank 0: 1 point"));
    }
    // D mismatch, mesh mismatch
    {
      auto x3 = DistTensor<double, 2>::random({6, 3}, mesh, pl, 4);
      CHECK_THAT(error_of([&] { F::partition_by_box(x3, part); }), ContainsSubstring("3 coordinates"));
      DeviceMesh other(comm, {1, P});
      auto xo = DistTensor<double, 2>::random({6, 2}, other, point_placements(other), 4);
      CHECK_THAT(error_of([&] { F::partition_by_box(xo, part); }), ContainsSubstring("different meshes"));
    }
    // features of a different point set
    auto q = DistTensor<double, 2>::random({7, 2}, mesh, pl, 8, {}, point_sizes(ragged(7, P, 1)));
    auto s = DistTensor<double, 2>::random({9, 2}, mesh, pl, 9, {}, point_sizes(ragged(9, P, 2)));
    const auto nb = make_lists(q, s, ListKind{true, 3, 0});
    {
      Var<double, 2> f_other_n(DistTensor<double, 2>::random({10, 2}, mesh, pl, 1), true);
      CHECK_THAT(error_of([&] { F::gather_neighbors(f_other_n, nb); }),
                 ContainsSubstring("indices from a different point set"));
      if (P > 1) {
        Var<double, 2> f_other_layout(DistTensor<double, 2>::random({9, 4}, mesh, pl, 1, {}, point_sizes(ragged(9, P, 0))));
        CHECK_THAT(error_of([&] { F::gather_neighbors(f_other_layout, nb); }),
                   ContainsSubstring("indices from a different point set"));
      }
      // D mismatch of query and support in the offsets
      Var<double, 2> q3(DistTensor<double, 2>::random({7, 3}, mesh, pl, 8, {}, q.spec().sizes()));
      CHECK_THAT(error_of([&] { F::neighbor_offsets(q3, Var<double, 2>(s), nb); }),
                 ContainsSubstring("3 coordinates but support has 2"));
      // query set swapped for the support set
      CHECK_THAT(error_of([&] { F::neighbor_distance(Var<double, 2>(s), Var<double, 2>(s), nb); }),
                 ContainsSubstring("neighbor_offsets"));
      // aggregate of values with another width
      Var<double, 3> v(DistTensor<double, 3>::random({7, 4, 2}, mesh, pl, 1, {}, point_sizes(ragged(7, P, 1), 3)));
      CHECK_THAT(error_of([&] { F::aggregate(v, nb); }), ContainsSubstring("4 entries per row but the lists have 3"));
    }
    // an index outside [-1, Ns) on the last rank holding query rows: every rank refuses
    {
      auto bad = make_lists(q, s, ListKind{true, 3, 0});
      const auto counts = point_counts(q.spec());
      int last = -1;
      for (int r = 0; r < P; ++r)
        if (counts[static_cast<std::size_t>(r)] > 0) last = r;
      if (me == last) bad.indices.local().data()[0] = 9;
      Var<double, 2> f(s);
      const auto msg = error_of([&] { F::gather_neighbors(f, bad); });
      CHECK_THAT(msg, ContainsSubstring(fmt::format("rank {}: 1 index", last)));
    }
  });
}

}  // namespace st_nn_mpi_point_ops
