// Consumer-project test program: built against an installed shardtensor (find_package) or
// through add_subdirectory. Uses only the umbrella header, builds a DistTensor over the default
// communicator (MPI when enabled, else SelfComm), redistributes it and checks it against the
// full tensor generated locally from the same seed. Then checks what the program sees of the
// CUDA backend: linked (SHARDTENSOR_CONSUMER_LINKS_CUDA=1: libshardtensor_cuda is loaded; CUDA
// tensors work on a GPU, or are refused with the device-index error without one) or not (no CUDA
// library is loaded into the process and CUDA tensors are refused with the "not linked" error).
// Exit code 0 = every check passed.
#include <shardtensor/shardtensor.hpp>

#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

#ifndef SHARDTENSOR_CONSUMER_LINKS_CUDA
#define SHARDTENSOR_CONSUMER_LINKS_CUDA 0
#endif

namespace {

/// The first shared object mapped into this process whose file name contains `what`, or "".
std::string mapped_library(const char* what) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.rfind('/');
    if (slash != std::string::npos && line.find(what, slash) != std::string::npos) return line.substr(slash + 1);
  }
  return {};
}

/// The message of the shard::Error thrown by making a CUDA tensor, or "" when none is thrown.
std::string cuda_tensor_error() {
  try {
    auto t = shard::Tensor<float, 1>::empty({4}, shard::Device::cuda(0));
    return {};
  } catch (const shard::Error& e) {
    return e.what();
  }
}

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

  // The CUDA backend as this program sees it.
  const bool cuda_loaded = !mapped_library("libshardtensor_cuda").empty();
  if (SHARDTENSOR_CONSUMER_LINKS_CUDA) {
    expect(cuda_loaded, "libshardtensor_cuda is loaded (the link anchor kept it)");
    if (cuda_device_count() > 0) {
      auto g = reference.to(Device::cuda(0));
      expect(max_rel_diff(g.to(Device::cpu()), reference) == 0.0, "host -> cuda:0 -> host round trip");
    } else {
      const std::string err = cuda_tensor_error();
      expect(err.find("no CUDA device is visible") != std::string::npos,
             "without a GPU, a CUDA tensor is refused with the device error");
    }
  } else {
    expect(!cuda_loaded, "libshardtensor_cuda is not loaded");
    for (const char* lib : {"libcudart", "libcuda.so", "libcublas", "libcudnn", "libnccl"}) {
      const std::string m = mapped_library(lib);
      if (!m.empty()) std::fprintf(stderr, "consumer [rank %d]: %s is mapped\n", mesh.rank(), m.c_str());
      expect(m.empty(), "no CUDA library is mapped into a program without shardtensor::cuda");
    }
    expect(cuda_device_count() == 0, "cuda_device_count() == 0 without the CUDA backend");
    const std::string err = cuda_tensor_error();
    const char* want = cuda_compiled() ? "link shardtensor::cuda" : "built without CUDA";
    if (err.find(want) == std::string::npos)
      std::fprintf(stderr, "consumer [rank %d]: CUDA tensor error was '%s'\n", mesh.rank(), err.c_str());
    expect(err.find(want) != std::string::npos, "a CUDA tensor is refused with a clear error");
  }

  // Every rank must agree that every rank passed.
  int all_failures = failures;
  mesh.comm()->allreduce_inplace(&all_failures, 1, ReduceOp::sum);
  if (mesh.rank() == 0)
    std::printf("consumer: shardtensor %s (mpi=%d cuda=%d, shardtensor::cuda %s, %d GPU(s)), %d rank(s), comm "
                "backend '%s': %s\n",
                SHARDTENSOR_VERSION, SHARDTENSOR_HAS_MPI, SHARDTENSOR_HAS_CUDA, cuda_loaded ? "loaded" : "not linked",
                cuda_device_count(), mesh.size(), mesh.comm()->backend().c_str(), all_failures == 0 ? "OK" : "FAILED");
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
