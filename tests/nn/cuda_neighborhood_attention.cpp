// GPU tests of the neighbourhood-attention kernel family through F::neighborhood_attention on a
// 1-rank mesh: the CUDA forward and dq/dk/dv against the CPU implementation (fp32 <= 1e-4, fp64
// <= 1e-10), 1-/2-/3-D domains, odd/even windows, dilation, zero/periodic boundaries, head dims
// that fill a warp partially and over several rounds; bf16 through the kernel front against the
// fp32 CPU kernel on the same (rounded) inputs. Skips (with a message) without CUDA or a GPU.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <shardtensor/exec/neighborhood.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_nn_cuda_neighborhood_attention {

using namespace shard;
namespace F = shard::nn::functional;
using autograd::Var;

namespace {

#define SHARD_REQUIRE_GPU()                                                                        \
  do {                                                                                             \
    if (!cuda_compiled()) SKIP("shardtensor was built without CUDA (SHARDTENSOR_ENABLE_CUDA=OFF)"); \
    if (cuda_device_count() <= 0) SKIP("no CUDA device visible: GPU tests skipped");               \
  } while (0)

const Device gpu = Device::cuda(0);

template <class T>
double tol() {
  return std::is_same_v<T, float> ? 1e-4 : 1e-10;
}

/// Forward and the three gradients on host and GPU copies of the same q, k, v, for placements
/// `pl` on a 1-rank mesh of pl.size() dims.
template <class T, int R>
void compare(const Shape<R>& qs, index_t Dv, const F::NeighborhoodOptions& o, std::vector<Placement> pl) {
  std::vector<int> ms(pl.size(), 1);
  DeviceMesh mesh(std::make_shared<SelfComm>(), ms);
  Shape<R> vs = qs;
  vs[R - 1] = Dv;
  auto pair = [&](const Shape<R>& s, std::uint64_t seed) {
    auto h = DistTensor<T, R>::random(s, mesh, pl, seed, RandomInit::uniform(-2, 2));
    return std::pair{Var<T, R>(h, true), Var<T, R>(DistTensor<T, R>(h.spec(), h.local().to(gpu)), true)};
  };
  auto [qh, qg] = pair(qs, 1);
  auto [kh, kg] = pair(qs, 2);
  auto [vh, vg] = pair(vs, 3);
  auto yh = F::neighborhood_attention(qh, kh, vh, o);
  auto yg = F::neighborhood_attention(qg, kg, vg, o);
  REQUIRE(yg.value().device() == gpu);
  CHECK(max_rel_diff(yg.local().to(Device::cpu()), yh.local()) <= tol<T>());
  auto g = DistTensor<T, R>::random(yh.value().global_shape(), mesh, pl, 4);
  yh.accumulate_grad(g);
  yg.accumulate_grad(DistTensor<T, R>(g.spec(), g.local().to(gpu)));
  autograd::run_backward(yh.node());
  autograd::run_backward(yg.node());
  CHECK(max_rel_diff(qg.grad().local().to(Device::cpu()), qh.grad().local()) <= tol<T>());
  CHECK(max_rel_diff(kg.grad().local().to(Device::cpu()), kh.grad().local()) <= tol<T>());
  CHECK(max_rel_diff(vg.grad().local().to(Device::cpu()), vh.grad().local()) <= tol<T>());
}

}  // namespace

TEMPLATE_TEST_CASE("CUDA neighbourhood attention matches the CPU", "[cuda][attention][nbhd]", float, double) {
  SHARD_REQUIRE_GPU();
  using T = TestType;
  compare<T, 4>({2, 17, 2, 64}, 64, {.window = {5}, .dilation = {2}}, {Replicate()});
  compare<T, 4>({2, 17, 2, 80}, 40, {.window = {4}, .periodic = {true}}, {Replicate()});
  compare<T, 4>({2, 17, 2, 8}, 8, {.window = {6}, .dilation = {2}, .periodic = {true}}, {Shard(1)});
  compare<T, 5>({2, 9, 7, 3, 16}, 16, {.window = {3, 4}, .dilation = {2, 1}, .periodic = {false, true}},
                {Replicate()});
  compare<T, 5>({1, 9, 7, 2, 33}, 5, {.window = {4, 3}, .periodic = {true, false}}, {Shard(1), Shard(2)});
  compare<T, 6>({1, 5, 4, 6, 2, 8}, 8, {.window = {3, 2, 3}, .dilation = {1, 2, 1}, .periodic = {false, true, true}},
                {Replicate()});
}

TEST_CASE("CUDA neighbourhood attention in bf16 matches fp32 on the host", "[cuda][attention][nbhd]") {
  SHARD_REQUIRE_GPU();
  const Shape<5> s{1, 8, 6, 2, 32};
  exec::NbhdGeom g;
  g.B = 1;
  g.H = 2;
  g.D = g.Dv = 32;
  g.nq[0] = 1;
  g.nq[1] = g.nk[1] = g.valid_hi[1] = 8;
  g.nq[2] = g.nk[2] = g.valid_hi[2] = 6;
  g.window[1] = 3;
  g.window[2] = 4;
  g.wrap[2] = true;
  g.scale = 0.2;
  auto f = Tensor<float, 5>::empty(s);
  Tensor<float, 5> hf[3];
  Tensor<bf16, 5> db[3];
  for (int i = 0; i < 3; ++i) {
    f.fill_random(100 + static_cast<std::uint64_t>(i), RandomInit::uniform(-2, 2));
    auto b = Tensor<bf16, 5>::empty(s);
    hf[i] = Tensor<float, 5>::empty(s);
    for (index_t j = 0; j < f.numel(); ++j) {
      b.data()[j] = bf16(f.data()[j]);
      hf[i].data()[j] = static_cast<float>(b.data()[j]);  // the rounded value, for the fp32 reference
    }
    db[i] = b.to(gpu);
  }
  auto oh = Tensor<float, 5>::empty(s);
  auto lh = Tensor<float, 4>::empty({1, 8, 6, 2});
  auto og = Tensor<bf16, 5>::empty(s, gpu);
  auto lg = Tensor<float, 4>::empty({1, 8, 6, 2}, gpu);
  // [B, S1, S2, H, D] blocks: two spatial dims, right-aligned onto the geometry's three
  exec::nbhd_attention_forward(g, as_block(hf[0]), as_block(hf[1]), as_block(hf[2]), as_block(oh), as_block(lh),
                               current_context(Device::cpu()));
  exec::nbhd_attention_forward(g, as_block(db[0]), as_block(db[1]), as_block(db[2]), as_block(og), as_block(lg),
                               current_context(gpu));
  const auto back = og.to(Device::cpu());
  double num = 0, den = 0;
  for (index_t j = 0; j < oh.numel(); ++j) {
    num = std::max(num, std::abs(static_cast<double>(static_cast<float>(back.data()[j])) - oh.data()[j]));
    den = std::max(den, std::abs(static_cast<double>(oh.data()[j])));
  }
  CHECK(num / den <= 1e-2);
  CHECK(max_rel_diff(lg.to(Device::cpu()), lh) <= 1e-5);
}

#undef SHARD_REQUIRE_GPU  // file-local: unity builds put several test files in one TU

}  // namespace st_nn_cuda_neighborhood_attention
