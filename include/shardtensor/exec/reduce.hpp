#pragma once
/// \file reduce.hpp
/// The reduce kernel family's front: keepdim sum/max over dims and their backward, global
/// sums and dot products, and the mse / relative-L2 loss kernels. Dispatch goes by the blocks'
/// device (CPU: src/exec/reduce_cpu.cpp; CUDA: kernels/reduce.cu, deterministic: fixed-order
/// block trees, no floating-point atomics). All blocks are contiguous, f32 or f64 unless noted,
/// on one device; sums accumulate in double. The reduced input x of reduce_sum / reduce_max /
/// max_ties / max_backward may be strided (any strides): the CPU table reads it in place, in
/// element order (bitwise the result of a contiguous copy); other tables get a contiguous copy. Results returned as `double` are on the host (the
/// call waits for the device).
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

/// out = scale * (sum of x over the dims where out has extent 1); out has x's rank (keepdim).
void reduce_sum(const Block& x, const Block& out, double scale, ExecContext& ctx);
/// out = max of x over the dims where out has extent 1 (keepdim; -inf over an empty extent).
void reduce_max(const Block& x, const Block& out, ExecContext& ctx);
/// gx[i] = g[j(i)] * scale, j(i) the keepdim index of i (backward of reduce_sum).
void broadcast_scaled(const Block& g, const Block& gx, double scale, ExecContext& ctx);
/// ties[j] = number of i with x[i] == m[j(i)]; ties is f64 with m's shape.
void max_ties(const Block& x, const Block& m, const Block& ties, ExecContext& ctx);
/// gx[i] = x[i] == m[j] ? g[j] / ties[j] : 0 (backward of reduce_max; ties f64).
void max_backward(const Block& x, const Block& m, const Block& g, const Block& ties, const Block& gx,
                  ExecContext& ctx);

/// Sum of all elements of x.
double sum_all(const Block& x, ExecContext& ctx);
/// Sum of a[i] * b[i].
double dot(const Block& a, const Block& b, ExecContext& ctx);
/// Sum of (a[i] - b[i])^2. a and b may be strided views of one shape (e.g. the interior of a
/// halo-padded array): the CPU table reads them in place; other tables get contiguous copies.
double sq_diff_sum(const Block& a, const Block& b, ExecContext& ctx);
/// out[0] = T(scale * sq_diff_sum(a, b)) (the same double sum, scaled, then rounded once to a's
/// dtype), written on the device: `out` is one element of a's dtype on a's device, and nothing
/// waits for the device or reads back to the host (the mse loss value stays where the step runs).
void sq_diff_sum_into(const Block& a, const Block& b, double scale, const Block& out, ExecContext& ctx);

/// mse backward: gp = c (p - t) with c = T(scale), gt = -gp (gt may be an empty Block: skipped).
/// p and t may be strided like sq_diff_sum's operands; gp and gt are contiguous.
void mse_backward(double scale, const Block& p, const Block& t, const Block& gp, const Block& gt, ExecContext& ctx);
/// The same with the upstream gradient left on the device: c = T(scale * g[0]), where g is one
/// element of p's dtype on p's device (read by the kernel, never by the host).
void mse_backward(double scale, const Block& g, const Block& p, const Block& t, const Block& gp, const Block& gt,
                  ExecContext& ctx);
/// Per-sample sums of relative L2: p and t hold `samples` equal rows; sums[2s] = ||p_s - t_s||^2,
/// sums[2s+1] = ||t_s||^2 (2 * samples doubles in the context's device memory: host memory on the
/// CPU). p and t may be strided views like sq_diff_sum's (read in place on the CPU).
void rel_l2_sums(const Block& p, const Block& t, index_t samples, double* sums, ExecContext& ctx);
/// Backward of relative L2 per row s: gp = cp_s (p - t), gt = -cp_s (p - t) - ct_s t with
/// coef[2s] = cp_s, coef[2s+1] = ct_s (device memory of the context).
void rel_l2_backward(const Block& p, const Block& t, index_t samples, const double* coef, const Block& gp,
                     const Block& gt, ExecContext& ctx);
/// out[0] = T(sum over s of sqrt(sums[2s]) / sqrt(sums[2s+1]), in order, / global_samples): this
/// rank's part of the per-sample relative L2 loss, written on the device (out: one element of the
/// loss dtype). `check`: the statistics allreduce's two check values (null: none; a failed check,
/// ranks that disagreed, makes the value NaN, see NormFinishArgs::check).
void rel_l2_value(index_t samples, index_t global_samples, const double* sums, const double* check, index_t P,
                  const Block& out, ExecContext& ctx);
/// The backward's coefficients from the loss gradient g (one element of the loss dtype on the
/// device, read there): gv = g[0] / global_samples, a_s = sqrt(sums[2s]), b_s = sqrt(sums[2s+1]),
/// coef[2s] = a_s > 0 ? gv / (a_s b_s) : 0, coef[2s+1] = gv a_s / b_s^3 (NaN on a failed check).
void rel_l2_coefficients(index_t samples, index_t global_samples, const double* sums, const double* check, index_t P,
                         const Block& g, double* coef, ExecContext& ctx);

}  // namespace shard::exec
