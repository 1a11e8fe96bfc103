// MPI tests of the domain-parallel pooling (ceil_mode included) and resampling (integer
// upsampling, F::interpolate: non-integer scales, sizes, align_corners, bicubic), and of
// redistribute_like in a U-Net skip connection: forward values and input gradients equal the unsharded computation at 1..4
// ranks on 1-D and 2-D meshes (uneven and empty shards, windows straddling ranks), fp32 and fp64;
// fp64 finite differences; bad input on every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <shardtensor/dist/halo_transport.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_nn_mpi_pool_upsample {

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;

namespace {

template <class T>
Body<T> pool_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    c.output(F::max_pool(x, PoolParams<2>{.kernel = {2, 2}}));
    c.output(F::avg_pool(x, PoolParams<2>{.kernel = {2, 2}}));
    for (bool cip : {true, false}) {
      const PoolParams<2> p{.kernel = {3, 2}, .stride = {2, 1}, .pad_lo = {1, 0}, .pad_hi = {1, 1},
                            .count_include_pad = cip};
      c.output(F::avg_pool(x, p));
      c.output(F::max_pool(x, p));
    }
    c.output(F::max_pool(x, PoolParams<2>{.kernel = {3, 3}, .stride = {1, 1}, .pad_lo = {1, 1}, .pad_hi = {1, 1}}));
    c.output(F::avg_pool(x, PoolParams<2>{.kernel = {4, 3}, .stride = {3, 2}, .pad_lo = {2, 0}, .pad_hi = {0, 2},
                                          .count_include_pad = false}));
  };
}

template <class T>
Body<T> pool3d_body(const Shape<5>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<5>(s);
    c.output(F::max_pool(x, PoolParams<3>{.kernel = {2, 2, 2}}));
    c.output(F::avg_pool(x, PoolParams<3>{.kernel = {3, 3, 2}, .stride = {2, 2, 2}, .pad_lo = {1, 1, 0},
                                          .pad_hi = {1, 0, 1}}));
  };
}

template <class T, int R>
Body<T> upsample_body(const Shape<R>& s, const Shape<R - 2>& f) {
  return [s, f](Ctx<T>& c) {
    auto x = c.template act<R>(s);
    c.output(F::upsample(x, ResizeMode::nearest, f));
    c.output(F::upsample(x, ResizeMode::linear, f));
  };
}

/// ceil_mode pooling (PyTorch's output-size rule; windows past the padding; avg divisors clipped
/// to the padded domain or to the input), 2-D.
template <class T>
Body<T> pool_ceil_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    c.output(F::max_pool(x, PoolParams<2>{.kernel = {2, 2}, .ceil_mode = true}));
    for (bool cip : {true, false}) {
      const PoolParams<2> p{.kernel = {3, 2}, .stride = {2, 2}, .pad_lo = {1, 0}, .pad_hi = {1, 1},
                            .count_include_pad = cip, .ceil_mode = true};
      c.output(F::avg_pool(x, p));
      c.output(F::max_pool(x, p));
      c.output(F::avg_pool(x, PoolParams<2>{.kernel = {3, 3}, .stride = {3, 2}, .pad_lo = {1, 1}, .pad_hi = {1, 1},
                                            .count_include_pad = cip, .ceil_mode = true}));
    }
  };
}

/// ceil_mode pooling in 1-D and 3-D.
template <class T, int R>
Body<T> pool_ceil_nd_body(const Shape<R>& s) {
  return [s](Ctx<T>& c) {
    constexpr int S = R - 2;
    auto x = c.template act<R>(s);
    PoolParams<S> p;
    for (int d = 0; d < S; ++d) {
      p.kernel[d] = 3;
      p.stride[d] = 2 + d % 2;
      p.pad_lo[d] = p.pad_hi[d] = 1;
    }
    p.ceil_mode = true;
    c.output(F::max_pool(x, p));
    c.output(F::avg_pool(x, p));
    p.count_include_pad = false;
    c.output(F::avg_pool(x, p));
  };
}

