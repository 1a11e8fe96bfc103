// CPU implementation of the `box` kernel family: strided copy / add / fill over boxes. The loops
// are the former copy_box (src/dist/redistribute.cpp), box_kernel / fill_zero (src/dist/halo.cpp)
// and zero_box / add_box_t (the former src/nn/conv_dist.cpp), merged: dims are coalesced first (so a box
// that is one contiguous run is one memcpy), inner rows with unit strides move with memcpy /
// vectorisable loops, and large boxes are split over OpenMP threads by rows (and long rows by
// chunks).
#include <complex>
#include <cstdint>
#include <cstring>

#include "exec/box_kernels.hpp"

namespace shard::exec {
namespace {

/// Boxes above this many elements are split over OpenMP threads.
constexpr index_t kParallelElements = index_t{1} << 15;
/// Rows longer than this many elements are split into chunks of this length (work units).
constexpr index_t kChunkElements = index_t{1} << 16;

BoxShape shape_of(const Block& dst, const Block* src) {
  BoxShape b = normalize_box(dst, src);
  if (b.rank == 0) {  // one element: a row of length 1
    b.rank = 1;
    b.len[0] = 1;
    b.dst_stride[0] = b.src_stride[0] = 1;
  }
  return b;
}

/// Calls f(dst_offset, src_offset, count) (element offsets of a run along the innermost dim) for
/// every work unit of the box: each row, long rows split in chunks. Parallel for large boxes.
template <class F>
void for_each_run(const BoxShape& b, F&& f) {
  const int R = b.rank;
  const index_t inner = b.len[R - 1], di = b.dst_stride[R - 1], si = b.src_stride[R - 1];
  index_t outer = 1;
  for (int k = 0; k + 1 < R; ++k) outer *= b.len[k];
  const index_t chunks = inner > kChunkElements ? (inner + kChunkElements - 1) / kChunkElements : 1;
  const index_t chunk = chunks > 1 ? kChunkElements : inner;
  const index_t units = outer * chunks;
#pragma omp parallel for schedule(static) if (outer * inner > kParallelElements)
  for (index_t u = 0; u < units; ++u) {
    const index_t o = u / chunks, c = u - o * chunks;
    index_t rem = o, od = 0, os = 0;
    for (int k = R - 2; k >= 0; --k) {
      const index_t i = rem % b.len[k];
      rem /= b.len[k];
      od += i * b.dst_stride[k];
      os += i * b.src_stride[k];
    }
    const index_t first = c * chunk;
    const index_t count = first + chunk <= inner ? chunk : inner - first;
    f(od + first * di, os + first * si, count);
  }
}

template <std::size_t ES>
void copy_strided(const BoxShape& b, char* t, const char* s) {
  const index_t di = b.dst_stride[b.rank - 1], si = b.src_stride[b.rank - 1];
  for_each_run(b, [&](index_t od, index_t os, index_t n) {
    char* tp = t + od * static_cast<index_t>(ES);
    const char* sp = s + os * static_cast<index_t>(ES);
    for (index_t i = 0; i < n; ++i)
      std::memcpy(tp + i * di * static_cast<index_t>(ES), sp + i * si * static_cast<index_t>(ES), ES);
  });
}

template <class T>
void add_typed(const BoxShape& b, T* t, const T* s) {
  const index_t di = b.dst_stride[b.rank - 1], si = b.src_stride[b.rank - 1];
  for_each_run(b, [&](index_t od, index_t os, index_t n) {
    T* x = t + od;
    const T* y = s + os;
    if (di == 1 && si == 1) {
      for (index_t i = 0; i < n; ++i) x[i] += y[i];
    } else {
      for (index_t i = 0; i < n; ++i) x[i * di] += y[i * si];
    }
  });
}

template <std::size_t ES>
void fill_strided(const BoxShape& b, char* t, const void* value) {
  unsigned char v[ES];
  std::memcpy(v, value, ES);
  const index_t di = b.dst_stride[b.rank - 1];
  for_each_run(b, [&](index_t od, index_t, index_t n) {
    char* tp = t + od * static_cast<index_t>(ES);
    for (index_t i = 0; i < n; ++i) std::memcpy(tp + i * di * static_cast<index_t>(ES), v, ES);
  });
}

bool all_zero(const void* value, std::size_t es) {
  const auto* p = static_cast<const unsigned char*>(value);
  for (std::size_t i = 0; i < es; ++i)
    if (p[i] != 0) return false;
  return true;
}

struct CpuBoxKernels final : BoxKernels {
  // bf16 / f16 boxes are copied, filled and accumulated (one rounding per element) in place.
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void copy(const Block& dst, const Block& src, ExecContext&) const override {
    const BoxShape b = shape_of(dst, &src);
    const auto es = static_cast<index_t>(dst.element_bytes());
    char* t = static_cast<char*>(dst.data);
    const char* s = static_cast<const char*>(src.data);
    if (b.dst_stride[b.rank - 1] == 1 && b.src_stride[b.rank - 1] == 1) {
      for_each_run(b, [&](index_t od, index_t os, index_t n) {
        std::memcpy(t + od * es, s + os * es, static_cast<std::size_t>(n * es));
      });
      return;
    }
    switch (es) {
      case 1: return copy_strided<1>(b, t, s);
      case 2: return copy_strided<2>(b, t, s);
      case 4: return copy_strided<4>(b, t, s);
      case 8: return copy_strided<8>(b, t, s);
      case 16: return copy_strided<16>(b, t, s);
      default: SHARD_FAIL("box_copy", "unsupported element size {} bytes ({})", es, dst.dtype);
    }
  }

