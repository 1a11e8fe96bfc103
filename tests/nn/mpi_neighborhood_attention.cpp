// MPI tests of the domain-parallel neighbourhood attention: forward values and dq/dk/dv equal the
// unsharded computation at 1..4 ranks on 1-D and 2-D meshes (uneven and empty shards, halos wider
// than a neighbour's shard, two mesh dims sharding one dim, a data-parallel batch dim), for 1-, 2-
// and 3-D domains, odd and even windows, dilation 2, zero and periodic boundaries, fp64 (1e-10)
// and fp32 (1e-4); the unsharded run is checked against dense masked attention; fp64 finite
// differences; bad input throws on every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"
#include "nn/nbhd_reference.hpp"

namespace st_nn_mpi_neighborhood_attention {

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;
using fn::Layout;
using fn::attn_tol;

namespace {

/// Layouts of [B, S..., H, D] tensors with S = R - 3 spatial dims (tensor dims 1..S) at P ranks:
/// each spatial dim sharded on a 1-D mesh (uneven where the extent does not divide), an empty
/// first shard, and at 4 ranks 2x2 meshes (two spatial dims; data x domain; two mesh dims on one
/// dim), at 2 ranks 1x2 / 2x1.
template <int R>
std::vector<Layout> attention_layouts(int P, const Shape<R>& shape) {
  constexpr int S = R - 3;
  std::vector<Layout> out;
  for (int d = 1; d <= S; ++d) out.push_back({fmt::format("1d-Shard({})", d), {P}, {Shard(d)}, {}});
  if (P >= 2 && shape[1] >= P - 1) {
    std::vector<index_t> s(static_cast<std::size_t>(P), 0);
    for (int i = 1; i < P; ++i) s[static_cast<std::size_t>(i)] = balanced_size(shape[1], P - 1, i - 1);
    ShardSizes sz(static_cast<std::size_t>(R));
    sz[1] = s;
    out.push_back({"1d-Shard(1)-empty-first", {P}, {Shard(1)}, sz});
  }
  const int d2 = S >= 2 ? 2 : 1;
  if (P == 4) {
    if (S >= 2) out.push_back({"2x2-spatial", {2, 2}, {Shard(1), Shard(d2)}, {}});
    out.push_back({"2x2-data-domain", {2, 2}, {Shard(0), Shard(1)}, {}});
    out.push_back({"2x2-same-dim", {2, 2}, {Shard(1), Shard(1)}, {}});
    if (S == 3) out.push_back({"2x2-dims-1-3", {2, 2}, {Shard(3), Shard(1)}, {}});
  }
  if (P == 2) {
    out.push_back({"1x2-spatial", {1, 2}, {Shard(1), Shard(d2)}, {}});
    out.push_back({"2x1-data-domain", {2, 1}, {Shard(0), Shard(1)}, {}});
  }
  return out;
}

template <class T, int R>
Body<T> nbhd_body(const Shape<R>& s, index_t Dv, std::vector<F::NeighborhoodOptions> opts) {
  return [s, Dv, opts](Ctx<T>& c) {
    Shape<R> vs = s;
    vs[R - 1] = Dv;
    auto q = c.template act<R>(s);
    auto k = c.template act<R>(s);
    auto v = c.template act<R>(vs);
    for (const auto& o : opts) c.output(F::neighborhood_attention(q, k, v, o));
  };
}

/// The unsharded reference of `body` against the dense masked attention (forward only; the
/// one-rank gradients are checked against dense attention in test_neighborhood_attention.cpp).
template <class T, int R>
void check_reference_dense(const Shape<R>& s, index_t Dv, const std::vector<F::NeighborhoodOptions>& opts) {
  const fn::Result ref = fn::reference<T>(nbhd_body<T, R>(s, Dv, opts));
  DeviceMesh m1(std::make_shared<SelfComm>(), {1});
  fn::Ctx<T> c(m1, fn::reference_layout(), 12345, nullptr);
  Shape<R> vs = s;
  vs[R - 1] = Dv;
  autograd::NoGradGuard ng;
  auto q = c.template act<R>(s), k = c.template act<R>(s), v = c.template act<R>(vs);
  for (std::size_t i = 0; i < opts.size(); ++i) {
    const auto d = dense_nbhd<T, R>(q.local(), k.local(), v.local(), Tensor<T, R>::zeros(v.local().shape()), opts[i]);
    CHECK(diff_of(fn::flatten(d.out), ref.outputs[i]).rel() <= attn_tol<T>() / 10);  // softmax outputs: never exactly 0
  }
}

template <class T, int R>
void check_nbhd_sharded(const Shape<R>& s, index_t Dv, const std::vector<F::NeighborhoodOptions>& opts) {
  const Body<T> body = nbhd_body<T, R>(s, Dv, opts);
  const fn::Result ref = fn::reference<T>(body);
  check_reference_dense<T, R>(s, Dv, opts);
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& L : attention_layouts<R>(comm->size(), s)) {
      INFO("layout " << L.name << " on " << comm->size() << " ranks");
      DeviceMesh mesh(comm, L.mesh_shape);
      fn::require_match(fn::run_case<T>(mesh, L, body), ref, attn_tol<T>());
    }
  });
}

}  // namespace

