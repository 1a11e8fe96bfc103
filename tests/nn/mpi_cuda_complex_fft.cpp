// The distributed complex FFT and the spectral convolution on CUDA device tensors at 1-4 ranks
// (shardtensor_cuda_mpi_tests; needs a GPU, else every case SKIPs) against the same computation on
// the CPU: a c2c fftn -> complex pointwise (mul by a complex field, conj, add) -> ifftn_to round
// trip back to the input's layout, its loss sum |.|^2 and the input gradients; rfftn / irfftn_to
// round trip; and F::spectral_conv forward, input and weight gradients. Rank r uses GPU
// r % (visible GPUs) with make_device_comm (NCCL, or MPI when ranks share a GPU). 1-D slab and
// 2-D pencil meshes with uneven shards, c128 <= 1e-10 and c64 <= 1e-4 relative to the largest CPU
// value. The complex element kernels under test: kernels/complex.cu (tests/nn/cuda_complex.cpp
// checks them one by one).
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <complex>
#include <numeric>
#include <shardtensor/comm/device_comm.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

#include "support/mpi_harness.hpp"
#include "support/complex_fill.hpp"

namespace st_nn_mpi_cuda_complex_fft {

using namespace shard;
using namespace shard::test;
using autograd::Var;

namespace {

Device my_gpu() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return Device::cuda(r % cuda_device_count());
}
template <class T> double tol() { return sizeof(T) == 4 ? 1e-4 : 1e-10; }

/// max |a - b| / max(1, max |b|) of two tensors (any devices).
template <class X, int R>
double rel(const Tensor<X, R>& a, const Tensor<X, R>& b) {
  if (a.shape() != b.shape()) return INFINITY;
  const auto x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  double m = 0, s = 1;
  for (index_t i = 0; i < y.numel(); ++i) s = std::max(s, static_cast<double>(std::abs(y.data()[i])));
  for (index_t i = 0; i < x.numel(); ++i) m = std::max(m, static_cast<double>(std::abs(x.data()[i] - y.data()[i])));
  return m / s;
}

struct Lay {
  std::string name;
  std::vector<int> mesh;
  std::vector<Placement> pl;
  ShardSizes sizes;
};
/// Layouts of x [B, C, H, W] (H = 7, W = 6) on P ranks: slabs (uneven), pencils.
std::vector<Lay> layouts(int P) {
  static const std::vector<std::vector<index_t>> uneven = {{}, {}, {5, 2}, {1, 4, 2}, {2, 1, 3, 1}};
  std::vector<Lay> v;
  v.push_back({"slab Shard(2) uneven", {P}, {Shard(2)}, P > 1 ? ShardSizes{uneven[static_cast<std::size_t>(P)], {}} : ShardSizes{}});
  v.push_back({"slab Shard(3)", {P}, {Shard(3)}, {}});
  if (P % 2 == 0) v.push_back({"pencil Shard(2), Shard(3)", {2, P / 2}, {Shard(2), Shard(3)}, {}});
  return v;
}

/// The c2c round trip with complex pointwise ops in the spectrum, on `dev`: the output, the
/// spectrum, and the gradients of z and of the complex field k.
template <class T>
struct C2c {
  Tensor<std::complex<T>, 4> y, spec, gz, gk;
};
template <class T>
C2c<T> c2c(const DeviceMesh& mesh, const Lay& l, Device dev) {
  using C = std::complex<T>;
  const Shape<4> s{1, 2, 7, 6};
  Var<C, 4> z(DistTensor<C, 4>::distribute(rnd_cplx<T, 4>(s, 1), mesh, l.pl, -1, l.sizes).to(dev), true);
  auto Z = F::fftn(z, {2, 3});
  Var<C, 4> k(DistTensor<C, 4>::distribute(rnd_cplx<T, 4>(s, 2), mesh, Z.value().spec().placements(), -1,
                                           Z.value().spec().sizes()).to(dev), true);
  auto Y = F::add(F::mul(Z, k), F::conj(F::mul(Z, T(0.5))));
  auto y = F::ifftn_to(Y, z.value().spec(), {2, 3});
  F::resolve(F::sum(F::abs_squared(y))).backward();
  return {y.value().full_tensor().to(Device::cpu()), Z.value().full_tensor().to(Device::cpu()),
          z.grad().full_tensor().to(Device::cpu()), k.grad().full_tensor().to(Device::cpu())};
}

/// rfftn -> irfftn_to and the spectral convolution on `dev`: outputs and gradients.
template <class T>
struct Spectral {
  Tensor<T, 4> back, y, gx;
  Tensor<T, 5> gw;
};
template <class T>
Spectral<T> spectral(const DeviceMesh& mesh, const Lay& l, Device dev) {
  const Shape<4> s{2, 3, 7, 6};
  Var<T, 4> x(DistTensor<T, 4>::distribute(rnd_real<T, 4>(s, 3), mesh, l.pl, -1, l.sizes).to(dev), true);
  auto back = F::irfftn_to(F::rfftn(x, {2, 3}, FftNorm::ortho), x.value().spec(), {2, 3}, FftNorm::ortho);
  const std::vector<index_t> modes{2, 2};
  Var<T, 5> w(DistTensor<T, 5>::distribute(rnd_real<T, 5>({3, 2, 4, 2, 2}, 4), mesh,
                                           std::vector<Placement>(l.mesh.size(), Replicate()))
                  .to(dev),
              true);
  auto y = F::spectral_conv(x, w, modes);
  Var<T, 4> q(DistTensor<T, 4>::distribute(rnd_real<T, 4>(y.value().global_shape(), 5), mesh,
                                           y.value().spec().placements(), -1, y.value().spec().sizes())
                  .to(dev),
              false);
  F::resolve(F::sum(F::mul(y, q))).backward();
  return {back.value().full_tensor().to(Device::cpu()), y.value().full_tensor().to(Device::cpu()),
          x.grad().full_tensor().to(Device::cpu()), w.grad().full_tensor().to(Device::cpu())};
}

/// compare(host mesh, GPU mesh, layout, this rank's GPU) for every communicator size of the
/// harness and every layout; the GPU mesh runs on a device communicator of the same ranks.
template <class Compare>
void each_layout_on_both(Compare&& compare) {
  for_each_comm_size([&](CommPtr c) {
    const Device gpu = my_gpu();
    CommPtr dc = make_device_comm(c, gpu);
    for (const auto& l : layouts(c->size())) {
      INFO(l.name << " on " << c->size() << " ranks");
      compare(DeviceMesh(c, l.mesh), DeviceMesh(dc, l.mesh), l, gpu);
    }
  });
}

}  // namespace

