// The row family on CUDA (src/cuda/rows_cuda.cpp, kernels/rows.cu) against the CPU table through
// the public front (exec/rows.hpp), exact equality: gather of f32, c128 and u8 rows with -1
// entries; scatter-add of f64, i64 and c64 (as real pairs) with -1 entries and repeated rows
// (integer-valued floats: every partial sum is exact, so the atomics' order cannot show).
// tests/gpusim/cuda_sim_rows.cpp covers every element size at small shapes. Skips without a GPU.
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/shardtensor.hpp>

#include <complex>
#include <cstdint>
#include <random>
#include <vector>

#include "shardtensor/exec/rows.hpp"
#include "shardtensor/exec/tensor_block.hpp"

namespace st_exec_cuda_rows {

using namespace shard;
using exec::RowsGeometry;

namespace {

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped")

template <class T, int R>
std::vector<T> host_values(const Tensor<T, R>& t) {
  const auto h = t.to(Device::cpu());
  return std::vector<T>(h.data(), h.data() + h.numel());
}

/// n entries in [-1, rows), about one in five -1.
Tensor<index_t, 1> random_index(index_t n, index_t rows, unsigned seed) {
  auto t = Tensor<index_t, 1>::empty({n});
  std::mt19937_64 g(seed);
  for (index_t i = 0; i < n; ++i)
    t.data()[i] = g() % 5 == 0 ? -1 : static_cast<index_t>(g() % static_cast<std::uint64_t>(rows));
  return t;
}

/// Integer values in [-50, 50] (exact in every type, and their sums too).
template <class T>
Tensor<T, 2> int_values(index_t rows, index_t width, unsigned seed) {
  auto t = Tensor<T, 2>::empty({rows, width});
  std::mt19937_64 g(seed);
  for (index_t i = 0; i < rows * width; ++i) {
    const auto v = [&] { return static_cast<double>(static_cast<int>(g() % 101) - 50); };
    if constexpr (std::is_same_v<T, std::complex<float>>)
      t.data()[i] = T(static_cast<float>(v()), static_cast<float>(v()));
    else if constexpr (std::is_same_v<T, std::complex<double>>)
      t.data()[i] = T(v(), v());
    else
      t.data()[i] = static_cast<T>(v());
  }
  return t;
}

template <class T>
void gather_case(index_t n_src, index_t n_index, index_t width, unsigned seed) {
  const Device dev = Device::cuda(0);
  ExecContext cctx(Device::cpu());
  const auto src = int_values<T>(n_src, width, seed);
  const auto index = random_index(n_index, n_src, seed + 1);
  auto dc = Tensor<T, 2>::zeros({n_index, width});
  auto dg = Tensor<T, 2>::full({n_index, width}, T(7), dev);  // -1 rows must be overwritten with zeros
  const RowsGeometry g{n_src, n_index, width};
  exec::rows_gather(g, as_block(src), as_block(index), as_block(dc), cctx);
  exec::rows_gather(g, as_block(src.to(dev)), as_block(index.to(dev)), as_block(dg), current_context(dev));
  CHECK(host_values(dg) == host_values(dc));
}

template <class T>
void scatter_case(index_t n_dst, index_t n_index, index_t width, unsigned seed) {
  const Device dev = Device::cuda(0);
  ExecContext cctx(Device::cpu());
  const auto src = int_values<T>(n_index, width, seed);
  const auto index = random_index(n_index, n_dst, seed + 1);
  const auto dc = int_values<T>(n_dst, width, seed + 2);
  const auto dg = dc.to(dev);
  const RowsGeometry g{n_dst, n_index, width};
  exec::rows_scatter_add(g, as_block(src), as_block(index), as_block(dc), cctx);
  exec::rows_scatter_add(g, as_block(src.to(dev)), as_block(index.to(dev)), as_block(dg), current_context(dev));
  CHECK(host_values(dg) == host_values(dc));
}

}  // namespace

TEST_CASE("CUDA rows: gather equals the CPU table exactly", "[cuda][exec][rows]") {
  REQUIRE_GPU();
  gather_case<float>(500, 2000, 3, 1u);
  gather_case<std::complex<double>>(300, 700, 5, 2u);
  gather_case<std::uint8_t>(100, 1000, 7, 3u);
}

TEST_CASE("CUDA rows: scatter-add equals the CPU table exactly (exact sums)", "[cuda][exec][rows]") {
  REQUIRE_GPU();
  scatter_case<double>(200, 3000, 3, 11u);
  scatter_case<std::int64_t>(50, 2000, 4, 12u);
  scatter_case<std::complex<float>>(64, 1000, 2, 13u);
}

}  // namespace st_exec_cuda_rows
