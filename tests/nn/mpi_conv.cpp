// MPI tests of the domain-parallel conv and conv_transpose: forward values and the gradients of
// input, weight and bias equal the unsharded computation at 1..4 ranks on 1-D, 2-D (2x2: corners)
// and 3-D meshes, uneven and empty shards, fp32 and fp64; every padding mode; odd and even
// kernels, stride 1 and 2, dilation 2, groups 2; fp64 finite differences; bad input on every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <shardtensor/dist/halo_transport.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_nn_mpi_conv {

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;
using O2 = F::ConvOptions<2>;

namespace {

/// 2-D convs: odd / even kernels, stride 1 / 2, dilation 2, groups 2, asymmetric and wide padding.
template <class T>
Body<T> conv2d_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    const index_t C = s[1];
    conv_out<T, 4>(c, x, {3, C, 3, 3}, O2::symmetric(1));
    conv_out<T, 4>(c, x, {2, C, 2, 2}, O2::same({2, 2}), false);
    conv_out<T, 4>(c, x, {2, C, 4, 3}, O2::symmetric(1, 2));
    conv_out<T, 4>(c, x, {2, C, 3, 3}, O2::symmetric(2, 1, 2));
    conv_out<T, 4>(c, x, {4, C / 2, 3, 2}, O2::symmetric(1, 2, 1, 2));
    O2 asym;
    asym.pad_lo = {0, 2};
    asym.pad_hi = {2, 0};
    conv_out<T, 4>(c, x, {2, C, 3, 3}, asym);
    O2 wide;  // padding wider than the kernel: outputs in zero padding only
    wide.pad_lo = {3, 0};
    wide.pad_hi = {1, 2};
    wide.stride = {2, 1};
    conv_out<T, 4>(c, x, {2, C, 1, 2}, wide);
    conv_out<T, 4>(c, x, {2, C, 1, 1}, O2{});
  };
}

/// 2-D convs with every non-zero padding mode (stride 1 and 2, per-dim modes).
template <class T>
Body<T> conv2d_modes_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    const index_t C = s[1];
    for (Boundary m : {Boundary::periodic, Boundary::reflect, Boundary::replicate}) {
      conv_out<T, 4>(c, x, {2, C, 3, 3}, O2::symmetric(1, 1, 1, 1, m));
      conv_out<T, 4>(c, x, {2, C, 4, 2}, O2::symmetric(2, 2, 1, 1, m));
    }
    O2 mixed = O2::symmetric(1);
    mixed.padding_mode = {Boundary::periodic, Boundary::reflect};
    mixed.pad_hi = {2, 1};
    mixed.dilation = {1, 2};
    conv_out<T, 4>(c, x, {2, C, 3, 3}, mixed);
    O2 rep = O2::same({2, 3}, 1, Boundary::replicate);
    conv_out<T, 4>(c, x, {2, C, 2, 3}, rep, false);
  };
}

template <class T>
Body<T> conv1d_body(const Shape<3>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<3>(s);
    conv_out<T, 3>(c, x, {3, s[1], 3}, F::ConvOptions<1>::symmetric(1));
    conv_out<T, 3>(c, x, {2, s[1], 4}, F::ConvOptions<1>::symmetric(2, 2, 1, 1, Boundary::periodic));
    conv_out<T, 3>(c, x, {2, s[1], 3}, F::ConvOptions<1>::symmetric(2, 1, 2, 1, Boundary::reflect));
  };
}

template <class T>
Body<T> conv3d_body(const Shape<5>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<5>(s);
    conv_out<T, 5>(c, x, {2, s[1], 3, 3, 3}, F::ConvOptions<3>::symmetric(1));
    conv_out<T, 5>(c, x, {2, s[1], 2, 2, 2}, F::ConvOptions<3>::symmetric(1, 2, 1, 1, Boundary::periodic));
  };
}

