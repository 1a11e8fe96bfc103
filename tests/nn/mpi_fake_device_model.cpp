// Whole-model and conv tests on a fake CUDA device (tests/support/fake_cuda_backend.hpp: "device"
// memory is host memory, the CPU kernel tables are registered for DeviceKind::cuda). Every tensor
// lives on Device::cuda(0), so every device-dispatch path of nn/ (kernel families looked up by the
// operands' device, scratch allocated on that device, halo exchange and redistribute of device
// blocks, Adam on device parameters) runs on a machine without a GPU:
//   * the 2-D U-Net (avg-pool / nearest+conv and strided-conv / transposed-conv variants) and the
//     3-D U-Net: forward, MSE loss, backward and one Adam step at 1..4 ranks on every layout of
//     mod::layouts equal the single-rank CPU reference (fp64 1e-10, fp32 1e-5);
//   * F::conv / F::conv_transpose with stride, dilation, groups and bias, through the three halo
//     transports of the stencil halo plan (dist/halo_transport.hpp) (thin faces on a 1-D mesh, whole block on a 2x2 mesh,
//     sliced adjoint on a 2x2 mesh with a tiny halo_chunk_bytes): output and the gradients of
//     input, weight and bias on the fake device equal the same run on the host;
//   * operands on different devices: a shard::Error naming the op and both devices.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "exec/tensor_kernels.hpp"
#include "nn/module_oracle.hpp"
#include "support/fake_cuda_backend.hpp"
#include "support/mpi_harness.hpp"
#include "support/point_cloud_pipeline.hpp"

namespace st_nn_mpi_fake_device_model {

using namespace shard;
using namespace shard::nn;
using namespace shard::test;
using autograd::Var;

namespace {

/// The fake backend (with its host "tensor" table) for a scope.
using FakeDevice = FakeCudaBackend;

/// The elements of a local tensor (any device), copied to the host in row-major order.
template <class T, int R>
std::vector<T> host_values(const Tensor<T, R>& x) {
  const auto h = x.contiguous().to(Device::cpu());
  return std::vector<T>(h.data(), h.data() + h.numel());
}

/// For a scope: an MpiComm's device collectives pass device pointers to MPI directly (the fake
/// device's "device" memory is host memory); the previous transport comes back at scope exit,
/// also when a REQUIRE throws. Nothing for other communicators.
class DirectDeviceTransport {
 public:
  explicit DirectDeviceTransport(const CommPtr& c) : mpi_(dynamic_cast<MpiComm*>(c.get())) {
    if (mpi_) {
      before_ = mpi_->device_transport();
      mpi_->set_device_transport(MpiDeviceTransport::direct);
    }
  }
  ~DirectDeviceTransport() {
    if (mpi_) mpi_->set_device_transport(before_);
  }
  DirectDeviceTransport(const DirectDeviceTransport&) = delete;
  DirectDeviceTransport& operator=(const DirectDeviceTransport&) = delete;

 private:
  MpiComm* mpi_;
  MpiDeviceTransport before_ = MpiDeviceTransport::automatic;
};

/// The whole-model check on the fake device against the CPU reference.
template <class T, int S>
void check_unet_on_device(const UNetOptions& o, const Shape<S + 2>& shape) {
  constexpr int R = S + 2;
  const mod::Builder<T, R> build = [o](const DeviceMesh& m) { return std::make_shared<UNet<T, S>>(m, o, 2024); };
  const mod::RunOptions host{.adam_step = true, .lr = 1e-2};
  const auto ref = mod::reference<T, R>(shape, build, host);
  REQUIRE(mod::with_grad(ref) == ref.names.size());
  mod::RunOptions dev = host;
  dev.device = Device::cuda(0);
  FakeDevice fake;
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& L : mod::layouts<R>(comm->size(), shape)) {
      INFO("layout " << L.name << " on " << comm->size() << " ranks, fake cuda:0");
      DeviceMesh mesh(comm, L.mesh_shape);
      mod::require_match(mod::run<T, R>(mesh, L, shape, build, dev), ref, tol<T>());
    }
  });
}

