// CUDA kernels of the pointwise family (launchers: src/kernels_api/pointwise.hpp). The formulas
// are shared with the CPU implementation (src/kernels_api/pointwise_ops.hpp).
#include <cuda_runtime.h>

#include <utility>

#include "common.cuh"
#include "kernels_api/convert_ops.hpp"
#include "kernels_api/pointwise.hpp"
#include "kernels_api/pointwise_ops.hpp"

namespace shard::kernels {
namespace {

using idx = pw_idx;
namespace ops = pw;
using namespace cu;

/// Shape and up to three operand stride sets, passed by value to the kernels.
struct Desc {
  int rank;
  idx shape[kPwMaxRank];
  idx s0[kPwMaxRank], s1[kPwMaxRank], s2[kPwMaxRank];
};
Desc make_desc(int rank, const idx* shape, const idx* s0, const idx* s1, const idx* s2) {
  Desc d{};
  d.rank = rank;
  for (int k = 0; k < rank; ++k) {
    d.shape[k] = shape[k];
    d.s0[k] = s0 ? s0[k] : 0;
    d.s1[k] = s1 ? s1[k] : 0;
    d.s2[k] = s2 ? s2[k] : 0;
  }
  return d;
}

// Templated on the storage type S (float, double, bf16 / f16 bits) and computed in its compute
// type C = Storage<S>::C: a bf16 / f16 result is the float op on the widened operands, rounded once.
template <class S, int Op>
__global__ void unary_kernel(idx n, typename Storage<S>::C a, const S* __restrict__ x, S* __restrict__ y) {
  using St = Storage<S>;
  SHARD_GRID_STRIDE(i, n) y[i] = St::store(ops::unary_fwd<Op, typename St::C>(St::load(x[i]), a));
}
template <class S, int Op>
__global__ void unary_bwd_kernel(idx n, typename Storage<S>::C a, const S* __restrict__ x, const S* __restrict__ y,
                                 const S* __restrict__ g, S* __restrict__ dx) {
  using St = Storage<S>;
  SHARD_GRID_STRIDE(i, n)
  dx[i] = St::store(ops::unary_bwd<Op, typename St::C>(St::load(x[i]), St::load(y[i]), St::load(g[i]), a));
}
template <class S, int Op>
__global__ void binary_contig_kernel(idx n, const S* __restrict__ a, const S* __restrict__ b, S* __restrict__ o) {
  using St = Storage<S>;
  SHARD_GRID_STRIDE(i, n) o[i] = St::store(ops::binary_fwd<Op, typename St::C>(St::load(a[i]), St::load(b[i])));
}
// Vectorised forms for contiguous, 16-byte aligned operands: each thread moves 16 bytes per
// operand per step (4 floats, 8 bf16 / f16, 2 doubles) and applies the same scalar formula to each
// element, so results equal the scalar kernels bit for bit; the n % V tail runs scalar.
template <class S>
constexpr int kVec = static_cast<int>(16 / sizeof(S));
template <class S>
struct alignas(16) Pack {
  S v[kVec<S>];
};
inline bool aligned16(const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15u) == 0; }
/// Calls pack(p) for the whole packs and tail(i) for the n % V elements after them (grid-stride).
template <class S, class FP, class FT>
__device__ __forceinline__ void vec_loop(idx n, FP&& pack, FT&& tail) {
  const idx np = n / kVec<S>;
  SHARD_GRID_STRIDE(p, np) pack(p);
  for (idx i = np * kVec<S> + blockIdx.x * static_cast<idx>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<idx>(gridDim.x) * blockDim.x)
    tail(i);
}
template <class S, int Op>
__global__ void unary_vec_kernel(idx n, typename Storage<S>::C a, const S* __restrict__ x, S* __restrict__ y) {
  using St = Storage<S>;
  using C = typename St::C;
  constexpr int V = kVec<S>;
  const auto* xp = reinterpret_cast<const Pack<S>*>(x);
  auto* yp = reinterpret_cast<Pack<S>*>(y);
  vec_loop<S>(n, [&](idx p) {
    const Pack<S> in = xp[p];
    Pack<S> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = St::store(ops::unary_fwd<Op, C>(St::load(in.v[j]), a));
    yp[p] = out;
  }, [&](idx i) { y[i] = St::store(ops::unary_fwd<Op, C>(St::load(x[i]), a)); });
}
template <class S, int Op>
__global__ void unary_bwd_vec_kernel(idx n, typename Storage<S>::C a, const S* __restrict__ x,
                                     const S* __restrict__ y, const S* __restrict__ g, S* __restrict__ dx) {
  using St = Storage<S>;
  using C = typename St::C;
  constexpr int V = kVec<S>;
  const auto* xp = reinterpret_cast<const Pack<S>*>(x);
  const auto* yp = reinterpret_cast<const Pack<S>*>(y);
  const auto* gp = reinterpret_cast<const Pack<S>*>(g);
  auto* dp = reinterpret_cast<Pack<S>*>(dx);
  vec_loop<S>(n, [&](idx p) {
    const Pack<S> xv = xp[p], yv = yp[p], gv = gp[p];
    Pack<S> out;
#pragma unroll
    for (int j = 0; j < V; ++j)
      out.v[j] = St::store(ops::unary_bwd<Op, C>(St::load(xv.v[j]), St::load(yv.v[j]), St::load(gv.v[j]), a));
    dp[p] = out;
  }, [&](idx i) { dx[i] = St::store(ops::unary_bwd<Op, C>(St::load(x[i]), St::load(y[i]), St::load(g[i]), a)); });
}
template <class S, int Op>
__global__ void binary_vec_kernel(idx n, const S* __restrict__ a, const S* __restrict__ b, S* __restrict__ o) {
  using St = Storage<S>;
  using C = typename St::C;
  constexpr int V = kVec<S>;
  const auto* ap = reinterpret_cast<const Pack<S>*>(a);
  const auto* bp = reinterpret_cast<const Pack<S>*>(b);
  auto* op = reinterpret_cast<Pack<S>*>(o);
  vec_loop<S>(n, [&](idx p) {
    const Pack<S> av = ap[p], bv = bp[p];
    Pack<S> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = St::store(ops::binary_fwd<Op, C>(St::load(av.v[j]), St::load(bv.v[j])));
    op[p] = out;
  }, [&](idx i) { o[i] = St::store(ops::binary_fwd<Op, C>(St::load(a[i]), St::load(b[i]))); });
}
/// Grid for the vectorised kernels: one thread per pack (at least one block for the tail).
template <class S>
unsigned vec_grid(idx n) {
  const idx np = n / kVec<S>;
  return grid_for(np > 0 ? np : 1);
}

template <class S, int Op>
__global__ void binary_strided_kernel(Desc d, idx n, const S* __restrict__ a, const S* __restrict__ b,
                                      S* __restrict__ o) {
  using St = Storage<S>;
  SHARD_GRID_STRIDE(lin, n) {
    idx rem = lin, oa = 0, ob = 0;
    for (int k = d.rank - 1; k >= 0; --k) {
      const idx i = rem % d.shape[k];
      rem /= d.shape[k];
      oa += i * d.s0[k];
      ob += i * d.s1[k];
    }
    o[lin] = St::store(ops::binary_fwd<Op, typename St::C>(St::load(a[oa]), St::load(b[ob])));
  }
}
template <class S>
__global__ void div_rhs_kernel(Desc d, idx n, const S* __restrict__ g, const S* __restrict__ a,
                               const S* __restrict__ b, S* __restrict__ o) {
  using St = Storage<S>;
  SHARD_GRID_STRIDE(lin, n) {
    idx rem = lin, og = 0, oa = 0, ob = 0;
    for (int k = d.rank - 1; k >= 0; --k) {
      const idx i = rem % d.shape[k];
      rem /= d.shape[k];
      og += i * d.s0[k];
      oa += i * d.s1[k];
      ob += i * d.s2[k];
    }
    o[lin] = St::store(ops::div_rhs_grad<typename St::C>(St::load(g[og]), St::load(a[oa]), St::load(b[ob])));
  }
}

/// Broadcast adjoint. Destination positions enumerate the kept dims (view stride != 0); each
/// sums the reduced dims (stride 0) of g. kept/red: dims lists; g strides contiguous.
struct SumToDesc {
  int nk, nr;
  idx kshape[kPwMaxRank], kview[kPwMaxRank], kg[kPwMaxRank];  // kept dims: extent, dst stride, g stride
  idx rshape[kPwMaxRank], rg[kPwMaxRank];                      // reduced dims: extent, g stride
};
__device__ __forceinline__ void kept_offsets(const SumToDesc& d, idx pos, idx& dst_off, idx& g_off) {
  dst_off = 0;
  g_off = 0;
  for (int k = d.nk - 1; k >= 0; --k) {
    const idx i = pos % d.kshape[k];
    pos /= d.kshape[k];
    dst_off += i * d.kview[k];
    g_off += i * d.kg[k];
  }
}
__device__ __forceinline__ idx red_offset(const SumToDesc& d, idx r) {
  idx off = 0;
  for (int k = d.nr - 1; k >= 0; --k) {
    off += (r % d.rshape[k]) * d.rg[k];
    r /= d.rshape[k];
  }
  return off;
}
/// One thread per destination position (few reduced elements): sequential sum in index order.
/// T: the storage type (bf16 / f16 widened exactly, the double sum rounded through float).
template <class T>
__global__ void sum_to_thread_kernel(SumToDesc d, idx npos, idx nred, const T* __restrict__ g, T* __restrict__ dst) {
  SHARD_GRID_STRIDE(pos, npos) {
    idx doff, goff;
    kept_offsets(d, pos, doff, goff);
    double s = 0;
    for (idx r = 0; r < nred; ++r) s += wide(g[goff + red_offset(d, r)]);
    dst[doff] = narrow<T>(s);
  }
}
/// One block per destination position: strided per-thread sums, then a fixed shared-memory tree.
template <class T>
__global__ void sum_to_block_kernel(SumToDesc d, idx npos, idx nred, const T* __restrict__ g, T* __restrict__ dst) {
  __shared__ double buf[kThreads];
  for (idx pos = blockIdx.x; pos < npos; pos += gridDim.x) {
    idx doff, goff;
    kept_offsets(d, pos, doff, goff);
    double s = 0;
    for (idx r = threadIdx.x; r < nred; r += blockDim.x) s += wide(g[goff + red_offset(d, r)]);
    const double total = block_sum(s, buf);
    if (threadIdx.x == 0) dst[doff] = narrow<T>(total);
  }
}

template <class F> int dispatch_unary(int op, F&& f) { return by_op<ops::u_count>(op, f); }
template <class F> int dispatch_binary(int op, F&& f) { return by_op<ops::b_count>(op, f); }
bool contiguous(int rank, const idx* shape, const idx* st) {
  idx acc = 1;
  for (int k = rank - 1; k >= 0; --k) {
    if (shape[k] != 1 && st[k] != acc) return false;
    acc *= shape[k];
  }
  return true;
}
idx count(int rank, const idx* shape) {
  idx n = 1;
  for (int k = 0; k < rank; ++k) n *= shape[k];
  return n;
}

}  // namespace

