// Whole-model MPI tests of MultiheadAttention and the ViT (nn/attention_layers.hpp, nn/vit.hpp):
// forward, MSE loss, backward and one Adam step at 1..4 ranks (H over a 1-D mesh with uneven and
// empty shards, patches straddling shard boundaries; a 2x2 mesh sharding H and W; data x domain
// meshes) give the loss, output, input gradient, every parameter gradient (the sharded positional
// embedding's gathered) and every updated parameter of the single-rank run, for each attention
// form (fp64 <= 1e-10, fp32 <= 1e-4). Also: the positional embedding stays sharded, save / load
// of a sharded parameter round trips, bad input throws on every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <unistd.h>

#include <cstdio>

#include <shardtensor/nn/vit.hpp>

#include "nn/module_oracle.hpp"
#include "support/mpi_harness.hpp"

namespace st_nn_mpi_vit {

using namespace shard;
using namespace shard::nn;
using namespace shard::test;

namespace {

template <class T>
constexpr double attn_tol() {
  return std::is_same_v<T, double> ? 1e-10 : 1e-4;
}

/// MultiheadAttention seen as a module on N, C, spatial... activations (channels_last, attention,
/// channels_first), so the module oracle's layouts and checks apply unchanged.
template <class T, int S>
class TokenAttention : public UnaryModule<T, S + 2> {
 public:
  TokenAttention(const DeviceMesh& mesh, index_t dim, index_t heads, const AttentionOptions& o, std::uint64_t seed) {
    mha_ = this->register_module("mha", std::make_shared<MultiheadAttention<T, S>>(mesh, dim, heads, o, true, seed));
  }
  autograd::Var<T, S + 2> forward(const autograd::Var<T, S + 2>& x) override {
    return F::channels_first(mha_->forward(F::channels_last(x)));
  }

 private:
  std::shared_ptr<MultiheadAttention<T, S>> mha_;
};

template <class T, int R>
void check_layouts(const Shape<R>& shape, const std::function<mod::Builder<T, R>(const mod::Layout&)>& build_for,
                   const char* what) {
  const mod::RunOptions ro{.adam_step = true, .lr = 1e-2};
  const auto ref = mod::reference<T, R>(shape, build_for(mod::reference_layout()), ro);
  CHECK(mod::with_grad(ref) == ref.names.size());
  mod::worst_seen() = 0;
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& L : mod::layouts<R>(comm->size(), shape)) {
      INFO(what << ": layout " << L.name << " on " << comm->size() << " ranks");
      DeviceMesh mesh(comm, L.mesh_shape);
      mod::require_match(mod::run<T, R>(mesh, L, shape, build_for(L), ro), ref, attn_tol<T>());
    }
  });
  int wr = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  if (std::getenv("SHARD_TEST_VERBOSE") && world_size() > 1 && wr == 0)
    std::printf("%s %s: worst relative difference to single-rank %.3e\n", what, sizeof(T) == 8 ? "fp64" : "fp32",
                mod::worst_seen());
}

template <class T, int S>
void check_mha(const AttentionOptions& o, const Shape<S + 2>& shape, index_t heads, const char* what) {
  check_layouts<T, S + 2>(
      shape,
      [o, shape, heads](const mod::Layout&) -> mod::Builder<T, S + 2> {
        return [o, shape, heads](const DeviceMesh& m) {
          return std::make_shared<TokenAttention<T, S>>(m, shape[1], heads, o, 77);
        };
      },
      what);
}

template <class T, int S>
void check_vit(const ViTOptions& o, const Shape<S + 2>& shape, const char* what) {
  check_layouts<T, S + 2>(
      shape,
      [o](const mod::Layout& L) -> mod::Builder<T, S + 2> {
        return [o, pl = L.act](const DeviceMesh& m) { return std::make_shared<ViT<T, S>>(m, o, pl, 2026); };
      },
      what);
}

