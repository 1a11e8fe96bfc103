// The host caching allocator behind allocate_bytes (issue 8): small and medium blocks (< 1 MiB)
// come from size-classed, thread-safe caches mapped with mmap, never from malloc; a steady-state
// U-Net training step makes no new OS mapping; statistics count requests, hits and mappings.
#include <catch2/catch_test_macros.hpp>

#include <malloc.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/nn/unet.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_tensor_test_host_pool {

using namespace shard;

TEST_CASE("medium host blocks are reused without new OS mappings", "[tensor][memory][pool]") {
  // 160 KiB: the per-call buffer size that used to go through glibc's mmap/munmap every call.
  const Shape<1> medium{40 * 1024};
  float* first = nullptr;
  { first = Tensor<float, 1>::empty(medium).data(); }
  const auto s0 = host_allocator_stats();
  for (int i = 0; i < 100; ++i) {
    auto t = Tensor<float, 1>::empty(medium);
    CHECK(t.data() == first);  // the same block, parked on this thread
    CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);
  }
  const auto s1 = host_allocator_stats();
  CHECK(s1.allocs - s0.allocs >= 100);  // + control blocks
  CHECK(s1.cache_hits - s0.cache_hits == s1.allocs - s0.allocs);
  CHECK(s1.os_maps == s0.os_maps);
}

TEST_CASE("host blocks never come from malloc (the host program's malloc state is untouched)",
          "[tensor][memory][pool]") {
  // Warm the pool for these sizes first (its first use maps memory; that is not malloc either).
  const std::vector<index_t> sizes{1, 100, 3000, 20000, 40 * 1024, 200 * 1024, 2 << 20};
  for (auto n : sizes) { auto t = Tensor<float, 1>::empty({n}); }
  std::vector<Tensor<float, 1>> keep;
  keep.reserve(64);  // the vector's own buffer is allocated outside the measured window
  const auto before = mallinfo2();
  for (int r = 0; r < 3; ++r)
    for (auto n : sizes) keep.push_back(Tensor<float, 1>::empty({n}));
  keep.clear();  // every block released (to the pool / cache)
  const auto after = mallinfo2();
  // Neither heap chunks (uordblks) nor glibc's own mmapped chunks (hblks, hblkhd) changed.
  CHECK(after.hblks == before.hblks);
  CHECK(after.hblkhd == before.hblkhd);
  const long long heap_diff = static_cast<long long>(after.uordblks) - static_cast<long long>(before.uordblks);
  CHECK(heap_diff == 0);  // tensors (and their control blocks) took no heap chunk
}

TEST_CASE("size classes round up by at most 25% above 4 KiB and blocks do not overlap", "[tensor][memory][pool]") {
  for (index_t bytes : {4100, 5000, 6000, 7000, 9000, 33000, 100000, 163840, 700000, 1000000}) {
    const index_t n = bytes / 4;
    auto a = Tensor<float, 1>::empty({n});
    auto b = Tensor<float, 1>::empty({n});
    const auto pa = reinterpret_cast<std::uintptr_t>(a.data()), pb = reinterpret_cast<std::uintptr_t>(b.data());
    CHECK((pa + static_cast<std::uintptr_t>(n) * 4 <= pb || pb + static_cast<std::uintptr_t>(n) * 4 <= pa));
    a.fill(1.f);
    b.fill(2.f);
    CHECK(a(n - 1) == 1.f);
    CHECK(b(0) == 2.f);
  }
  // The cached bytes of a medium class are bounded by the class size: 200 KiB -> 256 KiB at most.
  release_cached_memory();
  const auto c0 = host_allocator_stats().pool_cached_bytes;
  std::vector<Tensor<float, 1>> many;
  for (int i = 0; i < 8; ++i) many.push_back(Tensor<float, 1>::empty({50000}));
  many.clear();  // one stays on this thread, the rest go to the global list
  const auto c1 = host_allocator_stats().pool_cached_bytes;
  CHECK(c1 - c0 <= 7 * (std::size_t{250} << 10));
  CHECK(c1 - c0 >= 7 * std::size_t{200000});
  const auto u0 = host_allocator_stats().os_unmaps;
  release_cached_memory();  // unmaps cached medium blocks
  CHECK(host_allocator_stats().os_unmaps > u0);
}

TEST_CASE("the pool is thread-safe: blocks allocated on one thread and freed on another", "[tensor][memory][pool]") {
  constexpr int threads = 4, rounds = 400;
  std::vector<std::vector<Tensor<double, 1>>> handoff(threads);
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([t, &handoff, &bad] {
      std::vector<Tensor<double, 1>> mine;
      for (int r = 0; r < rounds; ++r) {
        const index_t n = 1 + (r * 7919 + t * 104729) % 30000;
        auto x = Tensor<double, 1>::full({n}, static_cast<double>(t * rounds + r));
        mine.push_back(x);
        if (mine.size() > 8) mine.erase(mine.begin());
        for (const auto& y : mine)
          if (y(0) != y(y.numel() - 1)) ++bad;
      }
      handoff[static_cast<std::size_t>(t)] = std::move(mine);  // freed by the main thread
    });
  for (auto& th : ts) th.join();
  for (auto& h : handoff)
    for (const auto& y : h)
      if (y(0) != y(y.numel() - 1)) ++bad;
  handoff.clear();
  CHECK(bad == 0);
  auto z = Tensor<double, 1>::zeros({30000});
  CHECK(z(29999) == 0.0);
}

TEST_CASE("a steady-state U-Net training step makes no new OS mappings", "[tensor][memory][pool][unet]") {
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  nn::UNetOptions o{.in_channels = 1, .out_channels = 1, .depth = 2, .base_width = 8, .norm_groups = 2};
  nn::UNet<float, 2> model(mesh, o, 3);
  optim::AdamW<float> opt(model.parameters(), {.lr = 1e-3, .weight_decay = 1e-4});
  const auto x = DistTensor<float, 4>::random({2, 1, 32, 32}, mesh, {Replicate()}, 1);
  const auto y = DistTensor<float, 4>::random({2, 1, 32, 32}, mesh, {Replicate()}, 2);
  auto step = [&] {
    opt.zero_grad();
    auto loss = F::mse_loss(model.forward(autograd::Var<float, 4>(x)), autograd::Var<float, 4>(y));
    loss.backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step();  // warm-up: caches fill
  const auto s0 = host_allocator_stats();
  for (int i = 0; i < 5; ++i) step();
  const auto s1 = host_allocator_stats();
  INFO("allocs " << s1.allocs - s0.allocs << ", hits " << s1.cache_hits - s0.cache_hits << ", large allocs "
                 << s1.large_allocs - s0.large_allocs);
  CHECK(s1.allocs - s0.allocs > 100);  // the steps did allocate ...
  CHECK(s1.os_maps == s0.os_maps);     // ... but only from cached blocks
  CHECK(s1.os_unmaps == s0.os_unmaps);
}

}  // namespace st_tensor_test_host_pool
