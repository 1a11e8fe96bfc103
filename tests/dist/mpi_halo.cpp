// Halo exchange against the oracle (the full tensor padded with the same boundary modes, sliced to
// each rank's extended box) and its adjoint by the dot-product identity <H x, g> == <x, H^T g>,
// at 1..4 ranks, on 1-D and 2-D meshes (corners), with uneven and empty shards, multi-hop widths,
// every boundary mode, fp64 and fp32. Bad input throws on every rank.
#include <cstring>
#include <thread>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <shardtensor/dist/halo.hpp>

#include "support/mpi_harness.hpp"

namespace st_dist_mpi_halo {

using namespace shard;
using Catch::Matchers::ContainsSubstring;
using shard::test::error_of;
using shard::test::for_each_comm_size;

namespace {

constexpr Boundary kModes[] = {Boundary::zero, Boundary::periodic, Boundary::reflect, Boundary::replicate};

/// Source index of ghost index g (PyTorch F.pad semantics), written independently of the library.
index_t oracle_source(index_t g, index_t n, Boundary mode) {
  if (g >= 0 && g < n) return g;
  index_t s = g;
  switch (mode) {
    case Boundary::zero: return -1;
    case Boundary::periodic:
      while (s < 0) s += n;
      while (s >= n) s -= n;
      return s;
    case Boundary::reflect:
      while (s < 0 || s >= n) {
        if (s < 0) s = -s;
        if (s >= n) s = 2 * (n - 1) - s;
      }
      return s;
    case Boundary::replicate: return std::clamp<index_t>(g, 0, n - 1);
  }
  return -1;
}

/// The full tensor padded by `h`, sliced to the extended box of the block at `off` of shape `len`.
template <class T, int R>
Tensor<T, R> oracle_extended(const Tensor<T, R>& full, const std::vector<index_t>& off, const std::vector<index_t>& len,
                             const HaloSpec& h) {
  Shape<R> es{};
  for (int d = 0; d < R; ++d) es[d] = len[d] + h.lo[d] + h.hi[d];
  auto out = Tensor<T, R>::empty(es);
  for (index_t lin = 0; lin < numel(es); ++lin) {
    const auto e = unravel(lin, es);
    Shape<R> src{};
    bool zero = false;
    for (int d = 0; d < R; ++d) {
      const index_t s = oracle_source(off[d] - h.lo[d] + e[d], full.size(d), h.modes[d]);
      zero = zero || s < 0;
      src[d] = s;
    }
    out.at(e) = zero ? T(0) : full.at(src);
  }
  return out;
}

/// One way of laying out the test tensor on a mesh.
struct Layout {
  std::vector<int> mesh;
  std::vector<Placement> placements;
  ShardSizes sizes;
  std::string name;
};

/// Layouts of a {2, 7, 9} tensor over P ranks: 1-D meshes sharding each dim (incl. explicit sizes
/// with empty shards), 2-D meshes sharding two dims (corners), one dim twice, or with a Replicate.
std::vector<Layout> layouts_for(int P) {
  std::vector<Layout> v;
  v.push_back({{P}, {Shard(1)}, {}, "1-D Shard(1)"});
  v.push_back({{P}, {Shard(2)}, {}, "1-D Shard(2)"});
  v.push_back({{P}, {Shard(0)}, {}, "1-D Shard(0) (halo dims local)"});
  if (P == 2) v.push_back({{P}, {Shard(1)}, {{}, {0, 7}, {}}, "1-D Shard(1) sizes 0,7"});
  if (P == 3) v.push_back({{P}, {Shard(1)}, {{}, {3, 0, 4}, {}}, "1-D Shard(1) sizes 3,0,4"});
  if (P == 4) v.push_back({{P}, {Shard(2)}, {{}, {}, {0, 2, 0, 7}}, "1-D Shard(2) sizes 0,2,0,7"});
  for (int a = 1; a <= P; ++a) {
    if (P % a || P == 1) continue;
    const int b = P / a;
    const auto tag = fmt::format("{}x{} ", a, b);
    v.push_back({{a, b}, {Shard(1), Shard(2)}, {}, tag + "Shard(1),Shard(2)"});
    v.push_back({{a, b}, {Shard(2), Shard(1)}, {}, tag + "Shard(2),Shard(1)"});
    v.push_back({{a, b}, {Shard(1), Shard(1)}, {}, tag + "Shard(1),Shard(1)"});
    v.push_back({{a, b}, {Shard(2), Replicate()}, {}, tag + "Shard(2),Replicate"});
  }
  if (P == 4) v.push_back({{2, 2}, {Shard(1), Shard(2)}, {{}, {7, 0}, {1, 8}}, "2x2 sizes (7,0)x(1,8)"});
  // A 3-D mesh: dims 0 and 2 exchanged with neighbours, dim 1 padded locally (3-D corners).
  if (P == 4) v.push_back({{2, 1, 2}, {Shard(0), Shard(1), Shard(2)}, {}, "2x1x2 Shard(0),Shard(1),Shard(2)"});
  if (P == 2) v.push_back({{2, 1, 1}, {Shard(0), Shard(1), Shard(2)}, {}, "2x1x1 Shard(0),Shard(1),Shard(2)"});
  return v;
}

/// Halo specs exercised on a {2, 7, 9} tensor: widths 1, 2, asymmetric, wider than a shard and
/// the largest allowed, with `mode` on dim 1 and the next mode on dim 2 (mixed corners).
std::vector<HaloSpec> halos_for(Boundary mode) {
  const Boundary m2 = kModes[(static_cast<int>(mode) + 1) % 4];
  auto mx = [](index_t n, Boundary b) { return b == Boundary::reflect ? n - 1 : n; };
  std::vector<HaloSpec> v;
  const std::vector<std::array<index_t, 4>> w = {
      {1, 1, 1, 1}, {2, 2, 2, 2}, {0, 3, 2, 0}, {5, 2, 3, 6}, {mx(7, mode), mx(7, mode), mx(9, m2), mx(9, m2)}};
  for (auto& x : w) v.push_back({{0, x[0], x[2]}, {0, x[1], x[3]}, {Boundary::zero, mode, m2}});
  v.push_back({{1, 0, 1}, {1, 2, 0}, {Boundary::periodic, mode, m2}});  // the (short) dim 0 too
  return v;
}

template <class T>
void check_halo_case(const DeviceMesh& mesh, const Layout& lay, const HaloSpec& h, std::uint64_t seed) {
  using D3 = DistTensor<T, 3>;
  const Shape<3> gshape{2, 7, 9};
  if (h.lo[0] + h.hi[0] > 0 && h.modes[0] == Boundary::reflect) return;
  auto x = D3::random(gshape, mesh, lay.placements, seed, {}, lay.sizes);
  auto full = Tensor<T, 3>::empty(gshape);
  full.fill_random(seed);
  const Box box = x.spec().local_box();

  // Forward: exactly the oracle (copies only).
  auto ext = halo_exchange(x, h);
  auto want = oracle_extended(full, box.lo, box.len, h);
  REQUIRE(ext.shape() == want.shape());
  CHECK(max_rel_diff(ext, want) == 0.0);

  // Adjoint: <H x, g> == <x, H^T g> summed over all ranks.
  auto g = Tensor<T, 3>::empty(ext.shape());
  g.fill_random(seed * 7919 + static_cast<std::uint64_t>(mesh.rank()) + 1);
  auto gx = halo_exchange_adjoint(x.spec(), g, h);
  REQUIRE(gx.shape() == x.local().shape());
  CHECK(max_rel_diff(halo_exchange_adjoint(x.spec(), g.clone(), h, /*overwrite_grad_ext=*/true), gx) == 0.0);
  // fp32: the adjoint sums in fp32, so the error is relative to sum |Hx_i g_i| (cancellation).
  auto absf = [](T v) { return std::abs(v); };
  double dots[3] = {dot(ext, g), dot(x.local(), gx), dot(map(ext, absf), map(g, absf))};
  mesh.comm()->allreduce(dots, dots, 3, DType::f64, ReduceOp::sum);
  const double scale = std::is_same_v<T, double> ? std::abs(dots[0]) : dots[2];
  const double rel = std::abs(dots[0] - dots[1]) / std::max(scale, 1e-300);
  CHECK(rel <= (std::is_same_v<T, double> ? 1e-12 : 1e-6));
}

}  // namespace

TEST_CASE("halo exchange equals the padded full tensor; adjoint passes the dot-product test", "[dist][halo][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    std::uint64_t seed = 100;
    for (const auto& lay : layouts_for(P)) {
      DeviceMesh mesh(comm, lay.mesh);
      for (Boundary mode : kModes)
        for (const auto& h : halos_for(mode)) {
          INFO("P=" << P << " layout " << lay.name << " halo " << fmt::format("{}", h));
          ++seed;
          check_halo_case<double>(mesh, lay, h, seed);
          check_halo_case<float>(mesh, lay, h, seed);
        }
    }
  });
}

