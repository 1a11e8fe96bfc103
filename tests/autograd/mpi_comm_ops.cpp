// The halo plan of a stencil op on the tape: a 2-D stencil op (correlation with a replicated
// weight, odd and even kernels, every boundary mode) recorded as one node whose forward reads the
// extended block through StencilHaloForward and whose backward sends the ghost gradients home
// through StencilHaloAdjoint (dist/halo_transport.hpp: thin, sliced or whole-block, as the plan
// picks), sharded on 1-D and 2-D meshes (corners) with uneven and empty shards and a Replicate
// mesh dim, against the single-rank run (values, x and weight gradients, fp64 and fp32), finite
// differences, a node that keeps no extended block, and errors.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <shardtensor/autograd/comm_ops.hpp>
#include <shardtensor/dist/halo_transport.hpp>

#include "support/mpi_harness.hpp"

namespace st_autograd_mpi_comm_ops {

using namespace shard;
using autograd::Var;
using Catch::Matchers::ContainsSubstring;
using shard::test::error_of;
using shard::test::for_each_comm_size;

namespace {

constexpr Boundary kModes[] = {Boundary::zero, Boundary::periodic, Boundary::reflect, Boundary::replicate};

/// "Same" halo of a kh x kw kernel (even kernels: one more ghost above than below).
HaloSpec same_halo(index_t kh, index_t kw, Boundary mode) {
  return {{(kh - 1) / 2, (kw - 1) / 2}, {kh - 1 - (kh - 1) / 2, kw - 1 - (kw - 1) / 2}, {mode, mode}};
}

/// out[i,j] = sum_pq w[p,q] ext[i+p, j+q] over the extended block.
template <class T>
Tensor<T, 2> correlate(const Tensor<T, 2>& ext, const Tensor<T, 2>& w) {
  const index_t H = ext.size(0) - w.size(0) + 1, W = ext.size(1) - w.size(1) + 1;
  auto out = Tensor<T, 2>::zeros({H, W});
  for (index_t i = 0; i < H; ++i)
    for (index_t j = 0; j < W; ++j) {
      T s = 0;
      for (index_t p = 0; p < w.size(0); ++p)
        for (index_t q = 0; q < w.size(1); ++q) s += w(p, q) * ext(i + p, j + q);
      out(i, j) = s;
    }
  return out;
}

/// One tape node for a stencil op on the halo plan, the way the library's ops record theirs:
/// `forward(ext)` gets x's extended block; `backward(grad_out, ext)` returns the extended block's
/// gradient (ext is empty unless `save_ext`), which goes to the plan's adjoint in the form the plan
/// asks for (the whole extended gradient, or the block's part plus the ghost cells' part).
template <class T, class Forward, class Backward, class... Extra>
Var<T, 2> halo_node(const Var<T, 2>& x, const char* name, const HaloSpec& h, bool save_ext, Forward&& forward,
                    Backward&& backward, const Extra&... extra) {
  const DistSpec xs = x.value().spec();
  StencilHaloShape shape;
  shape.op = name;
  shape.slice_dims = {0, 1};
  const auto es = shard::detail::halo_extended_shape(xs, h);
  auto ext = Tensor<T, 2>::empty({es[0], es[1]});
  {
    StencilHaloForward hf(dtype_of<T>, xs, h, as_block(x.local()), shape, current_context(Device::cpu()));
    hf.read({0, 0}, as_block(ext));
  }
  DistTensor<T, 2> out = forward(ext);
  const DistSpec out_spec = out.spec();
  return Var<T, 2>::make(
      std::move(out), name, {x.ref(), extra.ref()...},
      [x, h, xs, shape, out_spec, saved = save_ext ? ext : Tensor<T, 2>(), bwd = std::forward<Backward>(backward)](
          const DistTensor<T, 2>& g) {
        const DistTensor<T, 2> gn = autograd::gradient_as(out_spec, g);
        Tensor<T, 2> gext = bwd(gn, saved);
        if (!x.requires_grad()) return;
        StencilHaloAdjoint adj(dtype_of<T>, xs, h, shape, current_context(Device::cpu()));
        Tensor<T, 2> gx;
        if (adj.wants_extended_gradient()) {
          adj.start(as_block(gext));
          gx = tensor_of<T, 2>(adj.finish());
        } else {
          const Box b = xs.local_box();
          auto inner = gext.slice({h.lo[0], h.lo[1]}, {b.len[0], b.len[1]});
          gx = inner.clone();
          inner.fill(T(0));  // the ghost cells' gradients only
          adj.start(std::vector<GhostGradient>{GhostGradient{{0, 0}, as_block(gext)}});
          adj.progress(as_block(gx));
          adj.finish(as_block(gx));
        }
        const DistSpec gs = xs.with_placements(
            autograd::local_op_input_grad_placements(xs.placements(), out_spec.placements(), gn.placements()),
            xs.sizes());
        x.accumulate_grad(DistTensor<T, 2>(gs, gx));
      });
}

/// The stencil op: one node reading x's block plus ghosts and the weight w.
template <class T>
Var<T, 2> stencil(const Var<T, 2>& x, const Var<T, 2>& w, Boundary mode) {
  const auto h = same_halo(w.value().global_shape()[0], w.value().global_shape()[1], mode);
  return halo_node<T>(
      x, "stencil", h, true,
      [&](const Tensor<T, 2>& ext) { return DistTensor<T, 2>(x.value().spec(), correlate(ext, w.local())); },
      [x, w](const DistTensor<T, 2>& g, const Tensor<T, 2>& ext) {
        const auto& wl = w.local();
        auto gw = Tensor<T, 2>::zeros(wl.shape());
        auto gext = Tensor<T, 2>::zeros(ext.shape());
        for (index_t i = 0; i < g.local().size(0); ++i)
          for (index_t j = 0; j < g.local().size(1); ++j)
            for (index_t p = 0; p < wl.size(0); ++p)
              for (index_t q = 0; q < wl.size(1); ++q) {
                gw(p, q) += g.local()(i, j) * ext(i + p, j + q);
                gext(i + p, j + q) += wl(p, q) * g.local()(i, j);
              }
        const auto& ws = w.value().spec();
        w.accumulate_grad(DistTensor<T, 2>(
            ws.with_placements(autograd::local_op_input_grad_placements(ws.placements(), g.placements(),
                                                                        g.placements())),
            gw));
        return gext;
      },
      w);
}

/// A box sum that does not keep the extended block.
template <class T>
Var<T, 2> box_sum(const Var<T, 2>& x, index_t k, Boundary mode) {
  const auto h = same_halo(k, k, mode);
  return halo_node<T>(
      x, "box_sum", h, false,
      [&](const Tensor<T, 2>& ext) {
        return DistTensor<T, 2>(x.value().spec(), correlate(ext, Tensor<T, 2>::full({k, k}, T(1))));
      },
      [k](const DistTensor<T, 2>& g, const Tensor<T, 2>& ext) {
        CHECK(ext.numel() == 0);
        auto gext = Tensor<T, 2>::zeros({g.local().size(0) + k - 1, g.local().size(1) + k - 1});
        for (index_t i = 0; i < g.local().size(0); ++i)
          for (index_t j = 0; j < g.local().size(1); ++j)
            for (index_t p = 0; p < k; ++p)
              for (index_t q = 0; q < k; ++q) gext(i + p, j + q) += g.local()(i, j);
        return gext;
      });
}

/// Scalar loss 0.5 * sum(c * Y^2); the upstream gradient c*Y is handed over under `up`
/// (Partial(sum) parts split unevenly over the coordinates).
template <class T>
Var<T, 2> square_loss(const Var<T, 2>& y, const Tensor<T, 2>& c, const std::vector<Placement>& up) {
  const auto Y = y.value().full_tensor();
  double L = 0;
  for (index_t i = 0; i < Y.size(0); ++i)
    for (index_t j = 0; j < Y.size(1); ++j) L += 0.5 * double(c(i, j)) * double(Y(i, j)) * double(Y(i, j));
  const auto& mesh = y.value().mesh();
  DistSpec sspec(mesh, std::vector<Placement>(static_cast<std::size_t>(mesh.ndim()), Replicate()), {1, 1});
  return Var<T, 2>::make(DistTensor<T, 2>(sspec, Tensor<T, 2>::full({1, 1}, static_cast<T>(L))), "square_loss",
                         {y.ref()}, [y, c, up, Y](const DistTensor<T, 2>& g) {
                           auto G = mul(c, Y);
                           scale(G, g.local()(0, 0));
                           const auto& mesh = y.value().mesh();
                           const auto& ys = y.value().spec();
                           DistSpec spec = ys.with_placements(up, up == ys.placements() ? ys.sizes() : ShardSizes{});
                           const Box b = spec.local_box();
                           auto local = G.slice({b.lo[0], b.lo[1]}, {b.len[0], b.len[1]}).clone();
                           double wgt = 1;
                           for (int m = 0; m < mesh.ndim(); ++m)
                             if (up[static_cast<std::size_t>(m)].is_partial())
                               wgt *= (mesh.coord(m) + 1.0) / (mesh.size(m) * (mesh.size(m) + 1) / 2.0);
                           scale(local, static_cast<T>(wgt));
                           y.accumulate_grad(DistTensor<T, 2>(spec, local));
                         });
}

struct Result {
  Tensor<double, 2> y, gx, gw;
};

template <class T>
Result run_stencil(const DeviceMesh& mesh, const std::vector<Placement>& pl, const ShardSizes& sizes,
                   const std::vector<Placement>& up, Shape<2> shape, Shape<2> k, Boundary mode, bool boxed) {
  Var<T, 2> x(DistTensor<T, 2>::random(shape, mesh, pl, 42, {}, sizes), true);
  const std::vector<Placement> rep(static_cast<std::size_t>(mesh.ndim()), Replicate());
  Var<T, 2> w(DistTensor<T, 2>::random(k, mesh, rep, 43), true);
  auto c = Tensor<T, 2>::empty(shape);
  c.fill_random(44, RandomInit::uniform(0.5, 1.5));
  auto y = boxed ? stencil(box_sum(x, 3, mode), w, mode) : stencil(x, w, mode);
  square_loss(y, c, up).backward();
  auto to64 = [](const Tensor<T, 2>& t) {
    auto o = Tensor<double, 2>::empty(t.shape());
    for (index_t i = 0; i < t.size(0); ++i)
      for (index_t j = 0; j < t.size(1); ++j) o(i, j) = double(t(i, j));
    return o;
  };
  CHECK(x.grad().placements() == pl);  // leaf gradients end laid out like the value
  CHECK(w.grad().placements() == rep);
  return {to64(y.value().full_tensor()), to64(x.grad().full_tensor()), to64(w.grad().full_tensor())};
}

struct Layout {
  std::vector<int> mesh;
  std::vector<Placement> pl;
  ShardSizes sizes;
  std::vector<Placement> up;  // upstream gradient placements handed over by the loss
};

std::vector<Layout> layouts_for(int P) {
  std::vector<Layout> v = {{{P}, {Shard(0)}, {}, {Shard(0)}},
                           {{P}, {Shard(1)}, {}, {Partial()}},
                           {{P}, {Replicate()}, {}, {Replicate()}}};
  if (P == 3) v.push_back({{P}, {Shard(0)}, {{2, 0, 7}, {}}, {Replicate()}});
  if (P == 2) v.push_back({{1, 2}, {Shard(0), Shard(1)}, {}, {Shard(0), Shard(1)}});
  if (P == 2) v.push_back({{2, 1}, {Shard(1), Shard(0)}, {}, {Replicate(), Partial()}});
  if (P == 4) {
    v.push_back({{2, 2}, {Shard(0), Shard(1)}, {}, {Shard(0), Shard(1)}});
    v.push_back({{2, 2}, {Shard(1), Shard(0)}, {{0, 9}, {}}, {Partial(), Replicate()}});
    v.push_back({{2, 2}, {Shard(0), Replicate()}, {}, {Shard(0), Partial()}});
    v.push_back({{2, 2}, {Shard(0), Replicate()}, {}, {Shard(0), Replicate()}});
  }
  return v;
}

}  // namespace

TEST_CASE("stencil halo plan on the tape: sharded values and gradients equal the single-rank run", "[autograd][halo][mpi]") {
  const Shape<2> shape{9, 7};
  const std::vector<Shape<2>> kernels = {{3, 3}, {2, 4}, {5, 1}};
  for_each_comm_size([&](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh one(std::make_shared<SelfComm>());
    for (const auto& lay : layouts_for(P)) {
      DeviceMesh mesh(comm, lay.mesh);
      for (Boundary mode : kModes)
        for (const auto& k : kernels)
          for (bool boxed : {false, true}) {
            INFO(fmt::format("P={} mesh {} {} sizes {} up {} mode {} kernel {} boxed {}", P, lay.mesh, lay.pl, lay.sizes,
                             lay.up, mode, k, boxed));
            auto ref = run_stencil<double>(one, {Replicate()}, {}, {Replicate()}, shape, k, mode, boxed);
            auto got = run_stencil<double>(mesh, lay.pl, lay.sizes, lay.up, shape, k, mode, boxed);
            CHECK(max_rel_diff(got.y, ref.y) <= 1e-10);
            CHECK(max_rel_diff(got.gx, ref.gx) <= 1e-10);
            CHECK(max_rel_diff(got.gw, ref.gw) <= 1e-10);
            auto ref32 = run_stencil<float>(one, {Replicate()}, {}, {Replicate()}, shape, k, mode, boxed);
            auto got32 = run_stencil<float>(mesh, lay.pl, lay.sizes, lay.up, shape, k, mode, boxed);
            CHECK(max_rel_diff(got32.y, ref32.y) <= 1e-5);
            CHECK(max_rel_diff(got32.gx, ref32.gx) <= 1e-5);
            CHECK(max_rel_diff(got32.gw, ref32.gw) <= 1e-5);
          }
    }
  });
}

TEST_CASE("stencil halo plan on the tape: gradients match finite differences", "[autograd][halo][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, P == 4 ? std::vector<int>{2, 2} : std::vector<int>{P, 1});
    const std::vector<Placement> pl = {Shard(0), Shard(1)};
    const Shape<2> shape{6, 5};
    for (Boundary mode : kModes) {
      INFO(fmt::format("P={} mode {}", P, mode));
      auto c = Tensor<double, 2>::empty(shape);
      c.fill_random(7, RandomInit::uniform(0.5, 1.5));
      auto X = DistTensor<double, 2>::random(shape, mesh, pl, 8);
      auto Wt = DistTensor<double, 2>::random({3, 2}, mesh, {Replicate(), Replicate()}, 9);
      auto loss = [&](const DistTensor<double, 2>& xv, const DistTensor<double, 2>& wv) {
        autograd::NoGradGuard ng;
        return square_loss(stencil(Var<double, 2>(xv), Var<double, 2>(wv), mode), c, {Replicate(), Replicate()})
            .local()(0, 0);
      };
      Var<double, 2> x(X, true), w(Wt, true);
      square_loss(stencil(x, w, mode), c, {Replicate(), Replicate()}).backward();
      const auto gx = x.grad().full_tensor(), gw = w.grad().full_tensor();
      const double eps = 1e-5;
      for (index_t lin : {index_t{0}, index_t{13}, index_t{29}}) {  // corners and an inner cell
        const auto gi = unravel(lin, shape);
        auto bump = [&](double e) {
          auto l = X.local().clone();
          const Box b = X.spec().local_box();
          if (gi[0] >= b.lo[0] && gi[0] < b.lo[0] + b.len[0] && gi[1] >= b.lo[1] && gi[1] < b.lo[1] + b.len[1])
            l(gi[0] - b.lo[0], gi[1] - b.lo[1]) += e;
          return DistTensor<double, 2>(X.spec(), l);
        };
        const double fd = (loss(bump(eps), Wt) - loss(bump(-eps), Wt)) / (2 * eps);
        CHECK(std::abs(fd - gx.at(gi)) <= 1e-6 * std::max(1.0, std::abs(fd)));
      }
      for (index_t lin = 0; lin < 6; ++lin) {
        const auto wi = unravel(lin, Shape<2>{3, 2});
        auto bump = [&](double e) {
          auto l = Wt.local().clone();
          l.at(wi) += e;
          return DistTensor<double, 2>(Wt.spec(), l);
        };
        const double fd = (loss(X, bump(eps)) - loss(X, bump(-eps))) / (2 * eps);
        CHECK(std::abs(fd - gw.at(wi)) <= 1e-6 * std::max(1.0, std::abs(fd)));
      }
    }
  });
}

