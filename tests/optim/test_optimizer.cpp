// Optimisers and the schedule against hand-written reference updates, and Module save/load.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>
#include <shardtensor/shardtensor.hpp>

namespace st_optim_test_optimizer {

using namespace shard;
using autograd::Var;

namespace {
DeviceMesh self_mesh() { return DeviceMesh(std::make_shared<SelfComm>()); }

// A module with two parameters whose gradient we set by hand through a tiny graph.
struct Toy : nn::Module<double> {
  Var<double, 1> a;
  Var<double, 2> b;
  explicit Toy(const DeviceMesh& m, std::uint64_t seed = 7) {
    a = this->make_parameter<1>("a", m, {3}, seed, 1.0);
    b = this->make_parameter<2>("b", m, {2, 2}, seed, 0.5);
  }
};

// Sets grad(p) = g by backward of sum(p * g) (a real graph, so the tape is exercised too).
template <int R>
void set_grad(const Var<double, R>& p, const Tensor<double, R>& g) {
  auto spec = p.value().spec();
  std::vector<Placement> rep(1, Replicate());
  auto prod = mul(p.local(), g);
  DistTensor<double, 1> s(DistSpec(p.value().mesh(), rep, {1}), Tensor<double, 1>::full({1}, sum(prod)));
  auto loss = Var<double, 1>::make(s, "sum_mul", {p.ref()}, [p, g, spec](const DistTensor<double, 1>& go) {
    auto gx = g.clone();
    scale(gx, go.local()(0));
    p.accumulate_grad(DistTensor<double, R>(spec, gx));
  });
  loss.backward();
}
}  // namespace

TEST_CASE("SGD with momentum, Nesterov and weight decay matches the reference update", "[optim]") {
  auto mesh = self_mesh();
  for (bool nesterov : {false, true}) {
    Toy t(mesh);
    auto w0 = t.a.local().clone();
    std::vector<double> v(3, 0.0), w(w0.data(), w0.data() + 3);
    optim::SGD<double> opt(t.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov});
    for (int step = 0; step < 3; ++step) {
      auto g = Tensor<double, 1>::empty({3});
      for (int i = 0; i < 3; ++i) g(i) = 0.3 * i - 0.2 + step;
      opt.zero_grad();
      set_grad<1>(t.a, g);
      opt.step();
      for (int i = 0; i < 3; ++i) {
        double d = g(i) + 0.01 * w[i];
        v[i] = 0.9 * v[i] + d;
        w[i] -= 0.1 * (nesterov ? d + 0.9 * v[i] : v[i]);
      }
    }
    for (int i = 0; i < 3; ++i) CHECK(std::abs(t.a.local()(i) - w[i]) < 1e-14);
  }
}

TEST_CASE("Adam and AdamW match the reference update; params without grad are untouched", "[optim]") {
  auto mesh = self_mesh();
  for (bool decoupled : {false, true}) {
    Toy t(mesh);
    auto b0 = t.b.local().clone();
    std::vector<double> w(t.a.local().data(), t.a.local().data() + 3), m(3, 0), v(3, 0);
    typename optim::Adam<double>::Options o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
    std::unique_ptr<optim::Optimizer<double>> opt;
    if (decoupled) opt = std::make_unique<optim::AdamW<double>>(t.parameters(), o);
    else opt = std::make_unique<optim::Adam<double>>(t.parameters(), o);
    for (int step = 1; step <= 4; ++step) {
      auto g = Tensor<double, 1>::empty({3});
      for (int i = 0; i < 3; ++i) g(i) = std::sin(step + i);
      opt->zero_grad();
      set_grad<1>(t.a, g);
      opt->step();
      for (int i = 0; i < 3; ++i) {
        double gi = g(i);
        if (!decoupled) gi += 0.1 * w[i];
        else w[i] *= 1 - 0.01 * 0.1;
        m[i] = 0.8 * m[i] + 0.2 * gi;
        v[i] = 0.95 * v[i] + 0.05 * gi * gi;
        w[i] -= 0.01 * (m[i] / (1 - std::pow(0.8, step))) / (std::sqrt(v[i] / (1 - std::pow(0.95, step))) + 1e-6);
      }
    }
    for (int i = 0; i < 3; ++i) CHECK(std::abs(t.a.local()(i) - w[i]) < 1e-14);
    CHECK(max_rel_diff(t.b.local(), b0) == 0.0);
  }
}

TEST_CASE("Cosine schedule with warm-up", "[optim]") {
  optim::CosineWarmup s(1.0, 4, 14, 0.1);
  CHECK(std::abs(s(0) - 0.25) < 1e-15);
  CHECK(std::abs(s(3) - 1.0) < 1e-15);
  CHECK(std::abs(s(4) - 1.0) < 1e-15);
  CHECK(std::abs(s(9) - (0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)))) < 1e-15);
  CHECK(std::abs(s(14) - 0.1) < 1e-15);
  for (long k = 4; k < 13; ++k) CHECK(s(k + 1) <= s(k));
  CHECK_THROWS_AS(optim::CosineWarmup(1.0, 5, 4), Error);
}

