// Schedule of the norms (see include/shardtensor/nn/functional/norm.hpp): the norm kernel family's
// calls and the allreduces of the statistics, in order, for one rank's local block. The
// statistics live in the device memory of the block's context (host memory on the CPU): they are
// summed by device collectives and finished by exec::norm_finish, so nothing here reads a value
// back to the host or waits for a GPU.
#include <vector>

#include "shardtensor/exec/box.hpp"
#include "shardtensor/exec/norm.hpp"
#include "shardtensor/nn/functional/norm.hpp"

namespace shard::nn::functional::detail {
namespace {

/// n doubles of `buf` from element `lo` (a 1-D sub-block).
Block part(const Block& buf, index_t lo, index_t n) {
  const index_t l[1] = {lo}, len[1] = {n};
  return buf.slice(l, len);
}
index_t ranks(const CommPtr& comm) { return comm ? comm->size() : 1; }
/// Elements of one statistic in this rank's block.
index_t stat_len(const NormGeom& g) {
  switch (g.kind) {
    case NormKind::batch: return g.A * g.S;
    case NormKind::group: return g.G > 0 ? (g.C / g.G) * g.S : 0;
    default: return g.C;
  }
}

}  // namespace

void norm_forward(const NormGeom& geo, const Block& x, const Block* w, const Block* b, const Block* res,
                  const Block* run_mean,
                  const Block* run_var, double momentum, double eps, bool batch_eval, index_t count,
                  const CommPtr& comm, std::uint64_t key, const char* op, NormStats& st, const Block& y,
                  ExecContext& ctx) {
  const index_t K = geo.stats();
  st.K = K;
  // [2 check | mean K | 2 check | invstd K | local mean K]
  st.buf = Block::allocate(DType::f64, ctx.device(), {3 * K + 4});
  double* mean = st.mean();
  double* invstd = st.invstd();
  exec::NormFinishArgs a;
  a.K = K;
  a.count = count;
  a.eps = eps;
  a.P = ranks(comm);
  if (batch_eval) {
    a.mode = exec::NormFinish::eval;
    a.v = invstd;
    a.mean = mean;
    a.run_mean = run_mean;
    a.run_var = run_var;
    exec::norm_finish(a, ctx);
  } else {
    // One pass over x gives each statistic's local sum (into mean), M2 (into invstd) and mean
    // (lmean). The sums are allreduced and finished into the global mean; each rank then moves its
    // M2 to the global mean (spread: + n_r (m_r - mean)^2, Chan et al.) and those are allreduced:
    // two collectives, as before, but x is read twice in all (moments, apply) instead of three times.
    double* lmean = static_cast<double*>(st.buf.data) + 2 * K + 4;
    exec::norm_moments(geo, x, mean, invstd, lmean, ctx);
    a.mode = exec::NormFinish::mean;
    a.v = mean;
    a.check = allreduce_sum_on_device(comm, part(st.buf, 0, K + 2), K, key, op, ctx);
    exec::norm_finish(a, ctx);
    if (a.P > 1) {
      exec::NormFinishArgs sp;
      sp.mode = exec::NormFinish::spread;
      sp.K = K;
      sp.count = count;
      sp.v = invstd;
      sp.mean = mean;
      sp.local_mean = lmean;
      sp.local_count = stat_len(geo);
      exec::norm_finish(sp, ctx);
    }
    const bool update = geo.kind == NormKind::batch && (run_mean || run_var);
    a.mode = exec::NormFinish::invstd;
    a.v = invstd;
    a.mean = mean;
    a.momentum = momentum;
    a.run_mean = update ? run_mean : nullptr;
    a.run_var = update ? run_var : nullptr;
    a.check = allreduce_sum_on_device(comm, part(st.buf, K + 2, K + 2), K, key, op, ctx);
    exec::norm_finish(a, ctx);
  }
  exec::norm_apply(geo, x, w, b, res, mean, invstd, y, ctx);
}

void norm_backward(const NormGeom& geo, const Block& x, const Block& gy, const Block* w, const Block* b,
                   const Block* res, const NormStats& st,
                   index_t count, bool stats_grad, bool reduce_params, const CommPtr& comm, std::uint64_t key,
                   const char* op, const Block* dx, const Block* dw, const Block* db, const Block* dres,
                   ExecContext& ctx) {
  const index_t K = geo.stats(), C = geo.C;
  const bool sums = dx && stats_grad;
  // [2 check values | sg K | sgx K | dw C | db C], zeroed: the parts a call does not compute still
  // travel in the allreduce.
  const Block buf = Block::allocate(DType::f64, ctx.device(), {2 + 2 * K + 2 * C});
  exec::box_zero(buf, ctx);
  double* sg = static_cast<double*>(buf.data) + 2;
  double* sgx = sg + K;
  double* hdw = sgx + K;
  double* hdb = hdw + C;
  exec::norm_backward_sums(geo, x, gy, w, b, res, st.mean(), st.invstd(), sums ? sg : nullptr, sums ? sgx : nullptr,
                           dw ? hdw : nullptr, db ? hdb : nullptr, ctx);
  exec::NormFinishArgs a;
  a.mode = exec::NormFinish::check;
  a.v = sg;
  a.P = ranks(comm);
  if (reduce_params) {
    a.K = 2 * K + 2 * C;
    a.check = allreduce_sum_on_device(comm, buf, a.K, key, op, ctx);
  } else if (sums) {
    a.K = 2 * K;
    a.check = allreduce_sum_on_device(comm, part(buf, 0, 2 * K + 2), a.K, key, op, ctx);
  }
  if (a.check) exec::norm_finish(a, ctx);
  if (dx || dres) {
    // The residual's gradient comes out of the dx pass; without dx, that pass writes a scratch dx.
    Block scratch;
    if (!dx) scratch = Block::allocate(x.dtype, ctx.device(), {geo.A * geo.C * geo.S});
    exec::norm_backward_dx(geo, x, gy, w, b, res, st.mean(), st.invstd(), sums ? sg : nullptr, sums ? sgx : nullptr,
                           1.0 / static_cast<double>(count), dx ? *dx : scratch, dres, ctx);
  }
  if (dw) exec::store_f64(hdw, *dw, ctx);
  if (db) exec::store_f64(hdb, *db, ctx);
}

}  // namespace shard::nn::functional::detail
