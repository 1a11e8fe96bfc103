// Neighbourhood attention on one rank against dense attention with an explicit window mask
// (tests/nn/nbhd_reference.hpp): forward, dq, dk, dv for 1-, 2- and 3-D domains, odd and even
// windows, dilation, zero and periodic boundaries, through both local paths (unsharded dims:
// the kernel clips / wraps; dims "sharded" over one part: halo-extended key blocks); the kernel
// front's geometry checks; bad options.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <omp.h>

#include <cstring>

#include "nn/nbhd_reference.hpp"
#include "support/tolerance.hpp"

namespace st_nn_test_neighborhood_attention {

using namespace shard;
using namespace shard::test;
using autograd::Var;

namespace {

template <class Fn>
std::string error_of(Fn&& f) {
  try {
    f();
  } catch (const shard::Error& e) {
    return e.what();
  }
  return "";
}

const DeviceMesh& mesh_of(int ndim) {
  static DeviceMesh m1(std::make_shared<SelfComm>(), {1});
  static DeviceMesh m3(std::make_shared<SelfComm>(), {1, 1, 1});
  return ndim == 1 ? m1 : m3;
}

/// Mixed tolerance: relative 1e-12 (fp64) / 2e-5 (fp32) plus an absolute floor for reductions of
/// Dh * (window sites) terms of inputs in [-1.5, 1.5] (a term of dq is |dO| |v| |k| <= 1.5^3):
/// with window 1 the exact dq and dk are zero and only rounding noise remains, whose size
/// depends on the ISA path (AVX-512, AVX2, scalar).
template <class T, int R>
Tol tol_of(const Shape<R>& qs, const F::NeighborhoodOptions& o) {
  index_t sites = 1;
  for (auto w : o.window) sites *= w;
  return mixed_tol<T>(std::is_same_v<T, double> ? 1e-12 : 2e-5, qs[R - 1] * sites, 1.5 * 1.5 * 1.5);
}

/// Runs F::neighborhood_attention with q/k/v placed by `pl` on a one-rank mesh and compares the
/// output and the three gradients (for a fixed random output gradient) with the dense reference.
template <class T, int R>
void check_against_dense(const Shape<R>& qs, index_t Dv, const F::NeighborhoodOptions& o,
                         const std::vector<Placement>& pl) {
  const DeviceMesh& mesh = mesh_of(static_cast<int>(pl.size()));
  Shape<R> vs = qs;
  vs[R - 1] = Dv;
  const auto init = RandomInit::uniform(-1.5, 1.5);
  Var<T, R> q(DistTensor<T, R>::random(qs, mesh, pl, 11, init), true);
  Var<T, R> k(DistTensor<T, R>::random(qs, mesh, pl, 12, init), true);
  Var<T, R> v(DistTensor<T, R>::random(vs, mesh, pl, 13, init), true);
  auto y = F::neighborhood_attention(q, k, v, o);
  auto g = DistTensor<T, R>::random(y.value().global_shape(), mesh, pl, 14, init);
  y.accumulate_grad(g);
  autograd::run_backward(y.node());
  const auto ref = dense_nbhd<T, R>(q.local(), k.local(), v.local(), g.local(), o);
  const Tol tol = tol_of<T, R>(qs, o);
  CHECK(diff_of(y.local(), ref.out) <= tol);
  CHECK(diff_of(q.grad().local(), ref.dq) <= tol);
  CHECK(diff_of(k.grad().local(), ref.dk) <= tol);
  CHECK(diff_of(v.grad().local(), ref.dv) <= tol);
}

template <class T, int R>
void check_both_paths(const Shape<R>& qs, index_t Dv, const F::NeighborhoodOptions& o) {
  INFO("window " << fmt::format("{}", o.window) << " dilation " << fmt::format("{}", o.dilation) << " periodic "
                 << fmt::format("{}", o.periodic));
  {
    INFO("unsharded (kernel clips / wraps)");
    check_against_dense<T, R>(qs, Dv, o, {Replicate()});
  }
  {
    INFO("sharded over one part (halo-extended key blocks)");
    std::vector<Placement> pl;
    for (int d = 0; d < 3; ++d) pl.push_back(d < R - 3 ? Placement(Shard(1 + d)) : Placement(Replicate()));
    check_against_dense<T, R>(qs, Dv, o, pl);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("neighbourhood attention equals dense attention with a window mask", "[attention][nbhd]", float,
                   double) {
  using T = TestType;
  SECTION("1-D") {
    const Shape<4> s{2, 13, 2, 5};
    check_both_paths<T, 4>(s, 5, {.window = {3}});
    check_both_paths<T, 4>(s, 3, {.window = {4}});
    check_both_paths<T, 4>(s, 5, {.window = {5}, .dilation = {2}});
    check_both_paths<T, 4>(s, 5, {.window = {4}, .dilation = {3}, .periodic = {true}});
    check_both_paths<T, 4>(s, 5, {.window = {13}});
    check_both_paths<T, 4>(s, 5, {.window = {7}, .dilation = {2}, .periodic = {true}, .scale = 0.3});
    check_both_paths<T, 4>(s, 5, {.window = {1}});
  }
  SECTION("2-D") {
    const Shape<5> s{2, 7, 6, 2, 4};
    check_both_paths<T, 5>(s, 4, {.window = {3, 3}});
    check_both_paths<T, 5>(s, 3, {.window = {4, 2}, .dilation = {1, 2}, .periodic = {true, false}});
    check_both_paths<T, 5>(s, 4, {.window = {3, 4}, .dilation = {2, 1}, .periodic = {true, true}});
    check_both_paths<T, 5>(s, 4, {.window = {7, 5}, .dilation = {1, 1}, .periodic = {false, true}});
  }
  SECTION("3-D") {
    const Shape<6> s{1, 5, 4, 3, 2, 3};
    check_both_paths<T, 6>(s, 3, {.window = {3, 2, 3}, .dilation = {1, 2, 1}, .periodic = {false, true, true}});
    check_both_paths<T, 6>(s, 2, {.window = {2, 3, 2}, .dilation = {2, 1, 1}});
  }
}

TEST_CASE("neighbourhood attention refuses bad options and operands", "[attention][nbhd][errors]") {
  const DeviceMesh& mesh = mesh_of(1);
  Var<double, 5> q(DistTensor<double, 5>::random({1, 6, 5, 2, 3}, mesh, {Shard(1)}, 1), true);
  Var<double, 5> v4(DistTensor<double, 5>::random({1, 6, 5, 2, 4}, mesh, {Shard(1)}, 2), true);
  auto err = [&](const F::NeighborhoodOptions& o) {
    return error_of([&] { F::neighborhood_attention(q, q, q, o); });
  };
  CHECK(err({.window = {3}}).find("window has 1 entries") != std::string::npos);
  CHECK(err({.window = {3, 3, 3}}).find("window has 3 entries") != std::string::npos);
  CHECK(err({.window = {3, 3}, .dilation = {1}}).find("dilation has 1 entries") != std::string::npos);
  CHECK(err({.window = {3, 3}, .periodic = {true}}).find("periodic has 1 entries") != std::string::npos);
  CHECK(err({.window = {0, 3}}).find("must be >= 1") != std::string::npos);
  CHECK(err({.window = {3, 3}, .dilation = {1, 0}}).find("must be >= 1") != std::string::npos);
  CHECK(err({.window = {7, 3}}).find("larger than the domain") != std::string::npos);
  CHECK(err({.window = {3, 6}}).find("larger than the domain") != std::string::npos);
  CHECK(err({.window = {3, 3}, .dilation = {3, 1}, .periodic = {true, false}}).find("periodic window") !=
        std::string::npos);
  CHECK(err({.window = {3, 3}, .scale = -1}).find("scale") != std::string::npos);
  CHECK(err({.window = {6, 5}}).empty());
  CHECK(err({.window = {3, 3}, .dilation = {2, 1}, .periodic = {true, false}}).empty());
  // v may have its own head dim; k may not.
  CHECK(error_of([&] { F::neighborhood_attention(q, q, v4, {.window = {3, 3}}); }).empty());
  CHECK(error_of([&] { F::neighborhood_attention(q, v4, v4, {.window = {3, 3}}); }).find("same shape") !=
        std::string::npos);
  Var<double, 5> h3(DistTensor<double, 5>::random({1, 6, 5, 3, 3}, mesh, {Shard(1)}, 3), true);
  CHECK(!error_of([&] { F::neighborhood_attention(q, q, h3, {.window = {3, 3}}); }).empty());
  Var<double, 5> s7(DistTensor<double, 5>::random({1, 7, 5, 2, 3}, mesh, {Shard(1)}, 3), true);
  CHECK(!error_of([&] { F::neighborhood_attention(q, s7, s7, {.window = {3, 3}}); }).empty());
  Var<double, 5> qr(DistTensor<double, 5>::random({1, 6, 5, 2, 3}, mesh, {Replicate()}, 1), true);
  CHECK(error_of([&] { F::neighborhood_attention(q, qr, qr, {.window = {3, 3}}); }).find("same placements") !=
        std::string::npos);
  Var<double, 5> qh(DistTensor<double, 5>::random({1, 6, 5, 2, 3}, mesh, {Shard(3)}, 1), true);
  CHECK(error_of([&] { F::neighborhood_attention(qh, qh, qh, {.window = {3, 3}}); }).find("heads") !=
        std::string::npos);
  Var<double, 5> qd(DistTensor<double, 5>::random({1, 6, 5, 2, 3}, mesh, {Shard(4)}, 1), true);
  CHECK(error_of([&] { F::neighborhood_attention(qd, qd, qd, {.window = {3, 3}}); }).find("head dim") !=
        std::string::npos);
  DeviceMesh other(std::make_shared<SelfComm>(), {1});
  Var<double, 5> qo(DistTensor<double, 5>::random({1, 6, 5, 2, 3}, other, {Shard(1)}, 1), true);
  CHECK(error_of([&] { F::neighborhood_attention(q, qo, qo, {.window = {3, 3}}); }).find("different meshes") !=
        std::string::npos);
}

TEST_CASE("neighbourhood attention kernel front checks its geometry", "[attention][nbhd][errors]") {
  exec::NbhdGeom g;
  g.B = g.H = g.D = g.Dv = 1;
  double x = 0, lse = 0;
  auto& ctx = current_context(Device::cpu());
  const index_t ones[6] = {1, 1, 1, 1, 1, 1};
  // [B, S0, S1, S2, H, D] operands and a [B, S0, S1, S2, H] lse, every extent 1
  const Block xb = Block::view(DType::f64, Device::cpu(), &x, ones, 6), lb = Block::view(DType::f64, Device::cpu(), &lse, ones, 5);
  auto run = [&](const exec::NbhdGeom& gg) {
    return error_of([&] { exec::nbhd_attention_forward(gg, xb, xb, xb, xb, lb, ctx); });
  };
  CHECK(run(g).empty());
  CHECK(x == 0);  // one query, one key: out = v
  auto bad = g;
  bad.window[1] = 0;
  CHECK(!run(bad).empty());
  bad = g;
  bad.valid_hi[2] = 2;
  CHECK(run(bad).find("valid key range") != std::string::npos);
  bad = g;
  bad.wrap[0] = true;
  bad.nk[0] = 2;
  bad.valid_hi[0] = 2;
  CHECK(run(bad).find("wrapped") != std::string::npos);
  const Block xi = Block::view(DType::i32, Device::cpu(), &x, ones, 6);
  CHECK(!error_of([&] { exec::nbhd_attention_forward(g, xi, xi, xi, xi, lb, ctx); }).empty());
  // operands on another device than the context, of another shape, or a lse of the wrong dtype
  const Block xg = Block::view(DType::f64, Device::cuda(0), &x, ones, 6);
  CHECK(error_of([&] { exec::nbhd_attention_forward(g, xb, xg, xb, xb, lb, ctx); }).find("different devices") !=
        std::string::npos);
  const index_t two[6] = {1, 1, 1, 1, 1, 2};
  const Block x2 = Block::view(DType::f64, Device::cpu(), &x, two, 6);
  CHECK(error_of([&] { exec::nbhd_attention_forward(g, xb, xb, x2, xb, lb, ctx); }).find("shape") !=
        std::string::npos);
  const Block lf = Block::view(DType::f32, Device::cpu(), &lse, ones, 5);
  CHECK(!error_of([&] { exec::nbhd_attention_forward(g, xb, xb, xb, xb, lf, ctx); }).empty());
}

TEST_CASE("neighbourhood attention on the CPU is bitwise independent of the thread count", "[attention][nbhd]") {
  const DeviceMesh& mesh = mesh_of(1);
  const Shape<5> s{2, 24, 20, 2, 16};
  const F::NeighborhoodOptions o{.window = {5, 4}, .dilation = {1, 2}, .periodic = {false, true}};
  auto run = [&](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    Var<float, 5> q(DistTensor<float, 5>::random(s, mesh, {Replicate()}, 21), true);
    Var<float, 5> k(DistTensor<float, 5>::random(s, mesh, {Replicate()}, 22), true);
    Var<float, 5> v(DistTensor<float, 5>::random(s, mesh, {Replicate()}, 23), true);
    auto y = F::neighborhood_attention(q, k, v, o);
    y.accumulate_grad(DistTensor<float, 5>::random(s, mesh, {Replicate()}, 24));
    autograd::run_backward(y.node());
    omp_set_num_threads(before);
    std::vector<Tensor<float, 5>> r{y.local(), q.grad().local(), k.grad().local(), v.grad().local()};
    return r;
  };
  const auto a = run(1), b = run(2), c = run(3);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    CHECK(std::memcmp(a[i].data(), b[i].data(), sizeof(float) * static_cast<std::size_t>(a[i].numel())) == 0);
    CHECK(std::memcmp(a[i].data(), c[i].data(), sizeof(float) * static_cast<std::size_t>(a[i].numel())) == 0);
  }
}

}  // namespace st_nn_test_neighborhood_attention
