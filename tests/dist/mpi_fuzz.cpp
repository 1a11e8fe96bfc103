// Randomized bad-input fuzz (issue 8, scope 8): random meshes (1..5 dims, and up to 40 dims of
// mostly extent 1), tensor shapes (with zero extents), placements (valid and invalid), explicit
// uneven sizes (valid, with empty parts, and invalid), redistribute round trips, conv / pool,
// the norms (every kind, layer over dim 1 and the last dim, affine or not, fused activations,
// residuals), 1-/2-D neighbourhood attention, ring / Ulysses attention (causal, zigzag) over 1
// or 2 token dims, 1-/2-D spectral convolution (the FNO layer: distributed rfftn / irfftn with
// truncated modes), upsample, channel_linear / linear, reductions, broadcasting pointwise ops,
// concat and the mse loss, forward + every gradient. Each case must either
//  - succeed on every rank with the right result (full_tensor equal to the global tensor after
//    every redistribute; the ops' outputs and gradients equal to the unsharded computation
//    within 1e-10, fp64), or
//  - throw shard::Error on every rank (the ranks' outcomes are compared with an allreduce);
// never another exception, a mismatch, or a hang (the case communicators run with the collective
// watchdog on, so a hang aborts with a message instead of waiting for ctest's timeout).
//
// Bounded: stops after SHARDTENSOR_FUZZ_CASES cases (default 3000) or SHARDTENSOR_FUZZ_SECONDS
// seconds (default 25, decided on rank 0 and broadcast). Seeded: SHARDTENSOR_FUZZ_SEED (default
// fixed, so CI is reproducible); each case's draws depend only on (seed, case index), and
// SHARDTENSOR_FUZZ_CASE=k runs only case k. The seed and every failing case are printed.
#include <catch2/catch_test_macros.hpp>

#include <chrono>
#include <cstdlib>
#include <random>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_dist_mpi_fuzz {

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;
using fn::Layout;

