// MPI tests of ring attention and all-to-all (Ulysses) attention: forward and every gradient (dq,
// dk, dv) equal the unsharded computation (one rank, SelfComm) at 1..4 ranks, on 1-D and 2-D
// meshes, uneven and empty shards, 1-D and 2-D token domains, data x domain meshes, the variants
// (replicated q, replicated k/v), cross attention (other q length, other v head dim), causal with
// contiguous and zigzag layouts; fp64 <= 1e-10, fp32 <= 1e-4; fp64 finite differences; bad input
// failing on every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include "support/mpi_harness.hpp"
#define SHARD_FN_ORACLE_MPI
#include "nn/functional_oracle.hpp"

namespace st_nn_mpi_ring_attention {

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;
using fn::Layout;
using fn::attn_tol;

namespace {

enum class Form { ring, ulysses };
enum class Variant { both, q_replicated, kv_replicated };

/// Placements of `act` with every Shard of a token dim (1..R-3) replaced by Replicate.
std::vector<Placement> without_tokens(std::vector<Placement> pl, int R) {
  for (auto& p : pl)
    if (p.is_shard() && p.dim >= 1 && p.dim <= R - 3) p = Replicate();
  return pl;
}

struct AttnCase {
  index_t B = 2, H = 3, D = 4, Dv = 4;
  Form form = Form::ring;
  Variant variant = Variant::both;
  bool causal = false;
  double scale = 0;
};

/// q [B, Sq..., H, D], k [B, Sk..., H, D], v [B, Sk..., H, Dv].
template <class T, int R>
Body<T> attn_body(AttnCase a, Shape<R> sq, Shape<R> sk) {
  return [a, sq, sk](Ctx<T>& c) {
    Shape<R> qs = sq, ks = sk, vs = sk;
    qs[0] = ks[0] = vs[0] = a.B;
    qs[R - 2] = ks[R - 2] = vs[R - 2] = a.H;
    qs[R - 1] = ks[R - 1] = a.D;
    vs[R - 1] = a.Dv;
    const auto& act = c.layout().act;
    auto mk = [&](const Shape<R>& s, bool rep_tokens) {
      if (!rep_tokens) return c.template act<R>(s, true, RandomInit::uniform(-1, 1));
      return c.template input<R>(s, without_tokens(act, R), {}, true, RandomInit::uniform(-1, 1));
    };
    auto q = mk(qs, a.variant == Variant::q_replicated);
    auto k = mk(ks, a.variant == Variant::kv_replicated);
    auto v = mk(vs, a.variant == Variant::kv_replicated);
    if (a.form == Form::ring)
      c.output(F::ring_attention(q, k, v, {.scale = a.scale, .causal = a.causal}));
    else
      c.output(F::ulysses_attention(q, k, v, {.scale = a.scale, .causal = a.causal}));
  };
}

/// Token-sharded layouts of [B, S..., H, D] tensors at P ranks (token extents `s`): each token dim
/// on a 1-D mesh, uneven with an empty first shard, and at 2 / 4 ranks 2-D meshes: a 2-D token
/// domain, data x tokens, two mesh dims on one token dim, a replicated mesh dim x tokens.
template <int R>
std::vector<Layout> attn_layouts(int P, const Shape<R>& s, bool causal) {
  std::vector<Layout> out;
  const int last_tok = causal ? 1 : R - 3;  // causal: only the leading token dim may be sharded
  for (int d = 1; d <= last_tok; ++d) out.push_back({fmt::format("1d-Shard({})", d), {P}, {Shard(d)}, {}});
  if (P >= 2 && s[1] >= P - 1) {
    std::vector<index_t> z(static_cast<std::size_t>(P), 0);
    for (int i = 1; i < P; ++i) z[static_cast<std::size_t>(i)] = balanced_size(s[1], P - 1, i - 1);
    ShardSizes sz(static_cast<std::size_t>(R));
    sz[1] = z;
    out.push_back({"1d-Shard(1)-empty-first", {P}, {Shard(1)}, sz});
  }
  if (P == 4) {
    if (R >= 5 && !causal) out.push_back({"2x2-token-domain", {2, 2}, {Shard(1), Shard(2)}, {}});
    out.push_back({"2x2-data-tokens", {2, 2}, {Shard(0), Shard(1)}, {}});
    out.push_back({"2x2-same-dim", {2, 2}, {Shard(1), Shard(1)}, {}});
    out.push_back({"2x2-replica-tokens", {2, 2}, {Replicate(), Shard(1)}, {}});
  }
  if (P == 2) {
    if (R >= 5 && !causal) out.push_back({"1x2-token-domain", {1, 2}, {Shard(1), Shard(2)}, {}});
    out.push_back({"2x1-data-tokens", {2, 1}, {Shard(0), Shard(1)}, {}});
  }
  return out;
}

template <class T, int R>
void check_attention(const Body<T>& body, const Shape<R>& tok_shape, bool causal) {
  const fn::Result ref = fn::reference<T>(body);
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& L : attn_layouts<R>(comm->size(), tok_shape, causal)) {
      INFO("layout " << L.name << " on " << comm->size() << " ranks");
      DeviceMesh mesh(comm, L.mesh_shape);
      fn::require_match(fn::run_case<T>(mesh, L, body), ref, attn_tol<T>());
    }
  });
}

}  // namespace