/// F::interpolate in 2-D: non-integer scale factors (up and down), explicit sizes, align_corners,
/// nearest / bilinear / bicubic; and bicubic by integer factors through F::upsample.
template <class T>
Body<T> interpolate2d_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    using O = InterpolateOptions<2>;
    c.output(F::interpolate(x, O{.mode = ResizeMode::nearest, .scale_factor = {1.5, 0.7}}));
    c.output(F::interpolate(x, O{.mode = ResizeMode::nearest, .size = {10, 4}}));
    for (bool ac : {false, true}) {
      c.output(F::interpolate(x, O{.mode = ResizeMode::linear, .scale_factor = {1.7, 0.6}, .align_corners = ac}));
      c.output(F::interpolate(x, O{.mode = ResizeMode::linear, .size = {5, 13}, .align_corners = ac}));
      c.output(F::interpolate(x, O{.mode = ResizeMode::cubic, .scale_factor = {1.3, 2.5}, .align_corners = ac}));
      c.output(F::interpolate(x, O{.mode = ResizeMode::cubic, .size = {4, 6}, .align_corners = ac}));
    }
    c.output(F::upsample(x, ResizeMode::cubic, {2, 3}));
  };
}

/// F::interpolate in 1-D (linear, nearest) and 3-D (trilinear, nearest).
template <class T, int R>
Body<T> interpolate_nd_body(const Shape<R>& s) {
  return [s](Ctx<T>& c) {
    constexpr int S = R - 2;
    auto x = c.template act<R>(s);
    InterpolateOptions<S> up, down, sz;
    for (int d = 0; d < S; ++d) {
      up.scale_factor[d] = 1.5 + 0.25 * d;
      down.scale_factor[d] = 0.45 + 0.3 * d;
      sz.size[d] = s[2 + d] + 3 - 2 * d;
    }
    for (ResizeMode m : {ResizeMode::nearest, ResizeMode::linear}) {
      up.mode = down.mode = sz.mode = m;
      c.output(F::interpolate(x, up));
      c.output(F::interpolate(x, down));
      c.output(F::interpolate(x, sz));
    }
    up.align_corners = sz.align_corners = true;
    c.output(F::interpolate(x, up));
    c.output(F::interpolate(x, sz));
  };
}

/// A U-Net level: pool, conv, upsample (nearest / transposed conv), then combine with the skip
/// after redistribute_like (the layouts differ at 3 ranks with extent 10).
template <class T>
Body<T> unet_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    const index_t C = s[1];
    auto down = F::max_pool(x, PoolParams<2>{.kernel = {2, 2}});
    auto mid = F::conv(down, c.template param<4>({C, C, 3, 3}), c.template param<1>({C}), F::ConvOptions<2>::symmetric(1));
    auto up = F::upsample(mid, ResizeMode::linear, {2, 2});
    c.output(F::concat(x, F::redistribute_like(up, x.value().spec())));
    auto upt = F::conv_transpose(mid, c.template param<4>({C, C, 2, 2}), std::nullopt,
                                 F::ConvTransposeOptions<2>::symmetric(0, 2));
    c.output(F::add(F::redistribute_like(upt, x.value().spec()), x));
  };
}

}  // namespace

TEMPLATE_TEST_CASE("sharded pooling equals the unsharded pooling", "[nn][pool][mpi]", float, double) {
  for (Shape<4> s : {Shape<4>{2, 3, 9, 10}, Shape<4>{1, 2, 7, 8}}) {
    INFO("input " << fmt::format("{}", s));
    fn::check_sharded<TestType, 4>(pool_body<TestType>(s), s);
  }
  const Shape<5> s3{1, 2, 7, 5, 6};
  fn::check_sharded<TestType, 5>(pool3d_body<TestType>(s3), s3);
}

TEMPLATE_TEST_CASE("sharded upsampling equals the unsharded upsampling", "[nn][upsample][mpi]", float, double) {
  fn::check_sharded<TestType, 4>(upsample_body<TestType, 4>({2, 2, 7, 9}, {2, 3}), {2, 2, 7, 9});
  fn::check_sharded<TestType, 3>(upsample_body<TestType, 3>({1, 2, 10}, {3}), {1, 2, 10});
  fn::check_sharded<TestType, 5>(upsample_body<TestType, 5>({1, 1, 4, 5, 3}, {2, 1, 2}), {1, 1, 4, 5, 3});
}

TEMPLATE_TEST_CASE("sharded ceil_mode pooling equals the unsharded pooling", "[nn][pool][ceil][mpi]", float, double) {
  for (Shape<4> s : {Shape<4>{2, 3, 9, 10}, Shape<4>{1, 2, 7, 8}}) {
    INFO("input " << fmt::format("{}", s));
    fn::check_sharded<TestType, 4>(pool_ceil_body<TestType>(s), s);
  }
  fn::check_sharded<TestType, 3>(pool_ceil_nd_body<TestType, 3>({1, 2, 12}), {1, 2, 12});
  fn::check_sharded<TestType, 5>(pool_ceil_nd_body<TestType, 5>({1, 2, 8, 5, 6}), {1, 2, 8, 5, 6});
}