TEST_CASE("a stencil node on the halo plan is one node; bad halos and bad gradient shapes throw on every rank", "[autograd][halo][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm);
    Var<double, 2> x(DistTensor<double, 2>::random({5, 4}, mesh, {Shard(0)}, 1), true);
    Var<double, 2> w(DistTensor<double, 2>::random({3, 3}, mesh, {Replicate()}, 2), true);
    auto y = stencil(x, w, Boundary::zero);
    REQUIRE(y.node() != nullptr);
    CHECK(y.node()->name == "stencil");
    CHECK(y.node()->parents.empty());  // both inputs are leaves: one node, no hidden intermediates
    {
      autograd::NoGradGuard ng;
      CHECK(stencil(x, w, Boundary::zero).is_leaf());
    }
    // A kernel wider than the global extent: the halo is refused in the forward on every rank.
    Var<double, 2> wide(DistTensor<double, 2>::random({13, 1}, mesh, {Replicate()}, 2), true);
    CHECK_THAT(error_of([&] { stencil(x, wide, Boundary::periodic); }), ContainsSubstring("wider than the global domain"));
    // A backward that returns a wrongly shaped extended gradient on rank 0 only.
    auto h = same_halo(3, 3, Boundary::reflect);
    auto bad = halo_node<double>(
        x, "bad", h, true,
        [&](const Tensor<double, 2>& ext) { return DistTensor<double, 2>(x.value().spec(), correlate(ext, w.local())); },
        [comm](const DistTensor<double, 2>&, const Tensor<double, 2>& ext) {
          return comm->rank() == 0 ? Tensor<double, 2>::zeros({ext.size(0), ext.size(1) + 1})
                                   : Tensor<double, 2>::zeros(ext.shape());
        });
    std::vector<Placement> rep = {Replicate()};
    auto c = Tensor<double, 2>::full({5, 4}, 1.0);
    auto L = square_loss(bad, c, rep);
    CHECK_THAT(error_of([&] { L.backward(); }), ContainsSubstring("gradient of the extended block has shape"));
  });
}

}  // namespace st_autograd_mpi_comm_ops
