// MPI tests of the nn modules: each module's sharded forward, input gradient, every parameter
// gradient (and BatchNorm's running statistics) equal the unsharded computation at 1..4 ranks on
// 1-D meshes (H sharded, uneven, an empty shard), a 2x2 mesh sharding H and W, and data x domain
// meshes (N over the data dim); fp64 <= 1e-10 and fp32 <= 1e-5. Mismatched channel counts throw
// shard::Error on every rank.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include "nn/module_oracle.hpp"
#include "support/mpi_harness.hpp"

namespace st_nn_mpi_modules {

using namespace shard;
using namespace shard::nn;
using namespace shard::test;
using mod::Builder;

namespace {

/// Sharded runs of `build` on every layout of every communicator size equal the reference.
template <class T, int R>
void check_module(const Shape<R>& s, const Builder<T, R>& build, bool has_params = true) {
  const auto ref = mod::reference<T, R>(s, build);
  CHECK((mod::with_grad(ref) > 0) == has_params);
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& L : mod::layouts<R>(comm->size(), s)) {
      INFO("layout " << L.name << " on " << comm->size() << " ranks");
      DeviceMesh mesh(comm, L.mesh_shape);
      mod::require_match(mod::run<T, R>(mesh, L, s, build), ref, tol<T>());
    }
  });
}

/// ConvTranspose called with an explicit output size (exercises the output_padding choice).
template <class T, int S>
class SizedTranspose final : public UnaryModule<T, S + 2> {
 public:
  SizedTranspose(std::shared_ptr<ConvTranspose<T, S>> t, Shape<S> scale_num) : scale_(scale_num) {
    t_ = this->register_module("t", std::move(t));
  }
  autograd::Var<T, S + 2> forward(const autograd::Var<T, S + 2>& x) override {
    Shape<S> size{};
    for (int d = 0; d < S; ++d) size[d] = x.value().global_shape()[2 + d] * scale_[d];
    return t_->forward(x, size);
  }

 private:
  std::shared_ptr<ConvTranspose<T, S>> t_;
  Shape<S> scale_;
};

}  // namespace

TEMPLATE_TEST_CASE("Conv, ConvTranspose and Linear modules equal the unsharded computation", "[nn][module][mpi]",
                   float, double) {
  using T = TestType;
  const Shape<4> s{2, 4, 9, 7};
  SECTION("Conv2d 3x3 same, bias") {
    check_module<T, 4>(s, [](const DeviceMesh& m) {
      return std::make_shared<Conv2d<T>>(m, 4, 6, 3, F::ConvOptions<2>::same({3, 3}), true, 1);
    });
  }
  SECTION("Conv2d even kernel, stride, dilation, groups, reflect / periodic padding") {
    check_module<T, 4>(s, [](const DeviceMesh& m) {
      F::ConvOptions<2> o;
      o.stride = {2, 1};
      o.dilation = {1, 2};
      o.pad_lo = {1, 2};
      o.pad_hi = {2, 2};
      o.groups = 2;
      o.padding_mode = {Boundary::reflect, Boundary::periodic};
      return std::make_shared<Conv2d<T>>(m, 4, 6, Shape<2>{4, 3}, o, true, 2);
    });
  }
  SECTION("ConvTranspose2d stride 2 to an explicit output size") {
    check_module<T, 4>(s, [](const DeviceMesh& m) {
      auto t = std::make_shared<ConvTranspose2d<T>>(m, 4, 6, 3, F::ConvTransposeOptions<2>::symmetric(1, 2, 1, 2), true, 3);
      return std::make_shared<SizedTranspose<T, 2>>(t, Shape<2>{2, 2});
    });
  }
  SECTION("Linear (1x1 channel mixing)") {
    check_module<T, 4>(s, [](const DeviceMesh& m) { return std::make_shared<Linear<T, 4>>(m, 4, 5, true, 4); });
  }
  SECTION("Conv1d and Conv3d, ConvTranspose3d") {
    check_module<T, 3>(Shape<3>{2, 3, 11}, [](const DeviceMesh& m) {
      return std::make_shared<Conv1d<T>>(m, 3, 2, 4, F::ConvOptions<1>::same({4}, 1, Boundary::replicate), false, 5);
    });
    const Shape<5> s3{2, 2, 5, 6, 4};
    check_module<T, 5>(s3, [](const DeviceMesh& m) {
      return std::make_shared<Conv3d<T>>(m, 2, 3, 3, F::ConvOptions<3>::same({3, 3, 3}), true, 6);
    });
    check_module<T, 5>(s3, [](const DeviceMesh& m) {
      return std::make_shared<ConvTranspose3d<T>>(m, 2, 3, 2, F::ConvTransposeOptions<3>::symmetric(0, 2), true, 7);
    });
  }
}

