// The in-library profiler (runtime/profiler.hpp) on the CPU: structure and totals of its table, not
// timings. A small model step (two convs, a group norm, an mse loss, backward, SGD) under a
// shard::Profiler, exact call counts where the schedule fixes them, collective payload bytes,
// allocator rows, nesting, reset, the disabled state and SHARDTENSOR_PROFILE's parser.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <map>
#include <shardtensor/exec/attention.hpp>
#include <shardtensor/exec/profiler.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/layers.hpp>
#include <shardtensor/shardtensor.hpp>

// The store's raw totals (exported by libshardtensor; private header src/runtime/profiler_store.hpp).
namespace shard::profile::detail {
std::vector<ProfileRow> snapshot(bool wait);
}

namespace st_exec_test_profiler {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

namespace {
DeviceMesh self_mesh() { return DeviceMesh(std::make_shared<SelfComm>()); }

std::map<std::string, ProfileRow> by_key(const std::vector<ProfileRow>& rows) {
  std::map<std::string, ProfileRow> m;
  for (const auto& r : rows) {
    const std::string k = r.category + ":" + r.label();
    REQUIRE(m.count(k) == 0);  // one row per (category, name, pass)
    m.emplace(k, r);
  }
  return m;
}

std::uint64_t calls(const std::map<std::string, ProfileRow>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? 0 : it->second.calls;
}

std::uint64_t total_calls() {
  std::uint64_t n = 0;
  for (const auto& r : profile::detail::snapshot(false)) n += r.calls;
  return n;
}

struct Model {
  nn::Conv2d<float> c1, c2;
  nn::GroupNorm<float, 4> gn;
  explicit Model(const DeviceMesh& m) : c1(m, 2, 4, 3), c2(m, 4, 2, 3), gn(m, 2, 4) {}
  std::vector<std::shared_ptr<nn::ParameterBase<float>>> parameters() {
    auto p = c1.parameters();
    for (auto& q : c2.parameters()) p.push_back(q);
    for (auto& q : gn.parameters()) p.push_back(q);
    return p;
  }
};

void step(Model& net, optim::SGD<float>& opt, const DeviceMesh& mesh) {
  autograd::Var<float, 4> x(DistTensor<float, 4>::random({1, 2, 12, 10}, mesh, {Replicate()}, 3));
  auto y = net.c2(net.gn(net.c1(x)));
  auto t = autograd::Var<float, 4>(DistTensor<float, 4>::zeros(y.value().global_shape(), mesh, {Replicate()}));
  opt.zero_grad();
  F::mse_loss(y, t).backward();
  opt.step();
}
}  // namespace

TEST_CASE("profiler: a CPU training step gives the expected rows, counts and nesting", "[profiler]") {
  auto mesh = self_mesh();
  Model net(mesh);
  auto params = net.parameters();
  optim::SGD<float> opt(params, {.lr = 0.01});
  step(net, opt, mesh);  // warm: plans and caches built outside the profile

  Profiler prof;
  CHECK(profile::collecting());
  constexpr int kSteps = 3;
  for (int s = 0; s < kSteps; ++s) step(net, opt, mesh);
  const auto rows = prof.rows();
  const auto m = by_key(rows);

  // Fixed by the schedule: one backward walk and one optimiser step per training step, one
  // update per parameter with a gradient.
  CHECK(calls(m, "autograd:backward") == kSteps);
  CHECK(calls(m, "optim:sgd/step") == kSteps);
  CHECK(calls(m, "op:optim/sgd_update") == kSteps * params.size());
  // Each conv layer runs its forward front at least once per step (interior + strips may be
  // several calls, the same number every step), the weight gradient and the bias gradient.
  for (const char* k : {"op:conv/forward", "op:conv/backward_weight", "op:conv/backward_bias", "op:conv/backward_input",
                        "op:norm/moments", "op:norm/apply", "op:norm/backward_sums", "op:norm/backward_dx"}) {
    INFO(k);
    CHECK(calls(m, k) > 0);
    CHECK(calls(m, k) % kSteps == 0);
  }
  CHECK(calls(m, "op:conv/forward") >= 2 * kSteps);
  CHECK(calls(m, "op:conv/backward_bias") == 2 * kSteps);
  // Allocator traffic is counted; rows carry no time.
  REQUIRE(m.count("alloc:cpu/request"));
  CHECK(m.at("alloc:cpu/request").calls > 0);
  CHECK(m.at("alloc:cpu/request").bytes >= 64 * m.at("alloc:cpu/request").calls);  // 64-byte granules

  // Times: never negative, no device time on the CPU, and inclusive scopes contain their nested ones.
  for (const auto& r : rows) {
    INFO(r.category << ":" << r.label());
    CHECK(r.host_us >= 0);
    CHECK(r.device_calls == 0);
    CHECK(r.device_ms == 0);
  }
  CHECK(m.at("op:conv/backward_weight").host_us + m.at("op:conv/backward_input").host_us <=
        m.at("autograd:backward").host_us);
  CHECK(m.at("op:optim/sgd_update").host_us <= m.at("optim:sgd/step").host_us);
  // Rows come by category (op first) then by host time.
  for (std::size_t i = 1; i < rows.size(); ++i)
    if (rows[i].category == rows[i - 1].category) CHECK(rows[i].host_us <= rows[i - 1].host_us);
  CHECK(rows.front().category == "op");

  const std::string rep = prof.report();
  CHECK_THAT(rep, ContainsSubstring("shardtensor profile, rank 0"));
  CHECK_THAT(rep, ContainsSubstring("category"));
  CHECK_THAT(rep, ContainsSubstring("device ms"));
  for (const auto& r : rows) CHECK_THAT(rep, ContainsSubstring(r.label()));
  // One line per row plus the title and the column line.
  CHECK(static_cast<std::size_t>(std::count(rep.begin(), rep.end(), '\n')) == rows.size() + 2);
}

TEST_CASE("profiler: collectives carry their payload bytes; a forwarding call counts once", "[profiler]") {
  SelfComm comm;
  std::vector<float> buf(250, 1.0f);
  std::vector<double> d(3, 0.0);
  Profiler prof;
  comm.allreduce(buf.data(), buf.data(), 250, DType::f32, ReduceOp::sum);
  comm.allreduce(d.data(), d.data(), 3, DType::f64, ReduceOp::max);
  const std::vector<index_t> c{7}, z{0};
  std::vector<float> out(7);
  comm.alltoallv(buf.data(), c, z, out.data(), c, z, DType::f32);
  comm.alltoall(buf.data(), out.data(), 7, DType::f32);  // a convenience over alltoallv: one row
  comm.barrier();
  const auto m = by_key(prof.rows());
  CHECK(m.at("comm:allreduce").calls == 2);
  CHECK(m.at("comm:allreduce").bytes == 250 * 4 + 3 * 8);
  CHECK(m.at("comm:alltoallv").calls == 2);
  CHECK(m.at("comm:alltoallv").bytes == 2 * 7 * 4);
  CHECK(m.at("comm:barrier").calls == 1);
  CHECK(m.at("comm:barrier").bytes == 0);
  CHECK_THAT(prof.report(), ContainsSubstring("1.0 KiB"));  // 1024 B
}

TEST_CASE("profiler: nested profilers, reset, and nothing recorded while off", "[profiler]") {
  auto ctx_dev = Device::cpu();
  auto b = Block::allocate(DType::f32, ctx_dev, std::vector<index_t>{16, 4});
  auto& ctx = current_context(ctx_dev);

  REQUIRE_FALSE(profile::collecting());  // SHARDTENSOR_PROFILE is unset in the test run
  const std::uint64_t before = total_calls();
  for (int i = 0; i < 5; ++i) exec::box_zero(b, ctx);
  CHECK(total_calls() == before);  // off: the scopes record nothing

  Profiler outer;
  exec::box_zero(b, ctx);
  {
    Profiler inner;
    exec::box_zero(b, ctx);
    exec::box_zero(b, ctx);
    const auto mi = by_key(inner.rows());
    CHECK(mi.at("op:box/zero").calls == 2);
    inner.reset();
    CHECK(inner.rows().empty());
    exec::box_zero(b, ctx);
    CHECK(by_key(inner.rows()).at("op:box/zero").calls == 1);
  }
  CHECK(profile::collecting());  // the outer one still collects
  CHECK(by_key(outer.rows()).at("op:box/zero").calls == 4);
  outer.reset();
  CHECK(outer.rows().empty());
  CHECK_THAT(outer.report(), ContainsSubstring("(no profiled scope ran)"));
}

TEST_CASE("profiler: user scopes, the table's columns, and SHARDTENSOR_PROFILE's values", "[profiler]") {
  {
    Profiler prof;
    for (int i = 0; i < 3; ++i) {
      SHARD_PROFILE_SCOPE("user", "my_region", "", nullptr);
      SHARD_PROFILE_SCOPE("user", "my_region", "inner", nullptr);
    }
    const auto rows = prof.rows();
    const auto m = by_key(rows);
    CHECK(m.at("user:my_region").calls == 3);
    CHECK(m.at("user:my_region/inner").calls == 3);
    CHECK(m.at("user:my_region/inner").host_us <= m.at("user:my_region").host_us);
    // a row re-entered directly inside itself (an op front calling itself on f32 working copies)
    // counts once; entered again after an inner scope of another row closed, it still counts once
    // per outer call; a separate scope of the same row after it closed counts again
    {
      Profiler p2;
      for (int i = 0; i < 2; ++i) {
        SHARD_PROFILE_SCOPE("user", "reentrant", "", nullptr);
        { SHARD_PROFILE_SCOPE("user", "other", "", nullptr); }
        {
          SHARD_PROFILE_SCOPE("user", "reentrant", "", nullptr);
          SHARD_PROFILE_SCOPE("user", "reentrant", "", nullptr);
        }
      }
      { SHARD_PROFILE_SCOPE("user", "reentrant", "", nullptr); }
      const auto m2 = by_key(p2.rows());
      CHECK(m2.at("user:reentrant").calls == 3);
      CHECK(m2.at("user:other").calls == 2);
    }
    // an op: a bf16 attention on the CPU runs the f32 front on working copies inside its own row
    {
      const exec::AttnGeom g{1, 1, 5, 6, 4, 4};
      auto mk = [](index_t n) {
        auto t = Tensor<bf16, 1>::empty({n});
        for (index_t i = 0; i < n; ++i) t.data()[i] = bf16(0.1f * static_cast<float>(i % 7) - 0.3f);
        return t;
      };
      const auto q = mk(20), k = mk(24), v = mk(24);
      auto out = Tensor<bf16, 1>::empty({20});
      auto lse = Tensor<float, 1>::empty({5});
      auto view = [](const auto& t, std::vector<index_t> sh) {
        const Block b = as_block(t);
        return Block::view(b.dtype, b.device, b.data, sh.data(), static_cast<int>(sh.size()), nullptr, b.owner);
      };
      Profiler p3;
      exec::attention_forward(g, exec::AttnMask{}, view(q, {1, 1, 5, 4}), view(k, {1, 1, 6, 4}), view(v, {1, 1, 6, 4}),
                              nullptr, view(out, {1, 1, 5, 4}), view(lse, {1, 1, 5}),
                              current_context(Device::cpu()));
      CHECK(by_key(p3.rows()).at("op:attention/forward").calls == 1);
    }
    const std::string t = format_profile(rows, "title");
    CHECK(t.rfind("title\ncategory", 0) == 0);
    // CPU rows: device ms "-", no bytes "-".
    CHECK_THAT(t, ContainsSubstring("-            -\n"));
  }
  CHECK_FALSE(parse_profile_env(nullptr));
  CHECK_FALSE(parse_profile_env(""));
  CHECK_FALSE(parse_profile_env("0"));
  CHECK_FALSE(parse_profile_env("off"));
  CHECK(parse_profile_env("1"));
  CHECK(parse_profile_env("on"));
  CHECK_THROWS_AS(parse_profile_env("garbage"), shard::Error);
  CHECK_THROWS_WITH(parse_profile_env("yes please"), ContainsSubstring("SHARDTENSOR_PROFILE"));
}

}  // namespace st_exec_test_profiler
