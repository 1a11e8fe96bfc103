// The distributed FFT (dist/fft.hpp, nn/functional/fft.hpp) at 1-4 ranks on 1-D (slab) and 2-D
// (pencil) meshes, uneven and empty shards, odd and prime extents, fp64 and fp32:
//  - forward values of fftn / ifftn / rfftn / irfftn (every norm, with and without mode
//    truncation) against the unsharded transform (one rank, one local FFTW call; the local
//    family itself is checked against a naive DFT in tests/exec/test_fft.cpp);
//  - the gradient of every transform by the dot-product test Re<p, A x> = Re<A* p, x> (A* is what
//    backward computes) and against the unsharded gradient;
//  - round trips landing in the original layout (ifftn_to / irfftn_to), the bytes that mode
//    truncation saves, the plan cache, and bad input refused on every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <complex>
#include <numeric>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

#include "support/mpi_harness.hpp"

namespace st_nn_mpi_fft {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;
using autograd::Var;

namespace {

template <class T, int R>
Tensor<T, R> random_real(const Shape<R>& shape, std::uint64_t seed) {
  auto t = Tensor<T, R>::empty(shape);
  t.fill_random(seed);
  return t;
}

template <class C, int R>
Tensor<C, R> random_complex(const Shape<R>& shape, std::uint64_t seed) {
  using T = typename C::value_type;
  auto re = random_real<T, R>(shape, seed), im = random_real<T, R>(shape, seed + 1000003);
  auto out = Tensor<C, R>::empty(shape);
  for (index_t i = 0; i < out.numel(); ++i) out.data()[i] = C(re.data()[i], im.data()[i]);
  return out;
}

template <class T, int R>
Tensor<T, R> random_of(const Shape<R>& shape, std::uint64_t seed) {
  if constexpr (detail::is_std_complex<T>::value) return random_complex<T, R>(shape, seed);
  else return random_real<T, R>(shape, seed);
}

/// max |a - b| / max(1, max |b|) (shapes must agree).
template <class T, int R>
double rel_diff(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  if (a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
  const auto x = a.contiguous(), y = b.contiguous();
  double m = 0, s = 1;
  for (index_t i = 0; i < y.numel(); ++i) s = std::max(s, static_cast<double>(std::abs(y.data()[i])));
  for (index_t i = 0; i < x.numel(); ++i) m = std::max(m, static_cast<double>(std::abs(x.data()[i] - y.data()[i])));
  return m / s;
}

/// Re <a, b> = Re sum conj(a) b over the full tensors.
template <class T, int R>
double re_inner(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  const auto x = a.contiguous(), y = b.contiguous();
  double s = 0;
  for (index_t i = 0; i < x.numel(); ++i) {
    if constexpr (detail::is_std_complex<T>::value)
      s += static_cast<double>(std::real(std::conj(x.data()[i]) * y.data()[i]));
    else
      s += static_cast<double>(x.data()[i]) * static_cast<double>(y.data()[i]);
  }
  return s;
}

template <class T>
constexpr double ftol() {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, std::complex<double>>) return 1e-10;
  else return 1e-5;
}

/// A layout of an activation [B, C, spatial...] on P ranks.
struct L {
  std::string name;
  std::vector<int> mesh;
  std::vector<Placement> pl;
  ShardSizes sizes;
};

template <int R>
std::vector<L> layouts(int P, const Shape<R>& s) {
  std::vector<L> out;
  for (int d = 2; d < R; ++d) out.push_back({fmt::format("slab Shard({})", d), {P}, {Shard(d)}, {}});
  out.push_back({"Replicate", {P}, {Replicate()}, {}});
  if (P >= 2) {
    // Uneven: everything but one cell on the last part, and an empty first part.
    ShardSizes sz(static_cast<std::size_t>(R));
    std::vector<index_t> v(static_cast<std::size_t>(P), 0);
    v.back() = s[2];
    for (int i = 1; i < P - 1 && v.back() > 1; ++i) {
      v[static_cast<std::size_t>(i)] = 1;
      --v.back();
    }
    sz[2] = v;
    out.push_back({"slab Shard(2) uneven, empty first", {P}, {Shard(2)}, sz});
    out.push_back({"batch Shard(0)", {P}, {Shard(0)}, {}});
  }
  if (P == 4 && R >= 4) {
    out.push_back({"pencil 2x2", {2, 2}, {Shard(2), Shard(3)}, {}});
    out.push_back({"2x2 data x domain", {2, 2}, {Shard(0), Shard(R - 1)}, {}});
    out.push_back({"2x2 same dim", {2, 2}, {Shard(2), Shard(2)}, {}});
  }
  if (P == 4 && R >= 5) {
    out.push_back({"pencil 2x2 (y, z)", {2, 2}, {Shard(3), Shard(4)}, {}});
    out.push_back({"3-D mesh 2x1x2", {2, 1, 2}, {Shard(2), Shard(3), Shard(4)}, {}});
  }
  if (P == 8 && R >= 5) {
    out.push_back({"3-D mesh 2x2x2 (x, y, z)", {2, 2, 2}, {Shard(2), Shard(3), Shard(4)}, {}});
    out.push_back({"3-D mesh 2x2x2 (batch, x, z)", {2, 2, 2}, {Shard(0), Shard(2), Shard(4)}, {}});
  }
  if (P == 2 && R >= 4) out.push_back({"pencil 1x2", {1, 2}, {Shard(2), Shard(3)}, {}});
  if (P == 3 && R >= 4) out.push_back({"pencil 3x1", {3, 1}, {Shard(R - 1), Shard(2)}, {}});
  return out;
}

enum class Op { fftn, ifftn, rfftn, irfftn };
const char* op_name(Op o) {
  return o == Op::fftn ? "fftn" : o == Op::ifftn ? "ifftn" : o == Op::rfftn ? "rfftn" : "irfftn";
}

/// One transform case: the op, dims, norm, modes and (inverse kinds) sizes.
struct Case {
  Op op;
  std::vector<int> dims;
  FftNorm norm = FftNorm::backward;
  std::vector<index_t> modes, sizes;
};

template <class Ti, class To, int R>
Var<To, R> apply(const Case& c, const Var<Ti, R>& x) {
  if constexpr (std::is_same_v<Ti, To>) {
    if (c.op == Op::fftn) return F::fftn(x, c.dims, c.norm, c.modes);
    return F::ifftn(x, c.dims, c.norm, c.sizes, c.modes);
  } else if constexpr (detail::is_std_complex<To>::value) {
    return F::rfftn(x, c.dims, c.norm, c.modes);
  } else {
    return F::irfftn(x, c.dims, c.norm, c.sizes, c.modes);
  }
}

/// Input shape of the case given the real-space shape `s`.
template <int R>
Shape<R> input_shape(const Case& c, Shape<R> s) {
  if (c.op == Op::fftn || c.op == Op::rfftn) return s;
  auto dims = c.dims;
  std::sort(dims.begin(), dims.end());
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const int d = dims[i];
    const index_t n = s[static_cast<std::size_t>(d)];
    const bool halved = c.op == Op::irfftn && i + 1 == dims.size();
    const index_t full = halved ? n / 2 + 1 : n;
    const index_t m = c.modes.empty() ? 0 : c.modes[i];
    s[static_cast<std::size_t>(d)] = m == 0 ? full : halved ? std::min(m, full) : (2 * m < n ? 2 * m : n);
  }
  return s;
}

/// Runs case `c` on `mesh` with input laid out by `l`: the full output, the full input gradient
/// for the probe `p` (given in full), and the two sides of the dot-product test.
template <class Ti, class To, int R>
struct Run {
  Tensor<To, R> y;
  Tensor<Ti, R> gx;
  double lhs = 0, rhs = 0;  // Re<p, y>, Re<gx, x>
  DistSpec out_spec;
};

template <class Ti, class To, int R>
Run<Ti, To, R> run(const Case& c, const DeviceMesh& mesh, const L& l, const Tensor<Ti, R>& x_full,
                   const Shape<R>& out_shape, std::uint64_t probe_seed) {
  auto xv = Var<Ti, R>(DistTensor<Ti, R>::distribute(x_full, mesh, l.pl, -1, l.sizes), true);
  auto y = apply<Ti, To, R>(c, xv);
  Run<Ti, To, R> r;
  r.y = y.value().full_tensor();
  r.out_spec = y.value().spec();
  REQUIRE(r.y.shape() == out_shape);
  const auto p_full = random_of<To, R>(out_shape, probe_seed);
  auto p = DistTensor<To, R>::distribute(p_full, mesh, y.value().placements(), -1, y.value().spec().sizes());
  y.accumulate_grad(p);
  autograd::run_backward(y.node(), mesh.comm().get());
  REQUIRE(xv.has_grad());
  CHECK(xv.grad().spec() == xv.value().spec());
  r.gx = xv.grad().full_tensor();
  r.lhs = re_inner(p_full, r.y);
  r.rhs = re_inner(r.gx, x_full);
  return r;
}

template <class Ti, class To, int R>
void check_case(const Case& c, const Shape<R>& real_shape, std::uint64_t seed) {
  const Shape<R> in_shape = input_shape<R>(c, real_shape);
  const auto x_full = random_of<Ti, R>(in_shape, seed);
  // Output shape: from the unsharded run.
  DeviceMesh m1(std::make_shared<SelfComm>(), {1});
  Shape<R> out_shape{};
  {
    auto y = apply<Ti, To, R>(c, Var<Ti, R>(DistTensor<Ti, R>::distribute(x_full, m1, {Replicate()}), false));
    out_shape = y.value().global_shape();
  }
  const auto ref = run<Ti, To, R>(c, m1, {"reference", {1}, {Replicate()}, {}}, x_full, out_shape, seed + 17);
  const double tol = ftol<Ti>();
  // Dot-product test of the unsharded adjoint.
  CHECK(std::abs(ref.lhs - ref.rhs) <= tol * std::max(1.0, std::abs(ref.lhs)));
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& l : layouts<R>(comm->size(), real_shape)) {
      if (c.op == Op::ifftn || c.op == Op::irfftn) {
        // The spectrum may be shorter than the real extent: skip layouts whose sizes do not fit.
        bool fits = true;
        for (std::size_t d = 0; d < l.sizes.size(); ++d) {
          index_t tot = 0;
          for (auto v : l.sizes[d]) tot += v;
          fits = fits && (l.sizes[d].empty() || tot == in_shape[d]);
        }
        if (!fits) continue;
      }
      const int P = std::accumulate(l.mesh.begin(), l.mesh.end(), 1, std::multiplies<>());
      if (P != comm->size()) continue;
      INFO(fmt::format("{} dims {} norm {} modes {} sizes {} real shape {} layout '{}' on {} ranks", op_name(c.op),
                       c.dims, c.norm, c.modes, c.sizes, real_shape, l.name, comm->size()));
      DeviceMesh mesh(comm, l.mesh);
      const auto got = run<Ti, To, R>(c, mesh, l, x_full, out_shape, seed + 17);
      INFO("output layout " << fmt::format("{}", got.out_spec));
      CHECK(rel_diff(got.y, ref.y) <= tol);
      CHECK(rel_diff(got.gx, ref.gx) <= tol);
      CHECK(std::abs(got.lhs - got.rhs) <= tol * std::max(1.0, std::abs(got.lhs)));
    }
  });
}

}  // namespace

