// Outsider configurations (the "trial" campaign): every functional op family sharded on the mesh
// shapes and rank counts the per-op tests never name — 1-D meshes of 5..8 ranks, every 2-D
// factorisation (3x2, 2x3, 1x5, 5x1, 2x4, 4x2, 1x6, ...), 2x2x2, 3-D tensors on 2-D meshes —
// with extents that do not divide, shards of size 1, empty shards and halos wider than a shard,
// compared with the unsharded computation (forward and every gradient; fp64 1e-10, fp32 1e-5,
// attention 1e-4). Layouts are generated for each communicator size, so the ctest mpi_tests_np*
// runs cover 1..4 ranks and ctest mpi_odd_meshes_np8 covers 5..8 (tag [odd_mesh]).
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_nn_mpi_odd_meshes {

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;
using fn::Layout;
using fn::conv_out;
using fn::attn_tol;

namespace {

/// Sizes of `n` over `p` parts: p - 1 parts of one element and the rest on the last part (size-1
/// shards beside a large one; empty parts when n < p).
std::vector<index_t> ones_then_rest(index_t n, int p) {
  std::vector<index_t> v(static_cast<std::size_t>(p), 0);
  index_t left = n;
  for (int i = 0; i + 1 < p && left > 0; ++i, --left) v[static_cast<std::size_t>(i)] = 1;
  v.back() += left;
  return v;
}

/// Layouts of rank-R tensors at P ranks whose sharded dims are `d0` (and `d1` on 2-D meshes):
/// the 1-D mesh, every 2-D factorisation a x b (1 x P and P x 1 included), two mesh dims on one
/// dim, size-1 shards beside a large one, and 2x2x2 at 8 ranks.
template <int R>
std::vector<Layout> odd_layouts(int P, const Shape<R>& shape, int d0, int d1, int data_dim = -1) {
  std::vector<Layout> out;
  out.push_back({fmt::format("{}-Shard({})", P, d0), {P}, {Shard(d0)}, {}});
  if (d1 != d0) out.push_back({fmt::format("{}-Shard({})", P, d1), {P}, {Shard(d1)}, {}});
  if (P >= 2) {
    ShardSizes sz(static_cast<std::size_t>(R));
    sz[static_cast<std::size_t>(d0)] = ones_then_rest(shape[d0], P);
    out.push_back({fmt::format("{}-Shard({})-ones", P, d0), {P}, {Shard(d0)}, sz});
  }
  if (P >= 3 && shape[d0] >= 1) {  // empty shards at both ends, size-1 shards between
    std::vector<index_t> v(static_cast<std::size_t>(P), 0);
    index_t left = shape[d0];
    for (int i = 1; i + 1 < P && left > 0; ++i, --left) v[static_cast<std::size_t>(i)] = 1;
    v[static_cast<std::size_t>(P - 2)] += left;
    ShardSizes sz(static_cast<std::size_t>(R));
    sz[static_cast<std::size_t>(d0)] = v;
    out.push_back({fmt::format("{}-Shard({})-empty-ends", P, d0), {P}, {Shard(d0)}, sz});
  }
  for (int a = 1; a <= P; ++a) {
    if (P % a) continue;
    const int b = P / a;
    if (a == 1 && b == 1) continue;
    out.push_back({fmt::format("{}x{}-Shard({},{})", a, b, d0, d1), {a, b}, {Shard(d0), Shard(d1)}, {}});
    if (a > 1 && b > 1) out.push_back({fmt::format("{}x{}-same-dim", a, b), {a, b}, {Shard(d0), Shard(d0)}, {}});
    if (data_dim >= 0 && a > 1 && shape[data_dim] >= 1)
      out.push_back({fmt::format("{}x{}-data-domain", a, b), {a, b}, {Shard(data_dim), Shard(d0)}, {}});
    if (a > 1 && b > 1) out.push_back({fmt::format("{}x{}-replica", a, b), {a, b}, {Replicate(), Shard(d1)}, {}});
  }
  if (P == 8) out.push_back({"2x2x2", {2, 2, 2}, {Shard(d0), Shard(d1), Shard(d0)}, {}});
  return out;
}

/// Compares `body` under `layouts(P)` for every communicator size P with the unsharded run.
template <class T>
void check_layouts(const Body<T>& body, const std::function<std::vector<Layout>(int)>& layouts, double tol) {
  const fn::Result ref = fn::reference<T>(body);
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& L : layouts(comm->size())) {
      INFO("layout " << L.name << " mesh " << fmt::format("{}", L.mesh_shape) << " on " << comm->size() << " ranks");
      DeviceMesh mesh(comm, L.mesh_shape);
      fn::require_match(fn::run_case<T>(mesh, L, body), ref, tol);
    }
  });
}

