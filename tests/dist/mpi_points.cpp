// MPI tests of the distributed neighbour queries (dist/points.hpp: shard::knn,
// shard::radius_neighbors), against the unsharded oracle: exec::neighbors_knn / neighbors_radius
// (brute force) on the whole point sets, compared EXACTLY (indices and dist2 bitwise, counts).
// Both strategies (ring, spatial_halo), 1-D and 2-D meshes at 1..4 ranks, ragged and empty shards
// (ring: arbitrary counts; halo: partitions with empty boxes, clustered data leaving boxes empty),
// uniform / clustered / integer-lattice data (duplicates, exact ties, neighbours at exactly r),
// r = 0, k > Ns, query == support and different sets, D = 2 and 3, f32 and f64; kNN with an
// infinite local bound (the fallback) and a zero bound; the halo's traffic against the ring's;
// bad input throwing on every rank. Every query of check_queries also runs on the fake device
// (cuda:0 backed by host memory and the CPU kernel tables): bit-identical results, and only counts
// and index lists copied to the host (issue 31: no host copies of point data).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cstring>
#include <numeric>
#include <type_traits>

#include "shardtensor/comm/mpi_comm.hpp"
#include "shardtensor/dist/points.hpp"
#include "shardtensor/exec/neighbors.hpp"
#include "support/fake_cuda_backend.hpp"
#include "support/mpi_harness.hpp"

