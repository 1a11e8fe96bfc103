#pragma once
// FakeCudaBackend: makes DeviceKind::cuda usable on a machine without a GPU, for tests of the
// device paths (dist/, comm, whole models). It registers, for the scope of the object:
//   * the FakeDeviceRuntime (tests/comm/fake_device_runtime.hpp) as the CUDA runtime: "device"
//     memory is host memory, copies are counted by direction;
//   * for DeviceKind::cuda, the CPU tables of the kernel families box, pointwise, reduce, norm,
//     pool, resize, conv, gemm, optim, neighbors, rows and points, so every op on a Device::cuda(0) tensor runs the CPU
//     kernels on that (host) memory;
//   * for DeviceKind::cuda, HostTensorKernels as the "tensor" family (Tensor's own device entry
//     points: strided copy, fill, axpby, mul, sum, and their complex forms). That family has no CPU table in the registry
//     (the host side is inline in tensor.hpp), so it cannot be borrowed like the others; without
//     it Tensor::to(cuda) / copy_from throw "CUDA backend is not linked".
// The destructor restores whatever was registered before (a real CUDA backend, if linked).
// Usage:
//   shard::test::FakeCudaBackend fake;
//   auto x = ...to(Device::cuda(0));  ... fake.counts().d2h ...
#include <array>
#include <complex>
#include <cstring>
#include <stdexcept>

#include "../comm/fake_device_runtime.hpp"
#include "exec/tensor_kernels.hpp"
#include "shardtensor/runtime/registry.hpp"

namespace shard::test {

/// Host loops for Tensor's own device entry points, registered for DeviceKind::cuda by
/// FakeCudaBackend (the "tensor" family has no CPU table to borrow).
struct HostTensorKernels final : exec::TensorDeviceKernels {
  void strided_copy(DType dt, int rank, const index_t* shape, const void* src, const index_t* ss, void* dst,
                    const index_t* ds, Device) const override {
    const std::size_t es = dtype_size(dt);
    index_t n = 1;
    for (int d = 0; d < rank; ++d) n *= shape[d];
    std::array<index_t, 8> idx{};
    for (index_t i = 0; i < n; ++i) {
      index_t so = 0, dof = 0;
      for (int d = 0; d < rank; ++d) {
        so += idx[static_cast<std::size_t>(d)] * ss[d];
        dof += idx[static_cast<std::size_t>(d)] * ds[d];
      }
      std::memcpy(static_cast<char*>(dst) + static_cast<std::size_t>(dof) * es,
                  static_cast<const char*>(src) + static_cast<std::size_t>(so) * es, es);
      for (int d = rank - 1; d >= 0; --d) {
        if (++idx[static_cast<std::size_t>(d)] < shape[d]) break;
        idx[static_cast<std::size_t>(d)] = 0;
      }
    }
  }
  void fill(DType dt, void* dst, index_t n, const void* value, Device) const override {
    const std::size_t es = dtype_size(dt);
    for (index_t i = 0; i < n; ++i) std::memcpy(static_cast<char*>(dst) + static_cast<std::size_t>(i) * es, value, es);
  }
  template <class F>
  static void typed(DType dt, F&& f) {
    if (dt == DType::f32) f(float{});
    else if (dt == DType::f64) f(double{});
    else throw std::runtime_error("HostTensorKernels: f32 / f64 only");
  }
  void axpby(DType dt, index_t n, double alpha, const void* x, double beta, void* y, Device) const override {
    typed(dt, [&](auto z) {
      using T = decltype(z);
      for (index_t i = 0; i < n; ++i)
        static_cast<T*>(y)[i] = static_cast<T>(alpha * static_cast<const T*>(x)[i] + beta * static_cast<T*>(y)[i]);
    });
  }
  void mul(DType dt, index_t n, const void* a, const void* b, void* out, Device) const override {
    if (dt == DType::c64 || dt == DType::c128)
      return typed_complex(dt, [&](auto z) {
        using C = decltype(z);
        for (index_t i = 0; i < n; ++i) static_cast<C*>(out)[i] = static_cast<const C*>(a)[i] * static_cast<const C*>(b)[i];
      });
    typed(dt, [&](auto z) {
      using T = decltype(z);
      for (index_t i = 0; i < n; ++i) static_cast<T*>(out)[i] = static_cast<const T*>(a)[i] * static_cast<const T*>(b)[i];
    });
  }
  double sum(DType dt, index_t n, const void* x, Device) const override {
    double s = 0;
    typed(dt, [&](auto z) {
      using T = decltype(z);
      for (index_t i = 0; i < n; ++i) s += static_cast<double>(static_cast<const T*>(x)[i]);
    });
    return s;
  }
  template <class F>
  static void typed_complex(DType dt, F&& f) {
    if (dt == DType::c64) f(std::complex<float>{});
    else if (dt == DType::c128) f(std::complex<double>{});
    else throw std::runtime_error("HostTensorKernels: c64 / c128 expected");
  }
  void axpby_complex(DType dt, index_t n, std::complex<double> alpha, const void* x, std::complex<double> beta, void* y,
                     Device) const override {
    typed_complex(dt, [&](auto z) {
      using C = decltype(z);
      const C a(alpha), b(beta);
      for (index_t i = 0; i < n; ++i) static_cast<C*>(y)[i] = a * static_cast<const C*>(x)[i] + b * static_cast<C*>(y)[i];
    });
  }
  std::complex<double> sum_complex(DType dt, index_t n, const void* x, Device) const override {
    std::complex<double> s = 0;
    typed_complex(dt, [&](auto z) {
      using C = decltype(z);
      for (index_t i = 0; i < n; ++i) s += std::complex<double>(static_cast<const C*>(x)[i]);
    });
    return s;
  }
};

/// Registers the fake CUDA runtime and the CPU kernel tables for DeviceKind::cuda for a scope.
class FakeCudaBackend {
 public:
  /// The kernel families that get their CPU table registered for DeviceKind::cuda.
  /// (The "tensor" family is registered too, with HostTensorKernels.)
  static constexpr std::array<exec::KernelFamily, 12> kFamilies = {
      exec::KernelFamily::box,  exec::KernelFamily::pointwise, exec::KernelFamily::reduce,
      exec::KernelFamily::norm, exec::KernelFamily::pool,      exec::KernelFamily::resize,
      exec::KernelFamily::conv, exec::KernelFamily::gemm,      exec::KernelFamily::optim,
      exec::KernelFamily::neighbors, exec::KernelFamily::rows, exec::KernelFamily::points};

