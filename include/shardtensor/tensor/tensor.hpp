#pragma once
/// \file tensor.hpp
/// Tensor<T, Rank>: dense strided local storage on a Device, owning or viewing user memory.
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>

#include "shardtensor/core/device.hpp"
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/memory.hpp"

namespace shard {

namespace detail {
/// Type-erased strided copy on a device (CUDA kernel); rank <= 8.
void device_strided_copy(DType dt, int rank, const index_t* shape, const void* src, const index_t* src_strides,
                         void* dst, const index_t* dst_strides, Device dev);
/// Type-erased fill of a contiguous device buffer with the `dtype_size` bytes at `value`.
void device_fill(DType dt, void* dst, index_t n, const void* value, Device dev);
}  // namespace detail

/// Calls f(offset_a, offset_b, inner_len) for each innermost row of `shape`, with the element
/// offsets of that row's start under strides sa and sb. Rows are visited in row-major order.
template <std::size_t R, class F>
void for_each_row(const std::array<index_t, R>& shape, const std::array<index_t, R>& sa,
                  const std::array<index_t, R>& sb, F&& f) {
  if constexpr (R == 0) {
    f(index_t{0}, index_t{0}, index_t{1});
  } else {
    for (auto e : shape)
      if (e == 0) return;
    const index_t inner = shape[R - 1];
    index_t outer = 1;
    for (std::size_t d = 0; d + 1 < R; ++d) outer *= shape[d];
    for (index_t o = 0; o < outer; ++o) {
      index_t rem = o, oa = 0, ob = 0;
      for (int d = static_cast<int>(R) - 2; d >= 0; --d) {
        const index_t i = rem % shape[d];
        rem /= shape[d];
        oa += i * sa[d];
        ob += i * sb[d];
      }
      f(oa, ob, inner);
    }
  }
}

/// Distribution for deterministic random initialisation.
struct RandomInit {
  enum class Kind { uniform, normal } kind = Kind::uniform;
  double a = -1.0;  ///< uniform: low; normal: mean
  double b = 1.0;   ///< uniform: high; normal: std
  static constexpr RandomInit uniform(double lo, double hi) { return {Kind::uniform, lo, hi}; }
  static constexpr RandomInit normal(double mean, double stddev) { return {Kind::normal, mean, stddev}; }
};

/// Deterministic value for global linear index `idx` under `seed` (counter-based hash).
double random_value(std::uint64_t seed, std::uint64_t idx, RandomInit init) noexcept;

/// Dense strided Rank-dimensional array of T on a Device. Copies are shallow (they share
/// storage, like a view); use clone() for a deep copy. A default-constructed Tensor is empty.
template <class T, int Rank>
class Tensor {
  static_assert(Rank >= 0 && Rank <= 8, "Tensor supports ranks 0..8");

 public:
  using value_type = T;
  static constexpr int rank = Rank;

  Tensor() { shape_.fill(0); strides_.fill(1); }

  /// Uninitialised contiguous tensor.
  static Tensor empty(const Shape<Rank>& shape, Device dev = Device::cpu()) {
    for (auto e : shape) SHARD_CHECK(e >= 0, "Tensor::empty", "negative extent in shape {}", shape);
    SHARD_CHECK(numel_fits(shape, static_cast<index_t>(sizeof(T))), "Tensor::empty",
                "shape {} of {}-byte elements overflows a 64-bit byte count", shape, sizeof(T));
    Tensor t;
    t.shape_ = shape;
    t.strides_ = contiguous_strides(shape);
    t.device_ = dev;
    t.storage_ = allocate_bytes(static_cast<std::size_t>(shard::numel(shape)) * sizeof(T), dev);
    t.data_ = static_cast<T*>(t.storage_.get());
    return t;
  }
  /// Contiguous tensor of zeros.
  static Tensor zeros(const Shape<Rank>& shape, Device dev = Device::cpu()) { return full(shape, T(0), dev); }
  /// Contiguous tensor filled with `v`.
  static Tensor full(const Shape<Rank>& shape, T v, Device dev = Device::cpu()) {
    Tensor t = empty(shape, dev);
    t.fill(v);
    return t;
  }
  /// Non-owning contiguous view of user memory (zero-copy). The memory must outlive the view.
  /// shardtensor cannot see writes to user memory, so by default such a view is snapshotted when
  /// autograd would save it (see Var; costs a copy). declare_stable() opts out of the copy.
  static Tensor view(T* ptr, const Shape<Rank>& shape, Device dev = Device::cpu()) {
    return view(ptr, shape, contiguous_strides(shape), dev);
  }
  /// Non-owning strided view of user memory (zero-copy), e.g. the interior of a ghosted array.
  static Tensor view(T* ptr, const Shape<Rank>& shape, const Shape<Rank>& strides, Device dev = Device::cpu()) {
    SHARD_CHECK(ptr != nullptr || shard::numel(shape) == 0, "Tensor::view", "null pointer for shape {}", shape);
    Tensor t;
    t.shape_ = shape;
    t.strides_ = strides;
    t.device_ = dev;
    t.data_ = ptr;
    return t;
  }