TEMPLATE_TEST_CASE("distributed c2c fftn / ifftn equal the unsharded transform, values and gradients", "[nn][fft][mpi]",
                   double, float) {
  using C = std::complex<TestType>;
  std::uint64_t seed = 100;
  for (FftNorm norm : {FftNorm::backward, FftNorm::ortho, FftNorm::forward}) {
    check_case<C, C, 4>({Op::fftn, {2, 3}, norm}, {2, 3, 7, 5}, ++seed);
    check_case<C, C, 4>({Op::ifftn, {2, 3}, norm}, {1, 2, 6, 11}, ++seed);
  }
  check_case<C, C, 5>({Op::fftn, {2, 3, 4}}, {1, 2, 5, 4, 3}, ++seed);
  check_case<C, C, 3>({Op::fftn, {2}}, {2, 3, 13}, ++seed);
  check_case<C, C, 4>({Op::fftn, {1, 3}}, {2, 4, 3, 6}, ++seed);  // a batch dim between the dims
  // Mode truncation and its inverse (zero padding).
  check_case<C, C, 4>({Op::fftn, {2, 3}, FftNorm::backward, {2, 1}}, {1, 2, 7, 6}, ++seed);
  check_case<C, C, 4>({Op::ifftn, {2, 3}, FftNorm::ortho, {2, 1}, {7, 6}}, {1, 2, 7, 6}, ++seed);
}

