// Whole-model MPI tests of the U-Net: forward, MSE loss, backward and one Adam step of a 2-D
// (depth 2) and a tiny 3-D U-Net sharded at 1..4 ranks (H over a 1-D mesh with uneven and empty
// shards, 20x18 grids at 3 ranks; a 2x2 mesh sharding H and W; data x domain meshes) give the
// loss, output, input gradient, every parameter gradient and every updated parameter of the
// single-rank run (fp64 <= 1e-10, fp32 <= 1e-5). Also: no collective gathers a field (the
// decoder/skip layouts are aligned by all-to-all), save/load round trips, bad input.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <unistd.h>

#include <cstdio>

#include "nn/model_traffic.hpp"
#include "nn/module_oracle.hpp"
#include "support/mpi_harness.hpp"

namespace st_nn_mpi_unet_model {

using namespace shard;
using namespace shard::nn;
using namespace shard::test;

namespace {

/// The whole-model check for one configuration and input shape.
template <class T, int S>
void check_unet(const UNetOptions& o, const Shape<S + 2>& shape) {
  constexpr int R = S + 2;
  const mod::Builder<T, R> build = [o](const DeviceMesh& m) { return std::make_shared<UNet<T, S>>(m, o, 2024); };
  const mod::RunOptions ro{.adam_step = true, .lr = 1e-2};
  const auto ref = mod::reference<T, R>(shape, build, ro);
  CHECK(mod::with_grad(ref) == ref.names.size());  // GroupNorm U-Net: every parameter is trained
  mod::worst_seen() = 0;
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& L : mod::layouts<R>(comm->size(), shape)) {
      INFO("layout " << L.name << " on " << comm->size() << " ranks");
      DeviceMesh mesh(comm, L.mesh_shape);
      mod::require_match(mod::run<T, R>(mesh, L, shape, build, ro), ref, tol<T>());
    }
  });
  int wr = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  if (std::getenv("SHARD_TEST_VERBOSE") && world_size() > 1 && wr == 0)
    std::printf("U-Net %dd %s, %zu parameter tensors: worst relative difference to single-rank %.3e\n", S,
                sizeof(T) == 8 ? "fp64" : "fp32", ref.names.size(), mod::worst_seen());
}

UNetOptions small_2d(Downsample down, Upsample up) {
  return {.in_channels = 2, .out_channels = 1, .depth = 2, .base_width = 4, .channel_mult = 2, .norm_groups = 2,
          .down = down, .up = up};
}

/// A file name shared by the ranks of `comm` and unique to this run.
std::string shared_path(const CommPtr& comm, const char* what) {
  double token = static_cast<double>(::getpid());
  comm->broadcast(&token, 1, DType::f64, 0);
  return fmt::format("/tmp/shardtensor_{}_{}_{}.bin", what, static_cast<long>(token), comm->size());
}

}  // namespace

TEMPLATE_TEST_CASE("whole model: 2-D U-Net forward, backward and an Adam step equal single-rank", "[nn][unet][mpi]",
                   float, double) {
  SECTION("avg-pool down, nearest + conv up, 20x16") {
    check_unet<TestType, 2>(small_2d(Downsample::avg_pool, Upsample::nearest_conv), Shape<4>{2, 2, 20, 16});
  }
  SECTION("strided-conv down, transposed-conv up, 20x18 (odd extents at depth 2)") {
    check_unet<TestType, 2>(small_2d(Downsample::strided_conv, Upsample::transposed_conv), Shape<4>{2, 2, 20, 18});
  }
}

TEMPLATE_TEST_CASE("whole model: tiny 3-D U-Net equals single-rank", "[nn][unet][mpi]", float, double) {
  UNetOptions o{.in_channels = 1, .out_channels = 2, .depth = 2, .base_width = 2, .norm_groups = 2,
                .activation = Activation::gelu};
  check_unet<TestType, 3>(o, Shape<5>{2, 1, 8, 6, 5});
}