namespace {

std::uint64_t env_u64(const char* name, std::uint64_t dflt) {
  const char* e = std::getenv(name);
  return e && *e ? std::strtoull(e, nullptr, 10) : dflt;
}

/// Uniform integer in [lo, hi].
struct Rng {
  std::mt19937_64 g;
  explicit Rng(std::uint64_t seed) : g(seed) {}
  int uni(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(g) < p; }
};

/// A random mesh shape with product p: 1..5 dims, or (1 in 8) 30..40 dims of mostly extent 1.
std::vector<int> random_mesh(Rng& r, int p) {
  const int nd = r.chance(0.125) ? r.uni(30, 40) : r.uni(1, 5);
  std::vector<int> s(static_cast<std::size_t>(nd), 1);
  int rest = p;
  for (int f = 2; f <= rest;) {  // spread the prime factors of p over random dims
    if (rest % f == 0) {
      s[static_cast<std::size_t>(r.uni(0, nd - 1))] *= f;
      rest /= f;
    } else {
      ++f;
    }
  }
  return s;
}

/// A random placement for a rank-R tensor; `bad_ok` allows invalid ones (Shard of a missing dim).
Placement random_placement(Rng& r, int R, bool bad_ok, bool partial_ok) {
  const int k = r.uni(0, 9);
  if (k <= 3) return Replicate();
  if (k <= 7) return Shard(r.uni(0, R - 1));
  if (k == 8 && partial_ok) return Partial(r.chance(0.7) ? ReduceOp::sum : ReduceOp::avg);
  if (bad_ok) return r.chance(0.5) ? Shard(R + r.uni(0, 1)) : Shard(-1);
  return Replicate();
}

/// Random explicit sizes for the sharded dims of `pl` (or none): parts of the right count summing
/// to the extent (some empty); with `bad_ok`, sometimes a wrong sum, a negative or a wrong count.
ShardSizes random_sizes(Rng& r, const std::vector<int>& mesh, const std::vector<Placement>& pl,
                        const std::vector<index_t>& shape, bool bad_ok) {
  if (!r.chance(0.4)) return {};
  ShardSizes s(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    int parts = 1;
    for (std::size_t m = 0; m < pl.size(); ++m)
      if (pl[m].is_shard() && pl[m].dim == static_cast<int>(d)) parts *= mesh[m];
    if (parts == 1 || !r.chance(0.7)) continue;
    std::vector<index_t> v(static_cast<std::size_t>(parts), 0);
    for (index_t i = 0; i < shape[d]; ++i) ++v[static_cast<std::size_t>(r.uni(0, parts - 1))];
    if (bad_ok && r.chance(0.15)) {
      switch (r.uni(0, 2)) {
        case 0: v[0] += 1; break;
        case 1: v.back() = -1 - v.back(); break;
        default: v.push_back(0); break;
      }
    }
    s[d] = v;
  }
  return s;
}

std::string describe_sizes(const ShardSizes& s) { return s.empty() ? "balanced" : fmt::format("{}", s); }

/// Outcome of one case on this rank: 0 ok, 1 shard::Error, 2 another exception.
struct Outcome {
  int code = 0;
  std::string what;
};
template <class F> Outcome attempt(F&& f) {
  try {
    f();
  } catch (const shard::Error& e) {
    return {1, e.what()};
  } catch (const std::exception& e) {
    return {2, e.what()};
  }
  return {};
}

/// Checks that every rank of `comm` had the same outcome class (and none a foreign exception).
/// Returns the agreed code (0 ok, 1 shard::Error).
int agree(Communicator& comm, const Outcome& o, const std::string& desc) {
  int v[2] = {o.code, -o.code};
  comm.allreduce(v, v, 2, DType::i32, ReduceOp::max);
  INFO(desc);
  INFO("this rank: " << (o.code ? o.what : std::string("no error")));
  CHECK(o.code != 2);                 // never anything but shard::Error
  CHECK(v[0] == -v[1]);               // every rank agrees (error on all or on none)
  return v[0] == -v[1] ? o.code : -1;
}

/// Redistribute round trips of a random rank-R tensor on a random mesh.
template <int R>
void redistribute_case(Rng& r, const CommPtr& comm, const std::string& tag, int* errors) {
  const int p = comm->size();
  const auto mesh_shape = random_mesh(r, p);
  std::vector<index_t> shape(R);
  Shape<R> gshape{};
  for (int d = 0; d < R; ++d) gshape[d] = shape[static_cast<std::size_t>(d)] = r.chance(0.1) ? 0 : r.uni(1, 9);
  const int nd = static_cast<int>(mesh_shape.size());
  const bool bad = r.chance(0.3);
  std::vector<std::vector<Placement>> pls;
  std::vector<ShardSizes> szs;
  for (int k = 0; k < 3; ++k) {
    std::vector<Placement> pl;
    for (int m = 0; m < nd; ++m) pl.push_back(random_placement(r, R, bad && r.chance(0.1), k > 0));
    szs.push_back(random_sizes(r, mesh_shape, pl, shape, bad));
    pls.push_back(std::move(pl));
  }
  const std::string desc = fmt::format("{} redistribute: global {} on mesh {} ({} ranks): {} {} -> {} {} -> {} {}", tag,
                                       shape, mesh_shape, p, pls[0], describe_sizes(szs[0]), pls[1],
                                       describe_sizes(szs[1]), pls[2], describe_sizes(szs[2]));
  auto full = Tensor<double, R>::empty(gshape);
  full.fill_random(r.g());
  double err = 0;
  const Outcome o = attempt([&] {
    DeviceMesh mesh(comm, mesh_shape);
    auto cmp = [&](const DistTensor<double, R>& t) {
      const auto got = t.full_tensor();
      SHARD_CHECK(got.shape() == full.shape(), "fuzz", "full_tensor shape {} != {}", got.shape(), full.shape());
      for (index_t i = 0; i < full.numel(); ++i)
        err = std::max(err, std::abs(got.data()[i] - full.data()[i]) / std::max(1.0, std::abs(full.data()[i])));
    };
    auto x = DistTensor<double, R>::distribute(full, mesh, pls[0], -1, szs[0]);
    cmp(x);
    auto y = x.redistribute(pls[1], szs[1]);
    cmp(y);
    auto z = y.redistribute(pls[2], szs[2]);
    cmp(z);
    cmp(z.redistribute(pls[0], szs[0]));  // back
  });
  const int code = agree(*comm, o, desc);
  if (code == 0) {
    INFO(desc);
    CHECK(err <= 1e-13);
  }
  if (code == 1) ++*errors;
  if (code < 0 || (code == 0 && err > 1e-13)) std::fprintf(stderr, "fuzz FAILED: %s\n", desc.c_str());
}

/// The sharded run of `body` against its unsharded run: the same outcome class on every rank;
/// where the sharded run succeeds the unsharded one must too, with the same outputs and gradients
/// within 1e-10 (fp64). A case refused only when sharded is counted (and the first few printed).
/// compare_values false: the outcome classes alone (zigzag attention: a sharded zigzag run holds
/// the tokens in zigzag order, which the oracle's natural-order layout is not; its values are
/// tested in tests/nn/mpi_ring_attention.cpp).
void oracle_case(const CommPtr& comm, const std::vector<int>& mesh_shape, const std::vector<Placement>& act,
                 const ShardSizes& sizes, const Body<double>& body, const std::string& desc, int* errors,
                 int* refused_sharded_only, bool compare_values = true) {
  fn::Result ref;
  const Outcome ro = attempt([&] { ref = fn::reference<double>(body); });
  INFO(desc);
  CHECK(ro.code != 2);
  fn::Result got;
  const Outcome o = attempt([&] {
    DeviceMesh mesh(comm, mesh_shape);
    got = fn::run_case<double>(mesh, Layout{"fuzz", mesh_shape, act, sizes}, body);
  });
  const int code = agree(*comm, o, desc);
  if (code == 1) {
    ++*errors;
    if (ro.code == 0 && ++*refused_sharded_only <= 5 && comm->rank() == 0)
      std::printf("fuzz: refused only when sharded (the unsharded run accepts it): %s\n  -> %s\n", desc.c_str(),
                  o.what.c_str());
  }
  if (code == 0) {
    INFO("unsharded: " << (ro.code ? ro.what : std::string("ok")));
    CHECK(ro.code == 0);
    // A zero extent (a norm of an empty tensor, a sum over one) is valid: an empty output or input
    // gradient, which require_match refuses as vacuous, is compared by size, the rest by value.
    bool empty = false;
    for (const auto* set : {&ref.outputs, &ref.grads})
      for (const auto& v : *set) empty = empty || v.empty();
    if (!compare_values) {
    } else if (ro.code == 0 && empty) {
      CHECK(got.outputs.size() == ref.outputs.size());
      CHECK(got.grads.size() == ref.grads.size());
      for (const auto& [g, e] : {std::pair{&got.outputs, &ref.outputs}, std::pair{&got.grads, &ref.grads}})
        for (std::size_t i = 0; i < std::min(g->size(), e->size()); ++i) {
          const auto& a = (*g)[i];
          const auto& b = (*e)[i];
          CHECK(a.size() == b.size());  // CHECK only: a rank must not leave the collectives alone
          if (a.size() != b.size()) continue;
          double worst = 0, scale = 1;
          for (std::size_t j = 0; j < b.size(); ++j) {
            worst = std::max(worst, std::abs(a[j] - b[j]));
            scale = std::max(scale, std::abs(b[j]));
          }
          CHECK(worst <= 1e-10 * scale);
        }
    } else if (ro.code == 0) {
      fn::require_match(got, ref, 1e-10);
    }
  }
  if (code < 0) std::fprintf(stderr, "fuzz FAILED: %s\n", desc.c_str());
}

/// conv (+ pool) of a random rank-(S+2) activation under a random layout, against the unsharded
/// run of the same body (a case the unsharded run refuses must be refused sharded too).
template <int S>
void window_case(Rng& r, const CommPtr& comm, const std::string& tag, int* errors, int* refused_sharded_only) {
  constexpr int R = S + 2;
  const int p = comm->size();
  const auto mesh_shape = random_mesh(r, p);
  const int nd = static_cast<int>(mesh_shape.size());
  Shape<R> xs{};
  xs[0] = r.uni(1, 2);
  xs[1] = r.uni(1, 3);
  for (int d = 2; d < R; ++d) xs[d] = r.chance(0.05) ? 0 : r.uni(1, 10);
  std::vector<Placement> act;
  for (int m = 0; m < nd; ++m) {
    const int k = r.uni(0, 9);
    if (k <= 2) act.push_back(Replicate());
    else if (k <= 7) act.push_back(Shard(r.uni(2, R - 1)));
    else if (k == 8) act.push_back(Shard(0));
    else act.push_back(r.chance(0.5) ? Shard(1) : Partial());  // C sharded: refused; Partial: resolved
  }
  std::vector<index_t> shape(xs.begin(), xs.end());
  const ShardSizes sizes = random_sizes(r, mesh_shape, act, shape, false);
  // conv parameters
  const index_t groups = xs[1] % 2 == 0 && r.chance(0.3) ? 2 : 1;
  const index_t cout = groups * r.uni(1, 2);
  Shape<R> ws{};
  ws[0] = cout;
  ws[1] = xs[1] / groups;
  F::ConvOptions<S> co;
  co.groups = groups;
  for (int d = 0; d < S; ++d) {
    ws[2 + d] = r.uni(1, 4);
    co.stride[d] = r.uni(1, 2);
    co.dilation[d] = r.chance(0.2) ? 2 : 1;
    co.pad_lo[d] = r.uni(0, 2);
    co.pad_hi[d] = r.chance(0.1) ? -1 : r.uni(0, 2);  // negative padding: refused
    co.padding_mode[d] = static_cast<Boundary>(r.uni(0, 3));
  }
  const bool pool_max = r.chance(0.5);
  PoolParams<S> pp;
  for (int d = 0; d < S; ++d) {
    pp.kernel[d] = r.uni(1, 3);
    pp.stride[d] = r.uni(0, 2);
    pp.pad_lo[d] = r.uni(0, static_cast<int>(pp.kernel[d]) - 1);
    pp.pad_hi[d] = r.chance(0.05) ? pp.kernel[d] : r.uni(0, static_cast<int>(pp.kernel[d]) - 1);  // == kernel: bad
  }
  const bool bias = r.chance(0.5);
  std::vector<int> modes;
  for (auto m : co.padding_mode) modes.push_back(static_cast<int>(m));
  const std::string desc =
      fmt::format("{} conv{}d+{}pool: x {} on mesh {} ({} ranks) as {} {}; weight {} stride {} dilation {} pad {}/{} "
                  "modes {} groups {} bias {}; pool kernel {} stride {} pad {}/{}",
                  tag, S, pool_max ? "max" : "avg", shape, mesh_shape, p, act, describe_sizes(sizes),
                  std::vector<index_t>(ws.begin(), ws.end()), co.stride, co.dilation, co.pad_lo, co.pad_hi,
                  modes, groups, bias, pp.kernel, pp.stride,
                  pp.pad_lo, pp.pad_hi);
  const Body<double> body = [=](Ctx<double>& c) {
    auto x = c.template act<R>(xs);
    auto w = c.template param<R>(ws);
    auto y = bias ? F::conv(x, w, c.template param<1>({cout}), co) : F::conv(x, w, std::nullopt, co);
    c.output(y);
    c.output(pool_max ? F::max_pool(y, pp) : F::avg_pool(y, pp));
  };
  oracle_case(comm, mesh_shape, act, sizes, body, desc, errors, refused_sharded_only);
}

/// A random placement of a rank-R activation: mostly Replicate or Shard of any dim (the dims an
/// op cannot shard included: refused), sometimes Partial.
std::vector<Placement> random_act_placements(Rng& r, int nd, int R) {
  std::vector<Placement> act;
  for (int m = 0; m < nd; ++m) {
    const int k = r.uni(0, 9);
    if (k <= 2) act.push_back(Replicate());
    else if (k <= 8) act.push_back(Shard(r.uni(0, R - 1)));
    else act.push_back(Partial());
  }
  return act;
}

/// A random layout of an activation of global shape `gs` on `mesh_shape`: placements
/// (random_act_placements), the shape as a vector (for the descriptions), explicit sizes or none.
template <int R>
struct RandomLayout {
  std::vector<Placement> act;
  std::vector<index_t> shape;
  ShardSizes sizes;
};
template <int R>
RandomLayout<R> random_layout(Rng& r, const std::vector<int>& mesh_shape, const Shape<R>& gs) {
  RandomLayout<R> l;
  l.act = random_act_placements(r, static_cast<int>(mesh_shape.size()), R);
  l.shape.assign(gs.begin(), gs.end());
  l.sizes = random_sizes(r, mesh_shape, l.act, l.shape, false);
  return l;
}

/// batch / group / instance / layer norm (layer over dim 1 or the last dim: the CPU table's row
/// walk), with or without affine parameters, a fused activation and a residual, of a random
/// [N, C, H, W] activation under a random layout (a sharded normalised dim is refused).
void norm_case(Rng& r, const CommPtr& comm, const std::string& tag, int* errors, int* refused_sharded_only) {
  constexpr int R = 4;
  const int p = comm->size();
  const auto mesh_shape = random_mesh(r, p);
  Shape<R> xs{};
  xs[0] = r.uni(1, 3);
  xs[1] = r.uni(1, 6);
  xs[2] = r.chance(0.05) ? 0 : r.uni(1, 7);
  xs[3] = r.uni(1, 7);
  const auto [act, shape, sizes] = random_layout<R>(r, mesh_shape, xs);
  const int kind = r.uni(0, 4);  // batch, group, instance, layer (dim 1), layer (dim -1)
  const index_t groups = r.chance(0.1) ? r.uni(1, 7) : (xs[1] % 2 == 0 ? 2 : 1);  // sometimes not a divisor
  const index_t pc = kind == 4 ? xs[3] : xs[1];
  const index_t wlen = r.chance(0.05) ? pc + 1 : pc;  // a wrong parameter length: refused
  const bool affine = r.chance(0.6), residual = r.chance(0.3);
  const F::NormAct acts[] = {F::NormAct::none, F::NormAct::gelu, F::NormAct::silu, F::NormAct::relu,
                             F::NormAct::tanh, F::NormAct::gelu_tanh};
  const F::NormAct na = acts[r.uni(0, 5)];
  static const char* kinds[] = {"batch_norm", "group_norm", "instance_norm", "layer_norm(dim 1)", "layer_norm(dim -1)"};
  const std::string desc = fmt::format("{} {}: x {} on mesh {} ({} ranks) as {} {}; groups {} affine {} (length {}) act "
                                       "{} residual {}",
                                       tag, kinds[kind], shape, mesh_shape, p, act, describe_sizes(sizes), groups,
                                       affine, wlen, static_cast<int>(na), residual);
  const Body<double> body = [=](Ctx<double>& c) {
    using V1 = std::optional<autograd::Var<double, 1>>;
    auto x = c.template act<R>(xs);
    std::optional<autograd::Var<double, R>> res;
    if (residual) res = c.template act<R>(xs);
    V1 w, b;
    if (affine) {
      w = c.template param<1>({wlen}, true, RandomInit::uniform(0.5, 1.5));
      b = c.template param<1>({wlen});
    }
    switch (kind) {
      case 0: c.output(F::batch_norm(x, nullptr, nullptr, w, b, true, 0.1, 1e-5, na, res)); break;
      case 1: c.output(F::group_norm(x, groups, w, b, 1e-5, na, res)); break;
      case 2: c.output(F::instance_norm(x, w, b, 1e-5, na, res)); break;
      case 3: c.output(F::layer_norm(x, w, b, 1e-5, 1, na, res)); break;
      default: c.output(F::layer_norm(x, w, b, 1e-5, -1, na, res)); break;
    }
  };
  oracle_case(comm, mesh_shape, act, sizes, body, desc, errors, refused_sharded_only);
}

/// Neighbourhood attention of random [B, S..., H, D] q / k / v (S spatial dims) under a random
/// layout, random windows (sometimes wider than the domain or its periodic span: refused),
/// dilations and periodic dims, D != Dv sometimes.
template <int S>
void nbhd_case(Rng& r, const CommPtr& comm, const std::string& tag, int* errors, int* refused_sharded_only) {
  constexpr int R = S + 3;
  const int p = comm->size();
  const auto mesh_shape = random_mesh(r, p);
  Shape<R> qs{};
  qs[0] = r.uni(1, 2);
  for (int d = 1; d <= S; ++d) qs[d] = r.chance(0.05) ? 0 : r.uni(1, 9);
  qs[S + 1] = r.uni(1, 2);
  qs[S + 2] = r.uni(1, 4);
  Shape<R> vs = qs;
  if (r.chance(0.3)) vs[S + 2] = r.uni(1, 4);
  const auto [act, shape, sizes] = random_layout<R>(r, mesh_shape, qs);
  F::NeighborhoodOptions o;
  for (int d = 0; d < S; ++d) {
    o.window.push_back(r.chance(0.05) ? 0 : r.uni(1, 5));
    o.dilation.push_back(r.chance(0.25) ? 2 : 1);
    o.periodic.push_back(r.chance(0.3));
  }
  const std::string desc =
      fmt::format("{} neighborhood_attention {}-D: q/k {} v {} on mesh {} ({} ranks) as {} {}; window {} dilation {} "
                  "periodic {}",
                  tag, S, shape, std::vector<index_t>(vs.begin(), vs.end()), mesh_shape, p, act, describe_sizes(sizes),
                  o.window, o.dilation, o.periodic);
  const Body<double> body = [=](Ctx<double>& c) {
    auto q = c.template act<R>(qs);
    auto k = c.template act<R>(qs);
    auto v = c.template act<R>(vs);
    c.output(F::neighborhood_attention(q, k, v, o));
  };
  oracle_case(comm, mesh_shape, act, sizes, body, desc, errors, refused_sharded_only);
}

/// Ring or Ulysses attention of random [B, S..., H, D] q / k / v (S token dims) under a random
/// layout (uneven and empty token shards; sharded H / D, Partial, causal on a multi-dim ring and
/// zigzag without its layout are refused), causal or not, D != Dv sometimes.
template <int S>
void attention_case(Rng& r, const CommPtr& comm, const std::string& tag, int* errors, int* refused_sharded_only) {
  constexpr int R = S + 3;
  const int p = comm->size();
  const auto mesh_shape = random_mesh(r, p);
  Shape<R> qs{};
  qs[0] = r.uni(1, 2);
  for (int d = 1; d <= S; ++d) qs[d] = r.chance(0.05) ? 0 : r.uni(1, 7);
  qs[S + 1] = r.uni(1, 4);
  qs[S + 2] = r.uni(1, 4);
  Shape<R> vs = qs;
  if (r.chance(0.3)) vs[S + 2] = r.uni(1, 4);
  const auto [act, shape, sizes] = random_layout<R>(r, mesh_shape, qs);
  const bool ulysses = r.chance(0.4), causal = r.chance(0.4), zigzag = causal && !ulysses && r.chance(0.1);
  const std::string desc = fmt::format("{} {}_attention ({} token dims): q/k {} v {} on mesh {} ({} ranks) as {} {}; "
                                       "causal {} zigzag {}",
                                       tag, ulysses ? "ulysses" : "ring", S, shape,
                                       std::vector<index_t>(vs.begin(), vs.end()), mesh_shape, p, act,
                                       describe_sizes(sizes), causal, zigzag);
  const Body<double> body = [=](Ctx<double>& c) {
    auto q = c.template act<R>(qs);
    auto k = c.template act<R>(qs);
    auto v = c.template act<R>(vs);
    if (ulysses) c.output(F::ulysses_attention(q, k, v, {.causal = causal}));
    else c.output(F::ring_attention(q, k, v, {.causal = causal, .zigzag = zigzag}));
  };
  oracle_case(comm, mesh_shape, act, sizes, body, desc, errors, refused_sharded_only, !zigzag);
}

/// The FNO layer: spectral_conv (rfftn with the spectrum truncated, the spectral multiply by a
/// Replicate W, irfftn back to x's layout) of a random [B, Cin, n...] (S spatial dims) under a
/// random layout (slab and pencil transposes, uneven and empty shards; a sharded channel dim and
/// too many modes are refused).
template <int S>
void spectral_case(Rng& r, const CommPtr& comm, const std::string& tag, int* errors, int* refused_sharded_only) {
  constexpr int R = S + 2;
  const int p = comm->size();
  const auto mesh_shape = random_mesh(r, p);
  Shape<R> xs{};
  xs[0] = r.uni(1, 2);
  xs[1] = r.uni(1, 3);
  for (int d = 2; d < R; ++d) xs[d] = r.uni(2, 9);
  const index_t cout = r.uni(1, 2);
  std::vector<index_t> modes;
  Shape<R + 1> ws{};
  ws[0] = xs[1];
  ws[1] = cout;
  for (int d = 2; d < R; ++d) {
    const bool last = d == R - 1;
    const index_t most = last ? xs[d] / 2 + 1 : xs[d] / 2;
    const index_t m = r.chance(0.05) ? most + 1 : r.uni(1, static_cast<int>(most));  // too many: refused
    modes.push_back(m);
    ws[d] = last ? m : 2 * m;
  }
  ws[R] = 2;
  const auto [act, shape, sizes] = random_layout<R>(r, mesh_shape, xs);
  const std::string desc = fmt::format("{} spectral_conv {}-D: x {} on mesh {} ({} ranks) as {} {}; W {} modes {}", tag,
                                       S, shape, mesh_shape, p, act, describe_sizes(sizes),
                                       std::vector<index_t>(ws.begin(), ws.end()), modes);
  const Body<double> body = [=](Ctx<double>& c) {
    auto x = c.template act<R>(xs);
    auto w = c.template param<R + 1>(ws);
    c.output(F::spectral_conv(x, w, modes));
  };
  oracle_case(comm, mesh_shape, act, sizes, body, desc, errors, refused_sharded_only);
}

/// The remaining layers of the models, one per case, on a random [N, C, H, W] under a random
/// layout: upsample (nearest / linear / cubic, integer factors), channel_linear and linear (a
/// sharded mixed dim is refused), reductions over random dims (Partial results resolved by the
/// oracle), broadcasting pointwise ops with a Replicate [1, C, 1, 1] parameter, concat along a
/// random dim, and the mse loss.
void misc_case(Rng& r, const CommPtr& comm, const std::string& tag, int* errors, int* refused_sharded_only) {
  constexpr int R = 4;
  const int p = comm->size();
  const auto mesh_shape = random_mesh(r, p);
  Shape<R> xs{};
  xs[0] = r.uni(1, 2);
  xs[1] = r.uni(1, 4);
  xs[2] = r.chance(0.05) ? 0 : r.uni(1, 7);
  xs[3] = r.uni(1, 7);
  const auto [act, shape, sizes] = random_layout<R>(r, mesh_shape, xs);
  const int op = r.uni(0, 6);
  const int mode = r.uni(0, 2), cat_dim = r.uni(0, 3);
  const Shape<2> scale{static_cast<index_t>(r.uni(1, 3)), static_cast<index_t>(r.uni(1, 3))};
  const index_t cout = r.uni(1, 3);
  const bool bias = r.chance(0.5);
  std::vector<int> dims;
  for (int d = 0; d < R; ++d)
    if (r.chance(0.4)) dims.push_back(d);
  if (dims.empty()) dims.push_back(r.uni(0, R - 1));
  const int red = r.uni(0, 2);  // sum, mean, max
  static const char* ops[] = {"upsample", "channel_linear", "linear", "reduce", "broadcast", "concat", "mse_loss"};
  const std::string desc = fmt::format("{} {}: x {} on mesh {} ({} ranks) as {} {}; mode {} scale {} cout {} bias {} "
                                       "dims {} reduce {} concat dim {}",
                                       tag, ops[op], shape, mesh_shape, p, act, describe_sizes(sizes), mode,
                                       std::vector<index_t>(scale.begin(), scale.end()), cout, bias, dims, red, cat_dim);
  const Body<double> body = [=](Ctx<double>& c) {
    auto x = c.template act<R>(xs);
    switch (op) {
      case 0: c.output(F::upsample(x, static_cast<ResizeMode>(mode), scale)); break;
      case 1: {
        auto w = c.template param<2>({cout, xs[1]});
        c.output(bias ? F::channel_linear(x, w, c.template param<1>({cout})) : F::channel_linear(x, w));
        break;
      }
      case 2: {
        auto w = c.template param<2>({cout, xs[3]});
        c.output(bias ? F::linear(x, w, c.template param<1>({cout})) : F::linear(x, w));
        break;
      }
      case 3:
        c.output(red == 0 ? F::sum(x, dims) : red == 1 ? F::mean(x, dims) : F::max(x, dims));
        break;
      case 4: {
        auto y = c.template act<R>(xs);
        auto b = c.template param<R>({1, xs[1], 1, 1});
        c.output(F::mul(F::add(x, b), F::sub(y, F::mul(b, b))));
        break;
      }
      case 5: c.output(F::concat(x, c.template act<R>(xs), cat_dim)); break;
      default: c.output(F::mse_loss(x, c.template act<R>(xs))); break;
    }
  };
  oracle_case(comm, mesh_shape, act, sizes, body, desc, errors, refused_sharded_only);
}

}  // namespace