UNetOptions small_2d(Downsample down, Upsample up) {
  return {.in_channels = 2, .out_channels = 1, .depth = 2, .base_width = 4, .channel_mult = 2, .norm_groups = 2,
          .down = down, .up = up};
}

/// Output, input / weight / bias gradients of one conv (or conv_transpose) with an MSE loss, all
/// operands on `dev` (the same random values on every device).
template <class T, int R>
std::vector<std::vector<double>> conv_case(const DeviceMesh& mesh, const std::vector<Placement>& pl,
                                           const Shape<R>& xs, const Shape<R>& ws, bool transpose,
                                           const F::ConvOptions<R - 2>& co, const F::ConvTransposeOptions<R - 2>& to,
                                           Device dev) {
  const std::vector<Placement> rep(static_cast<std::size_t>(mesh.ndim()), Replicate());
  Var<T, R> x(DistTensor<T, R>::random(xs, mesh, pl, 1).to(dev), true);
  Var<T, R> w(DistTensor<T, R>::random(ws, mesh, rep, 2).to(dev), true);
  const index_t cout = transpose ? ws[1] * to.groups : ws[0];
  Var<T, 1> b(DistTensor<T, 1>::random({cout}, mesh, rep, 3).to(dev), true);
  auto y = transpose ? F::conv_transpose(x, w, b, to) : F::conv(x, w, b, co);
  CHECK(y.value().device() == dev);
  Var<T, R> t(DistTensor<T, R>::random(y.value().global_shape(), mesh, y.value().placements(), 4, {},
                                       y.value().spec().sizes())
                  .to(dev),
              false);
  F::mse_loss(y, t).backward();
  REQUIRE(x.has_grad());
  CHECK(x.grad().device() == dev);
  return {mod::flatten(y.value().full_tensor()), mod::flatten(x.grad().full_tensor()),
          mod::flatten(w.grad().full_tensor()), mod::flatten(b.grad().full_tensor())};
}

/// conv_case on the fake device equals conv_case on the host.
template <class T, int R>
void check_conv_device(const DeviceMesh& mesh, const std::vector<Placement>& pl, const Shape<R>& xs,
                       const Shape<R>& ws, bool transpose, const F::ConvOptions<R - 2>& co = {},
                       const F::ConvTransposeOptions<R - 2>& to = {}) {
  const auto host = conv_case<T, R>(mesh, pl, xs, ws, transpose, co, to, Device::cpu());
  std::vector<std::vector<double>> dev;
  {
    FakeDevice fake;
    dev = conv_case<T, R>(mesh, pl, xs, ws, transpose, co, to, Device::cuda(0));
  }
  const char* what[] = {"output", "input gradient", "weight gradient", "bias gradient"};
  for (std::size_t i = 0; i < host.size(); ++i) {
    INFO(what[i] << (transpose ? " of conv_transpose" : " of conv") << " on " << mesh.size() << " ranks");
    CHECK(!host[i].empty());
    CHECK(mod::rel_diff(dev[i], host[i]) <= tol<T>());
  }
}

}  // namespace

TEMPLATE_TEST_CASE("fake device: 2-D U-Net forward, backward and Adam on cuda:0 equal the CPU reference",
                   "[nn][unet][device][mpi]", float, double) {
  SECTION("avg-pool down, nearest + conv up, 20x16") {
    check_unet_on_device<TestType, 2>(small_2d(Downsample::avg_pool, Upsample::nearest_conv), Shape<4>{2, 2, 20, 16});
  }
  SECTION("strided-conv down, transposed-conv up, 20x18") {
    check_unet_on_device<TestType, 2>(small_2d(Downsample::strided_conv, Upsample::transposed_conv),
                                      Shape<4>{2, 2, 20, 18});
  }
}