namespace st_dist_mpi_points {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;

namespace {

constexpr double kL = 4.0;  // the domain is [0, kL]^D

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// Uniform in [0, 1), a function of (seed, i, d) only.
double unit(std::uint64_t seed, index_t i, index_t d) {
  const std::uint64_t h = mix(mix(seed) ^ mix(static_cast<std::uint64_t>(i) * 64 + static_cast<std::uint64_t>(d)));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

enum class Data { uniform, clustered, lattice };
const char* name(Data k) { return k == Data::uniform ? "uniform" : k == Data::clustered ? "clustered" : "lattice"; }

/// A global point set [n, D] in [0, kL]^D (values already rounded to T), a function of the seed.
template <class T>
std::vector<double> make_points(Data kind, index_t n, index_t D, std::uint64_t seed) {
  std::vector<double> p(static_cast<std::size_t>(n * D));
  for (index_t i = 0; i < n; ++i)
    for (index_t d = 0; d < D; ++d) {
      double x = 0;
      switch (kind) {
        case Data::uniform:
          x = kL * unit(seed, i, d);
          break;
        case Data::clustered: {  // 3 tight clusters with centres in the left half (right boxes empty)
          const index_t c = static_cast<index_t>(unit(seed, i, 99) * 3);
          const double centre = kL * (0.05 + 0.4 * unit(seed + 7, c, d));
          x = std::clamp(centre + 0.1 * kL * (unit(seed, i, d) - 0.5), 0.0, kL);
          break;
        }
        case Data::lattice:
          x = std::min(kL, std::floor(unit(seed, i, d) * (kL + 1)));
          break;
      }
      p[static_cast<std::size_t>(i * D + d)] = static_cast<double>(static_cast<T>(x));
    }
  return p;
}

/// A point set on `mesh`: rows of the global set `g` ([N, D]), rank r holding `counts[r]` rows.
template <class T>
DistTensor<T, 2> make_set(const DeviceMesh& mesh, const std::vector<double>& g, index_t D,
                          const std::vector<index_t>& counts) {
  const DistSpec spec = point_spec(mesh, counts, D);
  const index_t off = point_offset(spec, mesh.rank()), n = counts[static_cast<std::size_t>(mesh.rank())];
  auto local = Tensor<T, 2>::empty({n, D});
  for (index_t i = 0; i < n * D; ++i) local.data()[i] = static_cast<T>(g[static_cast<std::size_t>(off * D + i)]);
  return DistTensor<T, 2>(spec, local);
}

/// Sorts the global set by owner (stable) and returns the rows per rank: the set then lies in `part`.
std::vector<index_t> sort_by_owner(std::vector<double>& g, index_t D, const BoxPartition& part) {
  const index_t n = static_cast<index_t>(g.size()) / D;
  std::vector<index_t> owner(static_cast<std::size_t>(n)), order(static_cast<std::size_t>(n));
  std::vector<index_t> counts(static_cast<std::size_t>(part.mesh().size()), 0);
  for (index_t i = 0; i < n; ++i) {
    const int o = part.owner(&g[static_cast<std::size_t>(i * D)]);
    REQUIRE(o >= 0);
    owner[static_cast<std::size_t>(i)] = o;
    ++counts[static_cast<std::size_t>(o)];
  }
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) {
    return owner[static_cast<std::size_t>(a)] < owner[static_cast<std::size_t>(b)];
  });
  std::vector<double> s(g.size());
  for (index_t i = 0; i < n; ++i)
    std::copy_n(&g[static_cast<std::size_t>(order[static_cast<std::size_t>(i)] * D)], D,
                &s[static_cast<std::size_t>(i * D)]);
  g = std::move(s);
  return counts;
}

/// Ragged counts summing to about n (some empty: rank 1 of >= 3, and a seed-chosen one).
std::vector<index_t> ragged_counts(int P, index_t n, std::uint64_t seed) {
  std::vector<index_t> c(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) c[static_cast<std::size_t>(r)] = static_cast<index_t>(unit(seed, r, 0) * 2.0 * n / P);
  if (P >= 3) c[1] = 0;
  if (P >= 2) c[static_cast<std::size_t>(mix(seed) % static_cast<std::uint64_t>(P))] = 0;
  if (std::accumulate(c.begin(), c.end(), index_t{0}) == 0) c[0] = n;
  return c;
}

template <class T>
Tensor<T, 2> as_tensor(const std::vector<double>& g, index_t D) {
  const index_t n = static_cast<index_t>(g.size()) / D;
  auto t = Tensor<T, 2>::empty({n, D});
  for (index_t i = 0; i < n * D; ++i) t.data()[i] = static_cast<T>(g[static_cast<std::size_t>(i)]);
  return t;
}

/// The unsharded answer.
template <class T>
struct Oracle {
  Tensor<std::int64_t, 2> idx;
  Tensor<T, 2> d2;
  Tensor<std::int64_t, 1> cnt;
};

template <class T>
Oracle<T> oracle(const std::vector<double>& qg, const std::vector<double>& sg, index_t D, bool knn, index_t width,
                 double radius) {
  const auto q = as_tensor<T>(qg, D), s = as_tensor<T>(sg, D);
  const index_t nq = q.shape()[0], ns = s.shape()[0];
  Oracle<T> o{Tensor<std::int64_t, 2>::empty({nq, width}), Tensor<T, 2>::empty({nq, width}),
              Tensor<std::int64_t, 1>::empty({nq})};
  ExecContext& ctx = current_context(Device::cpu());
  if (knn) {
    exec::neighbors_knn({nq, ns, static_cast<int>(D), width, 0, exec::NeighborMethod::brute}, as_block(q), as_block(s),
                        as_block(o.idx), as_block(o.d2), ctx);
    o.cnt.fill(std::min(width, ns));
  } else {
    exec::neighbors_radius({nq, ns, static_cast<int>(D), radius, width, 0, exec::NeighborMethod::brute}, as_block(q),
                           as_block(s), as_block(o.idx), as_block(o.d2), as_block(o.cnt), ctx);
  }
  return o;
}

/// The local rows of `nb` equal the oracle's rows of this rank's queries, bit for bit, and the
/// result is laid out as the query set.
template <class T>
bool matches(const Neighbors<T>& nb, const Oracle<T>& o, const DistTensor<T, 2>& query) {
  const index_t w = o.idx.shape()[1], nq = query.local().shape()[0];
  const index_t off = point_offset(query.spec(), query.mesh().rank());
  if (nb.width() != w || nb.indices.global_shape()[0] != query.global_shape()[0]) return false;
  if (nb.indices.local().shape()[0] != nq || nb.dist2.local().shape()[0] != nq || nb.counts.local().shape()[0] != nq)
    return false;
  if (point_offset(nb.indices.spec(), query.mesh().rank()) != off) return false;
  const auto ii = nb.indices.local().contiguous();
  const auto dd = nb.dist2.local().contiguous();
  const auto cc = nb.counts.local().contiguous();
  return std::memcmp(ii.data(), o.idx.data() + off * w, static_cast<std::size_t>(nq * w) * sizeof(std::int64_t)) == 0 &&
         std::memcmp(dd.data(), o.d2.data() + off * w, static_cast<std::size_t>(nq * w) * sizeof(T)) == 0 &&
         std::memcmp(cc.data(), o.cnt.data() + off, static_cast<std::size_t>(nq) * sizeof(std::int64_t)) == 0;
}

/// The same query on the fake device (tests/support/fake_cuda_backend.hpp: cuda:0 is host memory
/// run by the CPU kernel tables, so every device branch of the query runs here): the result on
/// cuda:0 equals the host run's bit for bit (`host`: indices, dist2, counts, traffic), and the
/// query copies to the host only counts and index lists, never point data:
///  - the NaN counts (2 x 2 i64), the partition checks (2 x (P + 1) i64) and the per-box counts
///    of the halo selections (P i64 each; kNN selects twice) and of the boundary queries the
///    received candidates are searched for (P i64);
///  - kNN (spatial_halo): the cut lists of the queries other ranks shipped here (k i64 each).
template <class T, class Query>
void check_on_fake_device(const Neighbors<T>& host, const DistTensor<T, 2>& query, const DistTensor<T, 2>& support,
                          index_t k, Query&& run) {
  FakeCudaBackend fake;
  // MPI reads the (host) "device" buffers directly: the staged transport's copies are
  // communication, not the host copies this test is about
  auto* mpi = dynamic_cast<MpiComm*>(query.mesh().comm().get());
  const MpiDeviceTransport before = mpi ? mpi->device_transport() : MpiDeviceTransport::automatic;
  if (mpi) mpi->set_device_transport(MpiDeviceTransport::direct);
  const Device dev = Device::cuda(0);
  const auto dq = query.to(dev), ds = support.to(dev);
  fake.reset_counts();
  const Neighbors<T> nb = run(dq, ds);
  const std::size_t d2h = fake.counts().d2h_bytes;
  if (mpi) mpi->set_device_transport(before);
  REQUIRE(nb.indices.local().device() == dev);
  CHECK(nb.dist2.local().device() == dev);
  const auto same = [](const auto& a, const auto& b) {
    const auto x = a.local().to(Device::cpu()), y = b.local().contiguous();
    using E = std::remove_cvref_t<decltype(*x.data())>;
    return x.shape() == y.shape() &&
           std::memcmp(x.data(), y.data(), static_cast<std::size_t>(x.numel()) * sizeof(E)) == 0;
  };
  CHECK(same(nb.indices, host.indices));
  CHECK(same(nb.dist2, host.dist2));
  CHECK(same(nb.counts, host.counts));
  CHECK(nb.elements_sent == host.elements_sent);
  CHECK(nb.queries_received == host.queries_received);
  const std::size_t P = static_cast<std::size_t>(query.mesh().size());
  const std::size_t budget = 8 * (4 + 2 * (P + 1) + 3 * P) + 8 * static_cast<std::size_t>(k * nb.queries_received);
  INFO("device -> host bytes " << d2h << ", budget " << budget);
  CHECK(d2h <= budget);
}

/// Runs kNN and radius queries of several widths on (query, support) and compares each with the
/// oracle, on host blocks and on the fake device. Returns the total elements_sent of all ranks,
/// per query, summed.
template <class T>
std::int64_t check_queries(const DistTensor<T, 2>& query, const DistTensor<T, 2>& support,
                           const std::vector<double>& qg, const std::vector<double>& sg, index_t D, double radius,
                           const NeighborQueryOptions& opts) {
  const index_t ns = static_cast<index_t>(sg.size()) / D;
  std::int64_t sent = 0;
  const NeighborStrategy want = opts.partition ? NeighborStrategy::spatial_halo : NeighborStrategy::ring;
  for (index_t k : {index_t{1}, index_t{4}, ns + 3}) {
    INFO("knn k = " << k);
    const auto nb = knn(query, support, k, opts);
    CHECK(nb.strategy == (opts.strategy == NeighborStrategy::automatic ? want : opts.strategy));
    CHECK(matches(nb, oracle<T>(qg, sg, D, true, k, 0), query));
    sent += nb.elements_sent;
    check_on_fake_device(nb, query, support, k,
                         [&](const DistTensor<T, 2>& q, const DistTensor<T, 2>& s) { return knn(q, s, k, opts); });
  }
  for (double r : {0.0, radius})
    for (index_t m : {index_t{3}, ns + 1}) {
      INFO("radius " << r << " max_neighbours " << m);
      const auto nb = radius_neighbors(query, support, r, m, opts);
      CHECK(matches(nb, oracle<T>(qg, sg, D, false, m, r), query));
      CHECK(nb.queries_received == 0);
      sent += nb.elements_sent;
      check_on_fake_device(nb, query, support, 0, [&](const DistTensor<T, 2>& q, const DistTensor<T, 2>& s) {
        return radius_neighbors(q, s, r, m, opts);
      });
    }
  return sent;
}

/// The meshes a communicator of P ranks is tested on: the 1-D mesh, and 2-D shapes.
std::vector<std::vector<int>> mesh_shapes(int P) {
  std::vector<std::vector<int>> s{{P}};
  if (P == 4) s.push_back({2, 2});
  if (P == 2) s.push_back({1, 2});
  if (P == 3) s.push_back({3, 1});
  if (P > 4 && P % 2 == 0) s.push_back({2, P / 2});  // np 6, 8 (runs by hand)
  return s;
}

/// Box partitions of [0, kL]^D on `mesh`: uniform slabs/tiles, and one with an empty box (a
/// zero-width first slab along the mesh's first dim of size > 1).
std::vector<BoxPartition> partitions(const DeviceMesh& mesh, index_t D) {
  std::vector<int> mdims(static_cast<std::size_t>(D), -1);
  int c = 0;
  for (int m = 0; m < mesh.ndim(); ++m)
    if (mesh.size(m) > 1) mdims[static_cast<std::size_t>(c++ % D)] = m;
  // 2-D meshes of size 4: split x and the LAST coordinate (y in 2-D, z in 3-D)
  if (c == 2 && D == 3) std::swap(mdims[1], mdims[2]);
  std::vector<BoxPartition> out{BoxPartition::uniform(mesh, std::vector<double>(static_cast<std::size_t>(D), 0.0),
                                                      std::vector<double>(static_cast<std::size_t>(D), kL), mdims)};
  std::vector<std::vector<double>> cuts(static_cast<std::size_t>(D));
  bool skewed = false;
  for (index_t d = 0; d < D; ++d) {
    const int m = mdims[static_cast<std::size_t>(d)];
    const int n = m < 0 ? 1 : mesh.size(m);
    auto& cd = cuts[static_cast<std::size_t>(d)];
    cd.push_back(0.0);
    if (n >= 2 && !skewed) {  // slab 0 empty, slab 1 = [0, 0.3 kL), the rest uniform
      cd.push_back(0.0);
      for (int k = 1; k < n; ++k) cd.push_back(0.3 * kL + 0.7 * kL * (k - 1) / (n - 1));
      cd.back() = kL;
      skewed = true;
    } else {
      for (int k = 1; k <= n; ++k) cd.push_back(kL * k / n);
    }
  }
  if (skewed) out.emplace_back(mesh, cuts, mdims);
  return out;
}

template <class T>
void ring_cases(const CommPtr& comm, index_t D) {
  const int P = comm->size();
  for (const auto& shape : mesh_shapes(P)) {
    DeviceMesh mesh(comm, shape);
    for (Data kind : {Data::uniform, Data::clustered, Data::lattice})
      for (bool same : {true, false}) {
        INFO("mesh " << fmt::format("{}", shape) << " D " << D << " " << name(kind)
                     << (same ? " query == support" : ""));
        const std::uint64_t seed = 17 + static_cast<std::uint64_t>(D) * 7 + static_cast<std::uint64_t>(kind);
        const auto sc = ragged_counts(P, 70, seed);
        const index_t ns = std::accumulate(sc.begin(), sc.end(), index_t{0});
        const auto sg = make_points<T>(kind, ns, D, seed);
        const auto support = make_set<T>(mesh, sg, D, sc);
        const auto qc = same ? sc : ragged_counts(P, 50, seed + 3);
        const index_t nq = std::accumulate(qc.begin(), qc.end(), index_t{0});
        const auto qg = same ? sg : make_points<T>(kind, nq, D, seed + 5);
        const auto query = same ? support : make_set<T>(mesh, qg, D, qc);
        const double radius = kind == Data::lattice ? 1.0 : (D == 2 ? 0.7 : 1.1);
        NeighborQueryOptions opts;
        opts.strategy = same ? NeighborStrategy::automatic : NeighborStrategy::ring;
        const auto sent = check_queries(query, support, qg, sg, D, radius, opts);
        // every shard but the own one reaches every rank: (P - 1) shifts of what this rank holds
        std::int64_t total = sent;
        comm->allreduce_inplace(&total, 1, ReduceOp::sum);
        CHECK(total == 7 * (P - 1) * ns * D);  // 7 queries, each moves every shard P - 1 times
      }
  }
}

template <class T>
void halo_cases(const CommPtr& comm, index_t D) {
  const int P = comm->size();
  for (const auto& shape : mesh_shapes(P)) {
    DeviceMesh mesh(comm, shape);
    const auto parts = partitions(mesh, D);
    for (std::size_t pi = 0; pi < parts.size(); ++pi) {
      const BoxPartition& part = parts[pi];
      for (Data kind : {Data::uniform, Data::clustered, Data::lattice})
        for (bool same : {true, false}) {
          INFO("mesh " << fmt::format("{}", shape) << " partition " << pi << " D " << D << " " << name(kind)
                       << (same ? " query == support" : ""));
          const std::uint64_t seed = 23 + static_cast<std::uint64_t>(D) * 7 + static_cast<std::uint64_t>(kind);
          auto sg = make_points<T>(kind, 90, D, seed);
          const auto sc = sort_by_owner(sg, D, part);
          const auto support = make_set<T>(mesh, sg, D, sc);
          auto qg = same ? sg : make_points<T>(kind, 60, D, seed + 5);
          const auto qc = same ? sc : sort_by_owner(qg, D, part);
          const auto query = same ? support : make_set<T>(mesh, qg, D, qc);
          const double radius = kind == Data::lattice ? 1.0 : (D == 2 ? 0.7 : 1.1);
          NeighborQueryOptions opts;
          opts.partition = &part;
          if (!same) opts.strategy = NeighborStrategy::spatial_halo;
          check_queries(query, support, qg, sg, D, radius, opts);
        }
    }
  }
}

}  // namespace