TEST_CASE("halo exchange of a 1-D tensor over many tiny and empty shards (multi-hop)", "[dist][halo][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm);
    using D1 = DistTensor<double, 1>;
    const index_t n = 5;
    std::vector<std::vector<index_t>> size_sets = {{}};
    if (P == 2) size_sets.push_back({5, 0});
    if (P == 3) size_sets.push_back({0, 5, 0});
    if (P == 4) size_sets.push_back({1, 0, 3, 1});
    for (const auto& sizes : size_sets) {
      ShardSizes ss = {sizes};
      auto x = D1::random({n}, mesh, {Shard(0)}, 11, {}, ss);
      auto full = Tensor<double, 1>::empty({n});
      full.fill_random(11);
      for (Boundary mode : kModes)
        for (index_t lo = 0; lo <= n; ++lo)
          for (index_t hi = 0; hi <= n; ++hi) {
            if (mode == Boundary::reflect && (lo == n || hi == n)) continue;
            HaloSpec h{{lo}, {hi}, {mode}};
            INFO("P=" << P << " sizes " << fmt::format("{}", sizes) << " halo " << fmt::format("{}", h));
            auto ext = halo_exchange(x, h);
            CHECK(max_rel_diff(ext, oracle_extended(full, x.spec().local_box().lo, x.spec().local_box().len, h)) == 0.0);
            auto g = Tensor<double, 1>::empty(ext.shape());
            g.fill_random(1000 + static_cast<std::uint64_t>(comm->rank()));
            auto gx = halo_exchange_adjoint(x.spec(), g, h);
            double dots[2] = {dot(ext, g), dot(x.local(), gx)};
            comm->allreduce(dots, dots, 2, DType::f64, ReduceOp::sum);
            CHECK(std::abs(dots[0] - dots[1]) <= 1e-12 * std::max(std::abs(dots[0]), 1e-300));
          }
    }
  });
}

