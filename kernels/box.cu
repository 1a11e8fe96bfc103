// The `box` kernel family on CUDA: strided copy, add and fill over boxes of up to 8 dims (see
// src/kernels_api/box.hpp). One grid-stride kernel per operation; the index of element i is
// decomposed over the box's dims. Copies and fills move raw bytes (1, 2, 4, 8 or 16 per
// element, via trivially-copyable structs with the element's own alignment); add is typed,
// complex numbers as (re, im) pairs.
#include <cuda_runtime.h>

#include <cstring>

#include "common.cuh"
#include "kernels_api/box.hpp"
#include "kernels_api/convert_ops.hpp"

namespace shard::kernels {
namespace {

using idx = std::int64_t;
using namespace cu;

struct Geom {
  int rank;
  idx len[kBoxMaxRank];
  idx ds[kBoxMaxRank];
  idx ss[kBoxMaxRank];
};

struct CF { float re, im; };
struct CD { double re, im; };
struct BF { unsigned short bits; };  // bf16 storage: added in f32, rounded to nearest even
struct HF { unsigned short bits; };  // f16 storage: likewise

struct CopyOp {
  template <class T> __device__ void operator()(T& d, const T& s) const { d = s; }
};
struct AddOp {
  template <class T> __device__ void operator()(T& d, const T& s) const { d += s; }
  __device__ void operator()(CF& d, const CF& s) const { d.re += s.re; d.im += s.im; }
  __device__ void operator()(CD& d, const CD& s) const { d.re += s.re; d.im += s.im; }
  __device__ void operator()(BF& d, const BF& s) const { d.bits = cvt::bf16_bits(cvt::bf16_to_f32(d.bits) + cvt::bf16_to_f32(s.bits)); }
  __device__ void operator()(HF& d, const HF& s) const { d.bits = cvt::f16_bits(cvt::f16_to_f32(d.bits) + cvt::f16_to_f32(s.bits)); }
};

__device__ inline void offsets(const Geom& g, idx i, idx& od, idx& os) {
  od = 0;
  os = 0;
  for (int k = g.rank - 1; k >= 0; --k) {
    const idx j = i % g.len[k];
    i /= g.len[k];
    od += j * g.ds[k];
    os += j * g.ss[k];
  }
}

template <class T, class Op>
__global__ void binary_kernel(Geom g, idx n, T* dst, const T* src, Op op) {
  SHARD_GRID_STRIDE(i, n) {
    idx od, os;
    offsets(g, i, od, os);
    op(dst[od], src[os]);
  }
}

template <class T>
__global__ void fill_kernel(Geom g, idx n, T* dst, T v) {
  SHARD_GRID_STRIDE(i, n) {
    idx od, os;
    offsets(g, i, od, os);
    dst[od] = v;
  }
}

/// Drops size-1 dims and merges adjacent dims whose strides allow it (outermost first).
Geom make_geom(int rank, const idx* shape, const idx* ds, const idx* ss, idx& n) {
  Geom g{};
  idx len[kBoxMaxRank], a[kBoxMaxRank], b[kBoxMaxRank];
  int m = 0;
  n = 1;
  for (int d = rank - 1; d >= 0; --d) {
    n *= shape[d];
    if (shape[d] == 1) continue;
    const idx sv = ss ? ss[d] : 0;
    if (m > 0 && a[m - 1] * len[m - 1] == ds[d] && b[m - 1] * len[m - 1] == sv) {
      len[m - 1] *= shape[d];
      continue;
    }
    len[m] = shape[d];
    a[m] = ds[d];
    b[m] = sv;
    ++m;
  }
  g.rank = m;
  for (int k = 0; k < m; ++k) {
    g.len[k] = len[m - 1 - k];
    g.ds[k] = a[m - 1 - k];
    g.ss[k] = b[m - 1 - k];
  }
  return g;
}

template <class T, class Op>
int run_binary(int rank, const idx* shape, void* dst, const idx* ds, const void* src, const idx* ss, void* stream,
               Op op) {
  if (rank < 0 || rank > kBoxMaxRank) return invalid();
  idx n = 0;
  const Geom g = make_geom(rank, shape, ds, ss, n);
  if (n == 0) return 0;
  binary_kernel<T, Op><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(g, n, static_cast<T*>(dst),
                                                                                 static_cast<const T*>(src), op);
  return last_error();
}

template <class T>
int run_fill(int rank, const idx* shape, void* dst, const idx* ds, const void* value, void* stream) {
  if (rank < 0 || rank > kBoxMaxRank) return invalid();
  idx n = 0;
  const Geom g = make_geom(rank, shape, ds, nullptr, n);
  if (n == 0) return 0;
  T v;
  std::memcpy(&v, value, sizeof(T));
  fill_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(g, n, static_cast<T*>(dst), v);
  return last_error();
}

}  // namespace

int box_copy_launch(int elem_bytes, int rank, const idx* shape, void* dst, const idx* dst_strides, const void* src,
                    const idx* src_strides, void* stream) {
  if (rank >= 0 && rank <= kBoxMaxRank) {  // one contiguous run: a plain device-to-device copy
    idx n = 0;
    const Geom g = make_geom(rank, shape, dst_strides, src_strides, n);
    if (n == 0) return 0;
    if (g.rank == 0 || (g.rank == 1 && g.ds[0] == 1 && g.ss[0] == 1))
      return static_cast<int>(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * static_cast<std::size_t>(elem_bytes),
                                              cudaMemcpyDeviceToDevice, as_stream(stream)));
  }
  return by_width(elem_bytes, [&](auto t) {
    return run_binary<decltype(t)>(rank, shape, dst, dst_strides, src, src_strides, stream, CopyOp{});
  });
}

int box_add_launch(BoxAddType type, int rank, const idx* shape, void* dst, const idx* dst_strides, const void* src,
                   const idx* src_strides, void* stream) {
  switch (type) {
    case box_f32: return run_binary<float>(rank, shape, dst, dst_strides, src, src_strides, stream, AddOp{});
    case box_f64: return run_binary<double>(rank, shape, dst, dst_strides, src, src_strides, stream, AddOp{});
    case box_i32: return run_binary<int>(rank, shape, dst, dst_strides, src, src_strides, stream, AddOp{});
    case box_i64: return run_binary<long long>(rank, shape, dst, dst_strides, src, src_strides, stream, AddOp{});
    case box_c64: return run_binary<CF>(rank, shape, dst, dst_strides, src, src_strides, stream, AddOp{});
    case box_c128: return run_binary<CD>(rank, shape, dst, dst_strides, src, src_strides, stream, AddOp{});
    case box_bf16: return run_binary<BF>(rank, shape, dst, dst_strides, src, src_strides, stream, AddOp{});
    case box_f16: return run_binary<HF>(rank, shape, dst, dst_strides, src, src_strides, stream, AddOp{});
  }
  return invalid();
}

int box_fill_launch(int elem_bytes, int rank, const idx* shape, void* dst, const idx* dst_strides, const void* value,
                    void* stream) {
  return by_width(elem_bytes, [&](auto t) {
    return run_fill<decltype(t)>(rank, shape, dst, dst_strides, value, stream);
  });
}

const char* box_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace shard::kernels
