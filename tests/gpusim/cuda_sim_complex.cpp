// gpusim lane: the complex kernels (kernels/complex.cu) against the CPU:
//  - the pointwise family's complex_map, every ComplexOp (forward and the backward kernels the
//    autograd uses: mul_conj, mul_real, re_mul_conj, abs_backward, conj, scale, make with a null
//    part), c64 and c128, n = 517 (a ragged last block), abs / abs_backward at z = 0; and
//    complex_sum (n = 517 and n = 5000: several partial blocks);
//  - the tensor family's complex entry points (mul of c64 / c128, axpby with complex factors,
//    sum_complex), against std::complex on the host;
//  - the complex ops through the nn front (nn/functional/complex.hpp) at one rank on a small
//    tensor: forward values and every input gradient on the device == on the host.
// Tolerances: gpusim::tol (f32 2e-5, f64 1e-11, relative to the largest CPU value).
#include <catch2/catch_template_test_macros.hpp>

#include <complex>
#include <shardtensor/nn/functional.hpp>

#include "exec/pointwise_kernels.hpp"
#include "exec/tensor_kernels.hpp"
#include "gpusim_support.hpp"

namespace st_gpusim_cuda_sim_complex {

using namespace gpusim;
using exec::ComplexOp;
using exec::PointwiseKernels;
using exec::TensorDeviceKernels;
using autograd::Var;

namespace {

const PointwiseKernels& cu() { return exec::kernels_for<PointwiseKernels>(gpu(), "test"); }
const PointwiseKernels& cpu() { return exec::kernels_for<PointwiseKernels>(Device::cpu(), "test"); }

constexpr ComplexOp kOps[] = {ComplexOp::real,     ComplexOp::imag,     ComplexOp::make,        ComplexOp::conj,
                              ComplexOp::abs_squared, ComplexOp::abs,   ComplexOp::scale,       ComplexOp::add,
                              ComplexOp::mul,      ComplexOp::mul_conj, ComplexOp::mul_real,    ComplexOp::re_mul_conj,
                              ComplexOp::abs_backward};

/// 'c' complex, 'r' real, '-' unused: what op reads from a, b and writes to out. Written here on
/// purpose, apart from src/exec/pointwise.cpp's roles_of: the test states each op's operand kinds
/// from exec/pointwise.hpp's documentation, so a wrong entry in the library's table shows up as a
/// dtype error here instead of being copied into the test.
std::array<char, 3> roles(ComplexOp k) {
  switch (k) {
    case ComplexOp::real:
    case ComplexOp::imag:
    case ComplexOp::abs_squared:
    case ComplexOp::abs: return {'c', '-', 'r'};
    case ComplexOp::make: return {'r', 'r', 'c'};
    case ComplexOp::conj:
    case ComplexOp::scale: return {'c', '-', 'c'};
    case ComplexOp::add:
    case ComplexOp::mul:
    case ComplexOp::mul_conj: return {'c', 'c', 'c'};
    case ComplexOp::mul_real:
    case ComplexOp::abs_backward: return {'c', 'r', 'c'};
    case ComplexOp::re_mul_conj: return {'c', 'c', 'r'};
  }
  return {'-', '-', '-'};
}

template <class T>
constexpr DType cdt() {
  return std::is_same_v<T, float> ? DType::c64 : DType::c128;
}

template <class T>
void map_all(index_t n) {
  const std::complex<double> s(0.7, -1.3);
  for (ComplexOp op : kOps) {
    const auto r = roles(op);
    auto parts = [&](char role) { return role == 'c' ? 2 * n : n; };
    Pair<T> a({parts(r[0])}, 21u, -2.0, 2.0), b({parts(r[1] == '-' ? 'r' : r[1])}, 22u, -2.0, 2.0), out({parts(r[2])});
    // z = 0 at element 0 (abs, abs_backward: the 0 branch).
    if (r[0] == 'c') {
      static_cast<T*>(a.h.data)[0] = static_cast<T*>(a.h.data)[1] = 0;
      a.upload();
    }
    const void* bh = r[1] == '-' ? nullptr : b.h.data;
    const void* bd = r[1] == '-' ? nullptr : b.d.data;
    cpu().complex_map(op, s, cdt<T>(), n, a.h.data, bh, out.h.data, hctx());
    cu().complex_map(op, s, cdt<T>(), n, a.d.data, bd, out.d.data, gctx());
    GPUSIM_CHECK_CLOSE(out, T, "complex_map " << exec::op_name(op) << " n " << n);
    if (op == ComplexOp::make) {  // a null part reads as zeros (the gradients of real / imag)
      cpu().complex_map(op, s, cdt<T>(), n, nullptr, b.h.data, out.h.data, hctx());
      cu().complex_map(op, s, cdt<T>(), n, nullptr, b.d.data, out.d.data, gctx());
      GPUSIM_CHECK_CLOSE(out, T, "complex_map make (null real part)");
      cpu().complex_map(op, s, cdt<T>(), n, a.h.data, nullptr, out.h.data, hctx());
      cu().complex_map(op, s, cdt<T>(), n, a.d.data, nullptr, out.d.data, gctx());
      GPUSIM_CHECK_CLOSE(out, T, "complex_map make (null imaginary part)");
    }
  }
}

template <class T>
void sum_case(index_t n) {
  Pair<T> x({2 * n}, 31u, -1.0, 1.0);
  const auto h = cpu().complex_sum(cdt<T>(), n, x.h.data, hctx());
  const auto d = cu().complex_sum(cdt<T>(), n, x.d.data, gctx());
  INFO("complex_sum n " << n << ": cpu " << h << " cuda " << d);
  CHECK(std::abs(d - h) <= 1e-12 * std::max(1.0, std::abs(h)));  // both sum the same values in double
}

/// The tensor family's complex entry points against std::complex on the host.
template <class T>
void tensor_case(index_t n) {
  using C = std::complex<T>;
  const auto& t = exec::kernels_for<TensorDeviceKernels>(gpu(), "test");
  Pair<T> x({2 * n}, 41u), y({2 * n}, 42u), out({2 * n});
  const C* xh = static_cast<const C*>(x.h.data);
  C* yh = static_cast<C*>(y.h.data);
  C* oh = static_cast<C*>(out.h.data);
  for (index_t i = 0; i < n; ++i) oh[i] = xh[i] * yh[i];
  t.mul(cdt<T>(), n, x.d.data, y.d.data, out.d.data, gpu());
  GPUSIM_CHECK_CLOSE(out, T, "tensor mul n " << n);
  const std::complex<double> alpha(0.25, -1.5), beta(-2, 0.5);
  for (index_t i = 0; i < n; ++i) yh[i] = C(alpha) * xh[i] + C(beta) * yh[i];
  t.axpby_complex(cdt<T>(), n, alpha, x.d.data, beta, y.d.data, gpu());
  GPUSIM_CHECK_CLOSE(y, T, "tensor axpby_complex n " << n);
  std::complex<double> sh = 0;
  for (index_t i = 0; i < n; ++i) sh += std::complex<double>(xh[i]);
  const auto sd = t.sum_complex(cdt<T>(), n, x.d.data, gpu());
  INFO("tensor sum_complex: cpu " << sh << " cuda " << sd);
  CHECK(std::abs(sd - sh) <= 1e-12 * std::max(1.0, std::abs(sh)));
}

/// Forward and gradients of a chain of the complex ops through the nn front on `dev`.
template <class T>
std::vector<std::vector<std::complex<double>>> front_chain(Device dev) {
  using C = std::complex<T>;
  static DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  const Shape<2> shape{5, 7};
  auto cplx = [&](std::uint64_t seed) {
    auto re = Tensor<T, 2>::empty(shape), im = Tensor<T, 2>::empty(shape);
    re.fill_random(seed, RandomInit::uniform(-1, 1));
    im.fill_random(seed + 99, RandomInit::uniform(-1, 1));
    auto z = Tensor<C, 2>::empty(shape);
    for (index_t i = 0; i < z.numel(); ++i) z.data()[i] = C(re.data()[i], im.data()[i]);
    return z;
  };
  auto real = Tensor<T, 2>::empty(shape);
  real.fill_random(7, RandomInit::uniform(-1, 1));
  Var<C, 2> z(DistTensor<C, 2>::distribute(cplx(1), mesh, {Replicate()}).to(dev), true);
  Var<C, 2> w(DistTensor<C, 2>::distribute(cplx(2), mesh, {Replicate()}).to(dev), true);
  Var<T, 2> r(DistTensor<T, 2>::distribute(real, mesh, {Replicate()}).to(dev), true);
  // Every op at least once: y = |(z w + conj(z)) r - 0.5i z|^2 + |z - w| + Re z - Im w;
  // total = sum y + Re((2 - i) mean(z)) + sum Re(2 complex(Re w, r)).
  auto zw = F::add(F::mul(z, w), F::conj(z));
  auto u = F::sub(F::mul(zw, r), F::mul(z, C(T(0), T(0.5))));
  auto y = F::add(F::add(F::abs_squared(u), F::abs(F::sub(z, w))), F::sub(F::real(z), F::imag(w)));
  auto v = F::complex(F::real(w), r);
  auto total = F::add(F::add(F::sum(y), F::real(F::mul(F::mean(z), C(T(2), T(-1))))),
                      F::sum(F::real(F::mul(v, T(2)))));
  std::vector<std::vector<std::complex<double>>> res;
  auto flat = [&](const auto& t) {
    const auto h = t.to(Device::cpu()).contiguous();
    std::vector<std::complex<double>> out;
    for (index_t i = 0; i < h.numel(); ++i) out.push_back(std::complex<double>(h.data()[i]));
    res.push_back(out);
  };
  F::resolve(total).backward();
  flat(y.local());
  flat(total.local());
  flat(z.grad().local());
  flat(w.grad().local());
  flat(r.grad().local());
  return res;
}

}  // namespace

TEMPLATE_TEST_CASE("gpusim complex: complex_map, every op, == the CPU table", "[gpusim][complex]", float, double) {
  GPUSIM_REQUIRE_GPU();
  map_all<TestType>(517);
  map_all<TestType>(1);
}

TEMPLATE_TEST_CASE("gpusim complex: complex_sum == the CPU table", "[gpusim][complex]", float, double) {
  GPUSIM_REQUIRE_GPU();
  sum_case<TestType>(1);
  sum_case<TestType>(517);
  sum_case<TestType>(5000);
}

TEMPLATE_TEST_CASE("gpusim complex: the tensor family's complex mul, axpby, sum == std::complex", "[gpusim][complex]",
                   float, double) {
  GPUSIM_REQUIRE_GPU();
  tensor_case<TestType>(517);
}

TEMPLATE_TEST_CASE("gpusim complex: the complex ops through the nn front, forward and gradients, device == host",
                   "[gpusim][complex]", float, double) {
  GPUSIM_REQUIRE_GPU();
  using T = TestType;
  const auto h = front_chain<T>(Device::cpu());
  const auto d = front_chain<T>(gpu());
  REQUIRE(h.size() == d.size());
  const char* names[] = {"y", "loss", "grad z", "grad w", "grad r"};
  for (std::size_t i = 0; i < h.size(); ++i) {
    REQUIRE(h[i].size() == d[i].size());
    double num = 0, den = 1;
    for (std::size_t j = 0; j < h[i].size(); ++j) {
      num = std::max(num, std::abs(d[i][j] - h[i][j]));
      den = std::max(den, std::abs(h[i][j]));
    }
    INFO(names[i] << ": relative error " << num / den);
    CHECK(num / den <= 10 * tol<T>());
  }
}

TEMPLATE_TEST_CASE("gpusim complex: sub-chains of the nn-front chain, gradient of z, device == host",
                   "[gpusim][complex]", double) {
  // Localises the failing chain above: each piece alone.
  GPUSIM_REQUIRE_GPU();
  using T = TestType;
  using C = std::complex<T>;
  static DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  const Shape<2> shape{5, 7};
  auto zfull = Tensor<C, 2>::empty(shape);
  for (index_t i = 0; i < zfull.numel(); ++i) zfull.data()[i] = C(T(0.1) * T(i % 7) - T(0.3), T(0.05) * T(i % 5) + T(0.2));
  auto grad_of = [&](int piece, Device dev) {
    Var<C, 2> z(DistTensor<C, 2>::distribute(zfull, mesh, {Replicate()}).to(dev), true);
    auto wfull = zfull.clone();
    for (index_t i = 0; i < wfull.numel(); ++i) wfull.data()[i] = C(T(0.2), T(-0.1)) * wfull.data()[i] + C(T(0.3), T(0));
    auto rfull = Tensor<T, 2>::empty(shape);
    for (index_t i = 0; i < rfull.numel(); ++i) rfull.data()[i] = T(0.1) * T(i % 3) - T(0.4);
    Var<C, 2> w(DistTensor<C, 2>::distribute(wfull, mesh, {Replicate()}).to(dev), true);
    Var<T, 2> r(DistTensor<T, 2>::distribute(rfull, mesh, {Replicate()}).to(dev), true);
    Var<T, 1> loss;
    switch (piece) {
      case 6: loss = F::sum(F::real(F::mul(z, r))); break;
      case 7: loss = F::sum(F::abs(F::sub(z, w))); break;
      case 8: loss = F::sum(F::imag(F::mul(F::complex(F::real(z), r), T(2)))); break;
      case 9: loss = F::sum(F::abs_squared(F::mul(F::add(F::mul(z, w), F::conj(z)), r))); break;
      case 0: loss = F::real(F::mul(F::mean(z), C(T(2), T(-1)))); break;
      case 1: loss = F::sum(F::real(F::add(z, z))); break;
      case 2: loss = F::sum(F::sub(F::real(z), F::imag(z))); break;
      case 3: loss = F::sum(F::abs(F::sub(z, F::conj(z)))); break;
      case 4: loss = F::sum(F::real(F::mul(F::add(F::mul(z, z), F::conj(z)), C(T(0), T(0.5))))); break;
      default: loss = F::sum(F::abs_squared(F::mul(z, C(T(0), T(0.5))))); break;
    }
    F::resolve(loss).backward();
    const auto g = z.grad().local().to(Device::cpu()).contiguous();
    std::vector<std::complex<double>> v;
    for (index_t i = 0; i < g.numel(); ++i) v.push_back(std::complex<double>(g.data()[i]));
    return v;
  };
  const char* names[] = {"Re((2-i) mean z)", "sum Re(z + z)", "sum(Re z - Im z)", "sum |z - conj z|",
                         "sum Re(0.5i (z z + conj z))", "sum |0.5i z|^2", "sum Re(z r)", "sum |z - w|",
                         "sum Im(2 complex(Re z, r))", "sum |(z w + conj z) r|^2"};
  for (int piece = 0; piece < 10; ++piece) {
    const auto h = grad_of(piece, Device::cpu()), d = grad_of(piece, gpu());
    double num = 0, den = 1;
    for (std::size_t j = 0; j < h.size(); ++j) {
      num = std::max(num, std::abs(d[j] - h[j]));
      den = std::max(den, std::abs(h[j]));
    }
    INFO(names[piece] << ": relative error " << num / den << "; element 0 cpu " << h[0] << " cuda " << d[0]);
    CHECK(num / den <= 10 * tol<T>());
  }
}

}  // namespace st_gpusim_cuda_sim_complex