TEMPLATE_TEST_CASE("norm and activation modules equal the unsharded computation", "[nn][module][mpi]", float,
                   double) {
  using T = TestType;
  const Shape<4> s{2, 4, 9, 7};
  SECTION("BatchNorm, training (running statistics compared as buffers)") {
    check_module<T, 4>(s, [](const DeviceMesh& m) { return std::make_shared<BatchNorm<T, 4>>(m, 4, 1e-5, 0.3); });
  }
  SECTION("BatchNorm, eval mode after a training pass") {
    check_module<T, 4>(s, [](const DeviceMesh& m) {
      auto bn = std::make_shared<BatchNorm<T, 4>>(m, 4, 1e-5, 0.5);
      {
        autograd::NoGradGuard ng;
        std::vector<Placement> rep(static_cast<std::size_t>(m.ndim()), Replicate());
        bn->forward(autograd::Var<T, 4>(DistTensor<T, 4>::random({3, 4, 5, 5}, m, rep, 99, RandomInit::uniform(0, 3))));
      }
      bn->eval();
      return bn;
    });
  }
  SECTION("GroupNorm, InstanceNorm, LayerNorm") {
    check_module<T, 4>(s, [](const DeviceMesh& m) { return std::make_shared<GroupNorm<T, 4>>(m, 2, 4); });
    check_module<T, 4>(s, [](const DeviceMesh& m) { return std::make_shared<InstanceNorm<T, 4>>(m, 4, 1e-5, true); });
    check_module<T, 4>(s, [](const DeviceMesh& m) { return std::make_shared<LayerNorm<T, 4>>(m, 4); });
  }
  SECTION("activations") {
    check_module<T, 4>(s, [](const DeviceMesh&) { return std::make_shared<ReLU<T, 4>>(); }, false);
    check_module<T, 4>(s, [](const DeviceMesh&) { return std::make_shared<GELU<T, 4>>(); }, false);
    check_module<T, 4>(s, [](const DeviceMesh&) { return std::make_shared<SiLU<T, 4>>(); }, false);
    check_module<T, 4>(s, [](const DeviceMesh&) { return std::make_shared<Tanh<T, 4>>(); }, false);
    check_module<T, 4>(s, [](const DeviceMesh&) { return std::make_shared<Sigmoid<T, 4>>(); }, false);
  }
}

TEMPLATE_TEST_CASE("Sequential and ResidualBlock equal the unsharded computation", "[nn][module][mpi]", float,
                   double) {
  using T = TestType;
  const Shape<4> s{2, 4, 9, 7};
  SECTION("Sequential: conv, norm, activation, conv") {
    check_module<T, 4>(s, [](const DeviceMesh& m) {
      auto q = std::make_shared<Sequential<T, 4>>();
      q->add(std::make_shared<Conv2d<T>>(m, 4, 6, 3, F::ConvOptions<2>::same({3, 3}), false, 1));
      q->add(std::make_shared<GroupNorm<T, 4>>(m, 3, 6));
      q->add(std::make_shared<GELU<T, 4>>());
      q->add("out", std::make_shared<Conv2d<T>>(m, 6, 2, 3, F::ConvOptions<2>::same({3, 3}), true, 2));
      return q;
    });
  }
  SECTION("ResidualBlock with a projection (GroupNorm, SiLU)") {
    check_module<T, 4>(s, [](const DeviceMesh& m) { return std::make_shared<ResidualBlock<T, 2>>(m, 4, 6, ResidualBlockOptions{}, 3); });
  }
  SECTION("ResidualBlock with an identity skip (BatchNorm, ReLU, periodic padding)") {
    check_module<T, 4>(s, [](const DeviceMesh& m) {
      ResidualBlockOptions o{.norm = NormType::batch, .activation = Activation::relu, .padding_mode = Boundary::periodic};
      return std::make_shared<ResidualBlock<T, 2>>(m, 4, 4, o, 4);
    });
  }
  SECTION("3-D ResidualBlock (InstanceNorm, GELU)") {
    check_module<T, 5>(Shape<5>{2, 2, 5, 6, 4}, [](const DeviceMesh& m) {
      ResidualBlockOptions o{.norm = NormType::instance, .activation = Activation::gelu};
      return std::make_shared<ResidualBlock<T, 3>>(m, 2, 4, o, 5);
    });
  }
}

TEST_CASE("modules refuse mismatched channel counts on every rank", "[nn][module][errors][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    using V = autograd::Var<double, 4>;
    V x(DistTensor<double, 4>::random({2, 3, 9, 7}, mesh, {Shard(2)}, 1), true);
    Conv2d<double> conv(mesh, 4, 6, 3, F::ConvOptions<2>::same({3, 3}));
    ConvTranspose2d<double> tconv(mesh, 4, 6, 2, F::ConvTransposeOptions<2>::symmetric(0, 2));
    Linear<double, 4> lin(mesh, 4, 6);
    GroupNorm<double, 4> gn(mesh, 2, 4);
    BatchNorm<double, 4> bn(mesh, 4);
    LayerNorm<double, 4> ln(mesh, 4);
    ResidualBlock<double, 2> rb(mesh, 4, 4);
    CHECK(error_of([&] { conv(x); }).find("expects 4") != std::string::npos);
    CHECK_THROWS_AS((tconv(x)), shard::Error);
    CHECK_THROWS_AS((tconv.forward(V(DistTensor<double, 4>::random({2, 4, 9, 7}, mesh, {Shard(2)}, 1)), {30, 14})),
                    shard::Error);  // unreachable output size
    CHECK_THROWS_AS((lin(x)), shard::Error);
    CHECK_THROWS_AS((gn(x)), shard::Error);
    CHECK_THROWS_AS((bn(x)), shard::Error);
    CHECK_THROWS_AS((ln(x)), shard::Error);
    CHECK_THROWS_AS((rb(x)), shard::Error);
    CHECK_THROWS_AS((GroupNorm<double, 4>(mesh, 3, 4)), shard::Error);
    CHECK_THROWS_AS((Conv2d<double>(mesh, 4, 6, 3, F::ConvOptions<2>::symmetric(1, 1, 1, 4))), shard::Error);
    // Still usable afterwards: nothing is left half-way in a collective.
    V x4(DistTensor<double, 4>::random({2, 4, 9, 7}, mesh, {Shard(2)}, 1), true);
    auto y = F::add(F::sum(conv(x4)), F::sum(rb(x4)));
    CHECK_NOTHROW(y.backward());
    CHECK(x4.has_grad());
  });
}

}  // namespace st_nn_mpi_modules