TEMPLATE_TEST_CASE("sharded 1-D neighbourhood attention equals the unsharded one", "[attention][nbhd][mpi]", float,
                   double) {
  // 11 over 4 ranks is 3,3,3,2; reach 4 (window 5, dilation 2) and 5 (window 11) exceed a shard.
  check_nbhd_sharded<TestType, 4>({2, 11, 2, 4}, 3,
                                  {{.window = {3}},
                                   {.window = {4}, .dilation = {2}, .periodic = {true}},
                                   {.window = {5}, .dilation = {2}},
                                   {.window = {11}},
                                   {.window = {6}, .periodic = {true}}});
}

TEMPLATE_TEST_CASE("sharded 2-D neighbourhood attention equals the unsharded one", "[attention][nbhd][mpi]", float,
                   double) {
  check_nbhd_sharded<TestType, 5>({2, 7, 6, 2, 3}, 3,
                                  {{.window = {3, 3}},
                                   {.window = {4, 2}, .dilation = {1, 2}, .periodic = {true, false}},
                                   {.window = {3, 4}, .dilation = {2, 1}, .periodic = {true, true}},
                                   {.window = {5, 3}, .dilation = {1, 2}}});
}

TEMPLATE_TEST_CASE("sharded 3-D neighbourhood attention equals the unsharded one", "[attention][nbhd][mpi]", float,
                   double) {
  check_nbhd_sharded<TestType, 6>({1, 5, 4, 4, 2, 3}, 2,
                                  {{.window = {3, 2, 3}, .dilation = {1, 2, 1}, .periodic = {false, true, true}},
                                   {.window = {2, 3, 2}, .dilation = {2, 1, 1}, .periodic = {true, false, false}}});
}

TEST_CASE("sharded neighbourhood attention gradients match finite differences", "[attention][nbhd][fd][mpi]") {
  const Shape<5> s{1, 5, 4, 2, 2};
  const Body<double> body = nbhd_body<double, 5>(
      s, 2, {{.window = {3, 2}, .dilation = {2, 1}, .periodic = {false, true}}, {.window = {2, 3}}});
  fn::check_finite_differences(DeviceMesh(std::make_shared<SelfComm>(), {1}), fn::reference_layout(), body);
  for_each_comm_size(
      [&](CommPtr comm) {
        for (const auto& L : attention_layouts<5>(comm->size(), s)) {
          if (L.name != "1d-Shard(1)" && L.name != "2x2-spatial") continue;
          fn::check_finite_differences(DeviceMesh(comm, L.mesh_shape), L, body);
        }
      },
      world_size());
}

TEST_CASE("neighbourhood attention refuses bad input on every rank", "[attention][nbhd][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, {P});
    using V = autograd::Var<double, 5>;
    auto mk = [&](Shape<5> s, Placement p) { return V(DistTensor<double, 5>::random(s, mesh, {p}, 1), true); };
    V q = mk({1, 6, 5, 2, 3}, Shard(1));
    auto fails = [&](auto&& f) { return !error_of(f).empty(); };
    CHECK(fails([&] { F::neighborhood_attention(q, q, q, {.window = {3}}); }));
    CHECK(fails([&] { F::neighborhood_attention(q, q, q, {.window = {7, 3}}); }));
    CHECK(fails([&] { F::neighborhood_attention(q, q, q, {.window = {3, 3}, .dilation = {3, 1}, .periodic = {true, false}}); }));
    CHECK(fails([&] { F::neighborhood_attention(q, q, q, {.window = {3, -1}}); }));
    CHECK(fails([&] { F::neighborhood_attention(q, q, q, {.window = {3, 3}, .dilation = {0, 1}}); }));
    V kd = mk({1, 6, 5, 2, 4}, Shard(1)), kh = mk({1, 6, 5, 3, 3}, Shard(1)), k2 = mk({1, 6, 5, 2, 3}, Shard(2));
    CHECK(fails([&] { F::neighborhood_attention(q, kd, kd, {.window = {3, 3}}); }));
    CHECK(fails([&] { F::neighborhood_attention(q, kh, kh, {.window = {3, 3}}); }));
    CHECK(fails([&] { F::neighborhood_attention(q, k2, k2, {.window = {3, 3}}); }));
    V qh = mk({1, 6, 5, 4, 3}, Shard(3));
    CHECK(fails([&] { F::neighborhood_attention(qh, qh, qh, {.window = {3, 3}}); }));
    if (P == 3) {  // uneven explicit sizes differ between q and k
      V a(DistTensor<double, 5>::random({1, 6, 5, 2, 3}, mesh, {Shard(1)}, 1, {}, {{}, {1, 2, 3}, {}, {}, {}}), true);
      CHECK(fails([&] { F::neighborhood_attention(q, a, a, {.window = {3, 3}}); }));
    }
    DeviceMesh other(comm, {P});
    V qo(DistTensor<double, 5>::random({1, 6, 5, 2, 3}, other, {Shard(1)}, 1), true);
    CHECK(fails([&] { F::neighborhood_attention(q, qo, qo, {.window = {3, 3}}); }));
    // No rank is left behind in a collective: everyone reaches this allreduce.
    double one = 1;
    comm->allreduce(&one, &one, 1, DType::f64, ReduceOp::sum);
    CHECK(one == P);
  });
}

}  // namespace st_nn_mpi_neighborhood_attention