TEMPLATE_TEST_CASE("ring attention on a 1-D token dim equals the unsharded computation", "[nn][attention][mpi]",
                   float, double) {
  const Shape<4> s{2, 11, 3, 4};
  AttnCase a;
  check_attention<TestType, 4>(attn_body<TestType, 4>(a, s, s), s, false);
  AttnCase cross;  // other query length, other value head dim, explicit scale
  cross.Dv = 5;
  cross.H = 2;
  cross.scale = 0.3;
  check_attention<TestType, 4>(attn_body<TestType, 4>(cross, Shape<4>{2, 6, 2, 4}, s), s, false);
}

TEMPLATE_TEST_CASE("ring attention on a 2-D token domain equals the unsharded computation", "[nn][attention][mpi]",
                   float, double) {
  const Shape<5> s{2, 5, 3, 2, 3};
  AttnCase a;
  a.H = 2;
  a.D = 3;
  a.Dv = 2;
  check_attention<TestType, 5>(attn_body<TestType, 5>(a, s, s), s, false);
}

TEMPLATE_TEST_CASE("ring attention variants: replicated q, replicated k/v", "[nn][attention][mpi]", float, double) {
  const Shape<4> s{2, 9, 3, 4};
  for (Variant var : {Variant::q_replicated, Variant::kv_replicated}) {
    INFO("variant " << static_cast<int>(var));
    AttnCase a;
    a.variant = var;
    check_attention<TestType, 4>(attn_body<TestType, 4>(a, s, s), s, false);
  }
  const Shape<5> s2{2, 4, 3, 3, 4};
  AttnCase a;
  a.variant = Variant::q_replicated;
  check_attention<TestType, 5>(attn_body<TestType, 5>(a, s2, s2), s2, false);
}

TEMPLATE_TEST_CASE("causal ring attention equals the unsharded causal attention", "[nn][attention][mpi]", float,
                   double) {
  const Shape<4> s{2, 13, 3, 4};
  for (Variant var : {Variant::both, Variant::q_replicated, Variant::kv_replicated}) {
    INFO("variant " << static_cast<int>(var));
    AttnCase a;
    a.causal = true;
    a.variant = var;
    check_attention<TestType, 4>(attn_body<TestType, 4>(a, s, s), s, true);
  }
}

TEMPLATE_TEST_CASE("ulysses attention equals the unsharded computation", "[nn][attention][mpi]", float, double) {
  const Shape<4> s{2, 10, 3, 4};
  for (index_t H : {index_t(3), index_t(5), index_t(4)}) {  // 3 and 5 heads do not divide 2 or 4 ranks
    for (bool causal : {false, true}) {
      INFO("heads " << H << " causal " << causal);
      AttnCase a;
      a.form = Form::ulysses;
      a.H = H;
      a.causal = causal;
      check_attention<TestType, 4>(attn_body<TestType, 4>(a, s, s), s, false);
    }
  }
  const Shape<5> s2{2, 4, 3, 3, 4};
  AttnCase a;
  a.form = Form::ulysses;
  a.H = 3;
  a.Dv = 2;
  a.causal = true;  // whole sequences are local after the all-to-all: causal works on a 2-D domain
  check_attention<TestType, 5>(attn_body<TestType, 5>(a, s2, s2), s2, false);
}

TEST_CASE("ring and ulysses attention gradients match finite differences", "[nn][attention][fd][mpi]") {
  const Shape<4> s{1, 5, 2, 3};
  for (Form f : {Form::ring, Form::ulysses})
    for (bool causal : {false, true}) {
      AttnCase a;
      a.B = 1;
      a.H = 2;
      a.D = 3;
      a.Dv = 2;
      a.form = f;
      a.causal = causal;
      const auto body = attn_body<double, 4>(a, s, s);
      fn::check_finite_differences(DeviceMesh(std::make_shared<SelfComm>(), {1}), fn::reference_layout(), body);
      for_each_comm_size(
          [&](CommPtr comm) {
            for (const auto& L : attn_layouts<4>(comm->size(), s, true))
              if (L.name == "1d-Shard(1)" || L.name == "2x2-same-dim")
                fn::check_finite_differences(DeviceMesh(comm, L.mesh_shape), L, body);
          },
          world_size());
    }
}

