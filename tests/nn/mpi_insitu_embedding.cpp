// The in-situ embedding path (issue 8, scope 6; examples/insitu_advection.cpp) against the
// unsharded computation: a simulation-style decomposition (first p-1 parts get n/p, the last
// the rest: not the library's balanced rule, given explicitly), halo-padded arrays owned by the
// "simulation" whose ghost cells hold NaN, zero-copy strided views of their interiors (stable and
// snapshot policies), a conv surrogate (conv3x3 periodic -> tanh -> conv1x1) trained with an MSE
// loss against a second (contiguous) user array. Loss, every parameter gradient and the input
// gradient equal the 1-rank result on the full field (fp64 1e-10, fp32 1e-5 relative), at 1..4
// ranks on row, column and 2-D process grids; the user arrays (interiors and ghosts) are left
// bit-for-bit as they were.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <shardtensor/nn/functional.hpp>

#include "support/mpi_harness.hpp"

namespace st_nn_mpi_insitu_embedding {

using namespace shard;
using autograd::Var;
using shard::test::for_each_comm_size;

namespace {

constexpr index_t kNy = 11, kNx = 9;  // 11 rows over 3 ranks: 3, 3, 5 (the balanced rule: 4, 4, 3)

std::vector<index_t> sim_split(index_t n, int p) {
  std::vector<index_t> s(static_cast<std::size_t>(p), n / p);
  s.back() = n - (p - 1) * (n / p);
  return s;
}

template <class T>
T field_value(index_t i, index_t j, int which) {
  return static_cast<T>(which == 0 ? std::sin(0.7 * static_cast<double>(i) + 0.3) * std::cos(0.45 * static_cast<double>(j))
                                   : 0.25 * std::cos(0.5 * static_cast<double>(i * j) + 0.1) - 0.1);
}

template <class T>
struct Result {
  T loss;
  std::vector<std::vector<T>> grads;  // w1, b1, w2, b2 (full, replicated)
};

/// conv3x3 (periodic, 1 -> 3) -> tanh -> conv1x1 (3 -> 1); MSE against y. Weights from seeds
/// (a function of the global index: the same at every rank count).
template <class T>
Result<T> run_surrogate(const DeviceMesh& mesh, const DistTensor<T, 4>& x, const DistTensor<T, 4>& y,
                        Var<T, 4>* xv_out = nullptr) {
  std::vector<Placement> rep(static_cast<std::size_t>(mesh.ndim()), Replicate());
  Var<T, 4> w1(DistTensor<T, 4>::random({3, 1, 3, 3}, mesh, rep, 11), true);
  Var<T, 1> b1(DistTensor<T, 1>::random({3}, mesh, rep, 12), true);
  Var<T, 4> w2(DistTensor<T, 4>::random({1, 3, 1, 1}, mesh, rep, 13), true);
  Var<T, 1> b2(DistTensor<T, 1>::random({1}, mesh, rep, 14), true);
  Var<T, 4> xv(x, true), yv(y, false);
  const auto o = F::ConvOptions<2>::same({3, 3}, 1, Boundary::periodic);
  auto h = F::tanh(F::conv(xv, w1, b1, o));
  auto loss = F::mse_loss(F::conv(h, w2, b2, F::ConvOptions<2>{}), yv);
  loss.backward();
  Result<T> r;
  r.loss = loss.value().full_tensor().data()[0];
  auto flat = [](const auto& t) {
    const auto f = t.full_tensor().contiguous();
    return std::vector<T>(f.data(), f.data() + f.numel());
  };
  r.grads = {flat(w1.grad()), flat(b1.grad()), flat(w2.grad()), flat(b2.grad())};
  if (xv_out) *xv_out = xv;
  return r;
}

template <class T>
void check_close(T got, T want, double tol, const char* what) {
  INFO(what << ": got " << got << ", want " << want);
  CHECK(std::abs(static_cast<double>(got) - static_cast<double>(want)) <=
        tol * std::max(1.0, std::abs(static_cast<double>(want))));
}

}  // namespace

TEMPLATE_TEST_CASE("in-situ surrogate on strided views of ghosted user arrays equals the unsharded computation",
                   "[insitu][mpi]", double, float) {
  using T = TestType;
  const double tol = shard::test::tol<T>();
  // The reference: the full field on one rank (SelfComm), contiguous library tensors.
  DeviceMesh self_mesh(std::make_shared<SelfComm>(), {1, 1});
  Tensor<T, 4> xf = Tensor<T, 4>::empty({1, 1, kNy, kNx}), yf = Tensor<T, 4>::empty({1, 1, kNy, kNx});
  for (index_t i = 0; i < kNy; ++i)
    for (index_t j = 0; j < kNx; ++j) {
      xf(0, 0, i, j) = field_value<T>(i, j, 0);
      yf(0, 0, i, j) = field_value<T>(i, j, 1);
    }
  Var<T, 4> xref;
  const auto ref = run_surrogate<T>(self_mesh, DistTensor<T, 4>::from_local(xf, self_mesh, {Replicate(), Replicate()}),
                                    DistTensor<T, 4>::from_local(yf, self_mesh, {Replicate(), Replicate()}), &xref);
  const Tensor<T, 4> dx_ref = xref.grad().local().contiguous();

  for_each_comm_size([&](CommPtr comm) {
    const int P = comm->size();
    std::vector<std::vector<int>> grids{{P, 1}, {1, P}};
    if (P == 4) grids.push_back({2, 2});
    for (const auto& g : grids)
      for (const bool stable : {true, false}) {
        INFO(P << " ranks, process grid " << g[0] << "x" << g[1] << (stable ? ", stable views" : ", snapshot views"));
        DeviceMesh mesh(comm, g);
        const auto c = mesh.coords_of(comm->rank());
        const auto ys = sim_split(kNy, g[0]), xs = sim_split(kNx, g[1]);
        const index_t ly = ys[static_cast<std::size_t>(c[0])], lx = xs[static_cast<std::size_t>(c[1])];
        index_t y0 = 0, x0 = 0;
        for (int i = 0; i < c[0]; ++i) y0 += ys[static_cast<std::size_t>(i)];
        for (int i = 0; i < c[1]; ++i) x0 += xs[static_cast<std::size_t>(i)];
        // The simulation's arrays: (ly + 2) x (lx + 2) with NaN ghosts (ghost width 1), and a
        // contiguous target array.
        const index_t pitch = lx + 2;
        std::vector<T> u(static_cast<std::size_t>((ly + 2) * pitch), std::numeric_limits<T>::quiet_NaN());
        std::vector<T> tgt(static_cast<std::size_t>(ly * lx));
        for (index_t i = 0; i < ly; ++i)
          for (index_t j = 0; j < lx; ++j) {
            u[static_cast<std::size_t>((i + 1) * pitch + j + 1)] = field_value<T>(y0 + i, x0 + j, 0);
            tgt[static_cast<std::size_t>(i * lx + j)] = field_value<T>(y0 + i, x0 + j, 1);
          }
        const std::vector<T> u_before = u, tgt_before = tgt;
        auto xl = Tensor<T, 4>::view(u.data() + pitch + 1, {1, 1, ly, lx}, {ly * pitch, ly * pitch, pitch, 1});
        auto yl = Tensor<T, 4>::view(tgt.data(), {1, 1, ly, lx});
        if (stable) {
          xl = xl.declare_stable();
          yl = yl.declare_stable();
        }
        ShardSizes sizes(4);
        if (g[0] > 1) sizes[2] = ys;
        if (g[1] > 1) sizes[3] = xs;
        const std::vector<Placement> pl{Shard(2), Shard(3)};
        auto x = DistTensor<T, 4>::from_local(xl, mesh, pl, sizes);
        auto y = DistTensor<T, 4>::from_local(yl, mesh, pl, sizes);
        CHECK(x.local().data() == u.data() + pitch + 1);  // zero-copy
        CHECK(y.local().data() == tgt.data());
        CHECK(x.global_shape() == Shape<4>{1, 1, kNy, kNx});
        Var<T, 4> xv;
        const auto got = run_surrogate<T>(mesh, x, y, &xv);
        check_close(got.loss, ref.loss, tol, "loss");
        for (std::size_t k = 0; k < got.grads.size(); ++k) {
          REQUIRE(got.grads[k].size() == ref.grads[k].size());
          for (std::size_t e = 0; e < got.grads[k].size(); ++e) check_close(got.grads[k][e], ref.grads[k][e], tol, "param grad");
        }
        // The input gradient: this rank's block of the unsharded one.
        const auto dx = xv.grad().local();
        REQUIRE(dx.shape() == Shape<4>{1, 1, ly, lx});
        for (index_t i = 0; i < ly; ++i)
          for (index_t j = 0; j < lx; ++j) check_close(dx(0, 0, i, j), dx_ref(0, 0, y0 + i, x0 + j), tol, "input grad");
        // The simulation's memory is untouched: interiors bitwise, ghosts still NaN.
        CHECK(std::memcmp(u.data(), u_before.data(), u.size() * sizeof(T)) == 0);
        CHECK(std::memcmp(tgt.data(), tgt_before.data(), tgt.size() * sizeof(T)) == 0);
      }
  });
}

}  // namespace st_nn_mpi_insitu_embedding