TEMPLATE_TEST_CASE("distributed rfftn / irfftn equal the unsharded transform, values and gradients", "[nn][fft][mpi]",
                   double, float) {
  using T = TestType;
  using C = std::complex<T>;
  std::uint64_t seed = 200;
  for (FftNorm norm : {FftNorm::backward, FftNorm::ortho, FftNorm::forward}) {
    check_case<T, C, 4>({Op::rfftn, {2, 3}, norm}, {2, 3, 7, 6}, ++seed);
    check_case<C, T, 4>({Op::irfftn, {2, 3}, norm, {}, {7, 6}}, {2, 2, 7, 6}, ++seed);
  }
  check_case<T, C, 4>({Op::rfftn, {2, 3}}, {1, 2, 5, 9}, ++seed);                       // odd halved dim
  check_case<C, T, 4>({Op::irfftn, {2, 3}, FftNorm::backward, {}, {5, 9}}, {1, 2, 5, 9}, ++seed);
  check_case<C, T, 4>({Op::irfftn, {2, 3}}, {1, 2, 4, 8}, ++seed);                      // default even size
  check_case<T, C, 5>({Op::rfftn, {2, 3, 4}}, {1, 2, 5, 4, 6}, ++seed);
  check_case<C, T, 5>({Op::irfftn, {2, 3, 4}, FftNorm::ortho, {}, {5, 4, 7}}, {1, 2, 5, 4, 7}, ++seed);
  check_case<T, C, 3>({Op::rfftn, {2}}, {2, 3, 11}, ++seed);
  // Truncated spectra (FNO's kept modes) both ways.
  check_case<T, C, 4>({Op::rfftn, {2, 3}, FftNorm::backward, {2, 3}}, {1, 2, 9, 8}, ++seed);
  check_case<C, T, 4>({Op::irfftn, {2, 3}, FftNorm::backward, {2, 3}, {9, 8}}, {1, 2, 9, 8}, ++seed);
  check_case<T, C, 5>({Op::rfftn, {2, 3, 4}, FftNorm::forward, {1, 2, 2}}, {1, 2, 5, 6, 7}, ++seed);
  check_case<C, T, 5>({Op::irfftn, {2, 3, 4}, FftNorm::forward, {1, 2, 2}, {5, 6, 7}}, {1, 2, 5, 6, 7}, ++seed);
}