TEMPLATE_TEST_CASE("fake device: tiny 3-D U-Net on cuda:0 equals the CPU reference", "[nn][unet][device][mpi]",
                   float, double) {
  UNetOptions o{.in_channels = 1, .out_channels = 2, .depth = 2, .base_width = 2, .norm_groups = 2,
                .activation = Activation::gelu};
  check_unet_on_device<TestType, 3>(o, Shape<5>{2, 1, 8, 6, 5});
}

TEMPLATE_TEST_CASE("fake device: conv and conv_transpose (stride, dilation, groups, bias) equal the host",
                   "[nn][conv][device][mpi]", float, double) {
  using T = TestType;
  using O2 = F::ConvOptions<2>;
  using T2 = F::ConvTransposeOptions<2>;
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    // Thin-face transport: one sharded dim (H over a 1-D mesh, uneven 13 rows).
    DeviceMesh m1(comm, {P});
    const std::vector<Placement> h{Shard(2)};
    const Shape<4> xs{2, 4, 13, 11};
    check_conv_device<T, 4>(m1, h, xs, {6, 4, 3, 3}, false, O2::symmetric(1));
    check_conv_device<T, 4>(m1, h, xs, {4, 2, 3, 2}, false, O2::symmetric(1, 2, 1, 2));  // stride 2, groups 2
    check_conv_device<T, 4>(m1, h, xs, {2, 4, 3, 3}, false, O2::symmetric(2, 1, 2));     // dilation 2
    check_conv_device<T, 4>(m1, h, xs, {2, 4, 3, 3}, false, O2::symmetric(1, 1, 1, 1, Boundary::periodic));
    check_conv_device<T, 4>(m1, h, xs, {4, 3, 3, 3}, true, {}, T2::symmetric(1, 2, 1, 1, 1));  // stride 2, op 1
    check_conv_device<T, 4>(m1, h, xs, {4, 1, 2, 2}, true, {}, T2::symmetric(0, 2, 1, 2));     // groups 2
    if (P == 4) {
      // Whole-block transport: two sharded dims (2x2 mesh, corners).
      DeviceMesh m2(comm, {2, 2});
      const std::vector<Placement> hw{Shard(2), Shard(3)};
      check_conv_device<T, 4>(m2, hw, xs, {3, 4, 3, 3}, false, O2::symmetric(1));
      check_conv_device<T, 4>(m2, hw, xs, {4, 2, 3, 3}, false, O2::symmetric(2, 2, 2, 2));
      check_conv_device<T, 4>(m2, hw, xs, {4, 3, 3, 3}, true, {}, T2::symmetric(1, 2));
      // Sliced adjoint: D and H sharded, W unsharded and zero-padded, tiny slices.
      auto& st = current_context(Device::cuda(0)).settings();
      const std::size_t keep = st.halo_chunk_bytes;
      st.halo_chunk_bytes = 64;
      check_conv_device<T, 5>(m2, hw, Shape<5>{1, 2, 7, 6, 9}, {2, 2, 3, 3, 3}, false, F::ConvOptions<3>::symmetric(1));
      st.halo_chunk_bytes = keep;
    }
  });
}

TEMPLATE_TEST_CASE("fake device: the point-cloud pipeline on cuda:0 equals the host bit for bit at 1-4 ranks",
                   "[points][device][mpi]", float, double) {
  // partition_by_box, points_to_grid / grid_to_points with their gradients, and knn /
  // radius_neighbors (ring and spatial_halo) on device blocks run the same CPU kernels here, so every
  // value and index list equals the host run's exactly: what this checks is the device branches of
  // the schedules and plans (tests/nn/mpi_cuda_point_cloud.cpp runs the same pipeline on a GPU)
  using T = TestType;
  for_each_comm_size([&](CommPtr c) {
    const int P = c->size();
    const DirectDeviceTransport direct(c);  // "device" memory is host memory
    for (const auto& [shape, pl] : point_cloud::layouts(P))
      for (const auto& opts : point_cloud::grid_options()) {
        INFO("ranks " << P << ", mesh dims " << shape.size() << ", reduce " << int(opts.reduce) << ", weight "
                      << int(opts.weight));
        const DeviceMesh mesh(c, shape);
        const auto h = point_cloud::pipeline<T>(mesh, pl, Device::cpu(), 60, opts);
        point_cloud::Run d;
        {
          FakeDevice fake;
          d = point_cloud::pipeline<T>(mesh, pl, Device::cuda(0), 60, opts);
        }
        REQUIRE(h.values.size() == d.values.size());
        for (std::size_t i = 0; i < h.values.size(); ++i) {
          INFO("value block " << i);
          CHECK(d.values[i] == h.values[i]);
        }
        CHECK(d.indices == h.indices);
      }
  });
}