/// Transposed convs: the U-Net upsampler (k = s = 2), k 3 / 4 with stride 2 and output padding,
/// dilation 2, groups 2, and the conv of the transposed conv (layouts must line up).
template <class T>
Body<T> conv_transpose_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    const index_t C = s[1];
    using OT = F::ConvTransposeOptions<2>;
    auto w1 = c.template param<4>({C, 2, 2, 2});
    auto up = F::conv_transpose(x, w1, c.template param<1>({2}), OT::symmetric(0, 2));
    c.output(up);
    auto w2 = c.template param<4>({C, 3, 3, 4});
    c.output(F::conv_transpose(x, w2, c.template param<1>({3}), OT::symmetric(1, 2, 1, 1, 1)));
    auto w3 = c.template param<4>({C, 1, 3, 3});
    c.output(F::conv_transpose(x, w3, std::nullopt, OT::symmetric(2, 1, 2, 2)));
    auto w4 = c.template param<4>({2, 2, 3, 3});
    c.output(F::conv(up, w4, c.template param<1>({2}), O2::symmetric(1)));
    OT asym = OT::symmetric(0, 3);
    asym.pad_hi = {2, 1};
    asym.output_padding = {2, 0};
    auto w5 = c.template param<4>({C, 2, 4, 3});
    c.output(F::conv_transpose(x, w5, c.template param<1>({2}), asym));
  };
}

/// A 3-D mesh (2 x 1 x 2 at 4 ranks, 1 x 2 x 1 at 2) sharding all three spatial dims.
template <class T>
void check_3d_mesh(const Body<T>& body) {
  const auto ref = fn::reference<T>(body);
  for_each_comm_size([&](CommPtr comm) {
    const int P = comm->size();
    if (P != 2 && P != 4) return;
    fn::Layout L{"3d-mesh", P == 4 ? std::vector<int>{2, 1, 2} : std::vector<int>{1, 2, 1},
                 {Shard(2), Shard(3), Shard(4)}, {}};
    INFO("3-D mesh at " << P << " ranks");
    fn::require_match(fn::run_case<T>(DeviceMesh(comm, L.mesh_shape), L, body), ref, tol<T>());
  });
}

}  // namespace

TEMPLATE_TEST_CASE("sharded conv2d equals the unsharded conv", "[nn][conv][mpi]", float, double) {
  for (Shape<4> s : {Shape<4>{2, 4, 7, 10}, Shape<4>{1, 2, 9, 7}}) {
    INFO("input " << fmt::format("{}", s));
    fn::check_sharded<TestType, 4>(conv2d_body<TestType>(s), s);
  }
}

TEMPLATE_TEST_CASE("sharded conv2d with periodic, reflect and replicate padding", "[nn][conv][mpi]", float, double) {
  const Shape<4> s{2, 2, 10, 7};
  fn::check_sharded<TestType, 4>(conv2d_modes_body<TestType>(s), s);
}

TEMPLATE_TEST_CASE("sharded conv1d and conv3d equal the unsharded conv", "[nn][conv][mpi]", float, double) {
  fn::check_sharded<TestType, 3>(conv1d_body<TestType>({2, 3, 9}), {2, 3, 9});
  const Shape<5> s3{1, 2, 5, 6, 7};
  fn::check_sharded<TestType, 5>(conv3d_body<TestType>(s3), s3);
  check_3d_mesh<TestType>(conv3d_body<TestType>(s3));
}

TEMPLATE_TEST_CASE("sharded conv_transpose equals the unsharded one", "[nn][conv][mpi]", float, double) {
  const Shape<4> s{2, 4, 7, 5};
  fn::check_sharded<TestType, 4>(conv_transpose_body<TestType>(s), s);
}

TEST_CASE("sharded conv is exact with the backward in slices and without overlap", "[nn][conv][mpi]") {
  ExecContext ctx(Device::cpu());
  ctx.settings().halo_chunk_bytes = 200;  // every extended block is sliced (several slices)
  ContextGuard guard(ctx);
  const Shape<4> s{2, 4, 7, 10};
  fn::check_sharded<double, 4>(conv2d_body<double>(s), s);
  fn::check_sharded<double, 4>(conv2d_modes_body<double>({2, 2, 10, 7}), {2, 2, 10, 7});
  fn::check_sharded<double, 4>(conv_transpose_body<double>({2, 4, 7, 5}), {2, 4, 7, 5});
  const Shape<5> s3{1, 2, 5, 6, 7};
  fn::check_sharded<double, 5>(conv3d_body<double>(s3), s3);
  ctx.settings().overlap_halo = false;
  fn::check_sharded<float, 4>(conv2d_body<float>(s), s);
}