TEST_CASE("rfftn then irfftn_to lands in the input's layout, uneven sizes included", "[nn][fft][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const Shape<5> s{1, 2, 6, 5, 8};
    const auto x_full = random_real<double, 5>(s, 7);
    for (const auto& l : layouts<5>(comm->size(), s)) {
      const int P = std::accumulate(l.mesh.begin(), l.mesh.end(), 1, std::multiplies<>());
      if (P != comm->size()) continue;
      INFO("layout " << l.name << " on " << comm->size() << " ranks");
      DeviceMesh mesh(comm, l.mesh);
      auto x = Var<double, 5>(DistTensor<double, 5>::distribute(x_full, mesh, l.pl, -1, l.sizes), false);
      auto X = F::rfftn(x, {2, 3, 4}, FftNorm::ortho);
      auto back = F::irfftn_to(X, x.value().spec(), {2, 3, 4}, FftNorm::ortho);
      CHECK(back.value().spec() == x.value().spec());
      CHECK(rel_diff(back.local(), x.local().contiguous()) <= 1e-12);
      // c2c too.
      auto z_full = random_complex<std::complex<double>, 5>(s, 9);
      auto z = Var<std::complex<double>, 5>(DistTensor<std::complex<double>, 5>::distribute(z_full, mesh, l.pl, -1, l.sizes));
      auto Z = F::fftn(z, {2, 3, 4});
      auto zb = F::ifftn_to(Z, z.value().spec(), {2, 3, 4});
      CHECK(zb.value().spec() == z.value().spec());
      CHECK(rel_diff(zb.local(), z.local().contiguous()) <= 1e-12);
    }
  });
}

