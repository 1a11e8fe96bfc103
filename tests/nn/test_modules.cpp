// Serial tests of the nn modules: PyTorch-style init bounds, deterministic and seed-dependent
// initialisation, parameter naming of composite modules, BatchNorm buffers, U-Net shapes for
// odd extents in every down/up combination, save/load round trips and bad configurations.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstdio>
#include <set>
#include <unistd.h>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/layers.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_nn_test_modules {

using namespace shard;
using namespace shard::nn;

namespace {

DeviceMesh self_mesh() { return DeviceMesh(std::make_shared<SelfComm>(), {1}); }

/// max |p| over a parameter.
double max_abs(const ParameterBase<double>& p) {
  double m = 0;
  for (index_t i = 0; i < p.numel(); ++i) m = std::max(m, std::abs(p.data()[i]));
  return m;
}

std::vector<double> values(const ParameterBase<double>& p) { return {p.data(), p.data() + p.numel()}; }

template <class M>
std::vector<std::string> names(const M& m) {
  std::vector<std::string> out;
  for (auto& np : m.named_parameters()) out.push_back(np.name);
  return out;
}

}  // namespace

TEST_CASE("module initialisation follows PyTorch's default bounds", "[nn][module]") {
  auto mesh = self_mesh();
  Conv2d<double> conv(mesh, 6, 8, Shape<2>{3, 5}, F::ConvOptions<2>::symmetric(1, 1, 1, 2), true, 7);
  const double bc = 1.0 / std::sqrt(3.0 * 3 * 5);  // fan_in = C_in / groups * kh * kw
  auto ps = conv.named_parameters();
  REQUIRE(ps.size() == 2);
  CHECK(ps[0].name == "weight");
  CHECK(ps[0].param->shape() == std::vector<index_t>{8, 3, 3, 5});
  CHECK(max_abs(*ps[0].param) <= bc);
  CHECK(max_abs(*ps[0].param) > 0.9 * bc);  // 360 uniform samples reach close to the bound
  CHECK(max_abs(*ps[1].param) <= bc);
  ConvTranspose2d<double> tc(mesh, 4, 6, 2, F::ConvTransposeOptions<2>::symmetric(0, 2, 1, 2), true, 7);
  const double bt = 1.0 / std::sqrt(3.0 * 2 * 2);  // fan_in = C_out / groups * k * k (weight.size(1))
  CHECK(tc.weight().value().global_shape() == Shape<4>{4, 3, 2, 2});
  CHECK(max_abs(*tc.named_parameters()[0].param) <= bt);
  Linear<double, 4> lin(mesh, 10, 3, true, 7);
  CHECK(max_abs(*lin.named_parameters()[0].param) <= 1 / std::sqrt(10.0));
  GroupNorm<double, 4> gn(mesh, 2, 4);
  for (double v : values(*gn.named_parameters()[0].param)) CHECK(v == 1.0);
  for (double v : values(*gn.named_parameters()[1].param)) CHECK(v == 0.0);
  CHECK(InstanceNorm<double, 4>(mesh, 4).num_parameters() == 0);  // affine off by default
}

TEST_CASE("initialisation is deterministic, seed-dependent and distinct per child", "[nn][module]") {
  auto m1 = self_mesh(), m2 = self_mesh();
  UNetOptions o{.in_channels = 2, .depth = 2, .base_width = 4};
  UNet2d<double> a(m1, o, 5), b(m2, o, 5), c(m1, o, 6);
  auto pa = a.named_parameters(), pb = b.named_parameters(), pc = c.named_parameters();
  REQUIRE(pa.size() == pb.size());
  bool any_diff = false;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CHECK(values(*pa[i].param) == values(*pb[i].param));
    any_diff = any_diff || values(*pa[i].param) != values(*pc[i].param);
  }
  CHECK(any_diff);
  // Sibling convs with the same shape get different values.
  ResidualBlock<double, 2> rb(m1, 4, 4, {}, 3);
  auto pr = rb.named_parameters();
  CHECK(pr[0].name == "conv1.weight");
  const auto it = std::find_if(pr.begin(), pr.end(), [](auto& np) { return np.name == "conv2.weight"; });
  REQUIRE(it != pr.end());
  CHECK(values(*pr[0].param) != values(*it->param));
}

