// The spectral convolution and the FNO against the unsharded computation (DESIGN.md §5): every
// activation layout of the oracle harnesses (1-D meshes on each spatial dim, uneven shards with
// an empty first shard, 2-D meshes: both spatial dims, data x domain, two mesh dims on one dim)
// at 1-4 ranks, fp64 <= 1e-10 and fp32 <= 1e-5; forward and every gradient (input and complex
// weights); fp64 finite differences; a whole FNO training step (loss, output, all gradients and
// the parameters after one Adam step); bad input.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <shardtensor/nn/fno.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"
#include "nn/module_oracle.hpp"

namespace st_nn_mpi_fno {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;
using autograd::Var;

namespace {

/// Weight shape of a spectral conv over x [B, Cin, spatial...] with `modes`.
template <int R>
Shape<R + 1> weight_shape(index_t cin, index_t cout, const std::vector<index_t>& modes) {
  Shape<R + 1> w{};
  w[0] = cin;
  w[1] = cout;
  for (int d = 0; d < R - 2; ++d)
    w[static_cast<std::size_t>(d + 2)] = d + 1 < R - 2 ? 2 * modes[static_cast<std::size_t>(d)] : modes[static_cast<std::size_t>(d)];
  w[R] = 2;
  return w;
}

template <class T, int R>
fn::Body<T> spectral_body(const Shape<R>& s, index_t cout, std::vector<index_t> modes, FftNorm norm) {
  return [s, cout, modes, norm](fn::Ctx<T>& c) {
    auto x = c.template act<R>(s);
    auto w = c.template param<R + 1>(weight_shape<R>(s[1], cout, modes));
    c.output(F::spectral_conv(x, w, modes, norm));
  };
}

/// One FNO block in functional form: lift, spectral conv + 1x1 skip, GELU, projection.
template <class T>
fn::Body<T> fno_block_body(const Shape<4>& s) {
  return [s](fn::Ctx<T>& c) {
    auto x = c.template act<4>(s);
    const index_t W = 3;
    auto h = F::channel_linear(x, c.template param<2>({W, s[1]}), c.template param<1>({W}));
    const std::vector<index_t> modes{2, 2};
    auto sp = F::spectral_conv(h, c.template param<5>(weight_shape<4>(W, W, modes)), modes);
    auto sk = F::channel_linear(h, c.template param<2>({W, W}), std::nullopt);
    h = F::gelu(F::add(sp, sk));
    c.output(F::channel_linear(h, c.template param<2>({1, W}), std::nullopt));
  };
}

}  // namespace

TEMPLATE_TEST_CASE("sharded spectral convolution equals the unsharded one (forward, input and weight gradients)",
                   "[nn][fno][fft][mpi]", double, float) {
  using T = TestType;
  fn::check_sharded<T, 4>(spectral_body<T, 4>({2, 3, 8, 6}, 2, {2, 2}, FftNorm::backward), {2, 3, 8, 6});
  fn::check_sharded<T, 4>(spectral_body<T, 4>({1, 2, 7, 9}, 3, {3, 4}, FftNorm::ortho), {1, 2, 7, 9});  // odd, 2m=n-1
  fn::check_sharded<T, 4>(spectral_body<T, 4>({1, 2, 6, 5}, 2, {3, 3}, FftNorm::forward), {1, 2, 6, 5});  // nothing cut
  fn::check_sharded<T, 3>(spectral_body<T, 3>({2, 2, 11}, 2, {3}, FftNorm::backward), {2, 2, 11});
  fn::check_sharded<T, 5>(spectral_body<T, 5>({1, 2, 6, 5, 8}, 2, {2, 2, 3}, FftNorm::backward), {1, 2, 6, 5, 8});
}

TEMPLATE_TEST_CASE("a whole FNO block in functional form matches the unsharded one", "[nn][fno][fft][mpi]", double,
                   float) {
  fn::check_sharded<TestType, 4>(fno_block_body<TestType>({2, 2, 8, 7}), {2, 2, 8, 7});
}

TEST_CASE("spectral convolution: finite differences (fp64), unsharded and sharded", "[nn][fno][fft][fd][mpi]") {
  fn::check_fd_sharded<4>(spectral_body<double, 4>({1, 2, 6, 5}, 2, {2, 2}, FftNorm::backward), {1, 2, 6, 5});
  fn::check_fd_sharded<5>(spectral_body<double, 5>({1, 1, 4, 5, 6}, 1, {1, 2, 2}, FftNorm::ortho), {1, 1, 4, 5, 6});
  fn::check_fd_sharded<4>(fno_block_body<double>({1, 2, 6, 6}), {1, 2, 6, 6});
}

TEMPLATE_TEST_CASE("FNO model: a training step (loss, output, every gradient, Adam update) matches one rank",
                   "[nn][fno][fft][module][mpi]", double, float) {
  using T = TestType;
  auto check = [](auto S_tag, const auto& shape, nn::FNOOptions<decltype(S_tag)::value> o) {
    constexpr int S = decltype(S_tag)::value;
    constexpr int R = S + 2;
    const mod::Builder<T, R> build = [o](const DeviceMesh& m) { return std::make_shared<nn::FNO<T, S>>(m, o, 77); };
    const mod::RunOptions ro{.adam_step = true, .lr = 1e-2};
    const auto ref = mod::reference<T, R>(shape, build, ro);
    CHECK(mod::with_grad(ref) == ref.names.size());
    for_each_comm_size([&](CommPtr comm) {
      for (const auto& L : mod::layouts<R>(comm->size(), shape)) {
        INFO("FNO " << S << "d layout " << L.name << " on " << comm->size() << " ranks");
        DeviceMesh mesh(comm, L.mesh_shape);
        mod::require_match(mod::run<T, R>(mesh, L, shape, build, ro), ref, tol<T>());
      }
    });
  };
  check(std::integral_constant<int, 2>{}, Shape<4>{2, 2, 8, 9},
        nn::FNOOptions<2>{.in_channels = 2, .out_channels = 1, .width = 4, .layers = 2, .modes = {3, 3}, .proj_width = 8});
  check(std::integral_constant<int, 3>{}, Shape<5>{1, 1, 6, 5, 6},
        nn::FNOOptions<3>{.in_channels = 1, .out_channels = 2, .width = 3, .layers = 2, .modes = {2, 2, 2}, .proj_width = 4});
}

TEST_CASE("spectral convolution bad input is refused on every rank", "[nn][fno][fft][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm);
    auto x = Var<double, 4>(DistTensor<double, 4>::random({1, 2, 8, 6}, mesh, {Shard(2)}, 1), true);
    auto w = Var<double, 5>(DistTensor<double, 5>::random({2, 3, 4, 2, 2}, mesh, {Replicate()}, 2), true);
    CHECK_NOTHROW(F::spectral_conv(x, w, {2, 2}));
    CHECK_THAT(error_of([&] { (void)F::spectral_conv(x, w, {5, 2}); }), ContainsSubstring("at most 4 fit"));
    CHECK_THAT(error_of([&] { (void)F::spectral_conv(x, w, {2, 5}); }), ContainsSubstring("at most 4 fit"));
    CHECK_THAT(error_of([&] { (void)F::spectral_conv(x, w, {2}); }), ContainsSubstring("1 modes for 2 spatial dims"));
    CHECK_THAT(error_of([&] { (void)F::spectral_conv(x, w, {1, 2}); }), ContainsSubstring("does not match the modes"));
    auto wbad = Var<double, 5>(DistTensor<double, 5>::random({3, 3, 4, 2, 2}, mesh, {Replicate()}, 2), true);
    CHECK_THAT(error_of([&] { (void)F::spectral_conv(x, wbad, {2, 2}); }), ContainsSubstring("Cin=2"));
    if (comm->size() > 1) {
      auto wsh = Var<double, 5>(DistTensor<double, 5>::random({2, 3, 4, 2, 2}, mesh, {Shard(0)}, 2), true);
      CHECK_THAT(error_of([&] { (void)F::spectral_conv(x, wsh, {2, 2}); }), ContainsSubstring("Replicate"));
      auto xc = Var<double, 4>(DistTensor<double, 4>::random({1, 2, 8, 6}, mesh, {Shard(1)}, 1), true);
      CHECK_THAT(error_of([&] { (void)F::spectral_conv(xc, w, {2, 2}); }), ContainsSubstring("channels"));
    }
    CHECK_THROWS_AS(nn::SpectralConv2d<double>(mesh, 2, 3, {0, 2}), Error);
  });
}

