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

using namespace shard;
using namespace shard::test;
using fn::Body;
using fn::Ctx;
using fn::Layout;

namespace {

template <class T> constexpr double attn_tol() { return std::is_same_v<T, double> ? 1e-10 : 1e-4; }

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
/// domain, data x tokens, two mesh dims on one token dim.
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
