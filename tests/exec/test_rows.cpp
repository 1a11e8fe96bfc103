// The row family's copy-scatter on the CPU table (exec/rows.hpp, rows_scatter): named rows are
// copied, -1 entries skipped, rows no index names keep their values, a repeated index with the
// same data is allowed; bad shapes, dtypes and indices are shard::Error. (rows_gather and
// rows_scatter_add are covered through the point-cloud ops; CUDA: tests/exec/cuda_rows.cpp and
// tests/gpusim/cuda_sim_rows.cpp.)
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cstdint>
#include <vector>

#include <shardtensor/exec/rows.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_exec_test_rows {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("rows_scatter copies the named rows and leaves the others", "[exec][rows]") {
  ExecContext ctx(Device::cpu());
  auto dst = Tensor<double, 2>::full({5, 3}, -7.0);
  auto src = Tensor<double, 2>::empty({4, 3});
  for (index_t i = 0; i < 12; ++i) src.data()[i] = static_cast<double>(i);
  // row 0 of src -> dst row 3, row 1 skipped, rows 2 and 3 both -> dst row 1 with the same data
  for (index_t c = 0; c < 3; ++c) src.data()[3 * 3 + c] = src.data()[2 * 3 + c];
  auto index = Tensor<std::int64_t, 1>::empty({4});
  const std::int64_t idx[4] = {3, -1, 1, 1};
  std::copy(idx, idx + 4, index.data());
  exec::rows_scatter({5, 4, 3}, as_block(src), as_block(index), as_block(dst), ctx);
  const std::vector<double> want = {-7, -7, -7, 6, 7, 8, -7, -7, -7, 0, 1, 2, -7, -7, -7};
  CHECK(std::vector<double>(dst.data(), dst.data() + 15) == want);

  // i64 rows of width 1 (the neighbour counts)
  auto cd = Tensor<std::int64_t, 1>::full({4}, 0);
  auto cs = Tensor<std::int64_t, 1>::empty({2});
  cs.data()[0] = 11;
  cs.data()[1] = 22;
  auto ci = Tensor<std::int64_t, 1>::empty({2});
  ci.data()[0] = 2;
  ci.data()[1] = 0;
  exec::rows_scatter({4, 2, 1}, as_block(cs), as_block(ci), as_block(cd), ctx);
  CHECK(std::vector<std::int64_t>(cd.data(), cd.data() + 4) == std::vector<std::int64_t>{22, 0, 11, 0});
}

TEST_CASE("rows_scatter refuses bad input with shard::Error", "[exec][rows][errors]") {
  ExecContext ctx(Device::cpu());
  auto dst = Tensor<float, 2>::zeros({3, 2});
  auto src = Tensor<float, 2>::zeros({2, 2});
  auto index = Tensor<std::int64_t, 1>::zeros({2});
  index.data()[1] = 3;  // outside [-1, 3)
  CHECK_THROWS_WITH(exec::rows_scatter({3, 2, 2}, as_block(src), as_block(index), as_block(dst), ctx),
                    ContainsSubstring("row index 3 outside"));
  index.data()[1] = 1;
  auto src_d = Tensor<double, 2>::zeros({2, 2});
  CHECK_THROWS_AS(exec::rows_scatter({3, 2, 2}, as_block(src_d), as_block(index), as_block(dst), ctx), Error);
  CHECK_THROWS_WITH(exec::rows_scatter({3, 2, 3}, as_block(src), as_block(index), as_block(dst), ctx),
                    ContainsSubstring("must have shape"));
}

}  // namespace st_exec_test_rows