TEST_CASE("fake device: a U-Net training step makes no host round trip", "[nn][unet][device][mpi]") {
  // Issue 30 scope 4 (no host work in the step): forward, mse loss, backward and an Adam step of a
  // 2-D U-Net on the fake cuda:0 of a one-rank mesh, in the steady state (third step), counted by
  // the fake runtime: no stream synchronisation, no pinned allocation, no copy in either direction
  // (the mse value and its gradient stay on the device). Reading the loss afterwards is the one
  // device -> host copy. A new host round trip anywhere in the step fails this. Two one-rank
  // communicators: SelfComm, and an MpiComm over MPI_COMM_SELF (its device allreduce of the
  // parameter gradients must not stage through the host). Syncs inside a CUDA table are not
  // visible here: the fake device runs the CPU tables.
  for (int which = 0; which < 2; ++which) {
    FakeDevice fake;
    const CommPtr comm = which == 0 ? CommPtr(std::make_shared<SelfComm>()) : CommPtr(std::make_shared<MpiComm>(MPI_COMM_SELF));
    DeviceMesh mesh(comm, {1});
    const Device dev = Device::cuda(0);
    auto model = std::make_shared<UNet<float, 2>>(mesh, small_2d(Downsample::avg_pool, Upsample::nearest_conv), 7);
    model->to(dev);
    optim::Adam<float> adam(model->parameters(), {.lr = 1e-3});
    const auto xs = DistTensor<float, 4>::random({1, 2, 16, 16}, mesh, {Replicate()}, 1).to(dev);
    for (int step = 0; step < 3; ++step) {
      const auto ts = DistTensor<float, 4>::random({1, 1, 16, 16}, mesh, {Replicate()}, 2).to(dev);
      fake.reset_counts();
      Var<float, 4> x(xs, false);
      auto y = model->forward(x);
      auto loss = F::mse_loss(y, Var<float, 4>(ts, false));
      loss.backward();
      adam.step();
      adam.zero_grad();
      auto n = fake.counts();
      INFO("comm " << (which == 0 ? "SelfComm" : "MpiComm(MPI_COMM_SELF)") << ", step " << step << ": d2h " << n.d2h
                   << ", h2d " << n.h2d << ", syncs " << n.syncs << ", pinned " << n.pinned_allocs);
      if (step < 2) continue;
      CHECK(n.d2h == 0);
      CHECK(n.h2d == 0);
      CHECK(n.syncs == 0);
      CHECK(n.pinned_allocs == 0);
      // The logged loss is the one value that reaches the host, and it is the loss.
      const float v = loss.value().local().to(Device::cpu()).data()[0];
      n = fake.counts();
      CHECK(n.d2h == 1);
      CHECK(std::isfinite(v));
      CHECK(v > 0.0f);
    }
  }
}