// ---------------------------------------------------------------------------------------------
// Every transform through the functional oracle (real inputs and outputs via F::complex,
// F::real, F::imag): all activation layouts at 1-4 ranks and fp64 finite differences.

namespace {

template <class T>
fn::Body<T> c2c_body(const Shape<4>& s, bool inverse, FftNorm norm, std::vector<index_t> modes) {
  return [=](fn::Ctx<T>& c) {
    auto z = F::complex(c.template act<4>(s), c.template act<4>(s));
    std::vector<index_t> sizes;
    if (inverse && !modes.empty()) sizes = {s[2] + 1, s[3] + 2};  // a zero-padded inverse
    auto Z = inverse ? F::ifftn(z, {2, 3}, norm, sizes, modes) : F::fftn(z, {2, 3}, norm, modes);
    c.output(F::real(Z));
    c.output(F::imag(Z));
  };
}

template <class T>
fn::Body<T> r2c_c2r_body(const Shape<4>& s, FftNorm norm) {
  return [=](fn::Ctx<T>& c) {
    auto x = c.template act<4>(s);
    auto X = F::rfftn(x, {2, 3}, norm);
    c.output(F::real(X));
    c.output(F::imag(X));
    // irfftn of an arbitrary (not Hermitian-consistent) spectrum: odd real extent.
    Shape<4> hs = s;
    hs[3] = s[3] / 2 + 1;
    auto h = F::complex(c.template act<4>(hs), c.template act<4>(hs));
    c.output(F::irfftn(h, {2, 3}, norm, {s[2], s[3]}));
  };
}

}  // namespace

