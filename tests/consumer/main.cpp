// Consumer-project test program: built against an installed shardtensor (find_package) or
// through add_subdirectory. Uses only the umbrella header, builds a DistTensor over the default
// communicator (MPI when enabled, else SelfComm), redistributes it and checks it against the
// full tensor generated locally from the same seed. Exit code 0 = every check passed.
#include <shardtensor/shardtensor.hpp>

#include <cstdio>
#include <exception>

namespace {

int run() {
  using namespace shard;
  auto mesh = DeviceMesh::world();  // 1-D mesh over (a duplicate of) the world / a SelfComm
  const Shape<2> global{13, 9};     // 13 rows do not divide evenly over 2..4 ranks
  const std::uint64_t seed = 2024;
  auto a = DistTensor<double, 2>::random(global, mesh, {Shard(0)}, seed);

  auto reference = Tensor<double, 2>::empty(global);
  reference.fill_random(seed);

  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "consumer [rank %d]: FAILED %s\n", mesh.rank(), what);
      ++failures;
    }
  };
  const auto b = a.redistribute({Shard(1)});
  expect(b.local().shape()[1] == balanced_size(global[1], mesh.size(), mesh.rank()), "Shard(1) local extent");
  expect(max_rel_diff(b.full_tensor(), reference) == 0.0, "Shard(0) -> Shard(1) round trip");
  const auto c = b.redistribute({Replicate()});
  expect(max_rel_diff(c.local(), reference) == 0.0, "Shard(1) -> Replicate");
  const auto p = c.redistribute({Partial(ReduceOp::sum)}).redistribute({Shard(0)});
  expect(max_rel_diff(p.full_tensor(), reference) <= 1e-15, "Replicate -> Partial(sum) -> Shard(0)");

  // Every rank must agree that every rank passed.
  int all_failures = failures;
  mesh.comm()->allreduce_inplace(&all_failures, 1, ReduceOp::sum);
  if (mesh.rank() == 0)
    std::printf("consumer: shardtensor %s (mpi=%d cuda=%d), %d rank(s), comm backend '%s': %s\n", SHARDTENSOR_VERSION,
                SHARDTENSOR_HAS_MPI, SHARDTENSOR_HAS_CUDA, mesh.size(), mesh.comm()->backend().c_str(),
                all_failures == 0 ? "OK" : "FAILED");
  return all_failures == 0 ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 2;
  }
}
