// Tensor-core (nvcuda::wmma) kernels of the gpusim test tests/gpusim/cuda_sim_wmma.cpp: the
// simulator's wmma.load / wmma.mma / wmma.store (scripts/gpusim/gpgpu-sim.patch) on the forms a
// flash-attention kernel uses: f16 A / B fragments (row_major and col_major) and f32 or f16
// accumulators, all loaded from and stored to __shared__ memory with padded leading dimensions,
// fill_fragment, and elementwise work on frag.x[i] (the row-index trick). Compiled into
// shardtensor_gpusim_tests only (tests/gpusim/CMakeLists.txt); launchers: cuda_sim_wmma.hpp.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "cuda_sim_wmma.hpp"

namespace {

using namespace nvcuda;

constexpr int kLdH = 72;  // leading dimension of half matrices in shared memory (64 + 8)
constexpr int kLdF = 68;  // ... of float matrices (64 + 4)
constexpr int kMax = 64;

template <class T>
__device__ T poison();
template <>
__device__ half poison<half>() {
  return __ushort_as_half(0x7e00);  // NaN: an element read from the padding shows up
}
template <>
__device__ float poison<float>() {
  return __int_as_float(0x7fc00000);
}
__device__ float to_f(float x) { return x; }
__device__ float to_f(half x) { return __half2float(x); }

/// Copies a dense rows x cols matrix from global memory to shared memory with leading dimension ld.
template <class T>
__device__ void to_shared(T* s, int ld, const T* g, int rows, int cols) {
  for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) s[(e / cols) * ld + e % cols] = g[e];
}

template <class T>
__device__ void fill_poison(T* s, int n) {
  for (int e = threadIdx.x; e < n; e += blockDim.x) s[e] = poison<T>();
}

