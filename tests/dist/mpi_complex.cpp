// Complex dtypes (c64, c128) through redistribution and halo exchange at 1-4 ranks. Oracles: the
// full tensor (redistribute: distribute, redistribute, full_tensor() gives it back; Partial(sum)
// reduces genuine per-rank values), and for the halo the real and imaginary parts exchanged as
// real tensors (exchange and adjoint are real-linear, so the complex result must equal them
// bitwise). Partial(max/min) of a complex tensor is refused on every rank.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <complex>
#include <shardtensor/dist/halo.hpp>

#include "support/mpi_harness.hpp"

namespace st_dist_mpi_complex {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;

namespace {

template <class C, int R>
Tensor<C, R> complex_of(const Tensor<typename C::value_type, R>& re, const Tensor<typename C::value_type, R>& im) {
  auto out = Tensor<C, R>::empty(re.shape());
  const auto a = re.contiguous(), b = im.contiguous();
  for (index_t i = 0; i < out.numel(); ++i) out.data()[i] = C(a.data()[i], b.data()[i]);
  return out;
}

template <class C, int R>
Tensor<C, R> random_complex(const Shape<R>& shape, std::uint64_t seed) {
  using T = typename C::value_type;
  auto re = Tensor<T, R>::empty(shape), im = Tensor<T, R>::empty(shape);
  re.fill_random(seed);
  im.fill_random(seed + 1000003);
  return complex_of<C>(re, im);
}

/// Largest |a - b| / max(1, |b|) over the elements (shapes must agree; +inf if they do not).
template <class C, int R>
double diff(const Tensor<C, R>& a, const Tensor<C, R>& b) {
  if (a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
  const auto x = a.contiguous(), y = b.contiguous();
  double m = 0;
  for (index_t i = 0; i < x.numel(); ++i)
    m = std::max(m, static_cast<double>(std::abs(x.data()[i] - y.data()[i]) / std::max<double>(1, std::abs(y.data()[i]))));
  return m;
}

bool has_avg(const std::vector<Placement>& ps) {
  for (const auto& p : ps)
    if (p.is_partial() && p.op == ReduceOp::avg) return true;
  return false;
}

const std::vector<Placement> kComplexPlacements = {Shard(0), Shard(1), Replicate(), Partial(ReduceOp::sum),
                                                   Partial(ReduceOp::avg)};

template <class C>
void redistribute_pairs(const DeviceMesh& mesh, const Shape<2>& shape, const std::vector<std::vector<Placement>>& ps,
                        std::uint64_t seed) {
  using DT = DistTensor<C, 2>;
  const auto full = random_complex<C, 2>(shape, seed);
  for (const auto& src : ps)
    for (const auto& dst : ps) {
      INFO(fmt::format("{} mesh {} global {} [{}] -> [{}]", dtype_of<C>, mesh.shape(), shape, fmt::join(src, ", "),
                       fmt::join(dst, ", ")));
      const double allowed = has_avg(src) || has_avg(dst) ? 8 * std::numeric_limits<typename C::value_type>::epsilon() : 0.0;
      auto a = DT::distribute(full, mesh, src);
      const auto before = a.local().clone();
      auto b = a.redistribute(dst);
      if (!b.spec().has_partial()) {
        const Box box = b.spec().local_box();
        CHECK(diff(b.local(), full.slice(DT::from_vec(box.lo), DT::from_vec(box.len))) <= allowed);
      }
      CHECK(diff(b.full_tensor(), full) <= allowed);
      CHECK(diff(a.local(), before) == 0.0);
    }
}

}  // namespace

TEST_CASE("complex redistribute: every placement pair on 1-D meshes, c128 and c64", "[dist][complex][redistribute][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm);
    std::vector<std::vector<Placement>> ps;
    for (const auto& p : kComplexPlacements) ps.push_back({p});
    for (const Shape<2>& shape : {Shape<2>{9, 7}, Shape<2>{2, 5}}) {
      redistribute_pairs<std::complex<double>>(mesh, shape, ps, 31);
      redistribute_pairs<std::complex<float>>(mesh, shape, ps, 32);
    }
  });
}

TEST_CASE("complex redistribute: 2-D meshes (alltoallv over two dims, two Partial dims)", "[dist][complex][redistribute][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        if (comm->size() % 2) return;
        DeviceMesh mesh(comm, {2, comm->size() / 2});
        const std::vector<std::vector<Placement>> ps = {{Shard(0), Shard(1)},
                                                         {Shard(1), Shard(0)},
                                                         {Replicate(), Shard(1)},
                                                         {Partial(), Shard(0)},
                                                         {Partial(), Partial()},
                                                         {Replicate(), Replicate()}};
        redistribute_pairs<std::complex<double>>(mesh, {9, 7}, ps, 41);
        redistribute_pairs<std::complex<float>>(mesh, {5, 6}, ps, 42);
      },
      2);
}

