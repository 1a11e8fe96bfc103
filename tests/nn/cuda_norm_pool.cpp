// GPU tests of the norm, pool, resize and GEMM kernel families through the nn ops: every CUDA
// forward and every gradient against the CPU result on a 1-rank mesh (fp32 <= 1e-5 with TF32 off,
// fp64 <= 1e-10), plus the GEMM front (transposes, strided batches, alpha/beta) against OpenBLAS.
// The backward is driven by a fixed random output gradient, so only the op under test runs.
// Skips (with a message) when the build has no CUDA or no GPU is visible.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <shardtensor/exec/gemm.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_nn_cuda_norm_pool {

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

const DeviceMesh& mesh1() {
  static DeviceMesh m(std::make_shared<SelfComm>(), {1});
  return m;
}
template <class T>
double tol() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-10;
}

/// A random leaf on the host and the same values on the GPU.
template <class T, int R>
std::pair<Var<T, R>, Var<T, R>> leaf_pair(const Shape<R>& s, std::uint64_t seed) {
  auto h = DistTensor<T, R>::random(s, mesh1(), {Replicate()}, seed, RandomInit::uniform(-2, 3));
  return {Var<T, R>(h, true), Var<T, R>(DistTensor<T, R>(h.spec(), h.local().to(gpu)), true)};
}

/// Runs the op's backward with a fixed random output gradient (no loss op involved).
template <class T, int R>
void backward_with_seed(const Var<T, R>& y, std::uint64_t seed) {
  auto g = DistTensor<T, R>::random(y.local().shape(), mesh1(), {Replicate()}, seed);
  y.accumulate_grad(DistTensor<T, R>(y.value().spec(), g.local().to(y.value().device())));
  autograd::run_backward(y.node());
}

template <class T, int R>
void check_same(const Tensor<T, R>& got_gpu, const Tensor<T, R>& want_cpu, const char* what) {
  INFO(what);
  REQUIRE(got_gpu.device() == gpu);
  CHECK(max_rel_diff(got_gpu, want_cpu) <= tol<T>());
}

/// Forward + backward of `op` on host and GPU copies of x (and optional per-channel w, b).
template <class T, int R, class Op>
void compare_op(const Shape<R>& xs, index_t C, bool affine, Op op) {
  auto [xh, xg] = leaf_pair<T, R>(xs, 11);
  auto [wh, wg] = leaf_pair<T, 1>({C}, 12);
  auto [bh, bg] = leaf_pair<T, 1>({C}, 13);
  using OptP = std::optional<Var<T, 1>>;
  const auto yh = op(xh, affine ? OptP(wh) : std::nullopt, affine ? OptP(bh) : std::nullopt);
  const auto yg = op(xg, affine ? OptP(wg) : std::nullopt, affine ? OptP(bg) : std::nullopt);
  check_same(yg.local(), yh.local(), "forward");
  backward_with_seed(yh, 99);
  backward_with_seed(yg, 99);
  check_same(xg.grad().local(), xh.grad().local(), "input gradient");
  if (affine) {
    check_same(wg.grad().local(), wh.grad().local(), "weight gradient");
    check_same(bg.grad().local(), bh.grad().local(), "bias gradient");
  }
}

}  // namespace

TEMPLATE_TEST_CASE("CUDA norms match the CPU (forward, input/weight/bias gradients)", "[cuda][norm]", float, double) {
  SHARD_REQUIRE_GPU();
  using T = TestType;
  using OptP = std::optional<Var<T, 1>>;
  for (bool affine : {true, false}) {
    compare_op<T, 4>({3, 6, 5, 7}, 6, affine, [](auto x, OptP w, OptP b) {
      return F::batch_norm(x, nullptr, nullptr, w, b, true);
    });
    compare_op<T, 4>({3, 6, 5, 7}, 6, affine, [](auto x, OptP w, OptP b) { return F::group_norm(x, 3, w, b); });
    compare_op<T, 5>({2, 4, 3, 4, 5}, 4, affine, [](auto x, OptP w, OptP b) { return F::instance_norm(x, w, b); });
    compare_op<T, 4>({2, 6, 4, 5}, 6, affine, [](auto x, OptP w, OptP b) { return F::layer_norm(x, w, b); });
    compare_op<T, 3>({4, 9, 6}, 6, affine, [](auto x, OptP w, OptP b) { return F::layer_norm(x, w, b, 1e-5, -1); });
  }
}