AttentionOptions form(AttentionForm f) {
  AttentionOptions a;
  a.form = f;
  if (f == AttentionForm::neighborhood) a.window = {3};
  return a;
}

ViTOptions small_vit(AttentionForm f, std::vector<index_t> field, index_t patch) {
  ViTOptions o;
  o.in_channels = 2;
  o.out_channels = 1;
  o.field = std::move(field);
  o.patch = patch;
  o.dim = 8;
  o.heads = 2;
  o.layers = 2;
  o.mlp_ratio = 2;
  o.attention = form(f);
  return o;
}

/// A file name shared by the ranks of `comm` and unique to this run.
std::string shared_path(const CommPtr& comm, const char* what) {
  double token = static_cast<double>(::getpid());
  comm->broadcast(&token, 1, DType::f64, 0);
  return fmt::format("/tmp/shardtensor_{}_{}_{}.bin", what, static_cast<long>(token), comm->size());
}

}  // namespace

TEMPLATE_TEST_CASE("MultiheadAttention forward, gradients and an Adam step equal single-rank", "[nn][vit][mha][mpi]",
                   float, double) {
  const Shape<4> s{2, 8, 7, 5};  // 35 tokens per sample, 8 channels
  SECTION("ring") { check_mha<TestType, 2>(form(AttentionForm::ring), s, 2, "MHA ring"); }
  SECTION("ring, causal") {
    auto o = form(AttentionForm::ring);
    o.causal = true;
    check_mha<TestType, 1>(o, Shape<3>{2, 8, 11}, 2, "MHA ring causal 1-D");
  }
  SECTION("ulysses") { check_mha<TestType, 2>(form(AttentionForm::ulysses), s, 2, "MHA ulysses"); }
  SECTION("neighborhood, odd window") { check_mha<TestType, 2>(form(AttentionForm::neighborhood), s, 4, "MHA nbhd 3"); }
  SECTION("neighborhood, even window, dilation, periodic") {
    auto o = form(AttentionForm::neighborhood);
    o.window = {4, 2};
    o.dilation = {1, 2};
    o.periodic = {true, false};
    check_mha<TestType, 2>(o, s, 2, "MHA nbhd 4x2");
  }
}

TEMPLATE_TEST_CASE("whole model: 2-D ViT forward, backward and an Adam step equal single-rank", "[nn][vit][mpi]",
                   float, double) {
  // 16 x 12 field, 4 x 4 patches: 4 x 3 tokens; at 3 ranks the shard boundaries (rows 6, 11) cut
  // patches, so the patch conv reads halos and some ranks own one token row.
  const Shape<4> s{2, 2, 16, 12};
  SECTION("ring") { check_vit<TestType, 2>(small_vit(AttentionForm::ring, {16, 12}, 4), s, "ViT ring"); }
  SECTION("ulysses") { check_vit<TestType, 2>(small_vit(AttentionForm::ulysses, {16, 12}, 4), s, "ViT ulysses"); }
  SECTION("neighborhood") {
    check_vit<TestType, 2>(small_vit(AttentionForm::neighborhood, {16, 12}, 4), s, "ViT neighborhood");
  }
}

TEMPLATE_TEST_CASE("whole model: 3-D ViT equals single-rank", "[nn][vit][mpi]", float, double) {
  const Shape<5> s{1, 2, 8, 6, 4};  // 2 x 2 patches: 4 x 3 x 2 tokens
  SECTION("ring") { check_vit<TestType, 3>(small_vit(AttentionForm::ring, {8, 6, 4}, 2), s, "ViT3d ring"); }
  SECTION("neighborhood") {
    auto o = small_vit(AttentionForm::neighborhood, {8, 6, 4}, 2);
    o.attention.window = {3, 2, 2};  // a zero-boundary window may not exceed the token grid (4 x 3 x 2)
    check_vit<TestType, 3>(o, s, "ViT3d neighborhood");
  }
}