TEST_CASE("split-phase halo exchanges overlap and may finish out of order", "[dist][halo][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    std::vector<int> shape = P == 4 ? std::vector<int>{2, 2} : std::vector<int>{1, P};
    DeviceMesh mesh(comm, shape);
    using D4 = DistTensor<float, 4>;
    const Shape<4> gs{2, 3, 10, 11};  // N, C, H, W with H and W sharded
    auto x = D4::random(gs, mesh, {Shard(2), Shard(3)}, 5);
    auto y = D4::random(gs, mesh, {Shard(2), Shard(3)}, 6);
    auto full_x = Tensor<float, 4>::empty(gs), full_y = Tensor<float, 4>::empty(gs);
    full_x.fill_random(5);
    full_y.fill_random(6);
    HaloSpec hx{{0, 0, 1, 1}, {0, 0, 1, 1}, {Boundary::zero, Boundary::zero, Boundary::zero, Boundary::zero}};
    HaloSpec hy = HaloSpec::symmetric({0, 0, 2, 3}, Boundary::periodic);
    auto a = halo_exchange_start(x, hx);
    auto b = halo_exchange_start(y, hy);
    // The interior is valid before finish(): the op computes what needs no halo meanwhile.
    CHECK(max_rel_diff(a.interior(), x.local()) == 0.0);
    CHECK(max_rel_diff(b.interior(), y.local()) == 0.0);
    auto eb = b.finish();
    auto ea = a.finish();
    const Box box = x.spec().local_box();
    CHECK(max_rel_diff(ea, oracle_extended(full_x, box.lo, box.len, hx)) == 0.0);
    CHECK(max_rel_diff(eb, oracle_extended(full_y, box.lo, box.len, hy)) == 0.0);
    CHECK(a.finish().data() == ea.data());  // idempotent
    // The adjoint split phase, and an unfinished handle completes on destruction.
    auto g = Tensor<float, 4>::full(ea.shape(), 1.0f);
    auto ga = halo_exchange_adjoint_start(x.spec(), g, hx);
    { auto dropped = halo_exchange_start(y, hy); }
    auto gx = ga.finish();
    CHECK(gx.shape() == x.local().shape());
    double s[2] = {sum(ea), dot(x.local(), gx)};
    comm->allreduce(s, s, 2, DType::f64, ReduceOp::sum);
    CHECK(std::abs(s[0] - s[1]) <= 1e-5 * std::abs(s[0]));
  });
}