TEMPLATE_TEST_CASE("CUDA norms with a fused activation match the CPU (forward, input/weight/bias gradients)",
                   "[cuda][norm][fused]", float, double) {
  // Short rows (flat kernels) and rows of 128 and more (row kernels, chunked sums).
  SHARD_REQUIRE_GPU();
  using T = TestType;
  using OptP = std::optional<Var<T, 1>>;
  using A = F::NormAct;
  for (A act : {A::silu, A::gelu, A::gelu_tanh, A::relu, A::tanh, A::sigmoid}) {
    INFO("activation code " << static_cast<int>(act));
    for (bool affine : {true, false}) {
      compare_op<T, 4>({3, 6, 5, 7}, 6, affine, [act](auto x, OptP w, OptP b) {
        return F::batch_norm(x, nullptr, nullptr, w, b, true, 0.1, 1e-5, act);
      });
      compare_op<T, 4>({3, 6, 5, 7}, 6, affine, [act](auto x, OptP w, OptP b) { return F::group_norm(x, 3, w, b, 1e-5, act); });
      compare_op<T, 4>({2, 8, 24, 40}, 8, affine, [act](auto x, OptP w, OptP b) { return F::group_norm(x, 2, w, b, 1e-5, act); });
      compare_op<T, 4>({2, 6, 4, 5}, 6, affine, [act](auto x, OptP w, OptP b) { return F::layer_norm(x, w, b, 1e-5, 1, act); });
    }
  }
}

TEMPLATE_TEST_CASE("CUDA norms with a residual and a fused activation match the CPU (every gradient, the residual's "
                   "too)",
                   "[cuda][norm][fused]", float, double) {
  SHARD_REQUIRE_GPU();
  using T = TestType;
  using A = F::NormAct;
  for (A act : {A::silu, A::gelu, A::none}) {
    for (Shape<4> s : {Shape<4>{3, 6, 5, 7}, Shape<4>{2, 6, 24, 40}}) {
      INFO("activation code " << static_cast<int>(act) << ", shape " << fmt::format("{}", s));
      auto [xh, xg] = leaf_pair<T, 4>(s, 21);
      auto [rh, rg] = leaf_pair<T, 4>(s, 22);
      auto [wh, wg] = leaf_pair<T, 1>({6}, 23);
      auto [bh, bg] = leaf_pair<T, 1>({6}, 24);
      const auto yh = F::group_norm(xh, 3, wh, bh, 1e-5, act, rh);
      const auto yg = F::group_norm(xg, 3, wg, bg, 1e-5, act, rg);
      check_same(yg.local(), yh.local(), "forward");
      backward_with_seed(yh, 98);
      backward_with_seed(yg, 98);
      check_same(xg.grad().local(), xh.grad().local(), "input gradient");
      check_same(rg.grad().local(), rh.grad().local(), "residual gradient");
      check_same(wg.grad().local(), wh.grad().local(), "weight gradient");
      check_same(bg.grad().local(), bh.grad().local(), "bias gradient");
    }
  }
}