TEMPLATE_TEST_CASE("fake device: mse and rel_l2 losses stay on the device and equal the host bit for bit",
                   "[nn][loss][device][mpi]", float, double) {
  // The loss value, rel_l2's per-sample sums (allreduced on the device) and both backward passes
  // run without a copy to the host; value and gradients equal the host run's exactly (the same
  // CPU tables on host memory): the device branches of the loss schedules, at 1-4 ranks, with the
  // batch and a spatial dim sharded.
  using T = TestType;
  for_each_comm_size([&](CommPtr c) {
    const int P = c->size();
    const DirectDeviceTransport direct(c);  // "device" memory is host memory
    const DeviceMesh mesh(c, {P});
    for (int d : {0, 2}) {
      for (int which = 0; which < 3; ++which) {
        INFO("ranks " << P << ", sharded dim " << d << ", loss " << which);
        auto run = [&](Device dev, FakeDevice* fake) {
          const auto ps = DistTensor<T, 3>::random({P + 1, 3, 2 * P + 3}, mesh, {Shard(d)}, 7).to(dev);
          const auto ts = DistTensor<T, 3>::random({P + 1, 3, 2 * P + 3}, mesh, {Shard(d)}, 8).to(dev);
          Var<T, 3> p(ps, true), t(ts, true);
          if (fake) fake->reset_counts();
          auto loss = which == 0   ? F::mse_loss(p, t)
                      : which == 1 ? F::rel_l2_loss(p, t)
                                   : F::rel_l2_loss(p, t, F::RelL2Mode::global);
          loss.backward();
          if (fake) CHECK(fake->counts().d2h == 0);
          return std::vector<std::vector<T>>{host_values(loss.value().local()), host_values(p.grad().local()),
                                             host_values(t.grad().local())};
        };
        const auto h = run(Device::cpu(), nullptr);
        std::vector<std::vector<T>> dv;
        {
          FakeDevice fake;
          dv = run(Device::cuda(0), &fake);
        }
        CHECK(dv == h);
      }
    }
  });
}

TEMPLATE_TEST_CASE("fake device: every norm keeps its statistics on the device and equals the host bit for bit",
                   "[nn][norm][device][mpi]", float, double) {
  // batch (training with running statistics, whose dW / db ride on the statistics allreduce; then
  // eval from the updated running statistics), group, instance and layer norm, affine, forward and
  // backward, with the batch or a spatial dim sharded at 1-4 ranks: on the fake cuda:0 the
  // statistics live in "device" memory, are summed by the device allreduce and finished by
  // exec::norm_finish; nothing is copied to the host, and every value, gradient and running
  // statistic equals the host run's exactly.
  using T = TestType;
  for_each_comm_size([&](CommPtr c) {
    const int P = c->size();
    const DirectDeviceTransport direct(c);  // "device" memory is host memory
    const DeviceMesh mesh(c, {P});
    for (int d : {0, 2}) {
      for (int kind = 0; kind < 5; ++kind) {  // batch train, batch eval, group, instance, layer
        INFO("ranks " << P << ", sharded dim " << d << ", norm " << kind);
        auto run = [&](Device dev, FakeDevice* fake) {
          const Shape<4> gs{P + 1, 4, 2 * P + 3, 5};
          const auto xs = DistTensor<T, 4>::random(gs, mesh, {Shard(d)}, 11).to(dev);
          const auto ws = DistTensor<T, 1>::random({4}, mesh, {Replicate()}, 12).to(dev);
          const auto bs = DistTensor<T, 1>::random({4}, mesh, {Replicate()}, 13).to(dev);
          const auto gy = DistTensor<T, 4>::random(gs, mesh, {Shard(d)}, 14).to(dev);
          auto rm = DistTensor<T, 1>::random({4}, mesh, {Replicate()}, 15).to(dev);
          auto rv = DistTensor<T, 1>::random({4}, mesh, {Replicate()}, 16, RandomInit::uniform(0.5, 1.5)).to(dev);
          Var<T, 4> x(xs, true);
          Var<T, 1> w(ws, true), b(bs, true);
          if (fake) fake->reset_counts();
          Var<T, 4> y = kind <= 1 ? F::batch_norm(x, &rm, &rv, w, b, kind == 0)
                        : kind == 2 ? F::group_norm(x, 2, w, b)
                        : kind == 3 ? F::instance_norm(x, w, b)
                                    : F::layer_norm(x, w, b);
          F::sum(F::mul(y, Var<T, 4>(gy, false))).backward();
          if (fake) CHECK(fake->counts().d2h == 0);
          return std::vector<std::vector<T>>{host_values(y.value().local()), host_values(x.grad().local()),
                                             host_values(w.grad().local()), host_values(b.grad().local()),
                                             host_values(rm.local()), host_values(rv.local())};
        };
        const auto h = run(Device::cpu(), nullptr);
        std::vector<std::vector<T>> dv;
        {
          FakeDevice fake;
          dv = run(Device::cuda(0), &fake);
        }
        REQUIRE(dv.size() == h.size());
        for (std::size_t i = 0; i < h.size(); ++i) {
          INFO("result " << i << " (y, dx, dw, db, running mean, running var)");
          CHECK(dv[i] == h[i]);
        }
      }
    }
  });
}