  FakeCudaBackend() : prev_tensor_(exec::find_family(DeviceKind::cuda, exec::KernelFamily::tensor)) {
    for (std::size_t i = 0; i < kFamilies.size(); ++i) {
      prev_[i] = exec::find_family(DeviceKind::cuda, kFamilies[i]);
      const void* cpu = exec::find_family(DeviceKind::cpu, kFamilies[i]);
      if (!cpu) throw std::logic_error("FakeCudaBackend: a borrowed kernel family has no CPU table");
      exec::register_family(DeviceKind::cuda, kFamilies[i], cpu);
    }
    exec::register_family(DeviceKind::cuda, exec::KernelFamily::tensor,
                          static_cast<const exec::TensorDeviceKernels*>(&tensor_table_));
  }
  ~FakeCudaBackend() {
    exec::register_family(DeviceKind::cuda, exec::KernelFamily::tensor, prev_tensor_);
    for (std::size_t i = 0; i < kFamilies.size(); ++i) exec::register_family(DeviceKind::cuda, kFamilies[i], prev_[i]);
  }
  FakeCudaBackend(const FakeCudaBackend&) = delete;
  FakeCudaBackend& operator=(const FakeCudaBackend&) = delete;

  /// Copy/sync counters of the fake runtime (reset when the backend was registered).
  const FakeDeviceRuntime::Counts& counts() const { return runtime_.counts(); }
  /// Resets the counters (e.g. after setting up inputs, before the operation under test).
  void reset_counts() const { fake_runtime().n = FakeDeviceRuntime::Counts{}; }

 private:
  FakeCudaScope runtime_;  // registered first, restored last
  std::array<const void*, kFamilies.size()> prev_{};
  const void* prev_tensor_;
  static inline const HostTensorKernels tensor_table_{};
};

}  // namespace shard::test