TEMPLATE_TEST_CASE("CUDA batch norm running statistics and eval mode match the CPU", "[cuda][norm]", float, double) {
  SHARD_REQUIRE_GPU();
  using T = TestType;
  const index_t C = 5;
  auto rmh = DistTensor<T, 1>::random({C}, mesh1(), {Replicate()}, 3, RandomInit::uniform(-1, 1));
  auto rvh = DistTensor<T, 1>::random({C}, mesh1(), {Replicate()}, 4, RandomInit::uniform(0.5, 2));
  DistTensor<T, 1> rmg(rmh.spec(), rmh.local().to(gpu)), rvg(rvh.spec(), rvh.local().to(gpu));
  auto [xh, xg] = leaf_pair<T, 4>({2, C, 4, 3}, 5);
  auto yh = F::batch_norm(xh, &rmh, &rvh, std::nullopt, std::nullopt, true, 0.2);
  auto yg = F::batch_norm(xg, &rmg, &rvg, std::nullopt, std::nullopt, true, 0.2);
  check_same(yg.local(), yh.local(), "training forward");
  check_same(rmg.local(), rmh.local(), "running mean");
  check_same(rvg.local(), rvh.local(), "running var");
  auto eh = F::batch_norm(xh, &rmh, &rvh, std::nullopt, std::nullopt, false);
  auto eg = F::batch_norm(xg, &rmg, &rvg, std::nullopt, std::nullopt, false);
  check_same(eg.local(), eh.local(), "eval forward");
  backward_with_seed(eh, 7);
  backward_with_seed(eg, 7);
  check_same(xg.grad().local(), xh.grad().local(), "eval input gradient");
}

TEMPLATE_TEST_CASE("CUDA avg/max pooling match the CPU in 1-3 dims (forward and gradient)", "[cuda][pool]", float,
                   double) {
  SHARD_REQUIRE_GPU();
  using T = TestType;
  auto run = [](auto xs, auto p) {
    constexpr int R = std::tuple_size_v<decltype(xs)>;
    for (bool is_max : {false, true}) {
      INFO((is_max ? "max" : "avg") << " pool, rank " << R);
      auto [xh, xg] = leaf_pair<T, R>(xs, 21);
      auto yh = is_max ? F::max_pool(xh, p) : F::avg_pool(xh, p);
      auto yg = is_max ? F::max_pool(xg, p) : F::avg_pool(xg, p);
      check_same(yg.local(), yh.local(), "forward");
      backward_with_seed(yh, 22);
      backward_with_seed(yg, 22);
      check_same(xg.grad().local(), xh.grad().local(), "input gradient");
    }
  };
  PoolParams<1> p1;
  p1.kernel = {3};
  p1.stride = {2};
  p1.pad_lo = {1};
  p1.pad_hi = {1};
  run(Shape<3>{2, 3, 11}, p1);
  PoolParams<2> p2;
  p2.kernel = {2, 2};
  run(Shape<4>{2, 3, 8, 7}, p2);
  p2.kernel = {3, 3};
  p2.stride = {1, 2};
  p2.pad_lo = {1, 0};
  p2.pad_hi = {1, 2};
  p2.count_include_pad = false;
  run(Shape<4>{2, 3, 6, 7}, p2);
  PoolParams<3> p3;
  p3.kernel = {2, 3, 2};
  p3.stride = {2, 1, 2};
  p3.pad_lo = {0, 1, 1};
  p3.pad_hi = {1, 1, 0};
  run(Shape<5>{1, 2, 5, 6, 5}, p3);
}

TEMPLATE_TEST_CASE("CUDA nearest/linear upsampling matches the CPU in 1-3 dims (forward and gradient)",
                   "[cuda][upsample]", float, double) {
  SHARD_REQUIRE_GPU();
  using T = TestType;
  auto run = [](auto xs, auto scale) {
    constexpr int R = std::tuple_size_v<decltype(xs)>;
    for (ResizeMode mode : {ResizeMode::nearest, ResizeMode::linear}) {
      INFO((mode == ResizeMode::linear ? "linear" : "nearest") << ", rank " << R);
      auto [xh, xg] = leaf_pair<T, R>(xs, 31);
      auto yh = F::upsample(xh, mode, scale);
      auto yg = F::upsample(xg, mode, scale);
      check_same(yg.local(), yh.local(), "forward");
      backward_with_seed(yh, 32);
      backward_with_seed(yg, 32);
      check_same(xg.grad().local(), xh.grad().local(), "input gradient");
    }
  };
  run(Shape<3>{2, 3, 7}, Shape<1>{3});
  run(Shape<4>{2, 2, 5, 6}, Shape<2>{2, 3});
  run(Shape<5>{1, 2, 3, 4, 5}, Shape<3>{2, 2, 3});
}