TEST_CASE("ring knn / radius_neighbors equal the unsharded query exactly", "[points][mpi]") {
  for_each_comm([](CommPtr comm) {
    ring_cases<float>(comm, 2);
    ring_cases<double>(comm, 3);
    ring_cases<double>(comm, 2);
    ring_cases<float>(comm, 3);
  });
}

TEST_CASE("spatial_halo knn / radius_neighbors equal the unsharded query exactly", "[points][mpi]") {
  for_each_comm([](CommPtr comm) {
    halo_cases<float>(comm, 2);
    halo_cases<double>(comm, 3);
    halo_cases<double>(comm, 2);
    halo_cases<float>(comm, 3);
  });
}

TEST_CASE("spatial_halo kNN bounds: infinite (the query is shipped to every rank) and zero (sends nothing)", "[points][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size(), me = comm->rank();
    DeviceMesh mesh(comm, {P});
    const index_t D = 2;
    const auto part = BoxPartition::uniform(mesh, {0.0, 0.0}, {kL, kL}, {0, -1});
    // uniform points, but the last box holds exactly 2 support points: its queries' local 5th
    // distance is +inf, so it ships them to every rank, and each answers with its 5 nearest
    // (the answer is still exact)
    auto sg = make_points<double>(Data::uniform, 120, D, 5);
    {
      const double x_last = kL * (P - 1) / P;
      int kept = 0;
      for (std::size_t i = 0; i < sg.size(); i += 2)
        if (P > 1 && sg[i] >= x_last && kept++ >= 2) sg[i] = 0.5 * x_last * sg[i] / kL;  // move left
    }
    const auto sc = sort_by_owner(sg, D, part);
    if (P > 1) REQUIRE(sc.back() == 2);
    const auto support = make_set<double>(mesh, sg, D, sc);
    NeighborQueryOptions opts;
    opts.partition = &part;
    const auto nb = knn(support, support, 5, opts);
    CHECK(matches(nb, oracle<double>(sg, sg, D, true, 5, 0), support));
    // the last rank shipped its 2 unbounded queries (D coordinates + the bound) to every other rank
    if (P > 1 && me == P - 1) CHECK(nb.elements_sent >= 2 * (D + 1) * (P - 1));
    // query == support, k = 1, distinct points: every local bound is 0 -> nothing leaves any rank
    const auto ug = make_points<double>(Data::uniform, 200, D, 9);
    auto ug2 = ug;
    const auto uc = sort_by_owner(ug2, D, part);
    const auto u = make_set<double>(mesh, ug2, D, uc);
    const auto nb1 = knn(u, u, 1, opts);
    CHECK(matches(nb1, oracle<double>(ug2, ug2, D, true, 1, 0), u));
    CHECK(nb1.elements_sent == 0);
  });
}

