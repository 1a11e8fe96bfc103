#pragma once
// Helpers of the CUDA-vs-CPU kernel tests in tests/gpusim/ (the GPU simulator lane, ctest label
// gpusim; see scripts/gpusim.sh). Each test calls one kernel family's CUDA table and its CPU table
// directly through the registry (runtime/registry.hpp, exec/<family>_kernels.hpp) on the same small
// inputs and compares the results. They run on a real GPU too, and skip when no device is visible.
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/shardtensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "shardtensor/runtime/device_runtime.hpp"
#include "shardtensor/runtime/registry.hpp"

namespace gpusim {
using namespace shard;

#define GPUSIM_REQUIRE_GPU() \
  if (shard::cuda_device_count() == 0) SKIP("no CUDA device visible (real or simulated): skipped")

inline const exec::DeviceRuntime& rt() { return exec::cuda_runtime("gpusim test"); }
inline Device gpu() { return Device::cuda(0); }
inline ExecContext& gctx() { return current_context(gpu()); }
inline ExecContext& hctx() { return current_context(Device::cpu()); }

template <class T>
inline double tol() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-11;
}

/// Deterministic values in [lo, hi).
inline std::vector<double> rand_vals(std::size_t n, unsigned seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

/// A host block and a device block of the same shape and contents (contiguous).
template <class T>
struct Pair {
  Block h, d;
  std::size_t n = 0;
  explicit Pair(const std::vector<index_t>& shape, const std::vector<double>& vals = {}) {
    h = Block::allocate(dtype_of<T>, Device::cpu(), shape);
    d = Block::allocate(dtype_of<T>, gpu(), shape);
    n = static_cast<std::size_t>(h.numel());
    auto* p = static_cast<T*>(h.data);
    for (std::size_t i = 0; i < n; ++i) p[i] = vals.empty() ? T(0) : static_cast<T>(vals[i % vals.size()]);
    upload();
  }
  Pair(const std::vector<index_t>& shape, unsigned seed, double lo = -1.0, double hi = 1.0)
      : Pair(shape, rand_vals(count(shape), seed, lo, hi)) {}
  static std::size_t count(const std::vector<index_t>& s) {
    std::size_t n = 1;
    for (auto e : s) n *= static_cast<std::size_t>(e);
    return n;
  }
  void upload() {
    if (n) rt().copy(d.data, gpu(), h.data, Device::cpu(), n * sizeof(T), gctx().stream(), true);
  }
  std::vector<double> host() const {
    const auto* p = static_cast<const T*>(h.data);
    return std::vector<double>(p, p + n);
  }
  std::vector<double> device() const {
    std::vector<T> t(n);
    if (n) rt().copy(t.data(), Device::cpu(), d.data, gpu(), n * sizeof(T), gctx().stream(), true);
    return std::vector<double>(t.begin(), t.end());
  }
};

/// Max |a - b| / max(1, max |b|); inf/nan must match exactly.
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0, s = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      if (!(std::isnan(a[i]) && std::isnan(b[i])) && a[i] != b[i]) return INFINITY;
      continue;
    }
    m = std::max(m, std::abs(a[i] - b[i]));
    s = std::max(s, std::abs(b[i]));
  }
  return m / s;
}

/// The first index where a (device) and b (host) differ most, for failure messages.
inline std::string worst(const std::vector<double>& a, const std::vector<double>& b) {
  std::size_t w = 0;
  double m = -1;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = std::isfinite(a[i]) && std::isfinite(b[i]) ? std::abs(a[i] - b[i])
                     : (a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) ? 0.0
                                                                               : INFINITY;
    if (d > m) m = d, w = i;
  }
  if (a.empty() || b.empty()) return "empty";
  return "element " + std::to_string(w) + ": cuda " + std::to_string(a[w]) + " cpu " + std::to_string(b[w]);
}

/// Checks that the device copy of `p` matches its host copy (what the CPU table wrote).
#define GPUSIM_CHECK_CLOSE(pair, T, what)                                                  \
  do {                                                                                      \
    const auto d_ = (pair).device(), h_ = (pair).host();                                  \
    const double e_ = gpusim::rel_err(d_, h_);                                              \
    INFO(what << ": relative error " << e_ << " (tolerance " << gpusim::tol<T>() << "); worst " \
              << gpusim::worst(d_, h_));                                                     \
    CHECK(e_ <= gpusim::tol<T>());                                                          \
  } while (0)

}  // namespace gpusim