TEST_CASE("composite modules name their parameters by path", "[nn][module]") {
  auto mesh = self_mesh();
  ResidualBlock<double, 2> rb(mesh, 4, 6);
  CHECK(names(rb) == std::vector<std::string>{"conv1.weight", "norm1.weight", "norm1.bias", "conv2.weight",
                                              "norm2.weight", "norm2.bias", "proj.weight", "proj.bias"});
  Sequential<double, 4> q;
  q.add(std::make_shared<Conv2d<double>>(mesh, 1, 2, 3));
  q.add(std::make_shared<SiLU<double, 4>>());
  q.add("head", std::make_shared<Linear<double, 4>>(mesh, 2, 1));
  CHECK(names(q) == std::vector<std::string>{"0.weight", "0.bias", "head.weight", "head.bias"});
  CHECK(q.size() == 3);
  UNet2d<double> net(mesh, {.in_channels = 1, .depth = 2, .base_width = 4});
  std::set<std::string> unique;
  for (auto& n : names(net)) unique.insert(n);
  CHECK(unique.size() == names(net).size());
  CHECK(unique.count("stem.weight") == 1);
  CHECK(unique.count("dec0.0.conv1.weight") == 1);
  CHECK(unique.count("up1.conv.weight") == 1);
  CHECK(unique.count("head.weight") == 1);
  BatchNorm<double, 4> bn(mesh, 3);
  CHECK(names(bn) == std::vector<std::string>{"weight", "bias", "running_mean", "running_var"});
}

TEST_CASE("U-Nets keep the input's extents for odd sizes in every down/up combination", "[nn][unet]") {
  auto mesh = self_mesh();
  for (auto down : {Downsample::avg_pool, Downsample::strided_conv})
    for (auto up : {Upsample::nearest_conv, Upsample::transposed_conv}) {
      INFO("down " << static_cast<int>(down) << " up " << static_cast<int>(up));
      UNet2d<double> net(mesh, {.in_channels = 2, .out_channels = 3, .depth = 2, .base_width = 2, .down = down, .up = up});
      autograd::Var<double, 4> x(DistTensor<double, 4>::random({1, 2, 11, 6}, mesh, {Replicate()}, 1), true);
      auto y = net(x);
      CHECK(y.value().global_shape() == Shape<4>{1, 3, 11, 6});
      F::mse_loss(y, autograd::Var<double, 4>(DistTensor<double, 4>::zeros({1, 3, 11, 6}, mesh, {Replicate()})))
          .backward();
      for (auto& p : net.parameters()) CHECK(p->grad() != nullptr);
    }
  UNet3d<float> net3(mesh, {.depth = 1, .base_width = 2, .norm = NormType::batch, .activation = Activation::relu});
  autograd::Var<float, 5> x3(DistTensor<float, 5>::random({2, 1, 5, 4, 3}, mesh, {Replicate()}, 1));
  CHECK(net3(x3).value().global_shape() == Shape<5>{2, 1, 5, 4, 3});
}