TEST_CASE("spatial_halo sends far less than the ring on uniform data", "[points][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        const int P = comm->size();
        for (const auto& shape : mesh_shapes(P)) {
          DeviceMesh mesh(comm, shape);
          for (index_t D : {index_t{2}, index_t{3}}) {
            const auto part = partitions(mesh, D)[0];
            auto g = make_points<float>(Data::uniform, 4000, D, 31);
            const auto c = sort_by_owner(g, D, part);
            const auto pts = make_set<float>(mesh, g, D, c);
            NeighborQueryOptions halo, ring;
            halo.partition = &part;
            ring.strategy = NeighborStrategy::ring;
            auto total = [&](std::int64_t v) {
              comm->allreduce_inplace(&v, 1, ReduceOp::sum);
              return v;
            };
            const double r = D == 2 ? 0.1 : 0.3;
            const auto rh = radius_neighbors(pts, pts, r, 64, halo), rr = radius_neighbors(pts, pts, r, 64, ring);
            const auto kh = knn(pts, pts, 8, halo), kr = knn(pts, pts, 8, ring);
            const double radius_ratio =
                static_cast<double>(total(rh.elements_sent)) / static_cast<double>(total(rr.elements_sent));
            const double knn_ratio =
                static_cast<double>(total(kh.elements_sent)) / static_cast<double>(total(kr.elements_sent));
            INFO("mesh " << fmt::format("{}", shape) << " D " << D << " radius ratio " << radius_ratio << " knn ratio "
                         << knn_ratio);
            // kNN's per-rank bound is the worst k-th distance of the rank's queries (domain corners
            // see few neighbours): in 3-D on slabs it sends about 0.3 of the ring's traffic
            CHECK(radius_ratio < 0.2);
            CHECK(knn_ratio < (D == 2 ? 0.15 : 0.35));
            CHECK(matches(rh, oracle<float>(g, g, D, false, 64, r), pts));
            CHECK(std::memcmp(kh.indices.local().data(), kr.indices.local().data(),
                              static_cast<std::size_t>(kh.indices.local().numel()) * 8) == 0);
            if (comm->rank() == 0 && P == world_size())
              fmt::print(
                  "[points] traffic halo / ring, {} ranks, mesh {}, D {}, 4000 uniform points: radius {:.4f}, "
                  "knn(8) {:.4f}\n",
                  P, shape, D, radius_ratio, knn_ratio);
          }
        }
      },
      2);
}

