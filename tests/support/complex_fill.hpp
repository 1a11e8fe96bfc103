#pragma once
// Random real and complex tensors for the complex-tensor tests (tests/nn/cuda_complex.cpp,
// mpi_cuda_complex_fft.cpp, mpi_complex_ops.cpp): uniform in [-1, 1), a function of the seed only
// (the imaginary part uses seed + 7777), and a tensor's values as complex<double> on the host.
#include <complex>
#include <cstdint>
#include <vector>

#include <shardtensor/tensor/tensor.hpp>

namespace shard::test {

template <class T, int R>
Tensor<T, R> rnd_real(const Shape<R>& s, std::uint64_t seed) {
  auto t = Tensor<T, R>::empty(s);
  t.fill_random(seed, RandomInit::uniform(-1, 1));
  return t;
}

template <class T, int R>
Tensor<std::complex<T>, R> rnd_cplx(const Shape<R>& s, std::uint64_t seed) {
  const auto re = rnd_real<T, R>(s, seed), im = rnd_real<T, R>(s, seed + 7777);
  auto out = Tensor<std::complex<T>, R>::empty(s);
  for (index_t i = 0; i < out.numel(); ++i) out.data()[i] = {re.data()[i], im.data()[i]};
  return out;
}

/// The values of t (any device, real or complex) as complex<double>, row-major.
template <class X, int R>
std::vector<std::complex<double>> flat(const Tensor<X, R>& t) {
  const auto c = t.to(Device::cpu()).contiguous();
  std::vector<std::complex<double>> v(static_cast<std::size_t>(c.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::complex<double>(c.data()[i]);
  return v;
}

}  // namespace shard::test