TEST_CASE("a split-phase halo transfer finishes after its ContextGuard's context is gone, or on another thread",
          "[dist][halo][mpi][halo_ctx]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, P == 4 ? std::vector<int>{2, 2} : std::vector<int>{1, P});
    using D4 = DistTensor<double, 4>;
    const Shape<4> gs{1, 2, 9, 7};
    auto x = D4::random(gs, mesh, {Shard(2), Shard(3)}, 11);
    auto full = Tensor<double, 4>::empty(gs);
    full.fill_random(11);
    const HaloSpec h = HaloSpec::symmetric({0, 0, 2, 1}, Boundary::periodic);
    const Box box = x.spec().local_box();
    // The guard's context is freed before the transfers finish: a transfer that kept a pointer
    // to it reads freed memory (a heap-use-after-free under ASan; in a Release CPU build the old
    // bug is invisible: the box engine falls back to current_context() on a device mismatch and
    // the CPU kernels ignore the stream, so this test then checks the results only).
    auto* ctx = new ExecContext(Device::cpu());
    HaloExchange<double, 4> fwd, adj;
    auto g = Tensor<double, 4>::full(Shape<4>{1, 2, box.len[2] + 4, box.len[3] + 2}, 1.0);
    {
      ContextGuard guard(*ctx);
      fwd = halo_exchange_start(x, h);
      adj = halo_exchange_adjoint_start(x.spec(), g, h);
    }
    delete ctx;
    Tensor<double, 4> ext = fwd.finish(), gx = adj.finish();
    CHECK(max_rel_diff(ext, oracle_extended(full, box.lo, box.len, h)) == 0.0);
    double s[2] = {sum(ext), dot(x.local(), gx)};  // <H x, 1> == <x, H^T 1>
    comm->allreduce(s, s, 2, DType::f64, ReduceOp::sum);
    CHECK(std::abs(s[0] - s[1]) <= 1e-12 * std::abs(s[0]));
    // Started on a thread that then exits (its thread-local current context is destroyed),
    // finished here. Only where the exchange sends no messages (one rank): MPI is initialised
    // FUNNELED, so only the main thread may call it.
    if (P == 1) {
      HaloExchange<double, 4> other;
      std::thread t([&] {
        ExecContext tctx(Device::cpu());
        ContextGuard guard(tctx);
        other = halo_exchange_start(x, h);
      });
      t.join();
      CHECK(max_rel_diff(other.finish(), oracle_extended(full, box.lo, box.len, h)) == 0.0);
    }
  });
}

