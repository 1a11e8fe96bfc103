// Schedule of the norms (see include/shardtensor/nn/functional/norm.hpp): the norm kernel family's
// calls and the allreduces of the host statistics, in order, for one rank's local block.
#include <cmath>
#include <vector>

#include "shardtensor/exec/norm.hpp"
#include "shardtensor/nn/functional/norm.hpp"

namespace shard::nn::functional::detail {
namespace {
/// v rounded to the dtype the running statistics are stored in, widened back.
double round_to(DType dt, double v) { return dt == DType::f32 ? static_cast<double>(static_cast<float>(v)) : v; }
}  // namespace

void norm_forward(const NormGeom& geo, const Block& x, const Block* w, const Block* b, const Block* run_mean,
                  const Block* run_var, double momentum, double eps, bool batch_eval, index_t count,
                  const CommPtr& comm, std::uint64_t key, const char* op, std::vector<double>& mean,
                  std::vector<double>& invstd, const Block& y, ExecContext& ctx) {
  const index_t K = geo.stats();
  // Statistics live in host doubles (K values); the kernels read and write tensor data on the device.
  if (batch_eval) {
    exec::load_f64(*run_mean, mean.data(), ctx);
    exec::load_f64(*run_var, invstd.data(), ctx);
    for (auto& v : invstd) v = 1.0 / std::sqrt(v + eps);
  } else {
    exec::norm_sums(geo, x, nullptr, mean.data(), ctx);
    allreduce_sum(comm, mean.data(), K, key, op);
    for (auto& v : mean) v /= static_cast<double>(count);
    exec::norm_sums(geo, x, mean.data(), invstd.data(), ctx);
    allreduce_sum(comm, invstd.data(), K, key, op);
    const bool update = geo.kind == NormKind::batch && (run_mean || run_var);
    std::vector<double> rmean(update && run_mean ? static_cast<std::size_t>(K) : 0);
    std::vector<double> rvar(update && run_var ? static_cast<std::size_t>(K) : 0);
    if (!rmean.empty()) exec::load_f64(*run_mean, rmean.data(), ctx);
    if (!rvar.empty()) exec::load_f64(*run_var, rvar.data(), ctx);
    for (index_t k = 0; k < K; ++k) {
      const auto u = static_cast<std::size_t>(k);
      const double var = invstd[u] / static_cast<double>(count);
      const double unbiased = count > 1 ? var * static_cast<double>(count) / static_cast<double>(count - 1) : var;
      // Rounded to the dtype as the running statistic itself is stored (then widened back for the store).
      if (!rmean.empty()) rmean[u] = round_to(run_mean->dtype, (1 - momentum) * rmean[u] + momentum * mean[u]);
      if (!rvar.empty()) rvar[u] = round_to(run_var->dtype, (1 - momentum) * rvar[u] + momentum * unbiased);
      invstd[u] = 1.0 / std::sqrt(var + eps);
    }
    if (!rmean.empty()) exec::store_f64(rmean.data(), *run_mean, ctx);
    if (!rvar.empty()) exec::store_f64(rvar.data(), *run_var, ctx);
  }
  exec::norm_apply(geo, x, w, b, mean.data(), invstd.data(), y, ctx);
}

void norm_backward(const NormGeom& geo, const Block& x, const Block& gy, const Block* w, const std::vector<double>& mean,
                   const std::vector<double>& invstd, index_t count, bool stats_grad, bool reduce_params,
                   const CommPtr& comm, std::uint64_t key, const char* op, const Block* dx, const Block* dw,
                   const Block* db, ExecContext& ctx) {
  const index_t K = geo.stats(), C = geo.C;
  const bool sums = dx && stats_grad;
  std::vector<double> buf(static_cast<std::size_t>(2 * K + 2 * C), 0.0);
  double* sg = buf.data();
  double* sgx = sg + K;
  double* hdw = sgx + K;
  double* hdb = hdw + C;
  exec::norm_backward_sums(geo, x, gy, w, mean.data(), invstd.data(), sums ? sg : nullptr, sums ? sgx : nullptr,
                           dw ? hdw : nullptr, db ? hdb : nullptr, ctx);
  if (reduce_params) allreduce_sum(comm, buf.data(), static_cast<index_t>(buf.size()), key, op);
  else if (sums) allreduce_sum(comm, buf.data(), 2 * K, key, op);
  if (dx)
    exec::norm_backward_dx(geo, x, gy, w, mean.data(), invstd.data(), sums ? sg : nullptr, sums ? sgx : nullptr,
                           1.0 / static_cast<double>(count), *dx, ctx);
  if (dw) exec::store_f64(hdw, *dw, ctx);
  if (db) exec::store_f64(hdb, *db, ctx);
}

}  // namespace shard::nn::functional::detail