TEST_CASE("mode truncation: kept modes equal the full spectrum's corners, and transposes move fewer bytes",
          "[nn][fft][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const Shape<4> s{1, 3, 16, 12};
    const auto x_full = random_real<double, 4>(s, 11);
    DeviceMesh mesh(comm);
    auto x = DistTensor<double, 4>::distribute(x_full, mesh, {Shard(2)});
    const std::vector<index_t> modes{3, 4};
    auto full = shard::rfftn(x, {2, 3}).full_tensor();
    auto cut = shard::rfftn(x, {2, 3}, FftNorm::backward, modes).full_tensor();
    REQUIRE(cut.shape() == Shape<4>{1, 3, 6, 4});
    double worst = 0;
    for (index_t c = 0; c < 3; ++c)
      for (index_t i = 0; i < 6; ++i)
        for (index_t j = 0; j < 4; ++j) {
          const index_t fi = i < 3 ? i : 16 - 6 + i;
          worst = std::max(worst, std::abs(cut(0, c, i, j) - full(0, c, fi, j)));
        }
    CHECK(worst <= 1e-12);
    auto p_full = detail::fft_plan(x.spec(), DType::f64, {exec::FftKind::r2c, false, {2, 3}, {}, {}, FftNorm::backward});
    auto p_cut = detail::fft_plan(x.spec(), DType::f64, {exec::FftKind::r2c, false, {2, 3}, {}, modes, FftNorm::backward});
    INFO(p_full->describe() << "---\n" << p_cut->describe());
    CHECK(p_full->transposes() == (comm->size() > 1 ? 1 : 0));
    CHECK(p_cut->transposes() == p_full->transposes());
    if (comm->size() > 1) {
      // The transpose after the r2c moves 4 of 7 halved-dim modes.
      CHECK(p_cut->elements_sent() < p_full->elements_sent());
      CHECK(p_cut->elements_sent() * 7 <= p_full->elements_sent() * 4 + 7 * 16 * 3);
    }
    // The plan is cached: a second request returns the same object.
    CHECK(detail::fft_plan(x.spec(), DType::f64, {exec::FftKind::r2c, false, {2, 3}, {}, modes, FftNorm::backward}) ==
          p_cut);
  });
}

TEST_CASE("slab and pencil plans: transposes only where a dim is sharded", "[nn][fft][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        if (comm->size() != 4) return;
        DeviceMesh mesh(comm, {2, 2});
        DistSpec pencil(mesh, {Shard(2), Shard(3)}, {1, 2, 8, 8, 8});
        auto p = detail::fft_plan(pencil, DType::c128, {exec::FftKind::c2c, false, {2, 3, 4}, {}, {}, FftNorm::backward});
        INFO(p->describe());
        CHECK(p->transposes() == 2);
        // No dim is gathered whole beyond the pencil: every output block is 1/4 of the tensor.
        CHECK(p->out.local_box().numel() * 4 == 1 * 2 * 8 * 8 * 8);
        auto inv = detail::inverse_fft_plan(pencil, DType::c128,
                                            {exec::FftKind::c2c, false, {2, 3, 4}, {}, {}, FftNorm::backward},
                                            FftNorm::backward);
        CHECK(inv->in == p->out);
        CHECK(inv->out == pencil);
      },
      4);
}

TEST_CASE("distributed FFT bad input is refused on every rank", "[nn][fft][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm);
    using C = std::complex<double>;
    auto z = Var<C, 4>(DistTensor<C, 4>::distribute(random_complex<C, 4>({1, 2, 6, 5}, 3), mesh, {Shard(2)}));
    auto x = Var<double, 4>(DistTensor<double, 4>::distribute(random_real<double, 4>({1, 2, 6, 5}, 4), mesh, {Shard(2)}));
    CHECK_THAT(error_of([&] { (void)F::fftn(z, {2, 4}); }), ContainsSubstring("fftn") && ContainsSubstring("outside"));
    CHECK_THAT(error_of([&] { (void)F::fftn(z, {2, 2}); }), ContainsSubstring("repeat"));
    CHECK_THAT(error_of([&] { (void)F::fftn(z, {}); }), ContainsSubstring("no dims"));
    CHECK_THAT(error_of([&] { (void)F::fftn(z, {2, 3}, FftNorm::backward, {-1, 2}); }), ContainsSubstring(">= 0"));
    CHECK_THAT(error_of([&] { (void)F::fftn(z, {2, 3}, FftNorm::backward, {1}); }), ContainsSubstring("1 modes for 2 dims"));
    CHECK_THAT(error_of([&] { (void)F::ifftn(z, {2, 3}, FftNorm::backward, {}, {1, 1}); }),
               ContainsSubstring("sizes must be given"));
    CHECK_THAT(error_of([&] { (void)F::irfftn(z, {2, 3}, FftNorm::backward, {6, 11}); }),
               ContainsSubstring("spectrum of real extent 11"));
    CHECK_THAT(error_of([&] { (void)F::rfftn(x, {2, 3}, FftNorm::backward, {2}); }), ContainsSubstring("1 modes"));
    // A spectrum that is not the forward transform's output.
    CHECK_THAT(error_of([&] { (void)F::irfftn_to(z, x.value().spec(), {2, 3}); }),
               ContainsSubstring("is not the spectrum"));
    // The plan front refuses a Partial input and a wrong dtype.
    DistSpec partial(mesh, {Partial()}, {1, 2, 6, 5});
    CHECK_THAT(error_of([&] {
                 (void)detail::fft_plan(partial, DType::c128, {exec::FftKind::c2c, false, {2}, {}, {}, FftNorm::backward});
               }),
               ContainsSubstring("Partial"));
    CHECK_THAT(error_of([&] {
                 (void)detail::fft_plan(z.value().spec(), DType::f64, {exec::FftKind::c2c, false, {2}, {}, {}, FftNorm::backward});
               }),
               ContainsSubstring("complex input"));
  });
}