TEST_CASE("fuzz: random meshes, placements, sizes, redistribute, conv/pool, norms, attention: right results or "
          "shard::Error on every rank",
          "[fuzz][mpi]") {
  // In CI it runs with the whole MPI suite (ctest mpi_tests_np1..4); alone: "[fuzz]".
  auto world = MpiComm::world();
  const int W = world->size();
  const std::uint64_t seed = env_u64("SHARDTENSOR_FUZZ_SEED", 20261122);
  const std::uint64_t max_cases = env_u64("SHARDTENSOR_FUZZ_CASES", 3000);
  const double budget = static_cast<double>(env_u64("SHARDTENSOR_FUZZ_SECONDS", 25));
  const char* only = std::getenv("SHARDTENSOR_FUZZ_CASE");
  if (world->rank() == 0)
    std::printf("fuzz: seed %llu (reproduce: SHARDTENSOR_FUZZ_SEED=%llu; one case: SHARDTENSOR_FUZZ_CASE=k), up to %llu "
                "cases or %.0f s at %d ranks\n",
                static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed),
                static_cast<unsigned long long>(max_cases), budget, W);
  // One communicator per size 1..W (ranks >= p sit a case out); watched, so a hang aborts loudly.
  std::vector<CommPtr> comms;
  for (int p = 1; p <= W; ++p) {
    auto c = world->split(world->rank() < p ? 0 : -1, world->rank());
    if (c) c->set_timeout(120);
    comms.push_back(c);
  }
  const auto t0 = std::chrono::steady_clock::now();
  int ran = 0, errors = 0, sharded_only = 0;
  for (std::uint64_t k = only ? std::strtoull(only, nullptr, 10) : 0; k < max_cases; ++k) {
    int go = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < budget ? 1 : 0;
    world->broadcast(&go, 1, DType::i32, 0);
    if (!go) break;
    Rng r(seed * 1000003u + k);
    const int p = r.uni(1, W);
    const int kind = r.uni(0, 11);
    const auto& comm = comms[static_cast<std::size_t>(p - 1)];
    const std::string tag = fmt::format("case {}", k);
    if (comm) {
      switch (kind) {
        case 0: redistribute_case<2>(r, comm, tag, &errors); break;
        case 1: redistribute_case<3>(r, comm, tag, &errors); break;
        case 2: window_case<1>(r, comm, tag, &errors, &sharded_only); break;
        case 3: window_case<2>(r, comm, tag, &errors, &sharded_only); break;
        case 4: norm_case(r, comm, tag, &errors, &sharded_only); break;
        case 5: nbhd_case<1>(r, comm, tag, &errors, &sharded_only); break;
        case 6: nbhd_case<2>(r, comm, tag, &errors, &sharded_only); break;
        case 7: attention_case<1>(r, comm, tag, &errors, &sharded_only); break;
        case 8: attention_case<2>(r, comm, tag, &errors, &sharded_only); break;
        case 9: spectral_case<1>(r, comm, tag, &errors, &sharded_only); break;
        case 10: spectral_case<2>(r, comm, tag, &errors, &sharded_only); break;
        default: misc_case(r, comm, tag, &errors, &sharded_only); break;
      }
    }
    ++ran;
    if (only) break;
  }
  int stats[3] = {ran, errors, sharded_only};
  world->allreduce(stats + 1, stats + 1, 2, DType::i32, ReduceOp::max);
  if (world->rank() == 0)
    std::printf("fuzz: %d cases in %.1f s (seed %llu); %d refused with shard::Error (on every rank), %d of them only "
                "when sharded\n",
                stats[0], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                static_cast<unsigned long long>(seed), stats[1], stats[2]);
  CHECK(ran > 0);
}

}  // namespace st_dist_mpi_fuzz