TEST_CASE("neighbour queries refuse bad input on every rank", "[points][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size(), me = comm->rank();
    auto in_step = [&] {
      int one = 1;
      comm->allreduce_inplace(&one, 1, ReduceOp::sum);
      CHECK(one == P);
    };
    DeviceMesh mesh(comm, {P});
    std::vector<index_t> counts(static_cast<std::size_t>(P), 5);
    const index_t n = 5 * P;
    const auto g2 = make_points<double>(Data::uniform, n, 2, 3), g3 = make_points<double>(Data::uniform, n, 3, 3);
    const auto a = make_set<double>(mesh, g2, 2, counts), b = make_set<double>(mesh, g3, 3, counts);
    CHECK_THAT(error_of([&] { knn(a, b, 2); }), ContainsSubstring("knn") && ContainsSubstring("coordinates"));
    in_step();
    DeviceMesh other(comm, {P});
    const auto a_other = make_set<double>(other, g2, 2, counts);
    CHECK_THAT(error_of([&] { radius_neighbors(a, a_other, 0.5, 4); }), ContainsSubstring("different meshes"));
    in_step();
    const auto not_points = DistTensor<double, 2>::zeros({n, 2}, mesh, {Shard(1)});
    CHECK_THAT(error_of([&] { knn(not_points, a, 2); }), ContainsSubstring("knn") && ContainsSubstring("query set"));
    CHECK_THAT(error_of([&] { knn(a, not_points, 2); }), ContainsSubstring("support set"));
    in_step();
    CHECK_THAT(error_of([&] { knn(a, a, 0); }), ContainsSubstring("k must be >= 1"));
    CHECK_THAT(error_of([&] { radius_neighbors(a, a, -1.0, 4); }), ContainsSubstring("radius"));
    CHECK_THAT(error_of([&] { radius_neighbors(a, a, std::nan(""), 4); }), ContainsSubstring("radius"));
    CHECK_THAT(error_of([&] { radius_neighbors(a, a, 0.5, 0); }), ContainsSubstring("max_neighbours"));
    in_step();
    NeighborQueryOptions halo_without;
    halo_without.strategy = NeighborStrategy::spatial_halo;
    CHECK_THAT(error_of([&] { knn(a, a, 2, halo_without); }), ContainsSubstring("partition"));
    in_step();
    // NaN on the last rank only: every rank throws, naming it
    auto nan_local = a.local().clone();
    if (me == P - 1) nan_local.data()[3] = std::nan("");
    const DistTensor<double, 2> a_nan(a.spec(), nan_local);
    CHECK_THAT(error_of([&] { knn(a, a_nan, 2); }),
               ContainsSubstring("NaN") &&
                   ContainsSubstring(fmt::format("rank {}: 0 in the query set, 1 in the support", P - 1)));
    CHECK_THAT(error_of([&] { radius_neighbors(a_nan, a, 0.3, 2); }), ContainsSubstring("NaN"));
    in_step();
    // a point outside its box on rank 0 only (spatial_halo)
    const auto part = BoxPartition::uniform(mesh, {0.0, 0.0}, {kL, kL}, {0, -1});
    auto gp = g2;
    const auto pc = sort_by_owner(gp, 2, part);
    const auto inside = make_set<double>(mesh, gp, 2, pc);
    NeighborQueryOptions opts;
    opts.partition = &part;
    CHECK_NOTHROW(knn(inside, inside, 2, opts));
    auto moved = inside.local().clone();
    if (me == 0 && moved.shape()[0] > 0) moved.data()[0] = -1.0;
    const DistTensor<double, 2> outside(inside.spec(), moved);
    if (pc[0] > 0) {
      CHECK_THAT(error_of([&] { radius_neighbors(outside, inside, 0.5, 3, opts); }),
                 ContainsSubstring("outside") && ContainsSubstring("rank 0: 1 point(s)"));
      CHECK_THAT(error_of([&] { knn(inside, outside, 3, opts); }), ContainsSubstring("rank 0: 1 point(s)"));
    }
    in_step();
    // the partition of another mesh
    const auto part_other = BoxPartition::uniform(other, {0.0, 0.0}, {kL, kL}, {0, -1});
    opts.partition = &part_other;
    CHECK_THAT(error_of([&] { knn(inside, inside, 2, opts); }), ContainsSubstring("different meshes"));
    in_step();
  });
}

}  // namespace st_dist_mpi_points