TEST_CASE("distributed FFT on 3-D meshes of 8 ranks (all three spatial dims sharded)", "[nn][fft][odd_mesh][mpi]") {
  // Runs where the world has 8 ranks (ctest mpi_tests_np8_odd_meshes); other sizes use the
  // smaller layouts of the cases above.
  if (world_size() < 8) return;
  using C = std::complex<double>;
  check_case<C, C, 5>({Op::fftn, {2, 3, 4}, FftNorm::ortho}, {2, 2, 5, 4, 6}, 901);
  check_case<double, C, 5>({Op::rfftn, {2, 3, 4}, FftNorm::backward, {2, 1, 2}}, {1, 2, 6, 5, 7}, 902);
  check_case<C, double, 5>({Op::irfftn, {2, 3, 4}, FftNorm::backward, {2, 1, 2}, {6, 5, 7}}, {1, 2, 6, 5, 7}, 903);
}

TEST_CASE("a sharded 1-D signal: gather, transform, slice back (the only plan without a spare dim)", "[nn][fft][mpi]") {
  using C = std::complex<double>;
  DeviceMesh m1(std::make_shared<SelfComm>(), {1});
  for (const index_t n : {index_t{13}, index_t{16}}) {
    const auto z_full = random_complex<C, 1>({n}, 5);
    const auto x_full = random_real<double, 1>({n}, 6);
    const auto Zref = shard::fftn(DistTensor<C, 1>::distribute(z_full, m1, {Replicate()}), {0}, FftNorm::ortho).full_tensor();
    const auto Xref = shard::rfftn(DistTensor<double, 1>::distribute(x_full, m1, {Replicate()})).full_tensor();
    for_each_comm_size([&](CommPtr comm) {
      INFO("n " << n << " on " << comm->size() << " ranks");
      DeviceMesh mesh(comm);
      auto z = Var<C, 1>(DistTensor<C, 1>::distribute(z_full, mesh, {Shard(0)}), true);
      auto Z = F::fftn(z, {0}, FftNorm::ortho);
      CHECK(Z.value().placements() == std::vector<Placement>{Shard(0)});
      CHECK(rel_diff(Z.value().full_tensor(), Zref) <= 1e-10 * std::sqrt(static_cast<double>(n)));
      auto x = Var<double, 1>(DistTensor<double, 1>::distribute(x_full, mesh, {Shard(0)}), true);
      auto X = F::rfftn(x, {0});
      CHECK(rel_diff(X.value().full_tensor(), Xref) <= 1e-10);
      // Adjoint: Re<p, A x> = Re<A* p, x>.
      const auto p_full = random_complex<C, 1>(Z.value().global_shape(), 8);
      Z.accumulate_grad(DistTensor<C, 1>::distribute(p_full, mesh, Z.value().placements(), -1, Z.value().spec().sizes()));
      autograd::run_backward(Z.node(), comm.get());
      const double lhs = re_inner(p_full, Z.value().full_tensor()), rhs = re_inner(z.grad().full_tensor(), z_full);
      CHECK(std::abs(lhs - rhs) <= 1e-10 * std::max(1.0, std::abs(lhs)));
      const auto q_full = random_complex<C, 1>(X.value().global_shape(), 9);
      X.accumulate_grad(DistTensor<C, 1>::distribute(q_full, mesh, X.value().placements(), -1, X.value().spec().sizes()));
      autograd::run_backward(X.node(), comm.get());
      const double l2 = re_inner(q_full, X.value().full_tensor()), r2 = re_inner(x.grad().full_tensor(), x_full);
      CHECK(std::abs(l2 - r2) <= 1e-10 * std::max(1.0, std::abs(l2)));
    });
  }
}

}  // namespace st_nn_mpi_fft
