#pragma once
// Kernel firewall for the reduce family (kernels/reduce.cu): plain C++17. Launchers queue work on
// `stream` of the current device and return a cudaError_t as int; those that return host values
// synchronise the stream. Deterministic: block-level trees in a fixed order plus a fixed-order
// final pass; no floating-point atomics. is_f64: 0 float, 1 double. All arrays contiguous.
// `x_shape`/`k_shape` (rank <= 8): a tensor and its keepdim reduction (extents equal or 1).
#include <cstdint>

namespace shard::kernels {

using rd_idx = std::int64_t;

/// out = scale * sum (kind 0) or max (kind 1) of x over the dims where k_shape is 1.
int rd_reduce_dims(int is_f64, int kind, int rank, const rd_idx* x_shape, const rd_idx* k_shape, const void* x,
                   void* out, double scale, void* stream);
/// gx[i] = g[j(i)] * T(scale).
int rd_broadcast_scaled(int is_f64, int rank, const rd_idx* x_shape, const rd_idx* k_shape, const void* g, void* gx,
                        double scale, void* stream);
/// ties[j] (double) = #{i : x[i] == m[j(i)]}.
int rd_max_ties(int is_f64, int rank, const rd_idx* x_shape, const rd_idx* k_shape, const void* x, const void* m,
                double* ties, void* stream);
/// gx[i] = x[i] == m[j] ? T(g[j] / ties[j]) : 0.
int rd_max_backward(int is_f64, int rank, const rd_idx* x_shape, const rd_idx* k_shape, const void* x, const void* m,
                    const void* g, const double* ties, void* gx, void* stream);
/// Doubles of workspace rd_global_sum needs for n elements.
rd_idx rd_global_sum_workspace(rd_idx n);
/// *host_out = sum a (kind 0), sum a b (1), sum (a - b)^2 (2); `ws` device workspace of
/// rd_global_sum_workspace(n) doubles. Synchronises the stream.
int rd_global_sum(int is_f64, int kind, rd_idx n, const void* a, const void* b, double* ws, double* host_out,
                  void* stream);
/// *out (one T, device memory) = T(scale * sum) for kind 0/1/2 as rd_global_sum; no host read, no
/// synchronisation. `ws` as rd_global_sum's. n = 0 stores 0.
int rd_global_sum_into(int is_f64, int kind, rd_idx n, const void* a, const void* b, double* ws, double scale,
                       void* out, void* stream);
/// gp = c (p - t); gt = -gp when gt is not null. c = T(scale * g[0]) when g (one T, device memory)
/// is not null, read by the kernel; else T(scale).
int rd_mse_backward(int is_f64, rd_idx n, double scale, const void* g, const void* p, const void* t, void* gp,
                    void* gt, void* stream);
/// Doubles of workspace rd_rel_l2_sums needs.
rd_idx rd_rel_l2_workspace(rd_idx samples, rd_idx inner);
/// sums[2s] = ||p_s - t_s||^2, sums[2s+1] = ||t_s||^2 (device memory; no synchronisation).
int rd_rel_l2_sums(int is_f64, rd_idx samples, rd_idx inner, const void* p, const void* t, double* ws, double* sums,
                   void* stream);
/// *out (one T) = T(sum_s sqrt(sums[2s]) / sqrt(sums[2s+1]) / global), NaN when check (two
/// doubles or null) fails for P ranks.
int rd_rel_l2_value(int is_f64, rd_idx samples, rd_idx global, const double* sums, const double* check, rd_idx P,
                    void* out, void* stream);
/// coef from sums and the loss gradient g (one T, device): see exec::rel_l2_coefficients.
int rd_rel_l2_coefficients(int is_f64, rd_idx samples, rd_idx global, const double* sums, const double* check,
                           rd_idx P, const void* g, double* coef, void* stream);
/// gp = cp_s (p - t), gt = -cp_s (p - t) - ct_s t per row s; coef (device, 2 * samples doubles).
int rd_rel_l2_backward(int is_f64, rd_idx samples, rd_idx inner, const void* p, const void* t, const double* coef,
                       void* gp, void* gt, void* stream);

}  // namespace shard::kernels