TEMPLATE_TEST_CASE("fake device: norms fused with their activation (and a residual) equal the separate ops on the "
                   "host bit for bit",
                   "[nn][norm][fused][device][mpi]", float, double) {
  // On CUDA tensors models fuse each norm with the activation after it (nn::fused_norm_act_on):
  // Sequential's norm + activation-module pairs (GELU's tanh form included) and ResidualBlock's
  // two norms (the second with the skip add). On the fake cuda:0 (the CPU tables) the fused ops
  // must equal the host's separate ops exactly, values and every gradient, at 1-4 ranks; the
  // fused tape has one node where the host has two.
  using T = TestType;
  for_each_comm_size([&](CommPtr c) {
    const int P = c->size();
    const DirectDeviceTransport direct(c);
    const DeviceMesh mesh(c, {P});
    std::string last;  // the tape node that made the output
    auto run = [&](Device dev) {
      nn::Sequential<T, 4> seq;
      seq.add(std::make_shared<nn::GroupNorm<T, 4>>(mesh, 2, 4));
      seq.add(std::make_shared<nn::SiLU<T, 4>>());
      seq.add(std::make_shared<nn::LayerNorm<T, 4>>(mesh, 4));
      seq.add(std::make_shared<nn::GELU<T, 4>>(F::GeluApprox::tanh));
      seq.add(std::make_shared<nn::InstanceNorm<T, 4>>(mesh, 4, 1e-5, true));
      seq.add(std::make_shared<nn::Identity<T, 4>>());
      nn::ResidualBlock<T, 2> block(mesh, 4, 4);
      seq.to(dev);
      block.to(dev);
      const Shape<4> gs{2, 4, 2 * P + 3, 5};
      Var<T, 4> x(DistTensor<T, 4>::random(gs, mesh, {Shard(2)}, 21).to(dev), true);
      Var<T, 4> y = block.forward(seq.forward(x));
      last = y.node()->name;
      const auto gy = DistTensor<T, 4>::random(gs, mesh, y.value().placements(), 22, {}, y.value().spec().sizes());
      F::sum(F::mul(y, Var<T, 4>(gy.to(dev), false))).backward();
      std::vector<std::vector<T>> out{host_values(y.value().local()), host_values(x.grad().local())};
      for (auto* m : {static_cast<nn::Module<T>*>(&seq), static_cast<nn::Module<T>*>(&block)})
        for (auto& p : m->parameters()) {
          const auto g = p->grad_flat();
          REQUIRE(g.numel() > 0);  // every parameter gets a gradient
          out.push_back(host_values(g));
        }
      return out;
    };
    const auto h = run(Device::cpu());
    const std::string host_last = last;
    std::vector<std::vector<T>> dv;
    {
      FakeDevice fake;
      dv = run(Device::cuda(0));
    }
    // The block's last op: the activation on the host (unless SHARDTENSOR_FUSED_NORM_ACT=1), the
    // fused norm on the device (unless =0).
    CHECK(host_last == (nn::fused_norm_act_on(Device::cpu()) ? "group_norm" : "silu"));
    CHECK(last == (nn::fused_norm_act_on(Device::cuda(0)) ? "group_norm" : "silu"));
    REQUIRE(dv.size() == h.size());
    for (std::size_t i = 0; i < h.size(); ++i) {
      INFO("ranks " << P << ", result " << i << " (y, dx, then the parameters' gradients)");
      CHECK(dv[i] == h[i]);
    }
  });
}