TEMPLATE_TEST_CASE("distributed complex FFT round trip with complex pointwise ops on CUDA == on the CPU",
                   "[nn][fft][complex][cuda][mpi]", double, float) {
  if (cuda_device_count() == 0) SKIP("no GPU visible: distributed complex FFT on CUDA not run");
  using T = TestType;
  each_layout_on_both([](const DeviceMesh& host_mesh, const DeviceMesh& gpu_mesh, const auto& l, Device gpu) {
    const auto h = c2c<T>(host_mesh, l, Device::cpu());
    const auto g = c2c<T>(gpu_mesh, l, gpu);
    CHECK(rel(g.spec, h.spec) <= tol<T>());
    CHECK(rel(g.y, h.y) <= tol<T>());
    CHECK(rel(g.gz, h.gz) <= tol<T>());
    CHECK(rel(g.gk, h.gk) <= tol<T>());
  });
}

TEMPLATE_TEST_CASE("distributed rfftn round trip and spectral convolution on CUDA == on the CPU",
                   "[nn][fft][fno][cuda][mpi]", double, float) {
  if (cuda_device_count() == 0) SKIP("no GPU visible: distributed spectral convolution on CUDA not run");
  using T = TestType;
  each_layout_on_both([](const DeviceMesh& host_mesh, const DeviceMesh& gpu_mesh, const auto& l, Device gpu) {
    const auto h = spectral<T>(host_mesh, l, Device::cpu());
    const auto g = spectral<T>(gpu_mesh, l, gpu);
    CHECK(rel(g.back, h.back) <= tol<T>());
    CHECK(rel(g.y, h.y) <= tol<T>());
    CHECK(rel(g.gx, h.gx) <= tol<T>());
    CHECK(rel(g.gw, h.gw) <= tol<T>());
  });
}

}  // namespace st_nn_mpi_cuda_complex_fft
