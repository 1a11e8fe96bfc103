// The neighbors kernel family on CUDA (src/cuda/neighbors_cuda.cpp, kernels/neighbors.cu) against
// the CPU table through the public front (exec/neighbors.hpp), exact equality: kNN (k = 16 and
// 48, every CPU method), radius (cap hit and not) with counts, the merge of two shards' lists,
// f32 and f64, on shapes larger than the simulator lane's (several query blocks, support
// tiles of 512 points). tests/gpusim/cuda_sim_neighbors.cpp covers ties, duplicates, r = 0,
// k > n_support and more dims at small shapes. Skips without a GPU.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/shardtensor.hpp>

#include <random>
#include <vector>

#include "shardtensor/exec/neighbors.hpp"
#include "shardtensor/exec/tensor_block.hpp"

namespace st_exec_cuda_neighbors {

using namespace shard;
using exec::KnnGeometry;
using exec::NeighborMergeGeometry;
using exec::RadiusGeometry;

namespace {

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped")

template <class T>
Tensor<T, 2> random_points(index_t n, index_t D, unsigned seed) {
  auto t = Tensor<T, 2>::empty({n, D});
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (index_t i = 0; i < n * D; ++i) t.data()[i] = static_cast<T>(u(g));
  return t;
}

template <class T, int R>
std::vector<T> host_values(const Tensor<T, R>& t) {
  const auto h = t.to(Device::cpu());
  return std::vector<T>(h.data(), h.data() + h.numel());
}

/// A list's outputs on one device.
template <class T>
struct Lists {
  Tensor<index_t, 2> idx;
  Tensor<T, 2> d2;
  Tensor<index_t, 1> counts;
  Lists(index_t nq, index_t w, Device dev)
      : idx(Tensor<index_t, 2>::zeros({nq, w}, dev)), d2(Tensor<T, 2>::zeros({nq, w}, dev)),
        counts(Tensor<index_t, 1>::zeros({nq}, dev)) {}
};

template <class T>
void require_same(const Lists<T>& gpu, const Lists<T>& cpu, bool with_counts) {
  CHECK(host_values(gpu.idx) == host_values(cpu.idx));
  CHECK(host_values(gpu.d2) == host_values(cpu.d2));
  if (with_counts) CHECK(host_values(gpu.counts) == host_values(cpu.counts));
}

}  // namespace

TEMPLATE_TEST_CASE("CUDA neighbors: kNN and radius equal the CPU table exactly", "[cuda][exec][neighbors]", float,
                   double) {
  REQUIRE_GPU();
  using T = TestType;
  const Device dev = Device::cuda(0);
  ExecContext cctx(Device::cpu());
  ExecContext& gctx = current_context(dev);
  const index_t nq = 300, ns = 1100, D = 3;
  const auto qh = random_points<T>(nq, D, 1u), sh = random_points<T>(ns, D, 2u);
  const auto qd = qh.to(dev), sd = sh.to(dev);
  for (const index_t k : {index_t{16}, index_t{48}}) {
    INFO("k " << k);
    Lists<T> c(nq, k, Device::cpu()), g(nq, k, dev);
    const KnnGeometry geo{nq, ns, static_cast<int>(D), k, 100, exec::NeighborMethod::tree};
    exec::neighbors_knn(geo, as_block(qh), as_block(sh), as_block(c.idx), as_block(c.d2), cctx);
    exec::neighbors_knn(geo, as_block(qd), as_block(sd), as_block(g.idx), as_block(g.d2), gctx);
    require_same(g, c, false);
  }
  for (const index_t cap : {index_t{8}, index_t{64}}) {
    INFO("radius cap " << cap);
    Lists<T> c(nq, cap, Device::cpu()), g(nq, cap, dev);
    const RadiusGeometry geo{nq, ns, static_cast<int>(D), 0.15, cap, 0, exec::NeighborMethod::automatic};
    exec::neighbors_radius(geo, as_block(qh), as_block(sh), as_block(c.idx), as_block(c.d2), as_block(c.counts), cctx);
    exec::neighbors_radius(geo, as_block(qd), as_block(sd), as_block(g.idx), as_block(g.d2), as_block(g.counts), gctx);
    require_same(g, c, true);
  }
}

TEMPLATE_TEST_CASE("CUDA neighbors: merging two shards' radius lists equals the CPU table and the whole search",
                   "[cuda][exec][neighbors]", float, double) {
  REQUIRE_GPU();
  using T = TestType;
  const Device dev = Device::cuda(0);
  ExecContext cctx(Device::cpu());
  ExecContext& gctx = current_context(dev);
  const index_t nq = 200, n1 = 300, n2 = 500, D = 3, cap = 24;
  const auto q = random_points<T>(nq, D, 3u), s1 = random_points<T>(n1, D, 4u), s2 = random_points<T>(n2, D, 5u);
  auto all = Tensor<T, 2>::empty({n1 + n2, D});
  std::copy(s1.data(), s1.data() + n1 * D, all.data());
  std::copy(s2.data(), s2.data() + n2 * D, all.data() + n1 * D);
  Lists<T> merged_cpu(nq, cap, Device::cpu()), merged_gpu(nq, cap, dev), whole(nq, cap, Device::cpu());
  for (Lists<T>* out : {&merged_cpu, &merged_gpu}) {
    const Device d = out->idx.device();
    ExecContext& ctx = d.is_cuda() ? gctx : cctx;
    Lists<T> cand(nq, cap, d);
    const RadiusGeometry g1{nq, n1, static_cast<int>(D), 0.2, cap, 0, exec::NeighborMethod::automatic};
    const RadiusGeometry g2{nq, n2, static_cast<int>(D), 0.2, cap, n1, exec::NeighborMethod::automatic};
    exec::neighbors_radius(g1, as_block(q.to(d)), as_block(s1.to(d)), as_block(out->idx), as_block(out->d2),
                           as_block(out->counts), ctx);
    exec::neighbors_radius(g2, as_block(q.to(d)), as_block(s2.to(d)), as_block(cand.idx), as_block(cand.d2),
                           as_block(cand.counts), ctx);
    const Block counts = as_block(out->counts), cand_counts = as_block(cand.counts);
    exec::neighbors_merge(NeighborMergeGeometry{nq, cap}, as_block(out->idx), as_block(out->d2), &counts,
                          as_block(cand.idx), as_block(cand.d2), &cand_counts, ctx);
  }
  const RadiusGeometry gw{nq, n1 + n2, static_cast<int>(D), 0.2, cap, 0, exec::NeighborMethod::automatic};
  exec::neighbors_radius(gw, as_block(q), as_block(all), as_block(whole.idx), as_block(whole.d2),
                         as_block(whole.counts), cctx);
  require_same(merged_gpu, merged_cpu, true);
  require_same(merged_gpu, whole, true);
}

}  // namespace st_exec_cuda_neighbors
