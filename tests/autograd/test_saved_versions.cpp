// Saved-tensor safety (issue 8): storages carry a version counter that every in-place write bumps;
// backward refuses (shard::Error naming the op and the tensor) when a tensor a node saved changed
// since the op ran, instead of computing a silently wrong gradient. Views of user memory are
// snapshotted when autograd saves them (the default) or declared stable (zero-copy; the user bumps).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/exec/box.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_autograd_test_saved_versions {

using namespace shard;
using autograd::Var;
using V4 = Var<double, 4>;
using D4 = DistTensor<double, 4>;
using Catch::Matchers::ContainsSubstring;

namespace {
DeviceMesh self_mesh() { return DeviceMesh(std::make_shared<SelfComm>(), {1}); }
const Shape<4> xshape{2, 2, 9, 7};
const Shape<4> wshape{3, 2, 3, 3};
/// loss = sum(conv(x, w) * t): conv saves x (for dw) and w (for dx).
Var<double, 1> conv_loss(const V4& x, const V4& w, const V4& t) {
  F::ConvOptions<2> o;
  o.pad_lo = {1, 1};
  o.pad_hi = {1, 1};
  return F::sum(F::mul(F::conv(x, w, std::nullopt, o), t));
}
V4 weight(const DeviceMesh& m) { return V4(D4::random(wshape, m, {Replicate()}, 11), true); }
V4 target(const DeviceMesh& m) { return V4(D4::random({2, 3, 9, 7}, m, {Replicate()}, 12), false); }
/// dloss/dw for input values `xv` (library memory, nothing modified): the oracle.
Tensor<double, 4> reference_dw(const Tensor<double, 4>& xv) {
  auto m = self_mesh();
  V4 x(D4(DistSpec(m, {Replicate()}, {2, 2, 9, 7}), xv.clone()), false);
  V4 w = weight(m);
  conv_loss(x, w, target(m)).backward();
  return w.grad().local().clone();
}
}  // namespace

TEST_CASE("every in-place write bumps the storage version; views share it", "[autograd][versions]") {
  auto t = Tensor<float, 2>::zeros({4, 5});
  const auto v0 = t.version();
  auto row = t.narrow(0, 1, 1);
  row.fill(2.f);
  CHECK(t.version() == v0 + 1);  // a view writes into the same storage
  axpy(1.f, Tensor<float, 2>::full({4, 5}, 1.f), t);
  CHECK(t.version() == v0 + 2);
  scale(t, 3.f);
  CHECK(t.version() == v0 + 3);
  t.copy_from(Tensor<float, 2>::full({4, 5}, 1.f));
  CHECK(t.version() == v0 + 4);
  auto flat = t.reshape<1>({20});
  mark_modified(flat);
  CHECK(t.version() == v0 + 5);
  CHECK(flat.version() == t.version());
  // Kernel fronts writing into an existing block bump it too (halo fills, accumulation).
  exec::box_zero(as_block(t), current_context(Device::cpu()));
  CHECK(t.version() == v0 + 6);
  // An untracked user view has no counter; a stable one has its own.
  std::vector<float> user(6, 0.f);
  auto uv = Tensor<float, 1>::view(user.data(), {6});
  CHECK(uv.is_user_view());
  CHECK(uv.snapshot_on_save());
  auto sv = uv.declare_stable();
  CHECK(sv.is_user_view());
  CHECK_FALSE(sv.snapshot_on_save());
  CHECK_FALSE(sv.owns_memory());
  CHECK(sv.data() == user.data());
  const auto s0 = sv.version();
  sv.bump_version();
  CHECK(sv.version() == s0 + 1);
}

TEST_CASE("a library in-place op on a saved input makes backward throw, naming the op and the tensor",
          "[autograd][versions]") {
  auto m = self_mesh();
  V4 x(D4::random(xshape, m, {Replicate()}, 3), false);
  V4 w = weight(m);
  auto loss = conv_loss(x, w, target(m));
  // The simulation-style mistake: the input (saved by conv for dw) is updated in place.
  axpy(1.0, Tensor<double, 4>::full(xshape, 0.5), x.value().local());
  CHECK_THROWS_WITH(loss.backward(), ContainsSubstring("conv2d") && ContainsSubstring("input 0") &&
                                         ContainsSubstring("modified in place"));
  CHECK_FALSE(w.has_grad());  // nothing was computed from the modified data
}