TEST_CASE("sharded conv is exact with every halo transport of the halo plan", "[nn][conv][mpi][halo_transport]") {
  for (HaloTransport tp : {HaloTransport::thin, HaloTransport::whole_block}) {
    INFO("transport " << static_cast<int>(tp));
    ExecContext ctx(Device::cpu());
    ctx.settings().halo_transport = tp;
    ContextGuard guard(ctx);
    const Shape<4> s{2, 4, 7, 10};
    fn::check_sharded<double, 4>(conv2d_body<double>(s), s);
    fn::check_sharded<float, 4>(conv2d_modes_body<float>({2, 2, 10, 7}), {2, 2, 10, 7});
    fn::check_sharded<double, 3>(conv1d_body<double>({2, 3, 9}), {2, 3, 9});
    ctx.settings().halo_chunk_bytes = 200;  // sliced adjoint where no dim is thin
    fn::check_sharded<double, 4>(conv_transpose_body<double>({2, 4, 7, 5}), {2, 4, 7, 5});
  }
}

TEST_CASE("the halo plan picks the conv's transports", "[nn][conv][mpi][halo_transport]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    const DeviceMesh m1(comm, {P});
    const Shape<4> s{2, 3, 40, 30};
    const DistSpec one(m1, {Shard(2)}, {s.begin(), s.end()});
    const HaloSpec h1{{0, 0, 1, 0}, {0, 0, 2, 0}, std::vector<Boundary>(4, Boundary::zero)};
    StencilHaloShape shape;
    shape.reach = {0, 0, 4, 0};
    shape.slice_dims = {2, 3};
    ExecSettings set;
    // One dim with ghosts: thin faces of depth max(max(lo, hi) + 1, reach) = 4.
    const auto th = shard::detail::make_thin_halo(one, h1, shape.reach);
    REQUIRE(th.ok);
    CHECK(th.d == 2);
    CHECK(th.edge == 4);
    CHECK(th.spec.global_shape()[2] == std::min<index_t>(40, P * 8));
    CHECK(stencil_halo_adjoint_kind(DType::f64, one, h1, shape, set) == HaloAdjointKind::thin);
    // Whole block forced: the sliced adjoint along the unsharded, ghost-free dim 3 when the block
    // is larger than a slice, else the extended block's gradient.
    set.halo_transport = HaloTransport::whole_block;
    set.halo_chunk_bytes = 1000;
    CHECK(stencil_halo_adjoint_kind(DType::f64, one, h1, shape, set) == HaloAdjointKind::sliced);
    set.halo_chunk_bytes = std::size_t{1} << 30;
    CHECK(stencil_halo_adjoint_kind(DType::f64, one, h1, shape, set) == HaloAdjointKind::whole_block);
    // The plan object reads the same settings from its context.
    ExecContext ctx(Device::cpu());
    ctx.settings() = set;
    CHECK(StencilHaloAdjoint(DType::f64, one, h1, shape, ctx).wants_extended_gradient());
    // Two dims with ghosts: never thin.
    HaloSpec h2 = h1;
    h2.lo[3] = 1;
    set.halo_transport = HaloTransport::thin;
    CHECK_FALSE(shard::detail::make_thin_halo(one, h2, shape.reach).ok);
    CHECK(stencil_halo_adjoint_kind(DType::f64, one, h2, shape, set) == HaloAdjointKind::whole_block);
  });
}