TEMPLATE_TEST_CASE("sharded interpolate equals the unsharded interpolate", "[nn][upsample][interpolate][mpi]", float,
                   double) {
  fn::check_sharded<TestType, 4>(interpolate2d_body<TestType>({1, 2, 7, 9}), {1, 2, 7, 9});
  fn::check_sharded<TestType, 3>(interpolate_nd_body<TestType, 3>({1, 2, 10}), {1, 2, 10});
  fn::check_sharded<TestType, 5>(interpolate_nd_body<TestType, 5>({1, 1, 6, 5, 3}), {1, 1, 6, 5, 3});
}

TEST_CASE("sharded pooling and upsampling are exact with every halo transport of the halo plan",
          "[nn][pool][upsample][mpi][halo_transport]") {
  // thin faces (one dim with ghosts), the whole extended block, and the sliced adjoint (a tiny
  // slice budget), with and without overlap: each transport of dist/halo_transport.hpp.
  for (HaloTransport tp : {HaloTransport::thin, HaloTransport::whole_block}) {
    for (std::size_t chunk : {std::size_t{1} << 26, std::size_t{64}}) {
      for (bool overlap : {true, false}) {
        INFO("transport " << static_cast<int>(tp) << " chunk " << chunk << " overlap " << overlap);
        ExecContext ctx(Device::cpu());
        ctx.settings().halo_transport = tp;
        ctx.settings().halo_chunk_bytes = chunk;
        ctx.settings().overlap_halo = overlap;
        ContextGuard guard(ctx);
        fn::check_sharded<double, 4>(pool_body<double>({2, 3, 9, 10}), {2, 3, 9, 10});
        fn::check_sharded<double, 5>(pool3d_body<double>({1, 2, 7, 5, 6}), {1, 2, 7, 5, 6});
        fn::check_sharded<double, 4>(upsample_body<double, 4>({2, 2, 7, 9}, {2, 3}), {2, 2, 7, 9});
        fn::check_sharded<float, 3>(upsample_body<float, 3>({1, 2, 10}, {3}), {1, 2, 10});
      }
    }
  }
}

TEMPLATE_TEST_CASE("U-Net skip connections line up after redistribute_like", "[nn][pool][upsample][mpi]", float,
                   double) {
  const Shape<4> s{1, 2, 10, 8};
  fn::check_sharded<TestType, 4>(unet_body<TestType>(s), s);
  // At 3 ranks the layouts really differ, and combining them without redistribute_like fails.
  for_each_comm_size([](CommPtr comm) {
    if (comm->size() != 3) return;
    DeviceMesh mesh(comm, {3});
    autograd::Var<TestType, 4> x(DistTensor<TestType, 4>::random({1, 2, 10, 8}, mesh, {Shard(2)}, 1), true);
    auto up = F::upsample(F::max_pool(x, PoolParams<2>{.kernel = {2, 2}}), ResizeMode::nearest, {2, 2});
    CHECK(up.value().layout(2).sizes() == std::vector<index_t>{4, 4, 2});
    CHECK(x.value().layout(2).sizes() == std::vector<index_t>{4, 3, 3});
    CHECK(!error_of([&] { F::add(up, x); }).empty());
    CHECK(F::redistribute_like(up, x.value().spec()).value().spec() == x.value().spec());
  });
}

