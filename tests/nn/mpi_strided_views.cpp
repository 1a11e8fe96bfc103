// Issue 8, compute from user memory: a simulation hands each rank a zero-copy view of the INTERIOR
// of its halo-padded array (strided: row stride = padded width). conv (+ bias), an activation
// (tanh), a product with another strided field, batch / group norm, and mse_loss / rel_l2_loss
// with a strided prediction and a strided target must give the unsharded computation's loss and
// every gradient (x, w, b) at 1..4 ranks, 1-D and 2-D meshes, uneven shards, f32 and f64, under both saved-tensor policies
// (stable views: read and saved in place; default snapshot views). The ghost cells of the user's
// array hold NaN, so a kernel that read outside the view would poison the results.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <limits>
#include <vector>

#include <shardtensor/nn/functional.hpp>

#include "support/mpi_harness.hpp"

namespace st_nn_mpi_strided_views {

using namespace shard;
using autograd::Var;
using shard::test::for_each_comm_size;

namespace {

constexpr index_t kGhost = 2;  // ghost width of the user's array on every spatial side
const Shape<4> kX{2, 3, 11, 9};  // 11 rows / 9 columns over 2..4 parts: uneven shards

struct Layout {
  std::vector<int> mesh_shape;
  std::vector<Placement> placements;
};
std::vector<Layout> layouts(int P) {
  std::vector<Layout> ls{{{P}, {Shard(2)}}, {{P}, {Shard(3)}}};
  if (P == 4) ls.push_back({{2, 2}, {Shard(2), Shard(3)}});
  if (P == 2) ls.push_back({{1, 2}, {Shard(3), Shard(2)}});
  return ls;
}

/// A user's halo-padded array for one rank's block [N, C, h + 2g, w + 2g] (ghosts NaN) and the
/// zero-copy view of its interior, filled with the global field `seed`.
template <class T>
struct PaddedField {
  std::vector<T> mem;
  Tensor<T, 4> interior;
  PaddedField(const DistSpec& spec, std::uint64_t seed, bool stable) {
    const auto& b = spec.local_box();
    const Shape<4> len{b.len[0], b.len[1], b.len[2], b.len[3]};
    const Shape<4> padded{len[0], len[1], len[2] + 2 * kGhost, len[3] + 2 * kGhost};
    mem.assign(static_cast<std::size_t>(numel(padded)), std::numeric_limits<T>::quiet_NaN());
    const Shape<4> strides{padded[1] * padded[2] * padded[3], padded[2] * padded[3], padded[3], 1};
    T* first = mem.data() + kGhost * padded[3] + kGhost;
    interior = Tensor<T, 4>::view(first, len, strides);
    if (stable) interior = interior.declare_stable();
    interior.fill_random(seed, Shape<4>{b.lo[0], b.lo[1], b.lo[2], b.lo[3]}, kX);
  }
};

/// loss = mse(conv(x, w, b), t) + mse(conv_periodic/reflect(x, w), t) + mse(tanh(x) * u, x): conv, a
/// unary op, a binary op, mse, rel_l2 (+ rel_l2(tanh(x), u) + rel_l2(x, u)) and batch / group norm
/// (+ mse(bn(x), u) + mse(gn(x), u)) read
/// strided x / u; mse's target is strided too.
template <class T>
Var<T, 1> model_loss(const Var<T, 4>& x, const Var<T, 4>& u, const Var<T, 4>& w, const Var<T, 1>& b,
                     const Var<T, 4>& t) {
  F::ConvOptions<2> o;
  o.pad_lo = {1, 0};
  o.pad_hi = {1, 1};  // even kernel width: 'same' with asymmetric halo widths
  auto y = F::conv(x, w, b, o);
  // The same conv with periodic / reflect padding: ghost cells come from the halo (wrapping
  // around the global edges), whose face cells are read from the strided view.
  F::ConvOptions<2> op = o;
  op.padding_mode = {Boundary::periodic, Boundary::reflect};
  auto yp = F::conv(x, w, std::nullopt, op);
  auto l = F::add(F::add(F::mse_loss(y, t), F::mse_loss(yp, t)), F::mse_loss(F::mul(F::tanh(x), u), x));
  // rel_l2 with a strided target, and with both operands strided (per sample and global).
  l = F::add(F::add(l, F::rel_l2_loss(F::tanh(x), u)), F::rel_l2_loss(x, u, F::RelL2Mode::global));
  // Norms with statistics over sharded dims (allreduced), reading the strided view.
  auto bn = F::batch_norm(x, nullptr, nullptr, std::nullopt, std::nullopt, true);
  return F::add(F::add(l, F::mse_loss(bn, u)), F::mse_loss(F::group_norm(x, 3), u));
}

template <class T>
double rel(const Tensor<T, 4>& a, const Tensor<T, 4>& b) {
  return max_rel_diff(a, b);
}

}  // namespace

TEMPLATE_TEST_CASE("ops on strided interior views of padded user arrays equal the unsharded computation",
                   "[nn][strided][mpi]", float, double) {
  using T = TestType;
  const double tol = std::is_same_v<T, double> ? 1e-10 : 1e-4;
  const Shape<4> wshape{4, 3, 3, 2};  // even kernel width
  // Oracle: the unsharded computation on one rank (library memory, contiguous).
  DeviceMesh self(std::make_shared<SelfComm>(), {1});
  Var<T, 4> x0(DistTensor<T, 4>::random(kX, self, {Replicate()}, 11), true);
  Var<T, 4> u0(DistTensor<T, 4>::random(kX, self, {Replicate()}, 12), false);
  Var<T, 4> w0(DistTensor<T, 4>::random(wshape, self, {Replicate()}, 13), true);
  Var<T, 1> b0(DistTensor<T, 1>::random({4}, self, {Replicate()}, 14), true);
  Var<T, 4> t0(DistTensor<T, 4>::random({2, 4, 11, 9}, self, {Replicate()}, 15), false);
  auto l0 = model_loss(x0, u0, w0, b0, t0);
  l0.backward();
  const double loss0 = static_cast<double>(l0.value().local().data()[0]);

  for_each_comm_size([&](CommPtr comm) {
    const int P = comm->size();
    for (const auto& L : layouts(P)) {
      for (bool stable : {true, false}) {
        INFO(P << " ranks, mesh " << fmt::format("{}", L.mesh_shape) << ", placements "
               << fmt::format("{}", L.placements) << (stable ? ", stable views" : ", snapshot views"));
        DeviceMesh mesh(comm, L.mesh_shape);
        std::vector<Placement> rep(L.mesh_shape.size(), Replicate());
        const DistSpec spec(mesh, L.placements, {kX[0], kX[1], kX[2], kX[3]});
        PaddedField<T> xf(spec, 11, stable), uf(spec, 12, stable);
        REQUIRE(!xf.interior.is_contiguous());
        Var<T, 4> x(DistTensor<T, 4>::from_local(xf.interior, mesh, L.placements, spec.sizes()), true);
        Var<T, 4> u(DistTensor<T, 4>::from_local(uf.interior, mesh, L.placements, spec.sizes()), false);
        if (stable) {  // zero-copy: the Var's value still views the user's memory
          CHECK(x.value().local().data() == xf.interior.data());
          CHECK_FALSE(x.value().local().is_contiguous());
        }
        Var<T, 4> w(DistTensor<T, 4>::random(wshape, mesh, rep, 13), true);
        Var<T, 1> b(DistTensor<T, 1>::random({4}, mesh, rep, 14), true);
        Var<T, 4> t(DistTensor<T, 4>::random({2, 4, 11, 9}, mesh, L.placements, 15), false);
        auto loss = model_loss(x, u, w, b, t);
        loss.backward();
        const double lv = static_cast<double>(loss.value().local().data()[0]);
        CHECK(std::abs(lv - loss0) <= tol * std::abs(loss0));
        CHECK(rel(x.grad().full_tensor(), x0.grad().local()) <= tol);
        CHECK(rel(w.grad().full_tensor(), w0.grad().local()) <= tol);
        const auto gb = b.grad().full_tensor(), gb0 = b0.grad().local();
        for (index_t i = 0; i < 4; ++i)
          CHECK(std::abs(static_cast<double>(gb.data()[i] - gb0.data()[i])) <=
                tol * std::max(1.0, std::abs(static_cast<double>(gb0.data()[i]))));
        // The user's arrays were read, never written (ghosts still NaN, interior unchanged).
        std::size_t nan = 0;
        for (T v : xf.mem) nan += v != v;
        CHECK(nan == xf.mem.size() - static_cast<std::size_t>(xf.interior.numel()));
      }
    }
  });
}

// ---- linear / channel_linear, reductions and concat on strided views (the remaining ops) ----

namespace {

/// A rank's halo-padded array of any rank (ghost width kGhost on the dims >= first_ghost, NaN) and
/// the zero-copy view of its interior, filled with the global field `seed` of shape `global`.
template <class T, int R>
struct PaddedBlock {
  std::vector<T> mem;
  Tensor<T, R> interior;
  PaddedBlock(const DistSpec& spec, const Shape<R>& global, int first_ghost, std::uint64_t seed, bool stable) {
    const auto& b = spec.local_box();
    Shape<R> len{}, padded{}, lo{};
    for (int d = 0; d < R; ++d) {
      len[d] = b.len[static_cast<std::size_t>(d)];
      lo[d] = b.lo[static_cast<std::size_t>(d)];
      padded[d] = len[d] + (d >= first_ghost ? 2 * kGhost : 0);
    }
    mem.assign(static_cast<std::size_t>(numel(padded)), std::numeric_limits<T>::quiet_NaN());
    Shape<R> st{};
    index_t acc = 1, off = 0;
    for (int d = R - 1; d >= 0; --d) {
      st[d] = acc;
      if (d >= first_ghost) off += kGhost * acc;
      acc *= padded[d];
    }
    interior = Tensor<T, R>::view(mem.data() + off, len, st);
    if (stable) interior = interior.declare_stable();
    interior.fill_random(seed, lo, global);
  }
};

/// channel_linear (+ bias), sum over C, max over the spatial dims (Partial(max) when sharded),
/// mean over N and W (Partial(sum)), the global mean and max, nearest / bilinear upsampling (the
/// bilinear one with a halo when sharded) and channel_linear of concat(x, u), all on
/// strided x / u; every result resolved and squared so each gradient depends on x.
template <class T>
Var<T, 1> mix_reduce_loss(const Var<T, 4>& x, const Var<T, 4>& u, const Var<T, 2>& w, const Var<T, 1>& b,
                          const Var<T, 2>& w2) {
  auto sq = [](const auto& v) {
    auto r = F::resolve(v);
    return F::resolve(F::sum(F::mul(r, r)));
  };
  auto l = sq(F::channel_linear(x, w, b));
  l = F::add(l, sq(F::sum(x, {1})));
  l = F::add(l, sq(F::max(x, {2, 3})));
  l = F::add(l, sq(F::mean(x, {0, 3})));
  l = F::add(l, F::resolve(F::mean(x)));
  l = F::add(l, F::resolve(F::max(x)));
  l = F::add(l, sq(F::upsample_nearest(x, Shape<2>{2, 3})));
  l = F::add(l, sq(F::mul(F::upsample_linear(x, Shape<2>{2, 2}), F::upsample_nearest(u, Shape<2>{2, 2}))));
  return F::add(l, sq(F::channel_linear(F::concat(x, u), w2)));
}

/// linear (+ bias) on tokens [B, L, C], sum over L, max over C, mean of all: strided x.
template <class T>
Var<T, 1> token_loss(const Var<T, 3>& x, const Var<T, 2>& w, const Var<T, 1>& b) {
  auto sq = [](const auto& v) {
    auto r = F::resolve(v);
    return F::resolve(F::sum(F::mul(r, r)));
  };
  auto l = F::add(sq(F::linear(x, w, b)), sq(F::sum(x, {1})));
  l = F::add(l, sq(F::max(x, {2})));
  return F::add(l, F::resolve(F::mean(x)));
}

template <class T, int R>
double rel_r(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  return max_rel_diff(a, b);
}

}  // namespace

TEMPLATE_TEST_CASE("linear, channel_linear, reductions, upsampling and concat on strided interior views equal the unsharded computation",
                   "[nn][strided][linear][reduce][mpi]", float, double) {
  using T = TestType;
  const double tol = std::is_same_v<T, double> ? 1e-10 : 1e-4;
  DeviceMesh self(std::make_shared<SelfComm>(), {1});
  // Oracle 1: channels-first fields [2, 3, 11, 9] (library memory, one rank).
  Var<T, 4> x0(DistTensor<T, 4>::random(kX, self, {Replicate()}, 21), true);
  Var<T, 4> u0(DistTensor<T, 4>::random(kX, self, {Replicate()}, 22), true);
  Var<T, 2> w0(DistTensor<T, 2>::random({4, 3}, self, {Replicate()}, 23), true);
  Var<T, 1> b0(DistTensor<T, 1>::random({4}, self, {Replicate()}, 24), true);
  Var<T, 2> v0(DistTensor<T, 2>::random({2, 6}, self, {Replicate()}, 25), true);
  auto l0 = mix_reduce_loss(x0, u0, w0, b0, v0);
  l0.backward();
  const double loss0 = static_cast<double>(l0.value().local().data()[0]);
  // Oracle 2: tokens [2, 13, 6].
  const Shape<3> kT{2, 13, 6};
  Var<T, 3> tx0(DistTensor<T, 3>::random(kT, self, {Replicate()}, 26), true);
  Var<T, 2> tw0(DistTensor<T, 2>::random({5, 6}, self, {Replicate()}, 27), true);
  Var<T, 1> tb0(DistTensor<T, 1>::random({5}, self, {Replicate()}, 28), true);
  auto tl0 = token_loss(tx0, tw0, tb0);
  tl0.backward();
  const double tloss0 = static_cast<double>(tl0.value().local().data()[0]);

  auto close = [tol](double a, double b) { return std::abs(a - b) <= tol * std::max(1.0, std::abs(b)); };
  for_each_comm_size([&](CommPtr comm) {
    const int P = comm->size();
    for (bool stable : {true, false}) {
      for (const auto& L : layouts(P)) {
        INFO(P << " ranks, mesh " << fmt::format("{}", L.mesh_shape) << ", placements "
               << fmt::format("{}", L.placements) << (stable ? ", stable views" : ", snapshot views"));
        DeviceMesh mesh(comm, L.mesh_shape);
        std::vector<Placement> rep(L.mesh_shape.size(), Replicate());
        const DistSpec spec(mesh, L.placements, {kX[0], kX[1], kX[2], kX[3]});
        PaddedBlock<T, 4> xf(spec, kX, 2, 21, stable), uf(spec, kX, 2, 22, stable);
        REQUIRE(!xf.interior.is_contiguous());
        Var<T, 4> x(DistTensor<T, 4>::from_local(xf.interior, mesh, L.placements, spec.sizes()), true);
        Var<T, 4> u(DistTensor<T, 4>::from_local(uf.interior, mesh, L.placements, spec.sizes()), true);
        Var<T, 2> w(DistTensor<T, 2>::random({4, 3}, mesh, rep, 23), true);
        Var<T, 1> b(DistTensor<T, 1>::random({4}, mesh, rep, 24), true);
        Var<T, 2> v(DistTensor<T, 2>::random({2, 6}, mesh, rep, 25), true);
        auto loss = mix_reduce_loss(x, u, w, b, v);
        loss.backward();
        if (stable) CHECK(x.value().local().data() == xf.interior.data());  // saved in place
        CHECK(close(static_cast<double>(loss.value().local().data()[0]), loss0));
        CHECK(rel_r(x.grad().full_tensor(), x0.grad().local()) <= tol);
        CHECK(rel_r(u.grad().full_tensor(), u0.grad().local()) <= tol);
        CHECK(rel_r(w.grad().full_tensor(), w0.grad().local()) <= tol);
        CHECK(rel_r(v.grad().full_tensor(), v0.grad().local()) <= tol);
        CHECK(rel_r(b.grad().full_tensor(), b0.grad().local()) <= tol);
        std::size_t nan = 0;
        for (T e : xf.mem) nan += e != e;
        CHECK(nan == xf.mem.size() - static_cast<std::size_t>(xf.interior.numel()));
      }
      // Tokens sharded along L (and B on a 2-D mesh), rows padded on L and C.
      std::vector<Layout> tls{{{P}, {Shard(1)}}};
      if (P == 4) tls.push_back({{2, 2}, {Shard(0), Shard(1)}});
      if (P == 2) tls.push_back({{2, 1}, {Shard(1), Shard(0)}});
      for (const auto& L : tls) {
        INFO(P << " ranks, tokens, mesh " << fmt::format("{}", L.mesh_shape) << ", placements "
               << fmt::format("{}", L.placements) << (stable ? ", stable views" : ", snapshot views"));
        DeviceMesh mesh(comm, L.mesh_shape);
        std::vector<Placement> rep(L.mesh_shape.size(), Replicate());
        const DistSpec spec(mesh, L.placements, {kT[0], kT[1], kT[2]});
        PaddedBlock<T, 3> xf(spec, kT, 1, 26, stable);
        Var<T, 3> x(DistTensor<T, 3>::from_local(xf.interior, mesh, L.placements, spec.sizes()), true);
        Var<T, 2> w(DistTensor<T, 2>::random({5, 6}, mesh, rep, 27), true);
        Var<T, 1> b(DistTensor<T, 1>::random({5}, mesh, rep, 28), true);
        auto loss = token_loss(x, w, b);
        loss.backward();
        if (stable) CHECK(x.value().local().data() == xf.interior.data());
        CHECK(close(static_cast<double>(loss.value().local().data()[0]), tloss0));
        CHECK(rel_r(x.grad().full_tensor(), tx0.grad().local()) <= tol);
        CHECK(rel_r(w.grad().full_tensor(), tw0.grad().local()) <= tol);
        CHECK(rel_r(b.grad().full_tensor(), tb0.grad().local()) <= tol);
      }
    }
  });
}

TEMPLATE_TEST_CASE("neighbourhood attention on strided q, k, v interior views equals the unsharded computation",
                   "[nn][strided][attention][mpi]", float, double) {
  using T = TestType;
  const double tol = std::is_same_v<T, double> ? 1e-10 : 1e-4;
  const Shape<5> kQ{2, 11, 9, 2, 3};  // [B, S0, S1, H, D]: S0 / S1 sharded unevenly
  const F::NeighborhoodOptions opt{{3, 4}, {1, 1}, {false, true}, 0};
  DeviceMesh self(std::make_shared<SelfComm>(), {1});
  Var<T, 5> q0(DistTensor<T, 5>::random(kQ, self, {Replicate()}, 31), true);
  Var<T, 5> k0(DistTensor<T, 5>::random(kQ, self, {Replicate()}, 32), true);
  Var<T, 5> v0(DistTensor<T, 5>::random(kQ, self, {Replicate()}, 33), true);
  Var<T, 5> g0(DistTensor<T, 5>::random(kQ, self, {Replicate()}, 34), false);
  auto l0 = F::sum(F::mul(F::neighborhood_attention(q0, k0, v0, opt), g0));
  l0.backward();
  const double loss0 = static_cast<double>(l0.value().local().data()[0]);
  for_each_comm_size([&](CommPtr comm) {
    const int P = comm->size();
    std::vector<Layout> ls{{{P}, {Shard(1)}}, {{P}, {Shard(2)}}};
    if (P == 4) ls.push_back({{2, 2}, {Shard(1), Shard(2)}});
    for (bool stable : {true, false}) {
      for (const auto& L : ls) {
        INFO(P << " ranks, mesh " << fmt::format("{}", L.mesh_shape) << ", placements "
               << fmt::format("{}", L.placements) << (stable ? ", stable views" : ", snapshot views"));
        DeviceMesh mesh(comm, L.mesh_shape);
        const DistSpec spec(mesh, L.placements, {kQ[0], kQ[1], kQ[2], kQ[3], kQ[4]});
        PaddedBlock<T, 5> qf(spec, kQ, 1, 31, stable), kf(spec, kQ, 1, 32, stable), vf(spec, kQ, 1, 33, stable);
        REQUIRE(!qf.interior.is_contiguous());
        Var<T, 5> q(DistTensor<T, 5>::from_local(qf.interior, mesh, L.placements, spec.sizes()), true);
        Var<T, 5> k(DistTensor<T, 5>::from_local(kf.interior, mesh, L.placements, spec.sizes()), true);
        Var<T, 5> v(DistTensor<T, 5>::from_local(vf.interior, mesh, L.placements, spec.sizes()), true);
        Var<T, 5> g(DistTensor<T, 5>::random(kQ, mesh, L.placements, 34), false);
        auto loss = F::resolve(F::sum(F::mul(F::neighborhood_attention(q, k, v, opt), g)));
        loss.backward();
        if (stable) CHECK(q.value().local().data() == qf.interior.data());
        const double lv = static_cast<double>(loss.value().local().data()[0]);
        CHECK(std::abs(lv - loss0) <= tol * std::max(1.0, std::abs(loss0)));
        CHECK(rel_r(q.grad().full_tensor(), q0.grad().local()) <= tol);
        CHECK(rel_r(k.grad().full_tensor(), k0.grad().local()) <= tol);
        CHECK(rel_r(v.grad().full_tensor(), v0.grad().local()) <= tol);
      }
    }
  });
}

}  // namespace st_nn_mpi_strided_views