TEST_CASE("an optimizer step between forward and backward is refused", "[autograd][versions]") {
  auto m = self_mesh();
  V4 x(D4::random(xshape, m, {Replicate()}, 3), false);
  V4 w = weight(m);
  auto p = std::make_shared<nn::Parameter<double, 4>>(w);
  optim::SGD<double> opt({p}, {.lr = 0.1});
  conv_loss(x, w, target(m)).backward();  // a gradient to step with
  auto loss = conv_loss(x, w, target(m));
  opt.step();  // updates w in place while the second graph still holds the old w
  CHECK_THROWS_WITH(loss.backward(), ContainsSubstring("conv2d") && ContainsSubstring("input 1"));
}

TEST_CASE("writes before the op, and a normal training loop, are fine", "[autograd][versions]") {
  auto m = self_mesh();
  V4 x(D4::random(xshape, m, {Replicate()}, 3), false);
  x.value().local().fill(0.25);  // before the forward: the op records the new version
  V4 w = weight(m);
  auto p = std::make_shared<nn::Parameter<double, 4>>(w);
  optim::SGD<double> opt({p}, {.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    auto loss = conv_loss(x, w, target(m));
    REQUIRE_NOTHROW(loss.backward());
    opt.step();
  }
  CHECK(w.has_grad());
}

TEST_CASE("a user write declared with mark_modified on a stable view makes backward throw", "[autograd][versions]") {
  auto m = self_mesh();
  std::vector<double> field(static_cast<std::size_t>(numel(xshape)));
  auto init = Tensor<double, 4>::view(field.data(), xshape);
  init.fill_random(3);
  auto view = Tensor<double, 4>::view(field.data(), xshape).declare_stable();
  V4 x(D4::from_local(view, m, {Replicate()}), false);
  V4 w = weight(m);
  auto loss = conv_loss(x, w, target(m));
  CHECK(x.local().data() == field.data());  // stable: saved without a copy
  field[5] += 1.0;                          // the simulation advances its state ...
  mark_modified(view);                      // ... and says so
  CHECK_THROWS_WITH(loss.backward(), ContainsSubstring("conv2d") && ContainsSubstring("modified in place"));
}

TEST_CASE("a stable view that is not modified gives the exact gradient without a copy", "[autograd][versions]") {
  auto m = self_mesh();
  std::vector<double> field(static_cast<std::size_t>(numel(xshape)));
  auto view = Tensor<double, 4>::view(field.data(), xshape).declare_stable();
  view.fill_random(3);
  const auto ref = reference_dw(view);
  const auto before = host_allocator_stats();
  const auto cur_before = memory_stats().current_bytes;
  V4 x(D4::from_local(view, m, {Replicate()}), false);
  const auto& xl = x.local();  // read under grad mode: no snapshot for a stable view
  CHECK(xl.data() == field.data());
  CHECK(host_allocator_stats().allocs == before.allocs);
  CHECK(memory_stats().current_bytes == cur_before);
  V4 w = weight(m);
  conv_loss(x, w, target(m)).backward();
  CHECK(max_rel_diff(w.grad().local(), ref) == 0.0);
}

TEST_CASE("the snapshot default gives the right gradient after the user overwrote the array", "[autograd][versions]") {
  auto m = self_mesh();
  std::vector<double> field(static_cast<std::size_t>(numel(xshape)));
  auto view = Tensor<double, 4>::view(field.data(), xshape);
  view.fill_random(3);
  const auto ref = reference_dw(view);
  V4 x(D4::from_local(view, m, {Replicate()}), false);
  V4 w = weight(m);
  auto loss = conv_loss(x, w, target(m));
  CHECK(x.local().data() != field.data());  // snapshotted when the op read it under grad mode
  for (auto& v : field) v = -7.0;           // the simulation overwrites its state, no bump
  loss.backward();
  CHECK(max_rel_diff(w.grad().local(), ref) <= 1e-15);
  // Without recording there is nothing to protect: no copy.
  autograd::NoGradGuard ng;
  V4 x2(D4::from_local(view, m, {Replicate()}), false);
  CHECK(x2.local().data() == field.data());
}

TEST_CASE("a modified output saved by its op is refused too", "[autograd][versions]") {
  auto m = self_mesh();
  V4 x(D4::random(xshape, m, {Replicate()}, 3), true);
  auto y = F::relu(x);  // relu's gradient reads its saved values
  auto loss = F::sum(y);
  y.value().local().fill(1.0);
  CHECK_THROWS_WITH(loss.backward(), ContainsSubstring("modified in place"));
}

}  // namespace st_autograd_test_saved_versions