TEST_CASE("sharded pooling and upsampling gradients match finite differences", "[nn][pool][upsample][fd][mpi]") {
  const std::vector<std::string> names{"1d-Shard(2)", "1d-Shard(2)-empty-first", "2x2-spatial"};
  const Shape<4> s{1, 2, 5, 6};
  fn::check_fd_sharded<4>(
      [](Ctx<double>& c) {
        auto x = c.act<4>({1, 2, 5, 6});
        c.output(F::max_pool(x, PoolParams<2>{.kernel = {3, 2}, .stride = {2, 2}, .pad_lo = {1, 0}}));
        c.output(F::avg_pool(x, PoolParams<2>{.kernel = {2, 3}, .stride = {1, 2}, .pad_lo = {1, 1}, .pad_hi = {0, 1},
                                              .count_include_pad = false}));
        c.output(F::upsample(x, ResizeMode::linear, {2, 3}));
        c.output(F::upsample(x, ResizeMode::nearest, {3, 2}));
      },
      s, names);
  // ceil_mode pooling, bicubic and align_corners / non-integer interpolation.
  fn::check_fd_sharded<4>(
      [](Ctx<double>& c) {
        auto x = c.act<4>({1, 2, 5, 6});
        c.output(F::avg_pool(x, PoolParams<2>{.kernel = {2, 3}, .stride = {2, 2}, .pad_lo = {1, 1}, .pad_hi = {1, 1},
                                              .ceil_mode = true}));
        c.output(F::max_pool(x, PoolParams<2>{.kernel = {2, 2}, .stride = {2, 2}, .ceil_mode = true}));
        c.output(F::interpolate(x, InterpolateOptions<2>{.mode = ResizeMode::cubic, .scale_factor = {1.5, 0.8}}));
        c.output(F::interpolate(
            x, InterpolateOptions<2>{.mode = ResizeMode::linear, .size = {7, 4}, .align_corners = true}));
      },
      s, {"2x2-spatial"});
}

TEST_CASE("pooling and upsampling refuse bad input on every rank", "[nn][pool][upsample][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    autograd::Var<double, 4> x(DistTensor<double, 4>::random({1, 2, 5, 4}, mesh, {Shard(2)}, 1), true);
    CHECK(!error_of([&] { F::max_pool(x, PoolParams<2>{.kernel = {6, 2}}); }).empty());
    CHECK(!error_of([&] { F::avg_pool(x, PoolParams<2>{.kernel = {2, 2}, .pad_lo = {2, 0}}); }).empty());
    CHECK(!error_of([&] { F::max_pool(x, PoolParams<2>{.kernel = {2, 0}}); }).empty());
    CHECK(!error_of([&] { F::upsample(x, ResizeMode::linear, {0, 2}); }).empty());
    using O = InterpolateOptions<2>;
    CHECK(!error_of([&] { F::interpolate(x, O{.mode = ResizeMode::linear, .scale_factor = {-1.0, 2.0}}); }).empty());
    CHECK(!error_of([&] { F::interpolate(x, O{.mode = ResizeMode::linear, .size = {0, 3}}); }).empty());
    CHECK(!error_of([&] { F::interpolate(x, O{.mode = ResizeMode::linear, .scale_factor = {1.5, 1.5},
                                                .size = {3, 3}}); }).empty());
    CHECK(!error_of([&] { F::interpolate(x, O{.mode = ResizeMode::linear, .scale_factor = {0.1, 1.0}}); }).empty());
    CHECK(!error_of([&] { F::interpolate(x, O{.mode = ResizeMode::nearest, .scale_factor = {2.0, 2.0},
                                                .align_corners = true}); }).empty());
    CHECK(error_of([&] { F::interpolate(x, O{.mode = ResizeMode::nearest, .scale_factor = {2.0, 2.0},
                                               .align_corners = true}); })
              .find("align_corners") != std::string::npos);
    autograd::Var<double, 5> x3(DistTensor<double, 5>::random({1, 1, 5, 4, 3}, mesh, {Shard(2)}, 1), true);
    CHECK(error_of([&] { F::interpolate(x3, InterpolateOptions<3>{.mode = ResizeMode::cubic,
                                                                  .scale_factor = {2.0, 2.0, 2.0}}); })
              .find("bicubic") != std::string::npos);
    CHECK(!error_of([&] { F::upsample(x3, ResizeMode::cubic, {2, 2, 2}); }).empty());
    CHECK(error_of([&] { F::avg_pool(x, PoolParams<2>{.kernel = {3, 3}, .pad_lo = {2, 0}, .pad_hi = {2, 0},
                                                      .ceil_mode = true}); })
              .find("ceil_mode") != std::string::npos);
    autograd::Var<double, 4> y(DistTensor<double, 4>::random({1, 3, 5, 4}, mesh, {Shard(2)}, 1), true);
    CHECK(!error_of([&] { F::redistribute_like(x, F::max_pool(y, PoolParams<2>{.kernel = {2, 2}}).value().spec()); })
               .empty());
    double v = 1;
    comm->allreduce(&v, &v, 1, DType::f64, ReduceOp::sum);
    CHECK(v == comm->size());
  });
}

}  // namespace st_nn_mpi_pool_upsample