  void add(const Block& dst, const Block& src, ExecContext&) const override {
    const BoxShape b = shape_of(dst, &src);
    switch (dst.dtype) {
      case DType::f32: return add_typed(b, static_cast<float*>(dst.data), static_cast<const float*>(src.data));
      case DType::f64: return add_typed(b, static_cast<double*>(dst.data), static_cast<const double*>(src.data));
      case DType::bf16: return add_typed(b, static_cast<bf16*>(dst.data), static_cast<const bf16*>(src.data));
      case DType::f16: return add_typed(b, static_cast<f16*>(dst.data), static_cast<const f16*>(src.data));
      case DType::i32:
        return add_typed(b, static_cast<std::int32_t*>(dst.data), static_cast<const std::int32_t*>(src.data));
      case DType::i64:
        return add_typed(b, static_cast<std::int64_t*>(dst.data), static_cast<const std::int64_t*>(src.data));
      case DType::c64:
        return add_typed(b, static_cast<std::complex<float>*>(dst.data), static_cast<const std::complex<float>*>(src.data));
      case DType::c128:
        return add_typed(b, static_cast<std::complex<double>*>(dst.data),
                         static_cast<const std::complex<double>*>(src.data));
      default: SHARD_FAIL("box_add", "dtype {} cannot be accumulated (f32, f64, bf16, f16, c64, c128, i32, i64)", dst.dtype);
    }
  }

  void fill(const Block& dst, const void* value, ExecContext&) const override {
    const BoxShape b = shape_of(dst, nullptr);
    const auto es = static_cast<index_t>(dst.element_bytes());
    char* t = static_cast<char*>(dst.data);
    if (b.dst_stride[b.rank - 1] == 1 && all_zero(value, static_cast<std::size_t>(es))) {
      for_each_run(b, [&](index_t od, index_t, index_t n) {
        std::memset(t + od * es, 0, static_cast<std::size_t>(n * es));
      });
      return;
    }
    switch (es) {
      case 1: return fill_strided<1>(b, t, value);
      case 2: return fill_strided<2>(b, t, value);
      case 4: return fill_strided<4>(b, t, value);
      case 8: return fill_strided<8>(b, t, value);
      case 16: return fill_strided<16>(b, t, value);
      default: SHARD_FAIL("box_fill", "unsupported element size {} bytes ({})", es, dst.dtype);
    }
  }
};

const CpuBoxKernels g_cpu_box;

}  // namespace

SHARD_CPU_TABLE(box, g_cpu_box);

}  // namespace shard::exec