TEST_CASE("halo of a Partial tensor is the halo of each summand", "[dist][halo][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        if (comm->size() % 2) return;
        DeviceMesh mesh(comm, {2, comm->size() / 2});
        using D2 = DistTensor<double, 2>;
        auto x = D2::random({6, 8}, mesh, {Partial(), Shard(1)}, 21);
        auto full = Tensor<double, 2>::empty({6, 8});
        full.fill_random(21);
        auto h = HaloSpec::symmetric({1, 2}, Boundary::reflect);
        auto ext = halo_exchange(x, h);
        auto sum_ext = ext.clone();
        mesh.dim_comm(0)->allreduce(sum_ext.data(), sum_ext.data(), sum_ext.numel(), DType::f64, ReduceOp::sum);
        const Box box = x.spec().local_box();
        CHECK(max_rel_diff(sum_ext, oracle_extended(full, box.lo, box.len, h)) == 0.0);
      },
      2);
}

TEST_CASE("bad halos throw shard::Error on every rank, before any communication", "[dist][halo][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm);
    using D2 = DistTensor<double, 2>;
    auto x = D2::random({7, 5}, mesh, {Shard(0)}, 3);
    auto z = Boundary::zero;
    CHECK_THAT(error_of([&] { halo_exchange(x, HaloSpec{{8, 0}, {0, 0}, {Boundary::periodic, z}}); }),
               ContainsSubstring("wider than the global domain"));
    CHECK_THAT(error_of([&] { halo_exchange(x, HaloSpec{{0, 0}, {8, 0}, {z, z}}); }),
               ContainsSubstring("wider than the global domain"));
    CHECK_THAT(error_of([&] { halo_exchange(x, HaloSpec{{7, 0}, {7, 0}, {Boundary::reflect, z}}); }),
               ContainsSubstring("at most 6 with reflect"));
    CHECK_THAT(error_of([&] { halo_exchange(x, HaloSpec{{0, 6}, {0, 0}, {z, Boundary::replicate}}); }),
               ContainsSubstring("extent 5"));
    CHECK_THAT(error_of([&] { halo_exchange(x, HaloSpec{{-1, 0}, {1, 0}, {z, z}}); }),
               ContainsSubstring("negative ghost width"));
    CHECK_THAT(error_of([&] { halo_exchange(x, HaloSpec::symmetric({1}, z)); }),
               ContainsSubstring("one width below, one above and one mode per tensor dim"));
    CHECK_THAT(error_of([&] { halo_exchange(x, HaloSpec{{1, 1}, {1, 1}, {z}}); }),
               ContainsSubstring("one mode per tensor dim"));
    CHECK_THAT(error_of([&] { halo_exchange_adjoint(x.spec(), Tensor<double, 2>::zeros({1, 1}), HaloSpec{{1}, {1}, {z}}); }),
               ContainsSubstring("halo_exchange_adjoint"));
    // A gradient of the wrong shape on one rank only: every rank throws (collective check).
    auto h = HaloSpec::symmetric({1, 1}, Boundary::periodic);
    auto ext = halo_exchange(x, h);
    auto bad = comm->rank() == 0 ? Tensor<double, 2>::zeros({ext.size(0) + 1, ext.size(1)}) : ext.clone();
    CHECK_THAT(error_of([&] { halo_exchange_adjoint(x.spec(), bad, h); }),
               ContainsSubstring("gradient of the extended block has shape"));
    // Nothing is left in flight: a good exchange still works afterwards.
    auto full = Tensor<double, 2>::empty({7, 5});
    full.fill_random(3);
    CHECK(max_rel_diff(halo_exchange(x, h), oracle_extended(full, x.spec().local_box().lo, x.spec().local_box().len, h)) ==
          0.0);
  });
}

}  // namespace st_dist_mpi_halo
