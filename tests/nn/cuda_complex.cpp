// GPU tests of the complex ops (nn/functional/complex.hpp; CUDA kernels in kernels/complex.cu
// through the pointwise family's CUDA table, src/cuda/pointwise_cuda.cpp) and of Tensor's complex
// device entry points (tensor/ops.hpp: axpy / scale with complex factors, mul, sum; through
// src/cuda/tensor_ops_cuda.cpp): every op's forward and every input gradient of a real loss on
// Device::cuda(0) against the same computation on the CPU (c64 <= 1e-5, c128 <= 1e-10, relative
// to the largest CPU value), at one rank, on a shape of several thread blocks and on one that
// needs several sum partials. They SKIP with a message when no GPU is visible or the build has no
// CUDA. (Distributed complex FFT / spectral conv on CUDA: tests/nn/mpi_cuda_complex_fft.cpp.)
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <complex>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>
#include "support/complex_fill.hpp"

namespace st_nn_cuda_complex {

using namespace shard;
using namespace shard::test;
using autograd::Var;

namespace {

bool have_gpu() { return SHARDTENSOR_HAS_CUDA && cuda_device_count() > 0; }
#define REQUIRE_GPU()                                                                             \
  do {                                                                                            \
    if (!SHARDTENSOR_HAS_CUDA) SKIP("shardtensor was built without CUDA: GPU tests skipped");     \
    if (!have_gpu()) SKIP("no CUDA device visible: GPU tests skipped");                           \
  } while (0)

using cd = std::complex<double>;

const DeviceMesh& mesh1() {
  static DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  return mesh;
}
template <class T> double tol() { return sizeof(T) == 4 ? 1e-5 : 1e-10; }

/// max_i |a_i - b_i| / max(1, max|b|) (infinite when the sizes differ).
double rel_err(const std::vector<cd>& a, const std::vector<cd>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

enum Op : int {
  op_real, op_imag, op_complex, op_conj, op_add, op_sub, op_mul_real_scalar, op_mul_complex_scalar, op_sum, op_mean,
  op_abs_squared, op_abs, op_mul, op_mul_zr, op_chain, kOps
};
const char* op_label(int op) {
  static const char* names[] = {"real", "imag", "complex", "conj", "add", "sub", "mul(z, real s)", "mul(complex s, z)",
                                "sum", "mean", "abs_squared", "abs", "mul(z, w)", "mul(z, r)",
                                "abs(add(mul(z, w), conj(z)))"};
  return names[op];
}

struct Res {
  std::vector<std::vector<cd>> outs, grads;
  bool on_device = true;
};

/// Op `op` on inputs of `shape` on `dev`: the output and the gradients of z, w, r, r2 under the
/// loss sum Re(conj(p) y) (complex y), sum(q y) (real y), Re(conj(c) s) (complex scalar s).
template <class T>
Res run(Device dev, int op, const Shape<2>& shape) {
  using C = std::complex<T>;
  auto put = [&](const auto& full, bool rg) {
    using X = typename std::decay_t<decltype(full)>::value_type;
    return Var<X, 2>(DistTensor<X, 2>::distribute(full, mesh1(), {Replicate()}).to(dev), rg);
  };
  auto z = put(rnd_cplx<T, 2>(shape, 1), true), w = put(rnd_cplx<T, 2>(shape, 2), true);
  auto r = put(rnd_real<T, 2>(shape, 3), true), r2 = put(rnd_real<T, 2>(shape, 4), true);
  Res res;
  auto loss_c = [&](Var<C, 2> y) {
    res.on_device = res.on_device && y.value().device() == dev;
    res.outs.push_back(flat(y.local()));
    return F::sum(F::real(F::mul(F::conj(put(rnd_cplx<T, 2>(shape, 50), false)), y)));
  };
  auto loss_r = [&](Var<T, 2> y) {
    res.on_device = res.on_device && y.value().device() == dev;
    res.outs.push_back(flat(y.local()));
    return F::sum(F::mul(y, put(rnd_real<T, 2>(shape, 51), false)));
  };
  auto loss_s = [&](Var<C, 1> y) {
    y = F::resolve(y);
    res.on_device = res.on_device && y.value().device() == dev;
    res.outs.push_back(flat(y.local()));
    Var<C, 1> c(DistTensor<C, 1>::distribute(rnd_cplx<T, 1>({1}, 52), mesh1(), {Replicate()}).to(dev), false);
    return F::real(F::mul(F::conj(c), y));
  };
  Var<T, 1> loss;
  switch (op) {
    case op_real: loss = loss_r(F::real(z)); break;
    case op_imag: loss = loss_r(F::imag(z)); break;
    case op_complex: loss = loss_c(F::complex(r, r2)); break;
    case op_conj: loss = loss_c(F::conj(z)); break;
    case op_add: loss = loss_c(F::add(z, w)); break;
    case op_sub: loss = loss_c(F::sub(z, w)); break;
    case op_mul_real_scalar: loss = loss_c(F::mul(z, T(-1.5))); break;
    case op_mul_complex_scalar: loss = loss_c(F::mul(C(T(0.5), T(-2)), z)); break;
    case op_sum: loss = loss_s(F::sum(z)); break;
    case op_mean: loss = loss_s(F::mean(z)); break;
    case op_abs_squared: loss = loss_r(F::abs_squared(z)); break;
    case op_abs: loss = loss_r(F::abs(z)); break;
    case op_mul: loss = loss_c(F::mul(z, w)); break;
    case op_mul_zr: loss = loss_c(F::mul(z, r)); break;
    case op_chain: loss = loss_r(F::abs(F::add(F::mul(z, w), F::conj(z)))); break;
    default: FAIL("unknown op");
  }
  F::resolve(loss).backward();
  auto take = [&](const auto& v) {
    if (!v.has_grad()) {
      res.grads.emplace_back();
      return;
    }
    res.on_device = res.on_device && v.grad().device() == dev;
    res.grads.push_back(flat(v.grad().local()));
  };
  take(z);
  take(w);
  take(r);
  take(r2);
  return res;
}

}  // namespace

TEMPLATE_TEST_CASE("complex ops on CUDA == on the CPU, forward and every gradient", "[nn][complex][cuda]", double,
                   float) {
  REQUIRE_GPU();
  using T = TestType;
  // 37 x 29: several thread blocks and a ragged tail; 600 x 700: many sum partials.
  for (const Shape<2> shape : {Shape<2>{37, 29}, Shape<2>{600, 700}}) {
    for (int op = 0; op < kOps; ++op) {
      INFO(op_label(op) << " on " << shape[0] << " x " << shape[1]);
      const Res c = run<T>(Device::cpu(), op, shape), g = run<T>(Device::cuda(0), op, shape);
      CHECK(g.on_device);
      REQUIRE(g.outs.size() == c.outs.size());
      REQUIRE(g.grads.size() == c.grads.size());
      for (std::size_t i = 0; i < c.outs.size(); ++i) CHECK(rel_err(g.outs[i], c.outs[i]) <= tol<T>());
      for (std::size_t i = 0; i < c.grads.size(); ++i) {
        INFO("gradient of input " << i << " (z, w, r, r2)");
        CHECK(g.grads[i].empty() == c.grads[i].empty());
        CHECK(rel_err(g.grads[i], c.grads[i]) <= tol<T>());
      }
    }
  }
}

TEMPLATE_TEST_CASE("complex Tensor ops on CUDA (axpy, scale with complex factors, add, mul, sum) == on the CPU",
                   "[tensor][complex][cuda]", double, float) {
  REQUIRE_GPU();
  using T = TestType;
  using C = std::complex<T>;
  const Device dev = Device::cuda(0);
  for (const Shape<2> shape : {Shape<2>{1, 1}, Shape<2>{37, 29}, Shape<2>{600, 700}}) {
    INFO("shape " << shape[0] << " x " << shape[1]);
    const auto x = rnd_cplx<T, 2>(shape, 11), y = rnd_cplx<T, 2>(shape, 12);
    const auto xd = x.to(dev), yd = y.to(dev);
    auto yh = y.clone(), yg = y.clone().to(dev);
    axpy(C(T(0.25), T(-1.5)), x, yh);
    axpy(C(T(0.25), T(-1.5)), xd, yg);
    CHECK(max_rel_diff(yg, yh) <= tol<T>());
    scale(yh, C(T(-2), T(0.5)));
    scale(yg, C(T(-2), T(0.5)));
    CHECK(max_rel_diff(yg, yh) <= tol<T>());
    scale(yh, C(T(3)));  // a real factor: the real kernel over the parts
    scale(yg, C(T(3)));
    CHECK(max_rel_diff(yg, yh) <= tol<T>());
    CHECK(max_rel_diff(add(xd, yd), add(x, y)) <= tol<T>());
    CHECK(max_rel_diff(sub(xd, yd), sub(x, y)) <= tol<T>());
    const auto pd = mul(xd, yd);
    CHECK(pd.device() == dev);
    CHECK(max_rel_diff(pd, mul(x, y)) <= tol<T>());
    const cd sd = sum(xd), sh = sum(x);
    CHECK(std::abs(sd - sh) <= 1e-12 * std::max(1.0, std::abs(sh)));  // both sum the same values in double
  }
}

}  // namespace st_nn_cuda_complex
