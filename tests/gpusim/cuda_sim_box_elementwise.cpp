// gpusim lane: the box family (kernels/box.cu, src/cuda/box_cuda.cpp: strided copy, add, fill with
// negative strides and every element size) and Tensor's device kernels (kernels/elementwise.cu,
// src/cuda/tensor_ops_cuda.cpp: strided_copy, fill, axpby, mul, sum) against the CPU.
#include <complex>

#include "exec/box_kernels.hpp"
#include "exec/tensor_kernels.hpp"
#include "gpusim_support.hpp"

namespace st_gpusim_cuda_sim_box_elementwise {

using namespace gpusim;
using exec::BoxKernels;

namespace {
const BoxKernels& cu() { return exec::kernels_for<BoxKernels>(gpu(), "test"); }
const BoxKernels& cpu() { return exec::kernels_for<BoxKernels>(Device::cpu(), "test"); }

/// The [1:4, ::-1, 2:7:2] box of a [5, 6, 9] block: a strided view with a negative stride.
Block box_view(const Block& b) {
  Block v = b;
  const index_t s0 = b.strides[0], s1 = b.strides[1], s2 = b.strides[2];
  v.data = static_cast<char*>(b.data) + (1 * s0 + 5 * s1 + 2 * s2) * static_cast<index_t>(b.element_bytes());
  v.shape = {3, 6, 3, 1, 1, 1, 1, 1};
  v.strides = {s0, -s1, 2 * s2, 0, 0, 0, 0, 0};
  return v;
}

template <class T>
void box_case() {
  const std::vector<index_t> big{5, 6, 9}, small{3, 6, 3};
  Pair<T> dst(big, 31u), src(small, 32u);
  cpu().copy(box_view(dst.h), src.h, hctx());
  cu().copy(box_view(dst.d), src.d, gctx());
  GPUSIM_CHECK_CLOSE(dst, T, "box copy into a strided view");
  Pair<T> back(small);
  cpu().copy(back.h, box_view(dst.h), hctx());
  cu().copy(back.d, box_view(dst.d), gctx());
  GPUSIM_CHECK_CLOSE(back, T, "box copy from a strided view");
  cpu().add(box_view(dst.h), src.h, hctx());
  cu().add(box_view(dst.d), src.d, gctx());
  GPUSIM_CHECK_CLOSE(dst, T, "box add");
  const T v = static_cast<T>(-2.5);
  cpu().fill(box_view(dst.h), &v, hctx());
  cu().fill(box_view(dst.d), &v, gctx());
  GPUSIM_CHECK_CLOSE(dst, T, "box fill");
}

/// Raw bytes: element sizes 1..16 through copy and fill (complex<double> is 16 bytes).
template <class T>
void bytes_case(unsigned seed) {
  const std::vector<index_t> big{4, 7};
  Block hb = Block::allocate(dtype_of<T>, Device::cpu(), big), db = Block::allocate(dtype_of<T>, gpu(), big);
  std::vector<unsigned char> raw(hb.bytes());
  std::mt19937 g(seed);
  for (auto& c : raw) c = static_cast<unsigned char>(g());
  std::memcpy(hb.data, raw.data(), raw.size());
  rt().copy(db.data, gpu(), hb.data, Device::cpu(), raw.size(), gctx().stream(), true);
  Block hv = hb, dv = db;  // the transposed-order view [7, 4]
  hv.shape = dv.shape = {7, 4, 1, 1, 1, 1, 1, 1};
  hv.strides = dv.strides = {1, 7, 0, 0, 0, 0, 0, 0};
  Block ho = Block::allocate(dtype_of<T>, Device::cpu(), {7, 4}), dout = Block::allocate(dtype_of<T>, gpu(), {7, 4});
  cpu().copy(ho, hv, hctx());
  cu().copy(dout, dv, gctx());
  std::vector<unsigned char> a(ho.bytes()), b(ho.bytes());
  std::memcpy(a.data(), ho.data, a.size());
  rt().copy(b.data(), Device::cpu(), dout.data, gpu(), b.size(), gctx().stream(), true);
  CHECK(a == b);
  T val;
  std::memcpy(&val, raw.data(), sizeof(T));
  cpu().fill(hv, &val, hctx());
  cu().fill(dv, &val, gctx());
  rt().copy(b.data(), Device::cpu(), db.data, gpu(), b.size(), gctx().stream(), true);
  std::memcpy(a.data(), hb.data, a.size());
  CHECK(a == b);
}

template <class T>
void tensor_ops_case() {
  const auto& tk = exec::kernels_for<exec::TensorDeviceKernels>(gpu(), "test");
  const index_t n = 300;
  Pair<T> x({n}, 41u), y({n}, 42u), out({n});
  // axpby / mul / sum on the device against the same math on the host
  tk.axpby(dtype_of<T>, n, 1.5, x.d.data, -0.5, y.d.data, gpu());
  auto* hy = static_cast<T*>(y.h.data);
  const auto* hx = static_cast<const T*>(x.h.data);
  for (index_t i = 0; i < n; ++i) hy[i] = static_cast<T>(T(1.5) * hx[i] + T(-0.5) * hy[i]);
  GPUSIM_CHECK_CLOSE(y, T, "axpby");
  tk.mul(dtype_of<T>, n, x.d.data, y.d.data, out.d.data, gpu());
  auto* ho = static_cast<T*>(out.h.data);
  for (index_t i = 0; i < n; ++i) ho[i] = hx[i] * hy[i];
  GPUSIM_CHECK_CLOSE(out, T, "mul");
  double s = 0;
  for (index_t i = 0; i < n; ++i) s += static_cast<double>(hx[i]);
  CHECK(std::abs(tk.sum(dtype_of<T>, n, x.d.data, gpu()) - s) <= 1e-12 * n);
  const T v = static_cast<T>(3.25);
  tk.fill(dtype_of<T>, out.d.data, n, &v, gpu());
  for (index_t i = 0; i < n; ++i) ho[i] = v;
  GPUSIM_CHECK_CLOSE(out, T, "fill");
  // strided_copy: transpose [12, 25] -> [25, 12]
  const index_t shape[2] = {25, 12}, src_st[2] = {1, 25}, dst_st[2] = {12, 1};
  tk.strided_copy(dtype_of<T>, 2, shape, x.d.data, src_st, out.d.data, dst_st, gpu());
  for (index_t i = 0; i < 25; ++i)
    for (index_t j = 0; j < 12; ++j) ho[i * 12 + j] = hx[j * 25 + i];
  GPUSIM_CHECK_CLOSE(out, T, "strided_copy (transpose)");
}
}  // namespace

TEST_CASE("gpusim box: strided copy/add/fill with negative strides", "[gpusim][box]") {
  GPUSIM_REQUIRE_GPU();
  SECTION("f32") { box_case<float>(); }
  SECTION("f64") { box_case<double>(); }
  SECTION("i32") { box_case<std::int32_t>(); }
}

TEST_CASE("gpusim box: copy and fill of 1, 2, 4, 8 and 16-byte elements", "[gpusim][box]") {
  GPUSIM_REQUIRE_GPU();
  bytes_case<std::uint8_t>(1u);
  bytes_case<f16>(2u);
  bytes_case<float>(3u);
  bytes_case<double>(4u);
  bytes_case<std::complex<double>>(5u);
}

TEST_CASE("gpusim elementwise: Tensor device kernels (axpby, mul, sum, fill, strided_copy)", "[gpusim][elementwise]") {
  GPUSIM_REQUIRE_GPU();
  SECTION("f32") { tensor_ops_case<float>(); }
  SECTION("f64") { tensor_ops_case<double>(); }
}

}  // namespace st_gpusim_cuda_sim_box_elementwise