TEST_CASE("fake device: a norm whose ranks disagree gives NaN on every rank without a host read",
          "[nn][norm][device][mpi][consistency]") {
  // On a device the norms' statistics allreduce carries the cheap check's two values in device
  // memory and exec::norm_finish verifies them (no host read, no sync): ranks that disagree on the
  // call's arguments (here eps on rank 0) get NaN statistics, hence NaN outputs and gradients, on
  // every rank. (On the host the same call raises shard::Error: tests/dist/mpi_cheap_checks.cpp.)
  FakeDevice fake;
  for_each_comm_size([&](CommPtr c) {
    if (c->size() < 2) return;
    const DirectDeviceTransport direct(c);  // "device" memory is host memory
    const DeviceMesh mesh(c, {c->size()});
    const auto xs = DistTensor<double, 4>::random({2, 4, 4 * c->size() + 1, 5}, mesh, {Shard(2)}, 5).to(Device::cuda(0));
    for (bool agree : {true, false}) {
      INFO("ranks " << c->size() << (agree ? ", agreeing" : ", rank 0 with another eps"));
      Var<double, 4> x(xs, true);
      const double eps = agree || c->rank() != 0 ? 1e-5 : 1e-3;
      const auto zero = DistTensor<double, 4>::zeros(xs.global_shape(), mesh, {Shard(2)}).to(Device::cuda(0));
      fake.reset_counts();
      auto y = F::group_norm(x, 2, std::nullopt, std::nullopt, eps);
      F::mse_loss(y, Var<double, 4>(zero, false)).backward();
      // Nothing read back to decide (MPI's direct transport still waits for the stream before
      // each call; NCCL would not).
      CHECK(fake.counts().d2h == 0);
      const auto yh = y.value().local().to(Device::cpu()), gh = x.grad().local().to(Device::cpu());
      index_t nan_y = 0, nan_g = 0;
      for (index_t i = 0; i < yh.numel(); ++i) nan_y += std::isnan(yh.data()[i]) ? 1 : 0;
      for (index_t i = 0; i < gh.numel(); ++i) nan_g += std::isnan(gh.data()[i]) ? 1 : 0;
      CHECK(nan_y == (agree ? 0 : yh.numel()));
      CHECK(nan_g == (agree ? 0 : gh.numel()));
    }
  });
}

TEST_CASE("fake device: conv operands on different devices are refused on every rank", "[nn][conv][device][mpi]") {
  FakeDevice fake;
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    Var<double, 4> x(DistTensor<double, 4>::random({1, 2, 8, 8}, mesh, {Shard(2)}, 1).to(Device::cuda(0)), true);
    Var<double, 4> w(DistTensor<double, 4>::random({2, 2, 3, 3}, mesh, {Replicate()}, 2), true);
    Var<double, 1> b(DistTensor<double, 1>::random({2}, mesh, {Replicate()}, 3), true);
    using Catch::Matchers::ContainsSubstring;
    CHECK_THROWS_WITH(F::conv2d(x, w, std::nullopt, F::ConvOptions<2>::symmetric(1)),
                      ContainsSubstring("conv2d") && ContainsSubstring("different devices") &&
                          ContainsSubstring("cpu") && ContainsSubstring("cuda"));
    Var<double, 4> wd(w.value().to(Device::cuda(0)), true);
    CHECK_THROWS_WITH(F::conv_transpose2d(x, wd, b, F::ConvTransposeOptions<2>::symmetric(1)),
                      ContainsSubstring("conv_transpose2d") && ContainsSubstring("bias"));
  });
}

}  // namespace st_nn_mpi_fake_device_model