TEST_CASE("sharded conv gradients match finite differences", "[nn][conv][fd][mpi]") {
  const std::vector<std::string> names{"1d-Shard(2)", "1d-Shard(2)-empty-first", "2x2-spatial"};
  const Shape<4> s{1, 2, 5, 4};
  fn::check_fd_sharded<4>(
      [](Ctx<double>& c) {
        auto x = c.act<4>({1, 2, 5, 4});
        conv_out<double, 4>(c, x, {2, 2, 3, 2}, O2::symmetric(1, 2, 1, 1, Boundary::reflect));
        O2 per = O2::symmetric(1, 1, 2);
        per.padding_mode = {Boundary::periodic, Boundary::zero};
        conv_out<double, 4>(c, x, {1, 2, 2, 3}, per);
      },
      s, names);
  fn::check_fd_sharded<4>(
      [](Ctx<double>& c) {
        auto x = c.act<4>({1, 2, 5, 4});
        auto w = c.param<4>({2, 1, 3, 2});
        c.output(F::conv_transpose(x, w, c.param<1>({2}), F::ConvTransposeOptions<2>::symmetric(1, 2, 1, 2, 1)));
      },
      s, names);
}

TEST_CASE("conv refuses bad input on every rank", "[nn][conv][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    using V = autograd::Var<double, 4>;
    auto act = [&](Shape<4> s) { return V(DistTensor<double, 4>::random(s, mesh, {Shard(2)}, 1), true); };
    auto par = [&](Shape<4> s) { return V(DistTensor<double, 4>::random(s, mesh, {Replicate()}, 2), true); };
    auto bias = [&](index_t n) {
      return autograd::Var<double, 1>(DistTensor<double, 1>::random({n}, mesh, {Replicate()}, 3), true);
    };
    auto x = act({1, 4, 6, 5});
    const auto fails = [](auto&& f, const char* what) {
      const std::string msg = error_of(f);
      INFO(what << ": " << msg);
      CHECK(!msg.empty());
    };
    fails([&] { F::conv(x, par({2, 4, 7, 3}), std::nullopt, O2::symmetric(0)); }, "kernel larger than the extent");
    fails([&] { F::conv(x, par({2, 4, 3, 9}), std::nullopt, O2::symmetric(1)); }, "kernel larger than padded extent");
    fails([&] { F::conv(x, par({2, 3, 3, 3}), std::nullopt, O2::symmetric(1)); }, "channel mismatch");
    fails([&] { F::conv(x, par({3, 2, 3, 3}), std::nullopt, O2::symmetric(1, 1, 1, 2)); }, "groups vs C_out");
    fails([&] { F::conv(x, par({3, 1, 3, 3}), std::nullopt, O2::symmetric(1, 1, 1, 3)); }, "groups vs C_in");
    fails([&] { F::conv(x, par({2, 4, 3, 3}), bias(3), O2::symmetric(1)); }, "bias size");
    fails([&] { F::conv(x, act({2, 4, 3, 3}), std::nullopt, O2::symmetric(1)); }, "sharded weight");
    fails([&] { F::conv(x, par({2, 4, 3, 3}), std::nullopt, O2::symmetric(7, 1, 1, 1, Boundary::periodic)); },
          "halo wider than the domain (periodic)");
    fails([&] { F::conv(x, par({2, 4, 3, 3}), std::nullopt, O2::symmetric(6, 1, 1, 1, Boundary::reflect)); },
          "halo wider than the domain (reflect)");
    auto xc = V(DistTensor<double, 4>::random({1, 4, 6, 5}, mesh, {Shard(1)}, 1), true);
    if (comm->size() > 1) fails([&] { F::conv(xc, par({2, 4, 3, 3}), std::nullopt, O2::symmetric(1)); }, "sharded C");
    fails([&] { F::conv_transpose(x, par({4, 2, 3, 3}), std::nullopt, F::ConvTransposeOptions<2>::symmetric(0, 2, 1, 1, 2)); },
          "output_padding >= stride");
    fails([&] { F::conv_transpose(x, par({3, 2, 3, 3}), std::nullopt, {}); }, "transpose channel mismatch");
    // The communicator still works after every failure (no rank was left in a collective).
    double v = 1;
    comm->allreduce(&v, &v, 1, DType::f64, ReduceOp::sum);
    CHECK(v == comm->size());
  });
}

}  // namespace st_nn_mpi_conv