  /// Tensor over memory kept alive by `storage` (shared ownership; used by the type-erased layers).
  static Tensor adopt(std::shared_ptr<void> storage, T* ptr, const Shape<Rank>& shape, const Shape<Rank>& strides,
                      Device dev) {
    Tensor t = view(ptr, shape, strides, dev);
    t.storage_ = std::move(storage);
    return t;
  }
  /// The shared owner of this tensor's memory (null for views of user memory; a token without
  /// ownership for user memory declared stable).
  const std::shared_ptr<void>& storage() const { return storage_; }

  // ------------------------------------------------------------------ versions (saved-tensor safety)
  /// The version of this tensor's storage: every in-place write shardtensor makes (copy_from,
  /// fill, in-place arithmetic, kernel outputs written into existing tensors, optimiser updates)
  /// adds one, and so does bump_version(). Autograd records the versions of the tensors a node
  /// saves and backward refuses (shard::Error) when one changed. 0 for untracked user views.
  std::uint64_t version() const noexcept {
    const auto* c = storage_ ? detail::version_counter(storage_) : nullptr;
    return c ? c->load(std::memory_order_relaxed) : 0;
  }
  /// Declares that the data was modified through a pointer shardtensor does not see (e.g. the
  /// simulation wrote into the array a stable view looks at): a backward that needs the old
  /// values then fails with shard::Error instead of computing a wrong gradient.
  void bump_version() const noexcept { detail::bump_version(storage_); }
  /// True for a view of user memory (made by view(); declared stable or not).
  bool is_user_view() const noexcept { return !storage_ || detail::is_user_memory_token(storage_); }
  /// True for a view of user memory that autograd snapshots when it saves it (the default).
  bool snapshot_on_save() const noexcept { return !storage_ && numel() > 0; }
  /// This view of user memory declared stable: autograd saves it without a copy (zero-copy) and
  /// the user promises not to modify it between forward and backward, or to call bump_version()
  /// (or shard::mark_modified) after doing so. Views of shardtensor's own memory are returned
  /// unchanged (their writes are tracked already).
  Tensor declare_stable() const {
    if (storage_) return *this;
    Tensor t = *this;
    t.storage_ = detail::user_memory_token(data_);
    return t;
  }

  const Shape<Rank>& shape() const { return shape_; }
  index_t size(int d) const { return shape_[d]; }
  const Shape<Rank>& strides() const { return strides_; }
  index_t stride(int d) const { return strides_[d]; }
  index_t numel() const { return shard::numel(shape_); }
  T* data() const { return data_; }
  Device device() const { return device_; }
  /// True if this tensor (or the tensor it views into) owns its memory.
  bool owns_memory() const { return storage_ != nullptr && !detail::is_user_memory_token(storage_); }
  /// True if elements are laid out row-major without gaps.
  bool is_contiguous() const {
    index_t acc = 1;
    for (int d = Rank - 1; d >= 0; --d) {
      if (shape_[d] != 1 && strides_[d] != acc) return false;
      acc *= shape_[d];
    }
    return true;
  }

  /// Element reference (host tensors only).
  template <class... I>
  T& operator()(I... i) const {
    static_assert(sizeof...(I) == Rank, "wrong number of indices");
    const index_t idx[] = {static_cast<index_t>(i)..., 0};
    index_t off = 0;
    for (int d = 0; d < Rank; ++d) off += idx[d] * strides_[d];
    return data_[off];
  }
  /// Element reference by multi-index (host tensors only).
  T& at(const Shape<Rank>& idx) const {
    index_t off = 0;
    for (int d = 0; d < Rank; ++d) off += idx[d] * strides_[d];
    return data_[off];
  }

  /// View of [start, start+len) along `dim`.
  Tensor narrow(int dim, index_t start, index_t len) const {
    SHARD_CHECK(dim >= 0 && dim < Rank, "Tensor::narrow", "dim {} out of range for rank {}", dim, Rank);
    SHARD_CHECK(start >= 0 && len >= 0 && start + len <= shape_[dim], "Tensor::narrow",
                "range [{}, {}) out of bounds for dim {} of shape {}", start, start + len, dim, shape_);
    Tensor t = *this;
    t.shape_[dim] = len;
    if (len > 0) t.data_ = data_ + start * strides_[dim];
    return t;
  }
  /// View of the box [starts, starts+lens).
  Tensor slice(const Shape<Rank>& starts, const Shape<Rank>& lens) const {
    Tensor t = *this;
    for (int d = 0; d < Rank; ++d) t = t.narrow(d, starts[d], lens[d]);
    return t;
  }
  /// Reinterprets a contiguous tensor with a new shape of the same element count (a view).
  template <int R2>
  Tensor<T, R2> reshape(const Shape<R2>& s) const {
    SHARD_CHECK(is_contiguous(), "Tensor::reshape", "tensor of shape {} is not contiguous", shape_);
    SHARD_CHECK(shard::numel(s) == numel(), "Tensor::reshape", "cannot reshape {} to {}", shape_, s);
    Tensor<T, R2> t = Tensor<T, R2>::view(data_, s, device_);
    t.storage_ = storage_;
    return t;
  }