int pw_unary(int dtype, int op, double alpha, idx n, const void* x, void* y, void* stream) {
  if (n <= 0) return 0;
  return by_storage(dtype, [&](auto tag) {
    using S = decltype(tag);
    using C = typename Storage<S>::C;
    const bool vec = aligned16(x) && aligned16(y);
    return dispatch_unary(op, [&](auto k) {
      if (vec)
        unary_vec_kernel<S, decltype(k)::value><<<vec_grid<S>(n), kThreads, 0, as_stream(stream)>>>(
            n, static_cast<C>(alpha), static_cast<const S*>(x), static_cast<S*>(y));
      else
        unary_kernel<S, decltype(k)::value><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
            n, static_cast<C>(alpha), static_cast<const S*>(x), static_cast<S*>(y));
    });
  });
}

int pw_unary_backward(int dtype, int op, double alpha, idx n, const void* x, const void* y, const void* dy, void* dx,
                      void* stream) {
  if (n <= 0) return 0;
  return by_storage(dtype, [&](auto tag) {
    using S = decltype(tag);
    using C = typename Storage<S>::C;
    const bool vec = aligned16(x) && aligned16(y) && aligned16(dy) && aligned16(dx);
    return dispatch_unary(op, [&](auto k) {
      if (vec)
        unary_bwd_vec_kernel<S, decltype(k)::value><<<vec_grid<S>(n), kThreads, 0, as_stream(stream)>>>(
            n, static_cast<C>(alpha), static_cast<const S*>(x), static_cast<const S*>(y), static_cast<const S*>(dy),
            static_cast<S*>(dx));
      else
        unary_bwd_kernel<S, decltype(k)::value><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
            n, static_cast<C>(alpha), static_cast<const S*>(x), static_cast<const S*>(y), static_cast<const S*>(dy),
            static_cast<S*>(dx));
    });
  });
}