TEMPLATE_TEST_CASE("CUDA ceil_mode pooling and interpolate (non-integer scales, sizes, align_corners, bicubic) match "
                   "the CPU (forward and gradient)",
                   "[cuda][pool][upsample][interpolate]", float, double) {
  SHARD_REQUIRE_GPU();
  using T = TestType;
  auto fwd_bwd = [](auto& xh, auto& xg, auto op, const char* what) {
    INFO(what);
    auto yh = op(xh);
    auto yg = op(xg);
    REQUIRE(yg.local().shape() == yh.local().shape());
    check_same(yg.local(), yh.local(), "forward");
    backward_with_seed(yh, 42);
    backward_with_seed(yg, 42);
    check_same(xg.grad().local(), xh.grad().local(), "input gradient");
  };
  // ceil_mode pooling (the last window partly outside, both avg divisors, max).
  for (bool count_pad : {true, false}) {
    PoolParams<2> p;
    p.kernel = {3, 2};
    p.stride = {2, 2};
    p.pad_lo = {1, 0};
    p.pad_hi = {1, 1};
    p.ceil_mode = true;
    p.count_include_pad = count_pad;
    for (bool is_max : {false, true}) {
      auto [xh, xg] = leaf_pair<T, 4>({2, 3, 8, 7}, 41);
      fwd_bwd(xh, xg, [&](const auto& x) { return is_max ? F::max_pool(x, p) : F::avg_pool(x, p); },
              is_max ? "max ceil_mode" : (count_pad ? "avg ceil_mode, pad counted" : "avg ceil_mode, pad not counted"));
    }
  }
  // interpolate: every mode with a scale factor, an explicit size, and align_corners.
  for (ResizeMode mode : {ResizeMode::nearest, ResizeMode::linear, ResizeMode::cubic}) {
    for (int variant = 0; variant < 3; ++variant) {
      if (variant == 2 && mode == ResizeMode::nearest) continue;  // align_corners: linear / cubic only
      InterpolateOptions<2> o;
      o.mode = mode;
      if (variant == 0) o.scale_factor = {1.5, 0.75};
      else o.size = {9, 4};
      o.align_corners = variant == 2;
      auto [xh, xg] = leaf_pair<T, 4>({2, 2, 6, 7}, 43);
      fwd_bwd(xh, xg, [&](const auto& x) { return F::interpolate(x, o); },
              variant == 0 ? "scale factors 1.5 x 0.75" : (variant == 1 ? "size 9 x 4" : "size 9 x 4, align_corners"));
    }
  }
  // 1-D and 3-D linear with non-integer scales.
  {
    InterpolateOptions<1> o;
    o.mode = ResizeMode::linear;
    o.scale_factor = {2.5};
    auto [xh, xg] = leaf_pair<T, 3>({2, 3, 7}, 44);
    fwd_bwd(xh, xg, [&](const auto& x) { return F::interpolate(x, o); }, "1-D linear x2.5");
  }
  {
    InterpolateOptions<3> o;
    o.mode = ResizeMode::linear;
    o.size = {5, 3, 7};
    o.align_corners = true;
    auto [xh, xg] = leaf_pair<T, 5>({1, 2, 3, 4, 5}, 45);
    fwd_bwd(xh, xg, [&](const auto& x) { return F::interpolate(x, o); }, "3-D trilinear size 5x3x7, align_corners");
  }
}

