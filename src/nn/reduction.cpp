// Schedule of the reductions (see include/shardtensor/nn/functional/reduction.hpp) and of the
// losses (loss.hpp): the reduce kernel family's calls and the allreduces, in order, for one rank's
// local block.
#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "shardtensor/exec/box.hpp"
#include "shardtensor/exec/reduce.hpp"
#include "shardtensor/nn/functional/loss.hpp"
#include "shardtensor/nn/functional/reduction.hpp"

namespace shard::nn::functional::detail {

void reduce_forward(ReduceKind kind, index_t count, const Block& x, const Block& out, ExecContext& ctx) {
  if (kind == ReduceKind::max) {
    exec::reduce_max(x, out, ctx);
  } else {
    const double f = kind == ReduceKind::mean ? 1.0 / static_cast<double>(count) : 1.0;
    exec::reduce_sum(x, out, f, ctx);
  }
}

void reduce_backward(ReduceKind kind, index_t count, const CommPtr& comm, const Block& x, const Block& value,
                     const Block& g, const Block& gx, ExecContext& ctx) {
  if (kind != ReduceKind::max) {
    const double f = kind == ReduceKind::mean ? 1.0 / static_cast<double>(count) : 1.0;
    exec::broadcast_scaled(g, gx, f, ctx);
    return;
  }
  // Global maximum and the global number of positions attaining it, per result element.
  const bool reduce = comm && comm->size() > 1 && value.numel() > 0;
  Block gmax = Block::allocate(value.dtype, ctx.device(), value.shape_vec());
  exec::box_copy(gmax, value, ctx);
  if (reduce) comm->allreduce(gmax.data, gmax.data, gmax.numel(), gmax.dtype, ReduceOp::max);
  Block ties = Block::allocate(DType::f64, ctx.device(), value.shape_vec());
  exec::max_ties(x, gmax, ties, ctx);
  if (reduce) comm->allreduce(ties.data, ties.data, ties.numel(), DType::f64, ReduceOp::sum);
  exec::max_backward(x, gmax, g, ties, gx, ctx);
}

namespace {
/// The check value h in [1, 2^b] of a key, with P * 2^(2b) <= 2^53: every partial sum of h and h^2
/// is an exact integer in a double, whatever the reduction order. P * S2 == S1^2 (Cauchy-Schwarz)
/// iff all h are equal.
double check_value(const Communicator& comm, std::uint64_t key) {
  const auto P = static_cast<std::uint64_t>(comm.size());
  int lg = 0;
  while ((std::uint64_t{1} << lg) < P) ++lg;
  const int b = std::min(24, (53 - lg) / 2);
  return static_cast<double>((key >> 7) % (std::uint64_t{1} << b) + 1);
}
}  // namespace

void allreduce_sum(const CommPtr& comm, double* buf, index_t n, std::uint64_t key, const char* op) {
  if (!comm || comm->size() == 1) return;
  if (shard::detail::checking_collectives()) [[unlikely]]
    shard::detail::CollectiveFingerprint("statistics allreduce").text("op", op).field("elements", n).agree(*comm);
  const auto P = static_cast<std::uint64_t>(comm->size());
  const double h = check_value(*comm, key);
  std::vector<double> tmp(static_cast<std::size_t>(n) + 2);
  tmp[0] = h;
  tmp[1] = h * h;
  std::copy(buf, buf + n, tmp.begin() + 2);
  comm->allreduce(tmp.data(), tmp.data(), n + 2, DType::f64, ReduceOp::sum);
  const auto s1 = static_cast<unsigned __int128>(static_cast<std::uint64_t>(tmp[0]));
  const auto s2 = static_cast<unsigned __int128>(static_cast<std::uint64_t>(tmp[1]));
  if (s2 * P != s1 * s1) [[unlikely]] {
    // Every rank of comm sees the same sums, so all are here: group the ranks by their key.
    std::string groups;
    for (const auto& [k, rs] : comm->group_texts(fmt::format("{:x}", key)))
      groups += fmt::format("{}{{{}}}", groups.empty() ? "" : " vs ", fmt::join(rs, ","));
    SHARD_FAIL(op,
               "ranks disagree on this call: their arguments (global shape, placements, shard sizes, or the op's "
               "parameters) differ between the rank groups {} of the statistics allreduce (this is rank {} of {}; "
               "SHARDTENSOR_CHECK_COLLECTIVES=1 names the argument)",
               groups, comm->rank(), comm->size());
  }
  std::copy(tmp.begin() + 2, tmp.end(), buf);
}

const double* allreduce_sum_on_device(const CommPtr& comm, const Block& buf, index_t n, std::uint64_t key,
                                      const char* op, ExecContext& ctx) {
  SHARD_CHECK(buf.dtype == DType::f64 && buf.is_contiguous() && buf.numel() == n + 2 && buf.device == ctx.device(), op,
              "statistics buffer of {} doubles on {} expected", n + 2, ctx.device());
  if (!comm || comm->size() == 1) return nullptr;
  if (ctx.device().is_cpu()) {
    allreduce_sum(comm, static_cast<double*>(buf.data) + 2, n, key, op);
    return nullptr;
  }
  if (shard::detail::checking_collectives()) [[unlikely]]
    shard::detail::CollectiveFingerprint("statistics allreduce").text("op", op).field("elements", n).agree(*comm);
  const double h = check_value(*comm, key), h2 = h * h;
  const index_t lo0[1] = {0}, lo1[1] = {1}, one[1] = {1};
  exec::box_fill(buf.slice(lo0, one), &h, ctx);
  exec::box_fill(buf.slice(lo1, one), &h2, ctx);
  comm->allreduce(buf.data, buf.data, n + 2, DType::f64, ReduceOp::sum, &ctx);
  return static_cast<const double*>(buf.data);
}

void mse_forward(const Block& p, const Block& t, double scale, const Block& out, ExecContext& ctx) {
  exec::sq_diff_sum_into(p, t, scale, out, ctx);
}

void mse_backward(double coef, const Block& g, const Block& p, const Block& t, const Block& gp, const Block& gt,
                  ExecContext& ctx) {
  exec::mse_backward(coef, g, p, t, gp, gt, ctx);
}

void rel_l2_forward(const CommPtr& comm, std::uint64_t key, const Block& p, const Block& t, index_t samples,
                    index_t global_samples, const Block& sums, const Block& out, ExecContext& ctx) {
  double* s = static_cast<double*>(sums.data);
  exec::rel_l2_sums(p, t, samples, s + 2, ctx);
  const double* check = allreduce_sum_on_device(comm, sums, 2 * samples, key, "rel_l2_loss", ctx);
  exec::rel_l2_value(samples, global_samples, s + 2, check, comm ? comm->size() : 1, out, ctx);
}

void rel_l2_backward(const Block& g, const Block& sums, index_t samples, index_t global_samples, const CommPtr& comm,
                     const Block& p, const Block& t, const Block& gp, const Block& gt, ExecContext& ctx) {
  const double* s = static_cast<const double*>(sums.data);
  const bool reduced = comm && comm->size() > 1 && !ctx.device().is_cpu();
  const Block coef = Block::allocate(DType::f64, ctx.device(), {2 * samples > 0 ? 2 * samples : 1});
  exec::rel_l2_coefficients(samples, global_samples, s + 2, reduced ? s : nullptr, comm ? comm->size() : 1, g,
                            static_cast<double*>(coef.data), ctx);
  exec::rel_l2_backward(p, t, samples, static_cast<const double*>(coef.data), gp, gt, ctx);
}

}  // namespace shard::nn::functional::detail