using O2 = F::ConvOptions<2>;

/// 2-D convs whose halos are wider than the size-1 shards of these layouts (kernel 5, dilation 2),
/// stride 2, groups, every padding mode, even kernels.
template <class T>
Body<T> conv2d_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    const index_t C = s[1];
    conv_out<T, 4>(c, x, {2, C, 3, 3}, O2::symmetric(1));
    conv_out<T, 4>(c, x, {2, C, 5, 5}, O2::symmetric(2));
    conv_out<T, 4>(c, x, {2, C, 3, 3}, O2::symmetric(2, 1, 2), false);
    conv_out<T, 4>(c, x, {2, C, 3, 3}, O2::symmetric(1, 2));
    conv_out<T, 4>(c, x, {2, C, 4, 4}, O2::same({4, 4}), false);
    conv_out<T, 4>(c, x, {4, C / 2, 3, 3}, O2::symmetric(1, 1, 1, 2));
    for (Boundary m : {Boundary::periodic, Boundary::reflect, Boundary::replicate}) {
      conv_out<T, 4>(c, x, {2, C, 3, 3}, O2::symmetric(1, 1, 1, 1, m));
      conv_out<T, 4>(c, x, {2, C, 5, 3}, O2::symmetric(2, 2, 1, 1, m), false);
    }
    // halos of 6 and 7 cells: from ranks several shards away, up to the global limits (reflect:
    // extent - 1 = 6 along H; periodic: the whole extent 7)
    conv_out<T, 4>(c, x, {1, C, 7, 3}, O2::symmetric(6, 1, 2, 1, Boundary::reflect), false);
    conv_out<T, 4>(c, x, {1, C, 8, 2}, O2::symmetric(7, 2, 2, 1, Boundary::periodic));
  };
}

template <class T>
Body<T> conv_transpose_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    const index_t C = s[1];
    using OT = F::ConvTransposeOptions<2>;
    c.output(F::conv_transpose(x, c.template param<4>({C, 2, 2, 2}), c.template param<1>({2}), OT::symmetric(0, 2)));
    c.output(F::conv_transpose(x, c.template param<4>({C, 3, 3, 4}), c.template param<1>({3}),
                               OT::symmetric(1, 2, 1, 1, 1)));
    c.output(F::conv_transpose(x, c.template param<4>({C, 1, 5, 5}), std::nullopt, OT::symmetric(2, 1, 2, 2)));
  };
}

template <class T>
Body<T> conv3d_body(const Shape<5>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<5>(s);
    conv_out<T, 5>(c, x, {2, s[1], 3, 3, 3}, F::ConvOptions<3>::symmetric(1));
    conv_out<T, 5>(c, x, {2, s[1], 2, 2, 2}, F::ConvOptions<3>::symmetric(1, 2, 1, 1, Boundary::periodic));
    conv_out<T, 5>(c, x, {1, s[1], 3, 3, 3}, F::ConvOptions<3>::symmetric(1, 1, 1, 1, Boundary::reflect), false);
  };
}

template <class T>
Body<T> pool_upsample_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    c.output(F::max_pool(x, PoolParams<2>{.kernel = {2, 2}}));
    c.output(F::avg_pool(x, PoolParams<2>{.kernel = {2, 2}}));
    c.output(F::max_pool(x, PoolParams<2>{.kernel = {3, 3}, .stride = {1, 1}, .pad_lo = {1, 1}, .pad_hi = {1, 1}}));
    c.output(F::avg_pool(x, PoolParams<2>{.kernel = {3, 2}, .stride = {2, 1}, .pad_lo = {1, 0}, .pad_hi = {1, 1},
                                          .count_include_pad = false}));
    c.output(F::upsample(x, ResizeMode::nearest, {2, 3}));
    c.output(F::upsample(x, ResizeMode::linear, {3, 2}));
  };
}

template <class T, int R>
Body<T> norm_body(const Shape<R>& s, index_t groups) {
  return [s, groups](Ctx<T>& c) {
    auto x = c.template act<R>(s, true, RandomInit::uniform(-1, 2));
    auto w = c.template param<1>({s[1]});
    auto b = c.template param<1>({s[1]});
    c.output(F::batch_norm(x, nullptr, nullptr, w, b, true));
    c.output(F::group_norm(x, groups, w, b));
    c.output(F::instance_norm(x, w, b));
    c.output(F::layer_norm(x, w, b));
  };
}