TEST_CASE("ViT positional embedding is sharded like the tokens; save / load round trips", "[nn][vit][mpi]") {
  const ViTOptions o = small_vit(AttentionForm::ring, {16, 12}, 4);
  DeviceMesh m1(std::make_shared<SelfComm>(), {1});
  ViT2d<double> ref(m1, o, {Replicate()}, 1);
  for_each_comm_size([&](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, {P});
    ViT2d<double> a(mesh, o, {Shard(2)}, 1), b(mesh, o, {Shard(2)}, 2);
    const auto& pos = a.pos_embedding();
    CHECK(pos.value().placements() == std::vector<Placement>{Shard(1)});
    CHECK(pos.value().global_shape() == Shape<4>{1, 4, 3, 8});
    if (P > 1) CHECK(pos.local().numel() < numel(pos.value().global_shape()));
    // One training step: the embedding's gradient arrives sharded like its value.
    autograd::Var<double, 4> x(DistTensor<double, 4>::random({2, 2, 16, 12}, mesh, {Shard(2)}, 5), false);
    F::mean(F::square(a(x))).backward();
    REQUIRE(pos.has_grad());
    CHECK(pos.grad().spec() == pos.value().spec());
    const std::string path = shared_path(comm, "vit");
    a.save(path);
    b.load(path);
    comm->barrier();
    if (comm->rank() == 0) std::remove(path.c_str());
    auto pa = a.named_parameters(), pb = b.named_parameters(), pr = ref.named_parameters();
    REQUIRE(pa.size() == pr.size());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i].name);
      CHECK(mod::flatten(pb[i].param->value_flat()) == mod::flatten(pa[i].param->value_flat()));
      CHECK(mod::flatten(pb[i].param->full_value_host()) == mod::flatten(pr[i].param->full_value_host()));
    }
  });
}

TEST_CASE("ViT and MultiheadAttention refuse bad input on every rank", "[nn][vit][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    const std::vector<Placement> pl{Shard(2)};
    auto o = small_vit(AttentionForm::ring, {16, 12}, 4);
    {
      auto bad = o;
      bad.patch = 5;  // does not divide 16 x 12
      CHECK_THROWS_AS(ViT2d<double>(mesh, bad, pl), shard::Error);
      bad = o;
      bad.heads = 3;  // 8 % 3
      CHECK_THROWS_AS(ViT2d<double>(mesh, bad, pl), shard::Error);
      bad = o;
      bad.attention.form = AttentionForm::neighborhood;  // no window
      CHECK_THROWS_AS(ViT2d<double>(mesh, bad, pl), shard::Error);
      CHECK_THROWS_AS(ViT2d<double>(mesh, o, {Shard(1)}), shard::Error);  // channels sharded
    }
    ViT2d<double> net(mesh, o, pl, 3);
    autograd::Var<double, 4> wrong_extent(DistTensor<double, 4>::random({1, 2, 16, 8}, mesh, pl, 1), false);
    CHECK_THROWS_AS(net(wrong_extent), shard::Error);
    autograd::Var<double, 4> wrong_pl(DistTensor<double, 4>::random({1, 2, 16, 12}, mesh, {Shard(3)}, 1), false);
    CHECK_THROWS_AS(net(wrong_pl), shard::Error);
    AttentionOptions causal_nb = form(AttentionForm::neighborhood);
    causal_nb.causal = true;
    auto make_causal_nb = [&] { return MultiheadAttention<double, 2>(mesh, 8, 2, causal_nb); };
    CHECK_THROWS_AS(make_causal_nb(), shard::Error);
    autograd::Var<double, 4> ok(DistTensor<double, 4>::random({1, 2, 16, 12}, mesh, pl, 1), true);
    CHECK_NOTHROW(F::mean(net(ok)).backward());  // still works afterwards
  });
}

}  // namespace st_nn_mpi_vit
