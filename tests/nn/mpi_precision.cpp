// Mixed precision across ranks: a bf16 / f16 U-Net (f32 master parameters, loss in f32) sharded at
// 1..4 ranks over the module oracle's layouts (uneven and empty shards, 2x2 and data x domain
// meshes) gives the single-rank bf16 / f16 run's loss, output, input gradient and parameter
// gradients. Not bitwise: the norm statistics are summed in another
// order across ranks, so an f32 value near a rounding boundary can round to the neighbouring
// bf16 / f16 value; the tolerance is a few units of the dtype's roundoff (see kRel). Also: the
// dynamic loss scaler on a forced overflow, agreed by every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "nn/module_oracle.hpp"
#include "support/mpi_harness.hpp"

namespace st_nn_mpi_precision {

using namespace shard;
using namespace shard::nn;
using namespace shard::test;

namespace {

/// Relative tolerance of the sharded-vs-single-rank comparison: 8 units of roundoff (bf16 2^-8,
/// f16 2^-11). Measured worst relative differences are printed with SHARD_TEST_VERBOSE=1.
template <class L> constexpr double kRel = std::is_same_v<L, bf16> ? 8.0 / 256 : 8.0 / 2048;

template <class L>
void check_lowp_unet(const Shape<4>& shape, double rel = kRel<L>, const char* what = dtype_name(dtype_of<L>)) {
  UNetOptions o{.in_channels = 2, .out_channels = 1, .depth = 2, .base_width = 4, .channel_mult = 2,
                .norm_groups = 2};
  const mod::Builder<L, 4> build = [o](const DeviceMesh& m) { return std::make_shared<UNet<L, 2>>(m, o, 2024); };
  // No Adam step: Adam normalises each gradient element by its own magnitude, so an element whose
  // gradient is near zero moves by about +-lr whatever its sign is; a one-ulp bf16 difference
  // flips such signs (seen: 0.21 relative on the updated values, with every gradient within
  // tolerance). The gradients are what precision and sharding determine.
  const mod::RunOptions ro{.adam_step = false};
  const auto ref = mod::reference<L, 4>(shape, build, ro);
  CHECK(mod::with_grad(ref) == ref.names.size());
  mod::worst_seen() = 0;
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& Lay : mod::layouts<4>(comm->size(), shape)) {
      INFO("layout " << Lay.name << " on " << comm->size() << " ranks, " << dtype_name(dtype_of<L>));
      DeviceMesh mesh(comm, Lay.mesh_shape);
      mod::require_match(mod::run<L, 4>(mesh, Lay, shape, build, ro), ref, rel);
    }
  });
  int wr = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  if (std::getenv("SHARD_TEST_VERBOSE") && wr == 0)
    std::printf("U-Net 2d %s: worst relative difference to single-rank %.3e (tolerance %.3e)\n", what,
                mod::worst_seen(), rel);
}

}  // namespace

TEMPLATE_TEST_CASE("mixed precision: a bf16 / f16 U-Net sharded equals the single-rank run in that dtype",
                   "[precision][nn][mpi]", bf16, f16) {
  check_lowp_unet<TestType>(Shape<4>{2, 2, 20, 16});
}

TEST_CASE("mixed precision: an f32 U-Net under Autocast(bf16) sharded equals the single-rank autocast run",
          "[precision][autocast][nn][mpi]") {
  // conv / channel_linear compute in bf16 on casts recorded on the tape; everything else in f32.
  const Autocast ac(DType::bf16);
  check_lowp_unet<float>(Shape<4>{2, 2, 20, 16}, kRel<bf16>, "f32 under Autocast(bf16)");
}

TEST_CASE("mixed precision: the loss scaler skips an overflowing step on every rank and backs off",
          "[precision][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    // A Linear over a replicated f32 master; the gradient is made to overflow on ONE rank only
    // (rank 0's input is inf): every rank must still skip the step.
    Linear<f16, 2> lin(mesh, 3, 2, true, 7);
    optim::SGD<float> opt(lin.parameters(), {.lr = 0.1});
    optim::LossScaler scaler({.init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 2});
    auto step_with = [&](float v) {
      auto x = DistTensor<f16, 2>::zeros({4, 3}, mesh, {Replicate()});
      x.local().fill(f16(comm->rank() == 0 ? v : 0.5f));
      opt.zero_grad();
      auto y = F::cast<float>(lin(autograd::Var<f16, 2>(x, false)));
      scaler.scale(F::sum(y)).backward();
      return scaler.step(opt);
    };
    // Copies (full_value_host of a replicated parameter may view the live storage).
    auto values = [&] {
      const auto t = lin.parameters()[0]->full_value_host();
      return std::vector<float>(t.data(), t.data() + t.numel());
    };
    const auto before = values();
    CHECK_FALSE(step_with(std::numeric_limits<float>::infinity()));  // skipped everywhere
    CHECK(scaler.scale_value() == 512);
    CHECK(scaler.skipped_steps() == 1);
    const auto after = values();
    CHECK(after == before);  // no update
    CHECK(step_with(0.5f));  // a clean step is taken, with the unscaled gradient: dL/dW = sum_n x = 2,
    const auto w1 = values();  // so W moves by -lr * 2 = -0.2
    REQUIRE(w1.size() == after.size());
    for (std::size_t i = 0; i < w1.size(); ++i) CHECK(std::abs((w1[i] - after[i]) - (-0.2f)) <= 1e-6f);
    CHECK(step_with(0.5f));  // the second clean step in a row grows the scale
    CHECK(scaler.scale_value() == 1024);
    // A scale that collapses throws on every rank.
    optim::LossScaler tiny({.init_scale = 1, .backoff_factor = 0.5, .min_scale = 0.5});
    auto x = DistTensor<f16, 2>::zeros({4, 3}, mesh, {Replicate()});
    x.local().fill(f16(std::numeric_limits<float>::infinity()));
    opt.zero_grad();
    tiny.scale(F::sum(F::cast<float>(lin(autograd::Var<f16, 2>(x, false))))).backward();
    CHECK_FALSE(tiny.step(opt));  // 1 -> 0.5: at min_scale, still allowed
    opt.zero_grad();
    tiny.scale(F::sum(F::cast<float>(lin(autograd::Var<f16, 2>(x, false))))).backward();
    CHECK_THROWS_WITH(tiny.step(opt), Catch::Matchers::ContainsSubstring("collapsed"));
  });
}

}  // namespace st_nn_mpi_precision