TEMPLATE_TEST_CASE("CUDA linear and channel_linear match the CPU (cuBLAS, TF32 off)", "[cuda][linear]", float,
                   double) {
  SHARD_REQUIRE_GPU();
  using T = TestType;
  REQUIRE_FALSE(current_context(gpu).settings().allow_tf32);
  auto [wh, wg] = leaf_pair<T, 2>({7, 5}, 41);
  auto [bh, bg] = leaf_pair<T, 1>({7}, 42);
  {
    auto [xh, xg] = leaf_pair<T, 4>({3, 5, 4, 6}, 43);
    auto yh = F::channel_linear(xh, wh, bh);
    auto yg = F::channel_linear(xg, wg, bg);
    check_same(yg.local(), yh.local(), "channel_linear forward");
    backward_with_seed(yh, 44);
    backward_with_seed(yg, 44);
    check_same(xg.grad().local(), xh.grad().local(), "channel_linear input gradient");
    check_same(wg.grad().local(), wh.grad().local(), "channel_linear weight gradient");
    check_same(bg.grad().local(), bh.grad().local(), "channel_linear bias gradient");
  }
  wh.zero_grad();
  wg.zero_grad();
  bh.zero_grad();
  bg.zero_grad();
  {
    auto [xh, xg] = leaf_pair<T, 3>({4, 6, 5}, 45);
    auto yh = F::linear(xh, wh, bh);
    auto yg = F::linear(xg, wg, bg);
    check_same(yg.local(), yh.local(), "linear forward");
    backward_with_seed(yh, 46);
    backward_with_seed(yg, 46);
    check_same(xg.grad().local(), xh.grad().local(), "linear input gradient");
    check_same(wg.grad().local(), wh.grad().local(), "linear weight gradient");
    check_same(bg.grad().local(), bh.grad().local(), "linear bias gradient");
  }
}

TEMPLATE_TEST_CASE("CUDA GEMM front: transposes, strided batches, alpha and beta match OpenBLAS", "[cuda][gemm]", float,
                   double) {
  SHARD_REQUIRE_GPU();
  using T = TestType;
  const index_t m = 13, n = 9, k = 17, batch = 3;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      const index_t lda = (ta == Trans::no ? k : m) + 2, ldb = (tb == Trans::no ? n : k) + 1, ldc = n + 3;
      const index_t sa = (ta == Trans::no ? m : k) * lda, sb = (tb == Trans::no ? k : n) * ldb, sc = m * ldc;
      auto a = Tensor<T, 1>::empty({sa * batch});
      auto b = Tensor<T, 1>::empty({sb * batch});
      auto c = Tensor<T, 1>::empty({sc * batch});
      a.fill_random(1, {0}, a.shape());
      b.fill_random(2, {0}, b.shape());
      c.fill_random(3, {0}, c.shape());
      auto ag = a.to(gpu), bg = b.to(gpu), cg = c.to(gpu);
      // Stored matrices as rank-3 blocks [batch, rows, cols] with row strides lda/ldb/ldc.
      auto mat = [&](auto& t, index_t rows, index_t cols, index_t ld, index_t stride) {
        const index_t shape[3] = {batch, rows, cols}, strides[3] = {stride, ld, 1};
        return Block::view(dtype_of<T>, t.device(), t.data(), shape, 3, strides);
      };
      const index_t ar = ta == Trans::no ? m : k, ac = ta == Trans::no ? k : m;
      const index_t br = tb == Trans::no ? k : n, bc = tb == Trans::no ? n : k;
      const exec::GemmGeometry gg{ta, tb, 0.75, -0.5};
      exec::gemm(gg, mat(a, ar, ac, lda, sa), mat(b, br, bc, ldb, sb), mat(c, m, n, ldc, sc),
                 current_context(Device::cpu()));
      exec::gemm(gg, mat(ag, ar, ac, lda, sa), mat(bg, br, bc, ldb, sb), mat(cg, m, n, ldc, sc), current_context(gpu));
      check_same(cg, c, "strided batched gemm");
    }
}

#undef SHARD_REQUIRE_GPU  // file-local: unity builds put several test files in one TU

}  // namespace st_nn_cuda_norm_pool
