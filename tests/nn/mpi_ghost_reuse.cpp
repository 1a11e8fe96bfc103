// Ghost reuse (issue 8, dist/ghosts.hpp): a simulation's halo-padded array whose ghost cells its
// own exchange filled (here shard::fill_ghosts, or poison written by hand) is handed to
// DistTensor::from_local with GhostLayers; conv (1-3 spatial dims) and max / avg pooling then read
// those ghosts instead of exchanging. Checked at 1..4 ranks on 1-D and 2-D meshes with uneven
// (simulation-style) shards, fp64 and fp32, zero and periodic boundaries, kernels 3 and 5 with
// ghost widths 1, 2, 3 (and reflect / replicate ghosts):
//  - forward and every gradient (dx, dW, db) equal the exchange path and the unsharded oracle;
//  - the exchange is really skipped: no point-to-point message in the forward (a counting
//    communicator), and poisoned ghost cells change the result (while the exchange path ignores
//    them);
//  - narrower ghosts, another boundary mode, or stale ghosts (a version bump on ONE rank) fall
//    back to the exchange on every rank (same result, no hang); mark_ghosts_valid and
//    fill_ghosts declare them valid again; the snapshot policy copies the ghosts;
//  - bad declarations throw shard::Error on every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <limits>
#include <map>

#include <shardtensor/dist/halo.hpp>
#include <shardtensor/nn/functional.hpp>

#include "dist/counting_comm.hpp"
#include "support/mpi_harness.hpp"

namespace st_nn_mpi_ghost_reuse {

using namespace shard;
using Catch::Matchers::ContainsSubstring;
using shard::test::CountingComm;
using shard::test::error_of;
using shard::test::for_each_comm_size;
namespace F = shard::nn::functional;
using autograd::Var;

namespace {

constexpr std::uint64_t kSeed = 4242;

/// A simulation's own uneven split of n over p parts (not the balanced rule; some parts of 2
/// cells, so ghosts of width 3 span two neighbours).
std::vector<index_t> uneven(index_t n, int p) {
  if (p == 1) return {n};
  if (n < 2 * p) {  // too short for parts of 2 or more: the balanced rule
    std::vector<index_t> b(static_cast<std::size_t>(p), n / p);
    for (index_t i = 0; i < n % p; ++i) b[static_cast<std::size_t>(i)] += 1;
    return b;
  }
  std::vector<index_t> s(static_cast<std::size_t>(p), 2);
  index_t rest = n - 2 * p;
  for (int i = 0; rest > 0; i = (i + 1) % p, --rest) s[static_cast<std::size_t>(i)] += (i % 2 == 0) ? 1 : 0;
  index_t tot = 0;
  for (auto v : s) tot += v;
  s[0] += n - tot;
  return s;
}

/// A mesh and the placements of an N, C, spatial... tensor on it.
struct Layout {
  std::string name;
  std::vector<int> mesh;
  std::vector<Placement> pl;
};

/// 1-D meshes along the first and the last spatial dim, and a 2-D mesh over the first two.
template <int R>
std::vector<Layout> layouts(int P) {
  std::vector<Layout> L{{"1d-first", {P}, {Shard(2)}}, {"1d-last", {P}, {Shard(R - 1)}}};
  if (R >= 4) {
    const std::vector<int> m = P == 4   ? std::vector<int>{2, 2}
                               : P == 3 ? std::vector<int>{1, 3}
                                        : std::vector<int>{P, 1};
    L.push_back({"2d", m, {Shard(2), Shard(3)}});
  }
  return L;
}

template <class T, int R>
ShardSizes sizes_of(const DeviceMesh& mesh, const Layout& L, const Shape<R>& G) {
  ShardSizes s(R);
  for (int m = 0; m < mesh.ndim(); ++m) {
    const int d = L.pl[static_cast<std::size_t>(m)].dim;
    if (mesh.size(m) > 1) s[static_cast<std::size_t>(d)] = uneven(G[static_cast<std::size_t>(d)], mesh.size(m));
  }
  return s;
}

std::vector<int> spatial_dims(int R) {
  std::vector<int> d;
  for (int i = 2; i < R; ++i) d.push_back(i);
  return d;
}

/// The simulation's array on this rank: ghost width g on every spatial dim, the interior holding
/// this rank's block of the global random tensor (seed kSeed), ghosts filled by fill_ghosts with
/// `fill` (the library as the simulation's exchange). `x` views the interior with no ghosts
/// declared; `xg` with `decl` declared (stable views when `stable`).
template <class T, int R>
struct SimArray {
  std::vector<T> mem;
  Tensor<T, R> padded, interior;
  DistTensor<T, R> x, xg;

