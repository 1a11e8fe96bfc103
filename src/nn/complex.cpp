// The complex ops' kernel entry points (include/shardtensor/nn/functional/complex.hpp): the
// element kernels are the pointwise exec family's (exec::complex_map / complex_sum: CPU loops in
// src/exec/pointwise_cpu.cpp, CUDA kernels in kernels/complex.cu), run on the blocks' device.
#include <complex>

#include "shardtensor/exec/pointwise.hpp"
#include "shardtensor/nn/functional/complex.hpp"

namespace shard::nn::functional::detail {

void complex_pointwise(ComplexKernel k, std::complex<double> s, const Block& a, const Block& b, const Block& out,
                       const char* op) {
  exec::complex_map(k, s, a, b, out, current_context(out.device), op);
}

std::complex<double> complex_sum(const Block& x, const char* op) {
  return exec::complex_sum(x, current_context(x.device), op);
}

}  // namespace shard::nn::functional::detail
