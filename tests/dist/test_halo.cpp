// Halo exchange on one rank (SelfComm): purely local padding of every dim with every boundary mode
// against a hand-written PyTorch-style pad, the adjoint against an explicit transpose, and the
// validation messages.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <shardtensor/dist/halo.hpp>
#include <shardtensor/tensor/ops.hpp>

namespace st_dist_test_halo {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

namespace {

DeviceMesh self_mesh() { return DeviceMesh(std::make_shared<SelfComm>()); }

/// PyTorch F.pad index map for one dim (-1: zero).
index_t pad_source(index_t g, index_t n, Boundary mode) {
  if (g >= 0 && g < n) return g;
  switch (mode) {
    case Boundary::zero: return -1;
    case Boundary::periodic: return g < 0 ? g + n : g - n;
    case Boundary::reflect: return g < 0 ? -g : 2 * n - 2 - g;
    case Boundary::replicate: return g < 0 ? 0 : n - 1;
  }
  return -1;
}

}  // namespace

TEST_CASE("local halo = pad of the whole tensor; adjoint = explicit transpose", "[dist][halo]") {
  auto mesh = self_mesh();
  using D2 = DistTensor<double, 2>;
  const index_t n0 = 4, n1 = 6;
  auto x = D2::random({n0, n1}, mesh, {Replicate()}, 9);
  const Boundary modes[] = {Boundary::zero, Boundary::periodic, Boundary::reflect, Boundary::replicate};
  for (Boundary m0 : modes)
    for (Boundary m1 : modes)
      for (index_t w = 0; w <= 3; ++w) {
        HaloSpec h{{w, 1}, {1, w + 2}, {m0, m1}};
        INFO(fmt::format("{}", h));
        auto ext = halo_exchange(x, h);
        REQUIRE(ext.shape() == Shape<2>{n0 + w + 1, n1 + w + 3});
        // Forward and the transpose built entry by entry from the same index map.
        auto g = Tensor<double, 2>::empty(ext.shape());
        g.fill_random(77);
        auto gx_want = Tensor<double, 2>::zeros({n0, n1});
        for (index_t i = 0; i < ext.size(0); ++i)
          for (index_t j = 0; j < ext.size(1); ++j) {
            const index_t si = pad_source(i - w, n0, m0), sj = pad_source(j - 1, n1, m1);
            const bool zero = si < 0 || sj < 0;
            CHECK(ext(i, j) == (zero ? 0.0 : x.local()(si, sj)));
            if (!zero) gx_want(si, sj) += g(i, j);
          }
        auto gx = halo_exchange_adjoint(x.spec(), g, h);
        CHECK(max_rel_diff(gx, gx_want) <= 1e-14);
      }
}

TEST_CASE("a zero halo is a copy; rank-1 and float work; validation messages", "[dist][halo]") {
  auto mesh = self_mesh();
  auto x = DistTensor<float, 1>::random({5}, mesh, {Replicate()}, 2);
  auto h0 = HaloSpec::symmetric({0}, Boundary::zero);
  CHECK(h0.empty());
  auto e0 = halo_exchange(x, h0);
  CHECK(e0.data() != x.local().data());
  CHECK(max_rel_diff(e0, x.local()) == 0.0);
  auto e = halo_exchange(x, HaloSpec::symmetric({2}, Boundary::periodic));
  REQUIRE(e.size(0) == 9);
  CHECK(e(0) == x.local()(3));
  CHECK(e(8) == x.local()(1));
  CHECK_THROWS_WITH(halo_exchange(x, HaloSpec::symmetric({5}, Boundary::reflect)),
                    ContainsSubstring("wider than the global domain"));
  CHECK_THROWS_WITH(halo_exchange(x, HaloSpec::symmetric({6}, Boundary::zero)),
                    ContainsSubstring("halo width 6 along dim 0"));
  CHECK_THROWS_AS(halo_exchange(x, HaloSpec::symmetric({1, 1}, Boundary::zero)), shard::Error);
  auto empty = DistTensor<float, 1>::random({0}, mesh, {Replicate()}, 2);
  CHECK(halo_exchange(empty, HaloSpec::symmetric({0}, Boundary::zero)).numel() == 0);
  CHECK_THROWS_AS(halo_exchange(empty, HaloSpec::symmetric({1}, Boundary::replicate)), shard::Error);
}

}  // namespace st_dist_test_halo