namespace {

/// t with its token dim (1) permuted: out[:, i] = t[:, order[i]] (inverse: out[:, order[i]] = t[:, i]).
template <class T>
Tensor<T, 4> permute_tokens(const Tensor<T, 4>& t, const std::vector<index_t>& order, bool inverse) {
  auto src = t.contiguous();
  auto out = Tensor<T, 4>::empty(src.shape());
  const index_t B = src.size(0), N = src.size(1), row = src.size(2) * src.size(3);
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < N; ++i) {
      const index_t from = inverse ? i : order[static_cast<std::size_t>(i)];
      const index_t to = inverse ? order[static_cast<std::size_t>(i)] : i;
      std::copy_n(src.data() + (b * N + from) * row, row, out.data() + (b * N + to) * row);
    }
  return out;
}

/// Causal attention of full q, k, v on `mesh` (zigzag layout of `ring` ranks when zigzag), loss
/// sum(out * w); returns out and dq, dk, dv as full tensors in natural token order.
template <class T>
std::vector<Tensor<T, 4>> causal_run(const DeviceMesh& mesh, std::vector<Placement> pl, int ring, bool zigzag,
                                     const std::vector<Tensor<T, 4>>& full) {
  const index_t N = full[0].size(1);
  const auto order = F::zigzag_order(N, ring);
  ShardSizes sz(4);
  if (zigzag) sz[1] = F::zigzag_sizes(N, ring);
  std::vector<autograd::Var<T, 4>> in;
  for (const auto& f : full) {
    auto g = zigzag ? permute_tokens(f, order, false) : f;
    in.emplace_back(DistTensor<T, 4>::distribute(g, mesh, pl, -1, sz), true);
  }
  auto y = F::ring_attention(in[0], in[1], in[2], {.causal = true, .zigzag = zigzag});
  F::resolve(F::sum(F::mul(y, in[3]))).backward();
  std::vector<Tensor<T, 4>> out{y.value().full_tensor(), in[0].grad().full_tensor(), in[1].grad().full_tensor(),
                                in[2].grad().full_tensor()};
  if (zigzag)
    for (auto& o : out) o = permute_tokens(o, order, true);
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("zigzag causal ring attention equals the unsharded causal attention", "[nn][attention][mpi]",
                   float, double) {
  using T = TestType;
  for (index_t N : {index_t(13), index_t(16)}) {
    std::vector<Tensor<T, 4>> full;
    for (int i = 0; i < 4; ++i) {
      auto t = Tensor<T, 4>::empty({2, N, 3, 4});
      t.fill_random(300 + static_cast<std::uint64_t>(i), RandomInit::uniform(-1, 1));
      full.push_back(t);
    }
    const auto ref = causal_run<T>(DeviceMesh(std::make_shared<SelfComm>(), {1}), {Replicate()}, 1, false, full);
    {  // unsharded tokens: the one-rank zigzag order is the identity, so zigzag is plain causal (a model
       // written for a P-rank zigzag ring runs at one rank too; found by tests/dist/mpi_fuzz.cpp)
      const auto one = causal_run<T>(DeviceMesh(std::make_shared<SelfComm>(), {1}), {Replicate()}, 1, true, full);
      for (int i = 0; i < 4; ++i) CHECK(max_rel_diff(one[static_cast<std::size_t>(i)], ref[static_cast<std::size_t>(i)]) == 0.0);
    }
    for_each_comm_size([&](CommPtr comm) {
      const int P = comm->size();
      struct M { std::vector<int> shape; std::vector<Placement> pl; int ring; };
      std::vector<M> meshes{{{P}, {Shard(1)}, P}};
      if (P == 4) {
        meshes.push_back({{2, 2}, {Shard(1), Shard(1)}, 4});
        meshes.push_back({{2, 2}, {Shard(0), Shard(1)}, 2});
      }
      for (const auto& m : meshes) {
        INFO("N " << N << " mesh " << fmt::format("{}", m.shape) << " ring of " << m.ring);
        const auto got = causal_run<T>(DeviceMesh(comm, m.shape), m.pl, m.ring, true, full);
        for (int i = 0; i < 4; ++i) {
          INFO("output/dq/dk/dv #" << i);
          CHECK(max_rel_diff(got[static_cast<std::size_t>(i)], ref[static_cast<std::size_t>(i)]) <= attn_tol<T>());
        }
      }
    });
  }
}

TEST_CASE("ring and ulysses attention refuse bad input on every rank", "[nn][attention][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, {P});
    using V4 = autograd::Var<double, 4>;
    using V5 = autograd::Var<double, 5>;
    auto mk = [&](Shape<4> s, std::vector<Placement> pl, const DeviceMesh& m) {
      return V4(DistTensor<double, 4>::random(s, m, std::move(pl), 3), true);
    };
    const V4 q = mk({2, 9, 3, 4}, {Shard(1)}, mesh), k = mk({2, 9, 3, 4}, {Shard(1)}, mesh);
    const V4 v = mk({2, 9, 3, 5}, {Shard(1)}, mesh);
    const V4 k_h2 = mk({2, 9, 2, 4}, {Shard(1)}, mesh), k_d3 = mk({2, 9, 3, 3}, {Shard(1)}, mesh);
    const V4 k_b3 = mk({3, 9, 3, 4}, {Shard(1)}, mesh), q_heads = mk({2, 9, 3, 4}, {Shard(2)}, mesh);
    const V4 empty = mk({2, 0, 3, 4}, {Shard(1)}, mesh);
    DeviceMesh other(comm, {P});
    const V4 k_other = mk({2, 9, 3, 4}, {Shard(1)}, other);
    auto both = [&](const V4& a, const V4& b, const V4& c) {
      CHECK_THROWS_AS(F::ring_attention(a, b, c), shard::Error);
      CHECK_THROWS_AS(F::ulysses_attention(a, b, c), shard::Error);
    };
    both(q, k_h2, v);       // heads differ
    both(q, k_d3, v);       // q/k head dims differ
    both(q, k_b3, v);       // batch differs
    both(q_heads, k, v);    // sharded heads on input
    both(q, k_other, v);    // different meshes
    both(empty, empty, mk({2, 0, 3, 5}, {Shard(1)}, mesh));  // empty sequence on every rank
    both(q, k, mk({2, 8, 3, 5}, {Shard(1)}, mesh));          // k and v token counts differ
    const std::string msg = error_of([&] { F::ring_attention(q, k_h2, v); });
    CHECK(msg.find("ring_attention") != std::string::npos);
    CHECK(msg.find("head counts differ") != std::string::npos);
    CHECK_THROWS_AS(F::ring_attention(q, k, v, {.zigzag = true}), shard::Error);  // zigzag without causal
    if (P >= 2) {
      both(q, mk({2, 9, 3, 4}, {Shard(0)}, mesh), v);  // k batch-sharded on the token ring's mesh dim
      // zigzag needs the zigzag shard sizes (an empty first shard is not)
      ShardSizes sz(4);
      sz[1] = std::vector<index_t>(static_cast<std::size_t>(P), 0);
      for (int i = 1; i < P; ++i) sz[1][static_cast<std::size_t>(i)] = balanced_size(9, P - 1, i - 1);
      auto mz = [&](index_t d) {
        return V4(DistTensor<double, 4>::random({2, 9, 3, d}, mesh, {Shard(1)}, 3, RandomInit{}, sz), true);
      };
      CHECK_THROWS_AS(F::ring_attention(mz(4), mz(4), mz(5), {.causal = true, .zigzag = true}), shard::Error);
      // causal on a multi-dim spatial ring / a non-leading sharded token dim
      V5 q5(DistTensor<double, 5>::random({1, 3, 4, 2, 2}, mesh, {Shard(2)}, 4), true);
      CHECK_THROWS_AS(F::ring_attention(q5, q5, q5, {.causal = true}), shard::Error);
      CHECK_NOTHROW(F::ring_attention(q5, q5, q5));                   // non-causal is fine
      CHECK_NOTHROW(F::ulysses_attention(q5, q5, q5, {.causal = true}));  // whole sequences after all-to-all
    }
    if (P == 4) {
      DeviceMesh m2(comm, {2, 2});
      V5 q5(DistTensor<double, 5>::random({1, 3, 4, 2, 2}, m2, {Shard(1), Shard(2)}, 4), true);
      const std::string e = error_of([&] { F::ring_attention(q5, q5, q5, {.causal = true}); });
      CHECK(e.find("multi-dim spatial ring") != std::string::npos);
      // q tokens over mesh dim 0, k tokens over mesh dim 1: incompatible
      V5 k5(DistTensor<double, 5>::random({1, 3, 4, 2, 2}, m2, {Replicate(), Shard(2)}, 4), true);
      V5 q5b(DistTensor<double, 5>::random({1, 3, 4, 2, 2}, m2, {Shard(1), Replicate()}, 4), true);
      CHECK_THROWS_AS(F::ring_attention(q5b, k5, k5), shard::Error);
    }
    auto y = F::ring_attention(q, k, v);  // still works afterwards
    CHECK_NOTHROW(F::sum(y).backward());
  });
}

}  // namespace st_nn_mpi_ring_attention