template <class AL, class BL, class AccT>
__global__ void gemm_kernel(int M, int N, int K, int c_col, const half* A, const half* B,
                            const AccT* C0, float* D) {
  constexpr bool a_row = std::is_same<AL, wmma::row_major>::value;
  constexpr bool b_row = std::is_same<BL, wmma::row_major>::value;
  constexpr int ldc = sizeof(AccT) == 4 ? kLdF : kLdH;
  __shared__ __align__(32) half As[kMax * kLdH], Bs[kMax * kLdH];
  __shared__ __align__(32) AccT Cs[kMax * ldc];
  fill_poison(As, kMax * kLdH);
  fill_poison(Bs, kMax * kLdH);
  fill_poison(Cs, kMax * ldc);
  __syncthreads();
  // A: [M][K] row-major or [K][M] (column-major); B: [K][N] or [N][K]; C0: [M][N] or [N][M].
  to_shared(As, kLdH, A, a_row ? M : K, a_row ? K : M);
  to_shared(Bs, kLdH, B, b_row ? K : N, b_row ? N : K);
  to_shared(Cs, ldc, C0, c_col ? N : M, c_col ? M : N);
  __syncthreads();
  const int warp = threadIdx.x / 32, nwarps = blockDim.x / 32, tn = N / 16;
  const wmma::layout_t cl = c_col ? wmma::mem_col_major : wmma::mem_row_major;
  for (int t = warp; t < (M / 16) * tn; t += nwarps) {
    const int ti = t / tn, tj = t % tn;
    AccT* cp = c_col ? &Cs[tj * 16 * ldc + ti * 16] : &Cs[ti * 16 * ldc + tj * 16];
    wmma::fragment<wmma::accumulator, 16, 16, 16, AccT> acc;
    wmma::load_matrix_sync(acc, cp, ldc, cl);
    for (int kk = 0; kk < K; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, half, AL> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, half, BL> b;
      wmma::load_matrix_sync(a, a_row ? &As[ti * 16 * kLdH + kk] : &As[kk * kLdH + ti * 16], kLdH);
      wmma::load_matrix_sync(b, b_row ? &Bs[kk * kLdH + tj * 16] : &Bs[tj * 16 * kLdH + kk], kLdH);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(cp, acc, ldc, cl);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < M * N; e += blockDim.x) {
    const int i = e / N, j = e % N;
    D[e] = to_f(c_col ? Cs[j * ldc + i] : Cs[i * ldc + j]);
  }
}

__global__ void rowscale_kernel(const half* A, const half* B, const float* row_scale,
                                const float* col_add, float* D, float* ridx_out) {
  __shared__ __align__(32) half As[16 * kLdH], Bs[16 * kLdH];
  __shared__ __align__(32) float R[16 * kLdF], C[16 * kLdF], Cs[16 * kLdF];
  fill_poison(As, 16 * kLdH);
  fill_poison(Bs, 16 * kLdH);
  fill_poison(R, 16 * kLdF);
  fill_poison(C, 16 * kLdF);
  __syncthreads();
  to_shared(As, kLdH, A, 16, 16);
  to_shared(Bs, kLdH, B, 16, 16);
  for (int e = threadIdx.x; e < 256; e += blockDim.x) {
    R[(e / 16) * kLdF + e % 16] = static_cast<float>(e / 16);
    C[(e / 16) * kLdF + e % 16] = static_cast<float>(e % 16);
  }
  __syncthreads();
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> ridx, cidx, acc;
  wmma::load_matrix_sync(ridx, R, kLdF, wmma::mem_row_major);
  wmma::load_matrix_sync(cidx, C, kLdF, wmma::mem_row_major);
  wmma::fill_fragment(acc, 0.0f);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> b;
  wmma::load_matrix_sync(a, As, kLdH);
  wmma::load_matrix_sync(b, Bs, kLdH);
  for (int i = 0; i < b.num_elements; ++i) b.x[i] = __hmul(b.x[i], __float2half(0.5f));
  wmma::mma_sync(acc, a, b, acc);
  for (int i = 0; i < acc.num_elements; ++i) {
    acc.x[i] *= row_scale[static_cast<int>(ridx.x[i])];
    acc.x[i] += col_add[static_cast<int>(cidx.x[i])];
  }
  wmma::store_matrix_sync(Cs, acc, kLdF, wmma::mem_row_major);
  __syncwarp();
  wmma::store_matrix_sync(R, ridx, kLdF, wmma::mem_row_major);
  __syncwarp();
  for (int e = threadIdx.x; e < 256; e += blockDim.x) {
    D[e] = Cs[(e / 16) * kLdF + e % 16];
    ridx_out[e] = R[(e / 16) * kLdF + e % 16];
  }
}

template <int M, int N, class AL, class BL>
__global__ void shape_kernel(const half* A, const half* B, const float* C0, float* D) {
  constexpr bool a_row = std::is_same<AL, wmma::row_major>::value;
  constexpr bool b_row = std::is_same<BL, wmma::row_major>::value;
  __shared__ __align__(32) half As[32 * kLdH], Bs[32 * kLdH];
  __shared__ __align__(32) float Cs[32 * kLdF];
  fill_poison(As, 32 * kLdH);
  fill_poison(Bs, 32 * kLdH);
  fill_poison(Cs, 32 * kLdF);
  __syncthreads();
  to_shared(As, kLdH, A, a_row ? M : 16, a_row ? 16 : M);
  to_shared(Bs, kLdH, B, b_row ? 16 : N, b_row ? N : 16);
  to_shared(Cs, kLdF, C0, M, N);
  __syncthreads();
  wmma::fragment<wmma::accumulator, M, N, 16, float> acc;
  wmma::fragment<wmma::matrix_a, M, N, 16, half, AL> a;
  wmma::fragment<wmma::matrix_b, M, N, 16, half, BL> b;
  wmma::load_matrix_sync(acc, Cs, kLdF, wmma::mem_row_major);
  wmma::load_matrix_sync(a, As, kLdH);
  wmma::load_matrix_sync(b, Bs, kLdH);
  wmma::mma_sync(acc, a, b, acc);
  wmma::store_matrix_sync(Cs, acc, kLdF, wmma::mem_row_major);
  __syncthreads();
  for (int e = threadIdx.x; e < M * N; e += blockDim.x) D[e] = Cs[(e / N) * kLdF + e % N];
}

/// A, B (16x16 f16, leading dimension kLdG) and C0 / D (16x16 f32, leading dimension kLdGF) in
/// global memory, loaded and stored there directly; with via_shared, A goes through shared memory
/// and a pointer that may address either (generic wmma.load).
constexpr int kLdG = 24, kLdGF = 20;
__global__ void global_kernel(int via_shared, const half* A, const half* B, const float* C0, float* D) {
  __shared__ __align__(32) half As[16 * kLdH];
  fill_poison(As, 16 * kLdH);
  __syncthreads();
  for (int e = threadIdx.x; e < 256; e += blockDim.x) As[(e / 16) * kLdH + e % 16] = A[(e / 16) * kLdG + e % 16];
  __syncthreads();
  const half* ap = via_shared ? As : A;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(a, ap, via_shared ? kLdH : kLdG);
  wmma::load_matrix_sync(b, B, kLdG);
  wmma::load_matrix_sync(acc, C0, kLdGF, wmma::mem_row_major);
  wmma::mma_sync(acc, a, b, acc);
  wmma::store_matrix_sync(D, acc, kLdGF, wmma::mem_row_major);
}

// ---- host side

/// Device buffers freed on scope exit; the first CUDA error is kept.
struct Ctx {
  std::vector<void*> bufs;
  const char* err = nullptr;
  ~Ctx() {
    for (void* p : bufs) cudaFree(p);
  }
  bool check(cudaError_t e) {
    if (e != cudaSuccess && !err) err = cudaGetErrorString(e);
    return !err;
  }
  template <class T>
  T* upload(const std::vector<T>& h) {
    void* p = nullptr;
    if (!check(cudaMalloc(&p, h.size() * sizeof(T)))) return nullptr;
    bufs.push_back(p);
    check(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return static_cast<T*>(p);
  }
  float* alloc(std::size_t n) {
    void* p = nullptr;
    if (!check(cudaMalloc(&p, n * sizeof(float)))) return nullptr;
    bufs.push_back(p);
    return static_cast<float*>(p);
  }
  const char* download(float* h, const float* d, std::size_t n) {
    check(cudaGetLastError());
    check(cudaDeviceSynchronize());
    if (!err) check(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return err;
  }
};

/// The rows x cols logical row-major matrix x in the layout the kernels keep (col: transposed).
template <class T>
std::vector<T> in_layout(const float* x, int rows, int cols, bool col) {
  std::vector<T> out(static_cast<std::size_t>(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) out[col ? j * rows + i : i * cols + j] = static_cast<T>(x[i * cols + j]);
  return out;
}
template <>
std::vector<half> in_layout<half>(const float* x, int rows, int cols, bool col) {
  std::vector<half> out(static_cast<std::size_t>(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) out[col ? j * rows + i : i * cols + j] = __float2half(x[i * cols + j]);
  return out;
}

template <class AL, class BL, class AccT>
void launch_gemm(int warps, int m, int n, int k, int c_col, const half* a, const half* b, const AccT* c0,
                 float* d) {
  gemm_kernel<AL, BL, AccT><<<1, 32 * warps>>>(m, n, k, c_col, a, b, c0, d);
}

template <class AccT>
const char* gemm_acc(int m, int n, int k, int warps, int a_col, int b_col, int c_col, const float* a,
                     const float* b, const float* c0, float* d) {
  Ctx x;
  half* da = x.upload(in_layout<half>(a, m, k, a_col));
  half* db = x.upload(in_layout<half>(b, k, n, b_col));
  AccT* dc = x.upload(in_layout<AccT>(c0, m, n, c_col));
  float* dd = x.alloc(static_cast<std::size_t>(m) * n);
  if (x.err) return x.err;
  using R = wmma::row_major;
  using C = wmma::col_major;
  if (!a_col && !b_col) launch_gemm<R, R, AccT>(warps, m, n, k, c_col, da, db, dc, dd);
  if (!a_col && b_col) launch_gemm<R, C, AccT>(warps, m, n, k, c_col, da, db, dc, dd);
  if (a_col && !b_col) launch_gemm<C, R, AccT>(warps, m, n, k, c_col, da, db, dc, dd);
  if (a_col && b_col) launch_gemm<C, C, AccT>(warps, m, n, k, c_col, da, db, dc, dd);
  return x.download(d, dd, static_cast<std::size_t>(m) * n);
}

template <int M, int N>
const char* shape_mn(int a_col, int b_col, const float* a, const float* b, const float* c0, float* d) {
  Ctx x;
  half* da = x.upload(in_layout<half>(a, M, 16, a_col));
  half* db = x.upload(in_layout<half>(b, 16, N, b_col));
  float* dc = x.upload(in_layout<float>(c0, M, N, false));
  float* dd = x.alloc(M * N);
  if (x.err) return x.err;
  using R = wmma::row_major;
  using C = wmma::col_major;
  if (!a_col && !b_col) shape_kernel<M, N, R, R><<<1, 32>>>(da, db, dc, dd);
  if (!a_col && b_col) shape_kernel<M, N, R, C><<<1, 32>>>(da, db, dc, dd);
  if (a_col && !b_col) shape_kernel<M, N, C, R><<<1, 32>>>(da, db, dc, dd);
  if (a_col && b_col) shape_kernel<M, N, C, C><<<1, 32>>>(da, db, dc, dd);
  return x.download(d, dd, M * N);
}

}  // namespace

extern "C" const char* st_gpusim_wmma_gemm(int m, int n, int k, int warps, int a_col, int b_col, int c_col,
                                           int f16_acc, const float* a, const float* b, const float* c0,
                                           float* d) {
  if (m % 16 || n % 16 || k % 16 || m < 16 || n < 16 || k < 16 || m > kMax || n > kMax || k > kMax ||
      warps < 1 || warps > 32)
    return "st_gpusim_wmma_gemm: bad shape";
  return f16_acc ? gemm_acc<half>(m, n, k, warps, a_col, b_col, c_col, a, b, c0, d)
                 : gemm_acc<float>(m, n, k, warps, a_col, b_col, c_col, a, b, c0, d);
}

extern "C" const char* st_gpusim_wmma_rowscale(const float* a, const float* b, const float* row_scale,
                                               const float* col_add, float* d, float* ridx_out) {
  Ctx x;
  half* da = x.upload(in_layout<half>(a, 16, 16, false));
  half* db = x.upload(in_layout<half>(b, 16, 16, false));
  float* ds = x.upload(std::vector<float>(row_scale, row_scale + 16));
  float* dcol = x.upload(std::vector<float>(col_add, col_add + 16));
  float* dd = x.alloc(256);
  float* dr = x.alloc(256);
  if (x.err) return x.err;
  rowscale_kernel<<<1, 32>>>(da, db, ds, dcol, dd, dr);
  if (x.download(d, dd, 256)) return x.err;
  return x.download(ridx_out, dr, 256);
}

extern "C" const char* st_gpusim_wmma_shape(int m, int n, int a_col, int b_col, const float* a, const float* b,
                                            const float* c0, float* d) {
  if (m == 32 && n == 8) return shape_mn<32, 8>(a_col, b_col, a, b, c0, d);
  if (m == 8 && n == 32) return shape_mn<8, 32>(a_col, b_col, a, b, c0, d);
  return "st_gpusim_wmma_shape: (m, n) must be (32, 8) or (8, 32)";
}

extern "C" const char* st_gpusim_wmma_global(int via_shared, const float* a, const float* b, const float* c0,
                                             float* d) {
  Ctx x;
  // padded copies; the padding of A, B, C0 holds NaN, D's padding a sentinel that must survive
  std::vector<half> ha(16 * kLdG, __float2half(NAN)), hb(16 * kLdG, __float2half(NAN));
  std::vector<float> hc(16 * kLdGF, NAN), hd(16 * kLdGF, -777.f);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      ha[i * kLdG + j] = __float2half(a[i * 16 + j]);
      hb[j * kLdG + i] = __float2half(b[i * 16 + j]);  // B column-major
      hc[i * kLdGF + j] = c0[i * 16 + j];
    }
  half* da = x.upload(ha);
  half* db = x.upload(hb);
  float* dc = x.upload(hc);
  float* dd = x.upload(hd);
  if (x.err) return x.err;
  global_kernel<<<1, 32>>>(via_shared, da, db, dc, dd);
  return x.download(d, dd, 16 * kLdGF);
}