int pw_binary(int dtype, int op, int rank, const idx* shape, void* out, const void* a, const idx* sa, const void* b,
              const idx* sb, void* stream) {
  if (rank < 0 || rank > kPwMaxRank) return invalid();
  const idx n = count(rank, shape);
  if (n <= 0) return 0;
  const bool contig = contiguous(rank, shape, sa) && contiguous(rank, shape, sb);
  const Desc d = make_desc(rank, shape, sa, sb, nullptr);
  return by_storage(dtype, [&](auto tag) {
    using S = decltype(tag);
    return dispatch_binary(op, [&](auto k) {
      constexpr int K = decltype(k)::value;
      if (contig && aligned16(a) && aligned16(b) && aligned16(out))
        binary_vec_kernel<S, K><<<vec_grid<S>(n), kThreads, 0, as_stream(stream)>>>(
            n, static_cast<const S*>(a), static_cast<const S*>(b), static_cast<S*>(out));
      else if (contig)
        binary_contig_kernel<S, K><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
            n, static_cast<const S*>(a), static_cast<const S*>(b), static_cast<S*>(out));
      else
        binary_strided_kernel<S, K><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
            d, n, static_cast<const S*>(a), static_cast<const S*>(b), static_cast<S*>(out));
    });
  });
}

int pw_div_rhs_backward(int dtype, int rank, const idx* shape, void* out, const void* g, const idx* sg,
                        const void* a, const idx* sa, const void* b, const idx* sb, void* stream) {
  if (rank < 0 || rank > kPwMaxRank) return invalid();
  const idx n = count(rank, shape);
  if (n <= 0) return 0;
  const Desc d = make_desc(rank, shape, sg, sa, sb);
  return by_storage(dtype, [&](auto tag) {
    using S = decltype(tag);
    div_rhs_kernel<S><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
        d, n, static_cast<const S*>(g), static_cast<const S*>(a), static_cast<const S*>(b), static_cast<S*>(out));
    return last_error();
  });
}