  /// Copies elements of `src` (same shape; any strides; any device) into this tensor.
  void copy_from(const Tensor& src) const {
    SHARD_CHECK(src.shape_ == shape_, "Tensor::copy_from", "shape {} != destination shape {}", src.shape_, shape_);
    if (numel() == 0) return;
    bump_version();
    if (device_.is_cpu() && src.device_.is_cpu()) {
      T* dst = data_;
      const T* s = src.data_;
      const auto& ss = src.strides_;
      const bool inner_unit = Rank == 0 || (strides_[Rank - 1] == 1 && ss[Rank - 1] == 1);
      if (inner_unit && is_contiguous() && src.is_contiguous()) {
        std::memcpy(dst, s, sizeof(T) * static_cast<std::size_t>(numel()));
        return;
      }
      const index_t istr_d = Rank ? strides_[Rank - 1] : 1, istr_s = Rank ? ss[Rank - 1] : 1;
      for_each_row(shape_, strides_, ss, [&](index_t od, index_t os, index_t n) {
        if (inner_unit) {
          std::memcpy(dst + od, s + os, sizeof(T) * static_cast<std::size_t>(n));
        } else {
          for (index_t i = 0; i < n; ++i) dst[od + i * istr_d] = s[os + i * istr_s];
        }
      });
      return;
    }
    if (device_ == src.device_) {
      detail::device_strided_copy(dtype_of<T>, Rank, shape_.data(), src.data_, src.strides_.data(), data_,
                                  strides_.data(), device_);
      return;
    }
    // Across devices: stage through contiguous buffers.
    Tensor s = src.contiguous();
    if (is_contiguous()) {
      copy_bytes(data_, device_, s.data_, s.device_, sizeof(T) * static_cast<std::size_t>(numel()));
    } else {
      Tensor tmp = empty(shape_, device_);
      copy_bytes(tmp.data_, device_, s.data_, s.device_, sizeof(T) * static_cast<std::size_t>(numel()));
      copy_from(tmp);
    }
  }
  /// This tensor if contiguous, else a contiguous copy.
  Tensor contiguous() const { return is_contiguous() ? *this : clone(); }
  /// Deep contiguous copy on the same device.
  Tensor clone() const { return to(device_); }
  /// Deep contiguous copy on `dev`.
  Tensor to(Device dev) const {
    Tensor t = empty(shape_, dev);
    t.copy_from(*this);
    return t;
  }

  /// Sets every element to `v`.
  void fill(T v) const {
    if (numel() == 0) return;
    bump_version();
    if (device_.is_cpu()) {
      if (is_contiguous()) {
        std::fill_n(data_, numel(), v);
      } else {
        for_each_row(shape_, strides_, strides_, [&](index_t o, index_t, index_t n) {
          for (index_t i = 0; i < n; ++i) data_[o + i * strides_[Rank - 1]] = v;
        });
      }
      return;
    }
    if (is_contiguous()) {
      detail::device_fill(dtype_of<T>, data_, numel(), &v, device_);
    } else {
      Tensor tmp = full(shape_, v, device_);
      copy_from(tmp);
    }
  }

  /// Fills with deterministic random values that depend only on (seed, global index): this
  /// tensor is the box at `global_offset` of a tensor of shape `global_shape`.
  void fill_random(std::uint64_t seed, const Shape<Rank>& global_offset, const Shape<Rank>& global_shape,
                   RandomInit init = {}) const {
    bump_version();
    if (!device_.is_cpu()) {
      Tensor tmp = empty(shape_, Device::cpu());
      tmp.fill_random(seed, global_offset, global_shape, init);
      copy_from(tmp);
      return;
    }
    const index_t n = numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (index_t lin = 0; lin < n; ++lin) {
      auto idx = unravel(lin, shape_);
      index_t off = 0;
      for (int d = 0; d < Rank; ++d) {
        off += idx[d] * strides_[d];
        idx[d] += global_offset[d];
      }
      data_[off] = static_cast<T>(random_value(seed, static_cast<std::uint64_t>(ravel(idx, global_shape)), init));
    }
  }
  /// Fills a whole (non-distributed) tensor deterministically.
  void fill_random(std::uint64_t seed, RandomInit init = {}) const {
    Shape<Rank> z{};
    fill_random(seed, z, shape_, init);
  }

 private:
  template <class, int> friend class Tensor;
  std::shared_ptr<void> storage_;
  T* data_ = nullptr;
  Shape<Rank> shape_;
  Shape<Rank> strides_;
  Device device_{};
};

/// Declares that `t`'s data was modified through a pointer shardtensor does not see (same as
/// t.bump_version()).
template <class T, int Rank>
void mark_modified(const Tensor<T, Rank>& t) noexcept {
  t.bump_version();
}

}  // namespace shard