TEST_CASE("U-Net forward and backward gather no field; uneven skips are realigned by all-to-all",
          "[nn][unet][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    auto traffic = std::make_shared<TrafficComm>(comm);
    const int P = comm->size();
    for (const auto& shape : {Shape<4>{2, 2, 20, 18}, Shape<4>{1, 2, 16, 16}}) {
      DeviceMesh mesh(traffic, P == 4 ? std::vector<int>{2, 2} : std::vector<int>{P});
      const std::vector<Placement> pl = P == 4 ? std::vector<Placement>{Shard(2), Shard(3)} : std::vector<Placement>{Shard(2)};
      const UNetOptions o = small_2d(Downsample::avg_pool, Upsample::transposed_conv);
      UNet2d<double> net(mesh, o, 7);
      autograd::Var<double, 4> x(DistTensor<double, 4>::random(shape, mesh, pl, 1), true);
      traffic->reset();
      auto y = net(x);
      autograd::Var<double, 4> t(DistTensor<double, 4>::random(y.value().global_shape(), mesh, y.value().placements(),
                                                               2, {}, y.value().spec().sizes()));
      F::mse_loss(y, t).backward();
      INFO(P << " ranks, grid " << shape[2] << "x" << shape[3]);
      // Gather-type collectives only carry flags / sizes (a few bytes); the smallest field is the
      // input, >= 4 KiB here.
      const std::size_t field = static_cast<std::size_t>(numel(shape)) * sizeof(double);
      REQUIRE(field >= 4096);
      for (const char* op : {"allgather", "allgatherv", "broadcast"}) {
        INFO(op << ": " << traffic->calls(op) << " calls");
        CHECK(traffic->max_bytes(op) < 1024);
      }
      // An all-to-all delivers at most this rank's block of a level-0 activation (<= 2 w_0
      // channels at the input's layout, with one extra row of slack per sharded dim).
      const auto xl = x.value().local().shape();
      const std::size_t block = static_cast<std::size_t>(xl[0] * 2 * o.base_width * (xl[2] + 1) * (xl[3] + 1)) * sizeof(double);
      CHECK(traffic->max_bytes("alltoallv") <= block);
      // 20 rows over 3 ranks: 7,7,6 -> pooled 4,3,3 -> 2,2,1; upsampled 4,4,2 and 8,6,6 differ from
      // the skips' 4,3,3 and 7,7,6, so both skip connections realign (forward and backward).
      if (P == 3 && shape[2] == 20) CHECK(traffic->calls("alltoallv") >= 4);
      // 16 rows over 2 ranks (or 2x2): every layout matches, no realignment at all.
      if (shape[2] == 16 && (P == 2 || P == 4)) CHECK(traffic->calls("alltoallv") == 0);
      CHECK(x.has_grad());
    }
  });
}

TEST_CASE("U-Net save / load round trip at every rank count", "[nn][unet][mpi]") {
  const UNetOptions o = small_2d(Downsample::strided_conv, Upsample::nearest_conv);
  DeviceMesh m1(std::make_shared<SelfComm>(), {1});
  UNet2d<double> ref(m1, o, 1);
  for_each_comm_size([&](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    UNet2d<double> a(mesh, o, 1), b(mesh, o, 2);
    const std::string path = shared_path(comm, "unet");
    a.save(path);
    auto pa = a.named_parameters(), pb = b.named_parameters(), pr = ref.named_parameters();
    bool differs = false;
    for (std::size_t i = 0; i < pa.size(); ++i)
      differs = differs || std::vector<double>(pa[i].param->data(), pa[i].param->data() + pa[i].param->numel()) !=
                               std::vector<double>(pb[i].param->data(), pb[i].param->data() + pb[i].param->numel());
    CHECK(differs);
    b.load(path);
    comm->barrier();
    if (comm->rank() == 0) std::remove(path.c_str());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i].name);
      const auto* p = pb[i].param->data();
      CHECK(std::vector<double>(p, p + pb[i].param->numel()) ==
            std::vector<double>(pr[i].param->data(), pr[i].param->data() + pr[i].param->numel()));
    }
    autograd::Var<double, 4> x(DistTensor<double, 4>::random({1, 2, 12, 10}, mesh, {Shard(2)}, 3));
    CHECK(mod::rel_diff(mod::flatten(a(x).value().full_tensor()), mod::flatten(b(x).value().full_tensor())) == 0);
    // A file for another architecture is refused on every rank.
    UNet2d<double> other(mesh, {.in_channels = 2, .depth = 1, .base_width = 4}, 3);
    const std::string p2 = shared_path(comm, "unet_other");
    other.save(p2);
    CHECK_THROWS_AS((b.load(p2)), shard::Error);
    comm->barrier();
    if (comm->rank() == 0) std::remove(p2.c_str());
  });
}

TEST_CASE("U-Net refuses bad input on every rank", "[nn][unet][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    UNet2d<double> net(mesh, small_2d(Downsample::avg_pool, Upsample::nearest_conv), 1);
    using V = autograd::Var<double, 4>;
    V wrong(DistTensor<double, 4>::random({1, 3, 16, 16}, mesh, {Shard(2)}, 1), true);
    CHECK(error_of([&] { net(wrong); }).find("channels") != std::string::npos);
    V tiny(DistTensor<double, 4>::random({1, 2, 16, 3}, mesh, {Shard(2)}, 1), true);
    CHECK_THROWS_AS((net(tiny)), shard::Error);
    V sharded_c(DistTensor<double, 4>::random({1, 2, 16, 16}, mesh, {Shard(1)}, 1), true);
    if (comm->size() > 1) CHECK_THROWS_AS((net(sharded_c)), shard::Error);
    V good(DistTensor<double, 4>::random({1, 2, 16, 16}, mesh, {Shard(2)}, 1), true);
    CHECK_NOTHROW(F::sum(net(good)).backward());
    CHECK(good.has_grad());
  });
}

}  // namespace st_nn_mpi_unet_model