int pw_sum_to(int code, idx nd, void* dst, idx base, int rank, const idx* shape, const idx* view_strides,
              const void* g, void* stream) {
  if (rank < 0 || rank > kPwMaxRank || code < 0 || code > 3) return invalid();
  const int esz = code == 1 ? 8 : code == 0 ? 4 : 2;
  if (nd <= 0) return 0;
  cudaError_t e = cudaMemsetAsync(dst, 0, static_cast<size_t>(nd) * esz, as_stream(stream));
  if (e != cudaSuccess) return static_cast<int>(e);
  const idx n = count(rank, shape);
  if (n <= 0) return 0;
  SumToDesc d{};
  idx gst[kPwMaxRank];
  idx acc = 1;
  for (int k = rank - 1; k >= 0; --k) {
    gst[k] = acc;
    acc *= shape[k];
  }
  idx npos = 1, nred = 1;
  for (int k = 0; k < rank; ++k) {
    if (view_strides[k] != 0 || shape[k] == 1) {
      d.kshape[d.nk] = shape[k];
      d.kview[d.nk] = view_strides[k];
      d.kg[d.nk] = gst[k];
      ++d.nk;
      npos *= shape[k];
    } else {
      d.rshape[d.nr] = shape[k];
      d.rg[d.nr] = gst[k];
      ++d.nr;
      nred *= shape[k];
    }
  }
  return by_storage(code, [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(dst) + base;
    if (nred <= 32)
      sum_to_thread_kernel<T><<<grid_for(npos), kThreads, 0, as_stream(stream)>>>(d, npos, nred,
                                                                                   static_cast<const T*>(g), out);
    else
      sum_to_block_kernel<T><<<blocks_per_item(npos), kThreads, 0, as_stream(stream)>>>(
          d, npos, nred, static_cast<const T*>(g), out);
    return last_error();
  });
}

namespace {
/// Element codes of pw_convert: 0 f32, 1 f64, 2 bf16, 3 f16 (bf16 / f16 held as their bits).
__device__ __forceinline__ float load_as_float(int code, const void* p, idx i) {
  switch (code) {
    case 1: return static_cast<float>(static_cast<const double*>(p)[i]);
    case 2: return cvt::bf16_to_f32(static_cast<const unsigned short*>(p)[i]);
    case 3: return cvt::f16_to_f32(static_cast<const unsigned short*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
__global__ void convert_kernel(int from, int to, idx n, const void* __restrict__ x, void* __restrict__ y) {
  SHARD_GRID_STRIDE(i, n) {
    if (from == 1 && to == 1) {
      static_cast<double*>(y)[i] = static_cast<const double*>(x)[i];
      continue;
    }
    if (to == 1) {  // f32 / bf16 / f16 -> f64 is exact through float
      static_cast<double*>(y)[i] = static_cast<double>(load_as_float(from, x, i));
      continue;
    }
    const float v = load_as_float(from, x, i);
    switch (to) {
      case 2: static_cast<unsigned short*>(y)[i] = cvt::bf16_bits(v); break;
      case 3: static_cast<unsigned short*>(y)[i] = cvt::f16_bits(v); break;
      default: static_cast<float*>(y)[i] = v; break;
    }
  }
}
}  // namespace

int pw_convert(int from, int to, idx n, const void* x, void* y, void* stream) {
  if (from < 0 || from > 3 || to < 0 || to > 3) return invalid();
  if (n <= 0) return 0;
  convert_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(from, to, n, x, y);
  return last_error();
}

}  // namespace shard::kernels