template <class T>
Body<T> linear_loss_body(const Shape<4>& s) {
  return [s](Ctx<T>& c) {
    auto x = c.template act<4>(s);
    auto t = c.template act<4>(s, false);
    auto w = c.template param<2>({3, s[1]});
    c.output(F::channel_linear(x, w, c.template param<1>({3})));
    c.output(F::mse_loss(x, t));
    c.output(F::rel_l2_loss(x, t));
    c.output(F::rel_l2_loss(x, t, F::RelL2Mode::global));
    c.output(F::sum(x, {2}));
    c.output(F::mean(x, {0, 3}));
    c.output(F::max(x, {2, 3}));
  };
}

/// q, k, v [B, S1, S2, H, D]: ring attention and neighbourhood attention over a 2-D token domain.
template <class T>
Body<T> attention_body(const Shape<5>& s) {
  return [s](Ctx<T>& c) {
    auto q = c.template act<5>(s, true, RandomInit::uniform(-1, 1));
    auto k = c.template act<5>(s, true, RandomInit::uniform(-1, 1));
    auto v = c.template act<5>(s, true, RandomInit::uniform(-1, 1));
    c.output(F::ring_attention(q, k, v));
    c.output(F::neighborhood_attention(q, k, v, {.window = {3, 3}}));
    c.output(F::neighborhood_attention(q, k, v, {.window = {5, 2}, .periodic = {true, false}}));
  };
}

}  // namespace

TEMPLATE_TEST_CASE("odd meshes: conv2d, uneven / size-1 shards, halos wider than a shard", "[nn][conv][odd_mesh][mpi]",
                   float, double) {
  const Shape<4> s{2, 2, 7, 9};
  check_layouts<TestType>(conv2d_body<TestType>(s), [&](int P) { return odd_layouts<4>(P, s, 2, 3, 0); },
                          tol<TestType>());
}

TEMPLATE_TEST_CASE("odd meshes: conv_transpose", "[nn][conv][odd_mesh][mpi]", float, double) {
  const Shape<4> s{1, 2, 6, 5};
  check_layouts<TestType>(conv_transpose_body<TestType>(s), [&](int P) { return odd_layouts<4>(P, s, 2, 3); },
                          tol<TestType>());
}

TEMPLATE_TEST_CASE("odd meshes: conv3d on 1-, 2- and 3-D meshes", "[nn][conv][odd_mesh][mpi]", float, double) {
  const Shape<5> s{1, 2, 5, 6, 3};
  check_layouts<TestType>(
      conv3d_body<TestType>(s),
      [&](int P) {
        auto out = odd_layouts<5>(P, s, 2, 3);
        if (P == 8) out.push_back({"2x2x2-xyz", {2, 2, 2}, {Shard(2), Shard(3), Shard(4)}, {}});
        if (P == 6) out.push_back({"3x1x2-xyz", {3, 1, 2}, {Shard(2), Shard(3), Shard(4)}, {}});
        return out;
      },
      tol<TestType>());
}

TEMPLATE_TEST_CASE("odd meshes: pooling and upsampling", "[nn][pool][upsample][odd_mesh][mpi]", float, double) {
  const Shape<4> s{1, 2, 7, 8};
  check_layouts<TestType>(pool_upsample_body<TestType>(s), [&](int P) { return odd_layouts<4>(P, s, 2, 3); },
                          tol<TestType>());
}

TEMPLATE_TEST_CASE("odd meshes: norms", "[nn][norm][odd_mesh][mpi]", float, double) {
  const Shape<4> s{2, 4, 5, 7};
  check_layouts<TestType>(norm_body<TestType, 4>(s, 2), [&](int P) { return odd_layouts<4>(P, s, 2, 3, 0); },
                          tol<TestType>());
  const Shape<5> s3{1, 2, 3, 5, 4};
  check_layouts<TestType>(norm_body<TestType, 5>(s3, 1), [&](int P) { return odd_layouts<5>(P, s3, 3, 4); },
                          tol<TestType>());
}

TEMPLATE_TEST_CASE("odd meshes: channel linear, losses, reductions", "[nn][odd_mesh][mpi]", float, double) {
  const Shape<4> s{2, 3, 6, 5};
  check_layouts<TestType>(linear_loss_body<TestType>(s), [&](int P) { return odd_layouts<4>(P, s, 2, 3, 0); },
                          tol<TestType>());
}

TEMPLATE_TEST_CASE("odd meshes: ring and neighbourhood attention on a 2-D token domain",
                   "[nn][attention][odd_mesh][mpi]", float, double) {
  const Shape<5> s{1, 5, 6, 2, 3};
  check_layouts<TestType>(attention_body<TestType>(s), [&](int P) { return odd_layouts<5>(P, s, 1, 2, 0); },
                          attn_tol<TestType>());
}

}  // namespace st_nn_mpi_odd_meshes