TEMPLATE_TEST_CASE("every transform through the functional oracle (values and gradients vs unsharded)",
                   "[nn][fft][oracle][mpi]", double, float) {
  using T = TestType;
  fn::check_sharded<T, 4>(c2c_body<T>({2, 2, 7, 6}, false, FftNorm::ortho, {}), {2, 2, 7, 6});
  fn::check_sharded<T, 4>(c2c_body<T>({1, 2, 6, 5}, false, FftNorm::backward, {2, 2}), {1, 2, 6, 5});
  fn::check_sharded<T, 4>(c2c_body<T>({1, 2, 5, 6}, true, FftNorm::forward, {}), {1, 2, 5, 6});
  fn::check_sharded<T, 4>(r2c_c2r_body<T>({2, 2, 6, 7}, FftNorm::backward), {2, 2, 6, 7});
  fn::check_sharded<T, 4>(r2c_c2r_body<T>({1, 1, 5, 8}, FftNorm::ortho), {1, 1, 5, 8});
}

TEST_CASE("every transform: finite differences (fp64)", "[nn][fft][fd][mpi]") {
  fn::check_fd_sharded<4>(c2c_body<double>({1, 1, 5, 4}, false, FftNorm::ortho, {}), {1, 1, 5, 4});
  fn::check_fd_sharded<4>(c2c_body<double>({1, 1, 4, 4}, true, FftNorm::backward, {2, 2}), {1, 1, 4, 4});
  fn::check_fd_sharded<4>(r2c_c2r_body<double>({1, 1, 4, 5}, FftNorm::forward), {1, 1, 4, 5});
}

}  // namespace st_nn_mpi_fno
