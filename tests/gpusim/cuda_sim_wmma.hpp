#pragma once
// The launchers of tests/gpusim/cuda_sim_wmma_kernels.cu (nvcuda::wmma kernels, compiled into
// shardtensor_gpusim_tests only: tests/gpusim/CMakeLists.txt). tests/gpusim/cuda_sim_wmma.cpp
// declares them weak, so the normal build (tests/CMakeLists.txt also compiles cuda_sim_*.cpp into
// shardtensor_cuda_tests, without the .cu) links, and the test skips there.
// Every launcher returns nullptr on success, else a message (a static string).
extern "C" {

/// D = A * B + C0 on one thread block of `warps` warps (each warp takes 16x16 tiles of D in
/// turn), through __shared__ memory with padded leading dimensions (72 halves for A, B and f16
/// accumulators, 68 floats for f32 accumulators). m, n, k: multiples of 16, at most 64. a, b, c0,
/// d: logical row-major m x k, k x n, m x n, m x n; *_col selects the layout the kernel keeps the
/// matrix in (global and shared) and passes to wmma (A, B: fragment layout; C0 / D:
/// load_matrix_sync / store_matrix_sync with mem_col_major). f16_acc: half accumulator fragments
/// instead of float ones. a, b and (f16_acc) c0 must be exactly representable in f16.
const char* st_gpusim_wmma_gemm(int m, int n, int k, int warps, int a_col, int b_col, int c_col,
                                int f16_acc, const float* a, const float* b, const float* c0,
                                float* d);

/// The row-index trick, one warp, one 16x16x16 tile: a float 16x16 matrix in shared memory with
/// value = row index is loaded into an accumulator fragment `ridx` (load_matrix_sync,
/// mem_row_major, ldm 68); B's fragment is halved element by element (b.x[i] * 0.5); acc =
/// fill_fragment(0) then mma_sync(acc, A, B/2, acc); then acc.x[i] *= row_scale[(int)ridx.x[i]]
/// and acc.x[i] += col_add[cidx.x[i]] (cidx: the same with value = column index). Results: d =
/// the stored acc (row-major 16x16), ridx_out = ridx stored back.
const char* st_gpusim_wmma_rowscale(const float* a, const float* b, const float* row_scale,
                                    const float* col_add, float* d, float* ridx_out);

/// One warp, 16x16x16, D = A * B + C0 with A (row-major), B (column-major) and C0 / D (f32,
/// row-major) in global memory with leading dimensions 24, 24 and 20, loaded and stored there
/// directly (via_shared: A through shared memory and a generic pointer instead). d receives the
/// padded 16 x 20 D: its padding columns must keep the sentinel -777.
const char* st_gpusim_wmma_global(int via_shared, const float* a, const float* b, const float* c0,
                                  float* d);

/// One warp, one tile of the other shapes: D = A * B + C0 for m x n x 16 with (m, n) = (32, 8) or
/// (8, 32), f32 accumulators loaded / stored row-major, A and B in the given layouts (ldm 72 /
/// 68 as above).
const char* st_gpusim_wmma_shape(int m, int n, int a_col, int b_col, const float* a,
                                 const float* b, const float* c0, float* d);
}