  SimArray(const DeviceMesh& mesh, const Layout& L, const Shape<R>& G, index_t g, Boundary fill,
           const GhostLayers& decl, bool stable) {
    const ShardSizes sz = sizes_of<T, R>(mesh, L, G);
    const DistSpec spec(mesh, L.pl, std::vector<index_t>(G.begin(), G.end()), sz);
    const Box b = spec.local_box();
    Shape<R> ps{}, len{}, off{};
    for (int d = 0; d < R; ++d) {
      const auto u = static_cast<std::size_t>(d);
      len[u] = b.len[u];
      off[u] = b.lo[u];
      lo[u] = d >= 2 ? g : 0;
      ps[u] = len[u] + 2 * lo[u];
    }
    mem.assign(static_cast<std::size_t>(shard::numel(ps)), T(-777));  // never read unless a ghost is wrong
    padded = Tensor<T, R>::view(mem.data(), ps);
    interior = padded.slice(lo, len);
    if (stable) {
      padded = padded.declare_stable();
      interior = interior.declare_stable();
    }
    interior.fill_random(kSeed, off, G);
    x = DistTensor<T, R>::from_local(interior, mesh, L.pl, sz);
    std::vector<index_t> w(R, 0);
    for (int d = 2; d < R; ++d) w[static_cast<std::size_t>(d)] = g;
    fill_ghosts(x, padded, HaloSpec::symmetric(w, fill));
    xg = DistTensor<T, R>::from_local(interior, mesh, L.pl, sz, decl);
  }
  /// Writes `v` into every ghost cell through the raw memory, as a simulation does (untracked:
  /// no version changes; the interior keeps its values).
  void poison(T v) {
    const Tensor<T, R> keep = interior.clone();
    std::fill(mem.begin(), mem.end(), v);
    Tensor<T, R>::view(mem.data(), padded.shape()).slice(lo, interior.shape()).copy_from(keep);
  }
  Shape<R> lo{};
};

template <class T, int R>
std::vector<double> flat(const Tensor<T, R>& t) {
  const auto c = t.contiguous();
  return std::vector<double>(c.data(), c.data() + c.numel());
}

/// Forward value and every gradient, as full tensors.
struct Result {
  std::vector<double> y, gx, gw, gb;
};

/// Max |a - b| / max(1, max |b|) over every entry of every field (sizes must agree).
double rel_diff(const Result& a, const Result& b) {
  double d = 0;
  auto cmp = [&](const std::vector<double>& u, const std::vector<double>& v) {
    if (u.size() != v.size()) {
      d = std::numeric_limits<double>::infinity();
      return;
    }
    double m = 1;
    for (double e : v) m = std::max(m, std::abs(e));
    for (std::size_t i = 0; i < u.size(); ++i) d = std::max(d, std::abs(u[i] - v[i]) / m);
  };
  cmp(a.y, b.y);
  cmp(a.gx, b.gx);
  cmp(a.gw, b.gw);
  cmp(a.gb, b.gb);
  return d;
}

/// loss = sum(y * r) with a fixed random r laid out like y; backward fills the gradients.
template <class T, int R>
void seed_backward(const DeviceMesh& mesh, const Var<T, R>& y) {
  const auto& s = y.value().spec();
  Var<T, R> r(DistTensor<T, R>::random(y.value().global_shape(), mesh, s.placements(), 99, RandomInit::uniform(-1, 1),
                                       s.sizes()),
              false);
  F::resolve(F::sum(F::mul(y, r))).backward();
}

template <int R>
std::vector<Placement> replicate_on(const DeviceMesh& mesh) {
  return std::vector<Placement>(static_cast<std::size_t>(mesh.ndim()), Replicate());
}

/// conv of x (weight [2, C, k...], bias, 'same' padding in `mode`): value and all gradients.
/// `p2p` (optional) receives the number of point-to-point messages of the FORWARD when the mesh
/// runs on `counter`.
template <class T, int R>
Result run_conv(const DeviceMesh& mesh, const DistTensor<T, R>& x, index_t k, Boundary mode,
                CountingComm* counter = nullptr, int* p2p = nullptr) {
  constexpr int S = R - 2;
  Shape<R> ws{};
  ws[0] = 2;
  ws[1] = x.global_shape()[1];
  Shape<S> ks{};
  for (int d = 0; d < S; ++d) ws[static_cast<std::size_t>(d) + 2] = ks[static_cast<std::size_t>(d)] = k;
  Var<T, R> xv(x, true);
  Var<T, R> w(DistTensor<T, R>::random(ws, mesh, replicate_on<R>(mesh), 7, RandomInit::uniform(-0.5, 0.5)), true);
  Var<T, 1> b(DistTensor<T, 1>::random({2}, mesh, replicate_on<1>(mesh), 8, RandomInit::uniform(-0.5, 0.5)), true);
  const auto opt = F::ConvOptions<S>::same(ks, 1, mode);
  (void)xv.value();  // a snapshot (if any) happens before counting
  if (counter) counter->reset();
  auto y = F::conv(xv, w, b, opt);
  if (counter && p2p) {
    const auto& c = counter->counts();
    auto get = [&](const char* n) { return c.count(n) ? c.at(n) : 0; };
    *p2p = get("isend") + get("irecv") + get("sendrecv") + get("alltoallv") + get("ialltoallv");
  }
  seed_backward(mesh, y);
  return {flat(y.value().full_tensor()), flat(xv.grad().full_tensor()), flat(w.grad().full_tensor()),
          flat(b.grad().full_tensor())};
}

/// The unsharded conv of the same global tensor (one-rank SelfComm mesh).
template <class T, int R>
Result oracle_conv(const Shape<R>& G, index_t k, Boundary mode) {
  DeviceMesh m1(std::make_shared<SelfComm>(), {1});
  return run_conv<T, R>(m1, DistTensor<T, R>::random(G, m1, {Replicate()}, kSeed), k, mode);
}

/// The halo a 'same' conv with kernel k needs on each side: (k - 1) / 2 below, k - 1 - that above.
index_t conv_halo(index_t k) { return k - 1 - (k - 1) / 2; }

template <class T>
constexpr double tol() {
  return std::is_same_v<T, double> ? 1e-10 : 1e-4;
}

/// The conv matrix of one rank count: every layout, zero / periodic, kernel 3 / 5, widths 1..3.
template <class T, int R>
void conv_matrix(CommPtr comm, const Shape<R>& G, const std::vector<index_t>& kernels,
                 const std::vector<index_t>& widths,
                 const std::vector<Boundary>& modes = {Boundary::zero, Boundary::periodic}) {
  auto counter = std::make_shared<CountingComm>(comm);
  const int P = comm->size();
  std::map<std::pair<int, index_t>, Result> refs;
  for (Boundary mode : modes)
    for (index_t k : kernels) refs[{static_cast<int>(mode), k}] = oracle_conv<T, R>(G, k, mode);
  for (const auto& L : layouts<R>(P)) {
    DeviceMesh mesh(counter, L.mesh);
    for (Boundary mode : modes) {
      for (index_t k : kernels) {
        const Result& ref = refs.at({static_cast<int>(mode), k});
        for (index_t g : widths) {
          // Declared edge: periodic / reflect / replicate ghosts hold that mode; zero-filled ghosts are declared "not
          // valid at the domain edge" (zero padding never reads them).
          const std::optional<Boundary> edge = mode != Boundary::zero ? std::optional<Boundary>(mode) : std::nullopt;
          SimArray<T, R> a(mesh, L, G, g, mode, GhostLayers::uniform(R, g, spatial_dims(R), edge), true);
          INFO(L.name << " mesh, " << boundary_name(mode) << ", kernel " << k << ", ghost width " << g << ", " << P
                      << " ranks");
          int p2p_ghost = -1, p2p_exchange = -1;
          const Result ex = run_conv<T, R>(mesh, a.x, k, mode, counter.get(), &p2p_exchange);
          const Result gr = run_conv<T, R>(mesh, a.xg, k, mode, counter.get(), &p2p_ghost);
          CHECK(rel_diff(ex, ref) <= tol<T>());
          CHECK(rel_diff(gr, ref) <= tol<T>());
          CHECK(rel_diff(gr, ex) <= tol<T>());
          // Reuse exactly when the ghosts cover the halo: no message in the forward. (Whether a
          // conv needs a halo at all: zero padding on an unsharded dim needs none.)
          const bool covers = g >= conv_halo(k);
          bool halo_needs_messages = false;
          for (int m = 0; m < mesh.ndim(); ++m) halo_needs_messages = halo_needs_messages || mesh.size(m) > 1;
          if (covers) CHECK(p2p_ghost == 0);
          if (halo_needs_messages) {
            CHECK(p2p_exchange > 0);
            if (!covers) CHECK(p2p_ghost == p2p_exchange);  // narrower ghosts: the exchange ran
          }
        }
      }
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("conv2d reads declared ghosts: forward and all gradients equal the exchange and the oracle",
                   "[nn][conv][ghost_reuse][mpi]", float, double) {
  for_each_comm_size([](CommPtr comm) { conv_matrix<TestType, 4>(comm, {2, 2, 11, 9}, {3, 5}, {1, 2, 3}); });
}

TEMPLATE_TEST_CASE("conv1d and conv3d read declared ghosts", "[nn][conv][ghost_reuse][mpi]", float, double) {
  for_each_comm_size([](CommPtr comm) {
    conv_matrix<TestType, 3>(comm, {2, 2, 13}, {3, 5}, {1, 2});
    conv_matrix<TestType, 5>(comm, {1, 2, 9, 7, 5}, {3}, {1, 2});
  });
}

TEST_CASE("conv2d reads declared reflect and replicate ghosts", "[nn][conv][ghost_reuse][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    conv_matrix<double, 4>(comm, {1, 2, 11, 9}, {3}, {1, 2}, {Boundary::reflect, Boundary::replicate});
  });
}

TEST_CASE("ghost reuse reads the user's ghost cells: poison changes the result, the exchange ignores it",
          "[nn][conv][ghost_reuse][mpi]") {
  using T = double;
  const Shape<4> G{1, 2, 11, 9};
  for_each_comm_size([&](CommPtr comm) {
    const int P = comm->size();
    const Result ref = oracle_conv<T, 4>(G, 3, Boundary::periodic);
    for (const auto& L : layouts<4>(P)) {
      DeviceMesh mesh(comm, L.mesh);
      INFO(L.name << " at " << P << " ranks");
      SimArray<T, 4> a(mesh, L, G, 1, Boundary::periodic,
                       GhostLayers::uniform(4, 1, {2, 3}, Boundary::periodic), true);
      CHECK(rel_diff(run_conv<T, 4>(mesh, a.xg, 3, Boundary::periodic), ref) <= tol<T>());
      a.poison(T(1000));  // periodic: every rank has ghosts that the conv reads (the wrap at 1 rank)
      CHECK(rel_diff(run_conv<T, 4>(mesh, a.xg, 3, Boundary::periodic), ref) > 1.0);  // read the poison
      CHECK(rel_diff(run_conv<T, 4>(mesh, a.x, 3, Boundary::periodic), ref) <= tol<T>());  // exchange: fine

      // A write the library sees (here: into the interior, same values) makes the ghosts stale.
      a.interior.copy_from(a.interior.clone());
      CHECK_FALSE(a.xg.ghosts_current());
      CHECK(rel_diff(run_conv<T, 4>(mesh, a.xg, 3, Boundary::periodic), ref) <= tol<T>());
      a.xg.mark_ghosts_valid();
      CHECK(rel_diff(run_conv<T, 4>(mesh, a.xg, 3, Boundary::periodic), ref) > 1.0);

      // Stale on ONE rank (a declared write): every rank falls back to the exchange (no hang).
      if (comm->rank() == 0) mark_modified(a.xg);
      CHECK_FALSE((comm->rank() == 0 && a.xg.ghosts_current()));
      CHECK(rel_diff(run_conv<T, 4>(mesh, a.xg, 3, Boundary::periodic), ref) <= tol<T>());
      // Declared valid again (wrongly, the ghosts are still poisoned): read again.
      a.xg.mark_ghosts_valid();
      CHECK(rel_diff(run_conv<T, 4>(mesh, a.xg, 3, Boundary::periodic), ref) > 1.0);
      // Withdrawn: exchange.
      a.xg.mark_ghosts_stale();
      CHECK(rel_diff(run_conv<T, 4>(mesh, a.xg, 3, Boundary::periodic), ref) <= tol<T>());
      // fill_ghosts into the same array repairs the ghosts and declares them valid.
      fill_ghosts(a.x, a.padded, HaloSpec::symmetric({0, 0, 1, 1}, Boundary::periodic));
      CHECK_FALSE(a.xg.ghosts_current());  // filled through a.x (no declaration): still stale
      fill_ghosts(a.xg, a.padded, HaloSpec::symmetric({0, 0, 1, 1}, Boundary::periodic));
      CHECK(a.xg.ghosts_current());
      CHECK(rel_diff(run_conv<T, 4>(mesh, a.xg, 3, Boundary::periodic), ref) <= tol<T>());

      // Another boundary mode than declared (zero-filled ghosts, periodic conv): the exchange.
      SimArray<T, 4> z(mesh, L, G, 1, Boundary::zero, GhostLayers::uniform(4, 1, {2, 3}, Boundary::zero), true);
      z.poison(T(1000));
      CHECK(rel_diff(run_conv<T, 4>(mesh, z.xg, 3, Boundary::periodic), ref) <= tol<T>());
      // Narrower than the halo (width 1, kernel 5): the exchange.
      const Result ref5 = oracle_conv<T, 4>(G, 5, Boundary::periodic);
      SimArray<T, 4> n(mesh, L, G, 1, Boundary::periodic, GhostLayers::uniform(4, 1, {2, 3}, Boundary::periodic), true);
      n.poison(T(1000));
      CHECK(rel_diff(run_conv<T, 4>(mesh, n.xg, 5, Boundary::periodic), ref5) <= tol<T>());

      // The declaration is dropped by ops that make new tensors, kept by copies of the handle.
      const DistTensor<T, 4> copy = a.xg;
      CHECK(copy.ghost_layers() != nullptr);
      CHECK(a.xg.redistribute(std::vector<Placement>(L.pl.size(), Replicate())).ghost_layers() == nullptr);
    }
  });
}

TEST_CASE("ghost reuse with the snapshot policy copies the ghosts with the interior", "[nn][conv][ghost_reuse][mpi]") {
  using T = double;
  const Shape<4> G{2, 2, 11, 9};
  for_each_comm_size([&](CommPtr comm) {
    const int P = comm->size();
    auto counter = std::make_shared<CountingComm>(comm);
    const Result ref = oracle_conv<T, 4>(G, 3, Boundary::periodic);
    for (const auto& L : layouts<4>(P)) {
      DeviceMesh mesh(counter, L.mesh);
      INFO(L.name << " at " << P << " ranks");
      // Untracked views (not declared stable): Var snapshots x, ghosts included, at its first read.
      SimArray<T, 4> a(mesh, L, G, 2, Boundary::periodic, GhostLayers::uniform(4, 2, {2, 3}, Boundary::periodic),
                       false);
      int p2p = -1;
      CHECK(rel_diff(run_conv<T, 4>(mesh, a.xg, 3, Boundary::periodic, counter.get(), &p2p), ref) <= tol<T>());
      CHECK(p2p == 0);
      // The snapshot is library memory: its ghosts are the copies, valid at the copy's version.
      const auto snap = a.xg.snapshot();
      CHECK(snap.ghosts_current());
      CHECK(snap.local().data() != a.xg.local().data());
      a.poison(T(1000));  // the user overwrites the array: the snapshot keeps the old ghosts
      CHECK(rel_diff(run_conv<T, 4>(mesh, snap, 3, Boundary::periodic), ref) <= tol<T>());
    }
  });
}

TEMPLATE_TEST_CASE("max and avg pooling read declared ghosts", "[nn][pool][ghost_reuse][mpi]", float, double) {
  using T = TestType;
  const Shape<4> G{2, 2, 11, 9};
  struct PoolCase {
    index_t k, s, p;
  };
  const std::vector<PoolCase> cases{{3, 1, 1}, {5, 1, 2}, {2, 2, 0}, {3, 2, 1}};
  auto run = [](const DeviceMesh& mesh, const DistTensor<T, 4>& x, const PoolCase& pc, bool max, CountingComm* cnt,
                int* p2p) {
    PoolParams<2> pp;
    pp.kernel = {pc.k, pc.k};
    pp.stride = {pc.s, pc.s};
    pp.pad_lo = pp.pad_hi = {pc.p, pc.p};
    Var<T, 4> xv(x, true);
    (void)xv.value();
    if (cnt) cnt->reset();
    auto y = max ? F::max_pool(xv, pp) : F::avg_pool(xv, pp);
    if (cnt && p2p) {
      const auto& c = cnt->counts();
      auto get = [&](const char* n) { return c.count(n) ? c.at(n) : 0; };
      *p2p = get("isend") + get("irecv") + get("sendrecv") + get("alltoallv");
    }
    seed_backward(mesh, y);
    return Result{flat(y.value().full_tensor()), flat(xv.grad().full_tensor()), {}, {}};
  };
  for_each_comm_size([&](CommPtr comm) {
    const int P = comm->size();
    auto counter = std::make_shared<CountingComm>(comm);
    DeviceMesh m1(std::make_shared<SelfComm>(), {1});
    std::vector<Result> refs;
    for (const auto& pc : cases)
      for (bool max : {true, false})
        refs.push_back(run(m1, DistTensor<T, 4>::random(G, m1, {Replicate()}, kSeed), pc, max, nullptr, nullptr));
    for (const auto& L : layouts<4>(P)) {
      DeviceMesh mesh(counter, L.mesh);
      for (index_t g : {1, 2, 3}) {
        SimArray<T, 4> a(mesh, L, G, g, Boundary::zero, GhostLayers::uniform(4, g, {2, 3}), true);
        SimArray<T, 4> bad(mesh, L, G, g, Boundary::zero, GhostLayers::uniform(4, g, {2, 3}), true);
        bad.poison(T(1000));
        std::size_t ci = 0;
        for (const auto& pc : cases)
          for (bool max : {true, false}) {
            const Result& ref = refs[ci++];
            INFO(L.name << (max ? " max" : " avg") << " pool k " << pc.k << " s " << pc.s << " p " << pc.p
                        << ", ghost width " << g << ", " << P << " ranks");
            int pe = -1, pg = -1;
            const Result ex = run(mesh, a.x, pc, max, counter.get(), &pe);
            const Result gr = run(mesh, a.xg, pc, max, counter.get(), &pg);
            CHECK(rel_diff(ex, ref) <= tol<T>());
            CHECK(rel_diff(gr, ref) <= tol<T>());
            if (pe > 0) {  // the pool needs a halo here: ghosts >= it are read, the exchange skipped
              const bool covers = g >= pc.k / 2;
              if (covers) {
                CHECK(pg == 0);
                // Poisoned ghosts between ranks are read (max: 1000 wins; avg: shifts the mean).
                CHECK(rel_diff(run(mesh, bad.xg, pc, max, nullptr, nullptr), ref) > 1.0);
              } else {
                CHECK(pg == pe);
              }
              CHECK(rel_diff(run(mesh, bad.x, pc, max, nullptr, nullptr), ref) <= tol<T>());
            }
          }
      }
    }
  });
}

TEST_CASE("ghost declarations are checked on every rank", "[nn][ghost_reuse][errors][mpi]") {
  using T = double;
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    const int r = comm->rank();
    DeviceMesh mesh(comm, {P});
    const std::vector<Placement> pl{Shard(2)};
    std::vector<T> mem(static_cast<std::size_t>(2 * 2 * 9 * 9), T(0));
    auto padded = Tensor<T, 4>::view(mem.data(), {2, 2, 9, 9});
    auto interior = padded.slice({0, 0, 2, 2}, {2, 2, 5, 5});
    const ShardSizes none;
    // Widths that differ between ranks.
    if (P > 1) {
      auto e = error_of([&] {
        DistTensor<T, 4>::from_local(interior, mesh, pl, none, GhostLayers::uniform(4, r == P - 1 ? 2 : 1, {2, 3}));
      });
      CHECK_THAT(e, ContainsSubstring("ghost layers") && ContainsSubstring("differ"));
      // Edge modes that differ.
      e = error_of([&] {
        const std::optional<Boundary> edge = r == 0 ? std::optional<Boundary>(Boundary::periodic) : std::nullopt;
        DistTensor<T, 4>::from_local(interior, mesh, pl, none, GhostLayers::uniform(4, 1, {2, 3}, edge));
      });
      CHECK_THAT(e, ContainsSubstring("ghost layers"));
      // Declared on some ranks only.
      e = error_of([&] {
        if (r == 0) DistTensor<T, 4>::from_local(interior, mesh, pl, none);
        else DistTensor<T, 4>::from_local(interior, mesh, pl, none, GhostLayers::uniform(4, 1, {2, 3}));
      });
      CHECK_THAT(e, ContainsSubstring("ghost layers"));
    }
    // Negative widths on one rank.
    GhostLayers neg = GhostLayers::uniform(4, 1, {2, 3});
    if (r == 0) neg.lo[2] = -1;
    auto e = error_of([&] { DistTensor<T, 4>::from_local(interior, mesh, pl, none, neg); });
    CHECK_THAT(e, ContainsSubstring(">= 0"));
    // Wrong number of dims.
    GhostLayers shortg = GhostLayers::uniform(3, 1, {2});
    e = error_of([&] { DistTensor<T, 4>::from_local(interior, mesh, pl, none, shortg); });
    CHECK_THAT(e, ContainsSubstring("ghost layers describe"));
    // Ghosts on a broadcast (stride 0) dim.
    auto bcast = Tensor<T, 4>::view(mem.data() + 20, {2, 2, 5, 5}, {81, 0, 9, 1});
    e = error_of([&] { DistTensor<T, 4>::from_local(bcast, mesh, pl, none, GhostLayers::uniform(4, 1, {1})); });
    CHECK_THAT(e, ContainsSubstring("stride"));
    // A valid declaration works, and mark_ghosts_valid without one is refused.
    auto ok = DistTensor<T, 4>::from_local(interior, mesh, pl, none, GhostLayers::uniform(4, 2, {2, 3}));
    CHECK(ok.ghost_layers() != nullptr);
    CHECK(ok.ghosts_current());
    auto plain = DistTensor<T, 4>::from_local(interior, mesh, pl, none);
    CHECK_THAT(error_of([&] { plain.mark_ghosts_valid(); }), ContainsSubstring("no ghost layers"));
  });
}

}  // namespace st_nn_mpi_ghost_reuse