TEST_CASE("Module parameters: deterministic init, names, save/load round trip and mismatch errors", "[nn]") {
  auto mesh = self_mesh();
  Toy t1(mesh, 11), t2(mesh, 11), t3(mesh, 12);
  CHECK(max_rel_diff(t1.a.local(), t2.a.local()) == 0.0);
  CHECK(max_rel_diff(t1.a.local(), t3.a.local()) > 0.0);
  auto names = t1.named_parameters();
  REQUIRE(names.size() == 2);
  CHECK(names[0].name == "a");
  CHECK(names[1].name == "b");
  CHECK(t1.num_parameters() == 7);
  const std::string path = "shardtensor_test_params.bin";
  t1.save(path);
  t3.load(path);
  CHECK(max_rel_diff(t3.a.local(), t1.a.local()) == 0.0);
  CHECK(max_rel_diff(t3.b.local(), t1.b.local()) == 0.0);
  struct Other : nn::Module<double> {
    explicit Other(const DeviceMesh& m) { this->make_parameter<1>("a", m, {4}, 1, 1.0); }
  } other(mesh);
  CHECK_THROWS_WITH(other.load(path), Catch::Matchers::ContainsSubstring("Module::load"));
  CHECK_THROWS_AS(t1.load("/nonexistent/dir/x.bin"), Error);
  std::remove(path.c_str());
}

TEST_CASE("optimiser state export / import continues bit-identically; mismatches are refused", "[optim][checkpoint]") {
  auto mesh = self_mesh();
  auto grad_at = [](int step) {
    auto g = Tensor<double, 1>::empty({3});
    for (int i = 0; i < 3; ++i) g(i) = std::cos(0.7 * step + i);
    return g;
  };
  auto make_opt = [](int kind, Toy& t) -> std::unique_ptr<optim::Optimizer<double>> {
    if (kind == 0) return std::make_unique<optim::SGD<double>>(t.parameters(), optim::SGD<double>::Options{.lr = 0.1, .momentum = 0.9});
    typename optim::Adam<double>::Options o{.lr = 0.01, .weight_decay = 0.1};
    if (kind == 1) return std::make_unique<optim::Adam<double>>(t.parameters(), o);
    return std::make_unique<optim::AdamW<double>>(t.parameters(), o);
  };
  for (int kind = 0; kind < 3; ++kind) {
    Toy ref(mesh), a(mesh), b(mesh, 99);
    auto oref = make_opt(kind, ref), oa = make_opt(kind, a), ob = make_opt(kind, b);
    for (int s = 0; s < 5; ++s) {
      oref->zero_grad();
      set_grad<1>(ref.a, grad_at(s));
      oref->step();
    }
    for (int s = 0; s < 2; ++s) {
      oa->zero_grad();
      set_grad<1>(a.a, grad_at(s));
      oa->step();
    }
    const auto st = oa->state();
    CHECK(st.buffers.size() == (kind == 0 ? 1u : 2u));  // only `a` has a gradient
    b.a.local().copy_from(a.a.local());
    b.b.local().copy_from(a.b.local());
    ob->set_lr(123);
    ob->load_state(st);
    CHECK(ob->lr() == oa->lr());
    for (int s = 2; s < 5; ++s) {
      ob->zero_grad();
      set_grad<1>(b.a, grad_at(s));
      ob->step();
    }
    CHECK(max_rel_diff(b.a.local(), ref.a.local()) == 0.0);
    // A state of another kind, or of other sizes, is refused.
    auto other = make_opt((kind + 1) % 3, b);
    CHECK_THROWS_AS(other->load_state(st), Error);
    auto bad = st;
    for (auto& [k, blk] : bad.buffers) blk = Block::allocate(blk.dtype, Device::cpu(), {blk.numel() + 1});
    CHECK_THROWS_AS(ob->load_state(bad), Error);
  }
}

TEST_CASE("Module::save is atomic and load refuses truncated, corrupted or extended files", "[optim][checkpoint]") {
  auto mesh = self_mesh();
  Toy t1(mesh, 11), t2(mesh, 12);
  const std::string path = fmt::format("/tmp/shardtensor_params_{}.bin", static_cast<long>(::getpid()));
  t1.save(path);
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& b) { std::ofstream(path, std::ios::binary | std::ios::trunc) << b; };
  auto refused = [&](const char* what) {
    const double before = t2.a.local()(0);
    std::string msg;
    try {
      t2.load(path);
    } catch (const Error& e) {
      msg = e.what();
    }
    CHECK_THAT(msg, Catch::Matchers::ContainsSubstring(what));
    CHECK(t2.a.local()(0) == before);  // nothing loaded
  };
  write(bytes.substr(0, bytes.size() / 2));
  refused("truncated");
  write(bytes + "garbage");
  refused("trailing");
  for (std::size_t pos : {std::size_t{20}, bytes.size() / 2, bytes.size() - 20}) {
    std::string flipped = bytes;
    flipped[pos] = static_cast<char>(flipped[pos] ^ 0x10);
    write(flipped);
    INFO("flipped byte " << pos);
    CHECK_THROWS_AS(t2.load(path), Error);
  }
  write(bytes);
  t2.load(path);
  CHECK(max_rel_diff(t2.a.local(), t1.a.local()) == 0.0);
  // A failed save (unwritable directory) leaves the previous file alone and reports the error.
  CHECK_THROWS_AS(t1.save("/nonexistent/dir/x.bin"), Error);
  std::remove(path.c_str());
}

}  // namespace st_optim_test_optimizer