TEST_CASE("bad module configurations and inputs throw shard::Error", "[nn][module][errors]") {
  auto mesh = self_mesh();
  CHECK_THROWS_AS((Conv2d<double>(mesh, 0, 2, 3)), shard::Error);
  CHECK_THROWS_AS((Conv2d<double>(mesh, 4, 6, Shape<2>{3, 0})), shard::Error);
  CHECK_THROWS_AS((GroupNorm<double, 4>(mesh, 4, 6)), shard::Error);
  CHECK_THROWS_AS((ResidualBlock<double, 2>(mesh, 2, 2, {.kernel = 2})), shard::Error);
  CHECK_THROWS_AS((UNet2d<double>(mesh, {.depth = -1})), shard::Error);
  CHECK_THROWS_AS((UNet2d<double>(mesh, {.kernel = 4})), shard::Error);
  UNet2d<double> net(mesh, {.depth = 3, .base_width = 2});
  autograd::Var<double, 4> small(DistTensor<double, 4>::random({1, 1, 16, 3}, mesh, {Replicate()}, 1));
  CHECK_THROWS_AS((net(small)), shard::Error);  // 3 -> 1 -> 0: too small for 3 halvings
  autograd::Var<double, 4> wrong(DistTensor<double, 4>::random({1, 2, 16, 16}, mesh, {Replicate()}, 1));
  CHECK_THROWS_AS((net(wrong)), shard::Error);
}

TEST_CASE("BatchNorm buffers follow training and survive save / load", "[nn][module]") {
  auto mesh = self_mesh();
  BatchNorm<double, 4> bn(mesh, 2, 1e-5, 0.5);
  autograd::Var<double, 4> x(DistTensor<double, 4>::random({4, 2, 3, 3}, mesh, {Replicate()}, 3,
                                                           RandomInit::uniform(1, 3)),
                             true);
  F::sum(bn(x)).backward();
  const auto ps = bn.named_parameters();
  CHECK(ps[2].param->grad() == nullptr);  // buffers never get a gradient
  CHECK(ps[2].param->data()[0] > 0.5);    // running mean moved halfway to the batch mean (~2)
  const std::string path = fmt::format("/tmp/shardtensor_bn_{}.bin", static_cast<long>(::getpid()));
  bn.save(path);
  BatchNorm<double, 4> bn2(mesh, 2);
  bn2.load(path);
  bn.eval();
  bn2.eval();
  CHECK(bn(x).local().contiguous().data()[5] == bn2(x).local().contiguous().data()[5]);
  std::remove(path.c_str());
  // Eval mode normalises with the running statistics: (x - mean) / sqrt(var + eps) * w + b.
  const auto y = bn(x).local().contiguous();
  const auto xl = x.local().contiguous();
  for (index_t i : {0, 4, 8}) {  // channel 0 of sample 0
    const double want = (xl.data()[i] - ps[2].param->data()[0]) / std::sqrt(ps[3].param->data()[0] + 1e-5);
    CHECK(std::abs(y.data()[i] - want) <= 1e-12 * std::max(1.0, std::abs(want)));
  }
}

TEST_CASE("ResidualBlock computes act(norm(conv(act(norm(conv(x))))) + skip(x))", "[nn][module]") {
  auto mesh = self_mesh();
  autograd::Var<double, 4> x(DistTensor<double, 4>::random({2, 3, 6, 5}, mesh, {Replicate()}, 9), true);
  const auto same = F::ConvOptions<2>::same({3, 3});
  for (index_t cout : {3, 5}) {
    INFO("out channels " << cout);
    ResidualBlock<double, 2> rb(mesh, 3, cout, {.norm = NormType::none, .activation = Activation::tanh}, 4);
    // The same children, rebuilt from the documented child seeds.
    Conv2d<double> c1(mesh, 3, cout, 3, same, true, seed_for(4, "conv1")), c2(mesh, cout, cout, 3, same, true,
                                                                                seed_for(4, "conv2"));
    Linear<double, 4> proj(mesh, 3, cout, true, seed_for(4, "proj"));
    auto skip = cout == 3 ? x : proj(x);
    auto want = F::tanh(F::add(c2(F::tanh(c1(x))), skip)).local().contiguous();
    auto got = rb(x).local().contiguous();
    REQUIRE(got.numel() == want.numel());
    for (index_t i = 0; i < got.numel(); ++i) CHECK(got.data()[i] == want.data()[i]);
  }
}

}  // namespace st_nn_test_modules