TEST_CASE("complex Partial(sum) reduces genuine per-rank values", "[dist][complex][partial][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    using C = std::complex<double>;
    DeviceMesh mesh(comm);
    const int P = comm->size();
    // Rank r holds (r + 1) * base; the sum is P (P + 1) / 2 * base.
    const auto base = random_complex<C, 2>({5, 4}, 51);
    auto mine = base.clone();
    for (index_t i = 0; i < mine.numel(); ++i) mine.data()[i] *= static_cast<double>(comm->rank() + 1);
    auto x = DistTensor<C, 2>::from_local(mine, mesh, {Partial()});
    auto want = base.clone();
    for (index_t i = 0; i < want.numel(); ++i) want.data()[i] *= static_cast<double>(P * (P + 1) / 2);
    CHECK(diff(x.redistribute({Replicate()}).local(), want) <= 1e-15);
    CHECK(diff(x.redistribute({Shard(0)}).full_tensor(), want) <= 1e-15);
  });
}

TEST_CASE("complex Partial(max/min) is refused on every rank", "[dist][complex][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm);
    const auto full = random_complex<std::complex<float>, 2>({4, 3}, 61);
    for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) {
      auto x = DistTensor<std::complex<float>, 2>::distribute(full, mesh, {Partial(op)});
      for (Placement to : {Replicate(), Shard(0)}) {
        const auto msg = error_of([&] { (void)x.redistribute({to}); });
        CHECK_THAT(msg, ContainsSubstring("redistribute") && ContainsSubstring("c64") && ContainsSubstring("complex"));
      }
    }
    // The communicators refuse it too (SelfComm and MPI alike).
    std::complex<double> v{1, 2};
    CHECK_THAT(error_of([&] { comm->allreduce(&v, &v, 1, DType::c128, ReduceOp::max); }), ContainsSubstring("c128"));
    comm->allreduce(&v, &v, 1, DType::c128, ReduceOp::sum);
    CHECK(v == std::complex<double>(comm->size(), 2.0 * comm->size()));
  });
}

TEST_CASE("complex halo exchange and adjoint equal those of the real and imaginary parts", "[dist][complex][halo][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    using C = std::complex<double>;
    const int P = comm->size();
    struct Lay {
      std::vector<int> mesh;
      std::vector<Placement> placements;
    };
    std::vector<Lay> lays = {{{P}, {Shard(1)}}, {{P}, {Shard(2)}}};
    if (P % 2 == 0) lays.push_back({{2, P / 2}, {Shard(1), Shard(2)}});
    const Boundary modes[] = {Boundary::zero, Boundary::periodic, Boundary::reflect, Boundary::replicate};
    std::uint64_t seed = 70;
    for (const auto& lay : lays) {
      DeviceMesh mesh(comm, lay.mesh);
      for (Boundary mode : modes)
        for (index_t w : {1, 2, 4}) {
          INFO(fmt::format("P={} mesh {} {} width {}", P, lay.mesh, mode, w));
          ++seed;
          const HaloSpec h{{0, w, w - 1}, {1, w, w}, {Boundary::zero, mode, mode}};
          auto re_full = Tensor<double, 3>::empty({2, 7, 9}), im_full = Tensor<double, 3>::empty({2, 7, 9});
          re_full.fill_random(seed);
          im_full.fill_random(seed + 17);
          const auto full = complex_of<C>(re_full, im_full);
          auto x = DistTensor<C, 3>::distribute(full, mesh, lay.placements);
          auto xr = DistTensor<double, 3>::distribute(re_full, mesh, lay.placements);
          auto xi = DistTensor<double, 3>::distribute(im_full, mesh, lay.placements);
          const auto ext = halo_exchange(x, h);
          CHECK(diff(ext, complex_of<C>(halo_exchange(xr, h), halo_exchange(xi, h))) == 0.0);
          // Adjoint of a complex gradient == adjoint of its parts.
          auto gr = Tensor<double, 3>::empty(ext.shape()), gi = Tensor<double, 3>::empty(ext.shape());
          gr.fill_random(seed * 31 + static_cast<std::uint64_t>(comm->rank()));
          gi.fill_random(seed * 37 + static_cast<std::uint64_t>(comm->rank()));
          const auto g = complex_of<C>(gr, gi);
          const auto gx = halo_exchange_adjoint(x.spec(), g, h);
          CHECK(diff(gx, complex_of<C>(halo_exchange_adjoint(x.spec(), gr, h), halo_exchange_adjoint(x.spec(), gi, h))) ==
                0.0);
          // c64 (8-byte elements that are not doubles) against its float parts.
          auto fr = Tensor<float, 3>::empty({2, 7, 9}), fi = Tensor<float, 3>::empty({2, 7, 9});
          fr.fill_random(seed + 5);
          fi.fill_random(seed + 6);
          auto xf = DistTensor<std::complex<float>, 3>::distribute(complex_of<std::complex<float>>(fr, fi), mesh,
                                                                   lay.placements);
          auto xfr = DistTensor<float, 3>::distribute(fr, mesh, lay.placements);
          auto xfi = DistTensor<float, 3>::distribute(fi, mesh, lay.placements);
          CHECK(diff(halo_exchange(xf, h), complex_of<std::complex<float>>(halo_exchange(xfr, h), halo_exchange(xfi, h))) ==
                0.0);
        }
    }
  });
}

}  // namespace st_dist_mpi_complex
