// gpusim lane: the norm family (kernels/norm.cu: batch, group, layer statistics and one-pass moments; apply; backward
// sums and dx; f64 load/store; instance norm is group norm with G = C), pooling (kernels/pool.cu:
// avg with/without pad counting, max with argmax, backward) and resize (kernels/resize.cu:
// nearest and linear, forward and backward, a block inside a larger global extent), against the
// CPU tables; f32 and f64.
#include <tuple>
#include <type_traits>

#include "exec/norm_kernels.hpp"
#include "exec/pool_kernels.hpp"
#include "exec/resize_kernels.hpp"
#include "gpusim_support.hpp"

namespace st_gpusim_cuda_sim_norm_pool_resize {

using namespace gpusim;

namespace {

template <class K>
const K& cu() { return exec::kernels_for<K>(gpu(), "test"); }
template <class K>
const K& cpu() { return exec::kernels_for<K>(Device::cpu(), "test"); }

void close_host(const std::vector<double>& a, const std::vector<double>& b, double tolerance, const char* what) {
  const double e = rel_err(b, a);
  INFO(what << ": relative error " << e);
  CHECK(e <= tolerance);
}

/// A statistics Block's doubles.
double* f64(const Block& b) { return static_cast<double*>(b.data); }

template <class T>
void norm_case(exec::NormKind kind, index_t G, index_t A = 3, index_t C = 4, index_t S = 45,
               exec::NormAct act = exec::NormAct::none, bool residual = false) {
  using exec::NormKernels;
  INFO("fused activation code " << static_cast<int>(act) << (residual ? ", with a residual" : ""));
  exec::NormGeom g;
  g.act = act;
  g.kind = kind;
  g.A = A;
  g.C = C;
  g.S = S;
  g.G = G;
  const std::vector<index_t> s{g.A, g.C, g.S};
  const auto K = static_cast<std::size_t>(g.stats());
  Pair<T> x(s, 61u, -2.0, 3.0), gy(s, 62u), w({g.C}, 63u, 0.5, 1.5), b({g.C}, 64u), y(s), dx(s), r(s, 65u), dr(s);
  const void* rh = residual ? r.h.data : nullptr;
  const void* rd = residual ? r.d.data : nullptr;
  // The statistics are device arrays on the GPU (host arrays for the CPU table).
  const std::vector<index_t> ks{static_cast<index_t>(K)};
  Pair<double> sums(ks);
  cpu<NormKernels>().sums(dtype_of<T>, g, x.h.data, nullptr, f64(sums.h), hctx());
  cu<NormKernels>().sums(dtype_of<T>, g, x.d.data, nullptr, f64(sums.d), gctx());
  close_host(sums.host(), sums.device(), 1e-10, "sums");
  const double cnt = static_cast<double>(g.A * g.C * g.S) / static_cast<double>(K);
  std::vector<double> mv(K), iv(K);
  for (std::size_t k = 0; k < K; ++k) mv[k] = sums.host()[k] / cnt;
  Pair<double> mean(ks, mv);
  cpu<NormKernels>().sums(dtype_of<T>, g, x.h.data, f64(mean.h), f64(sums.h), hctx());
  cu<NormKernels>().sums(dtype_of<T>, g, x.d.data, f64(mean.d), f64(sums.d), gctx());
  close_host(sums.host(), sums.device(), 1e-10, "centred sums");
  {  // the one-pass moments (shifted sums; chunked like the sums on long rows) against the CPU table's
    Pair<double> msum(ks), mm2(ks), mlm(ks);
    cpu<NormKernels>().moments(dtype_of<T>, g, x.h.data, f64(msum.h), f64(mm2.h), f64(mlm.h), hctx());
    cu<NormKernels>().moments(dtype_of<T>, g, x.d.data, f64(msum.d), f64(mm2.d), f64(mlm.d), gctx());
    close_host(msum.host(), msum.device(), 1e-10, "moments: sum");
    close_host(mlm.host(), mlm.device(), 1e-10, "moments: local mean");
    close_host(mm2.host(), mm2.device(), 1e-9, "moments: M2");
    close_host(mm2.host(), sums.host(), 1e-9, "moments: M2 against the centred sums");
  }
  for (std::size_t k = 0; k < K; ++k) iv[k] = 1.0 / std::sqrt(sums.host()[k] / cnt + 1e-5);
  Pair<double> invstd(ks, iv);
  cpu<NormKernels>().apply(dtype_of<T>, g, x.h.data, f64(mean.h), f64(invstd.h), w.h.data, b.h.data, rh, y.h.data,
                           hctx());
  cu<NormKernels>().apply(dtype_of<T>, g, x.d.data, f64(mean.d), f64(invstd.d), w.d.data, b.d.data, rd, y.d.data,
                          gctx());
  GPUSIM_CHECK_CLOSE(y, T, "apply");
  Pair<double> sg(ks), sgx(ks), dw({C}), db({C});
  cpu<NormKernels>().backward_sums(dtype_of<T>, g, x.h.data, gy.h.data, f64(mean.h), f64(invstd.h), w.h.data,
                                   b.h.data, rh, f64(sg.h), f64(sgx.h), f64(dw.h), f64(db.h), hctx());
  cu<NormKernels>().backward_sums(dtype_of<T>, g, x.d.data, gy.d.data, f64(mean.d), f64(invstd.d), w.d.data,
                                  b.d.data, rd, f64(sg.d), f64(sgx.d), f64(dw.d), f64(db.d), gctx());
  // A fused activation of f32 data is evaluated in float (as the activation op would): the device's
  // expf / erff / tanhf may differ from glibc's in the last ulp, so those sums agree to float, not
  // double, precision (measured: <= 1.1e-7 relative).
  const double stol = act != exec::NormAct::none && !std::is_same_v<T, double> ? 1e-6 : 1e-9;
  close_host(sg.host(), sg.device(), stol, "backward sg");
  close_host(sgx.host(), sgx.device(), stol, "backward sgx");
  close_host(dw.host(), dw.device(), stol, "backward dw");
  close_host(db.host(), db.device(), stol, "backward db");
  sg.upload();  // the host table's sums on both sides: dx compares the dx kernels alone
  sgx.upload();
  cpu<NormKernels>().backward_dx(dtype_of<T>, g, x.h.data, gy.h.data, f64(mean.h), f64(invstd.h), w.h.data, b.h.data,
                                 rh, f64(sg.h),
                                 f64(sgx.h), 1.0 / cnt, dx.h.data, residual ? dr.h.data : nullptr, hctx());
  cu<NormKernels>().backward_dx(dtype_of<T>, g, x.d.data, gy.d.data, f64(mean.d), f64(invstd.d), w.d.data, b.d.data,
                                rd, f64(sg.d),
                                f64(sgx.d), 1.0 / cnt, dx.d.data, residual ? dr.d.data : nullptr, gctx());
  GPUSIM_CHECK_CLOSE(dx, T, "backward_dx");
  if (residual) GPUSIM_CHECK_CLOSE(dr, T, "backward_dx: the residual's gradient");
  // f64 load / store, device to device
  Pair<double> l64({4});
  cpu<NormKernels>().load_f64(dtype_of<T>, 4, w.h.data, f64(l64.h), hctx());
  cu<NormKernels>().load_f64(dtype_of<T>, 4, w.d.data, f64(l64.d), gctx());
  close_host(l64.host(), l64.device(), 0, "load_f64");
  Pair<double> st({4}, {1.25, -2.5, 3.0, 0.0625});
  cpu<NormKernels>().store_f64(dtype_of<T>, 4, f64(st.h), w.h.data, hctx());
  cu<NormKernels>().store_f64(dtype_of<T>, 4, f64(st.d), w.d.data, gctx());
  GPUSIM_CHECK_CLOSE(w, T, "store_f64");
}

/// norm_finish on the device against the host table, every mode, f32 and f64 running statistics,
/// with a passing and a failing allreduce check (NaN everywhere it writes). Exact equality: the
/// kernel repeats the host arithmetic with _rn intrinsics.
template <class R>
void finish_case() {
  using exec::NormFinish;
  using exec::NormKernels;
  const index_t K = 300;  // more than one block
  const std::vector<index_t> ks{K};
  for (int check = 0; check < 3; ++check) {  // none, agreeing (3 ranks, h = 5), disagreeing
    for (NormFinish mode :
         {NormFinish::mean, NormFinish::invstd, NormFinish::eval, NormFinish::check, NormFinish::spread}) {
      INFO("mode " << int(mode) << ", check " << check);
      Pair<double> v(ks, 81u, 0.5, 4.0), mean(ks, 82u), chk({2}, check == 1 ? std::vector<double>{15.0, 75.0}
                                                                             : std::vector<double>{15.0, 77.0});
      Pair<double> lmean(ks, 85u);
      Pair<R> rm(ks, 83u), rv(ks, 84u, 0.1, 2.0);
      Block brm_h = rm.h, brv_h = rv.h, brm_d = rm.d, brv_d = rv.d;
      exec::NormFinishArgs a;
      a.mode = mode;
      a.K = K;
      a.count = 37;
      a.eps = 1e-5;
      a.momentum = 0.1;
      a.P = 3;
      auto run = [&](bool dev) {
        a.v = static_cast<double*>(dev ? v.d.data : v.h.data);
        a.mean = static_cast<double*>(dev ? mean.d.data : mean.h.data);
        a.run_mean = dev ? &brm_d : &brm_h;
        a.run_var = dev ? &brv_d : &brv_h;
        a.check = check == 0 ? nullptr : static_cast<const double*>(dev ? chk.d.data : chk.h.data);
        a.local_mean = static_cast<const double*>(dev ? lmean.d.data : lmean.h.data);
        a.local_count = 11;
        if (dev) cu<NormKernels>().finish(a, gctx());
        else cpu<NormKernels>().finish(a, hctx());
      };
      run(false);
      run(true);
      for (const auto& [h, d, what] : {std::tuple{v.host(), v.device(), "v"}, std::tuple{mean.host(), mean.device(), "mean"},
                                       std::tuple{rm.host(), rm.device(), "running mean"},
                                       std::tuple{rv.host(), rv.device(), "running var"}}) {
        INFO(what);
        close_host(h, d, 0, what);
      }
      if (check == 2 && mode != NormFinish::spread) CHECK(std::isnan(v.device()[0]));  // spread: no check
      if (check == 1 && mode != NormFinish::check) CHECK(std::isfinite(v.device()[K - 1]));
    }
  }
}

template <class T>
void pool_case(bool include_pad) {
  using exec::PoolKernels;
  exec::PoolGeometry g;
  g.planes = 3;
  g.in = {5, 7, 6};
  g.kernel = {2, 3, 2};
  g.stride = {2, 2, 1};
  g.pad_lo = {0, 1, 1};
  g.count_include_pad = include_pad;
  for (int d = 0; d < 3; ++d) {
    const auto u = static_cast<std::size_t>(d);
    g.out[u] = (g.in[u] + 2 * g.pad_lo[u] - g.kernel[u]) / g.stride[u] + 1;
  }
  const std::vector<index_t> si{g.planes, g.in[0], g.in[1], g.in[2]}, so{g.planes, g.out[0], g.out[1], g.out[2]};
  std::vector<double> v = rand_vals(Pair<T>::count(si), 71u, -3.0, 3.0);
  for (std::size_t i = 0; i < v.size(); i += 5) v[i] = 1.0;  // ties
  Pair<T> x(si, v), y(so), gy(so, 72u), gx(si);
  Pair<std::int64_t> idx(so);
  cpu<PoolKernels>().avg_forward(dtype_of<T>, g, x.h.data, y.h.data, hctx());
  cu<PoolKernels>().avg_forward(dtype_of<T>, g, x.d.data, y.d.data, gctx());
  GPUSIM_CHECK_CLOSE(y, T, "avg_forward");
  cpu<PoolKernels>().avg_backward(dtype_of<T>, g, gy.h.data, gx.h.data, hctx());
  cu<PoolKernels>().avg_backward(dtype_of<T>, g, gy.d.data, gx.d.data, gctx());
  GPUSIM_CHECK_CLOSE(gx, T, "avg_backward");
  cpu<PoolKernels>().max_forward(dtype_of<T>, g, x.h.data, y.h.data, static_cast<std::int64_t*>(idx.h.data), hctx());
  cu<PoolKernels>().max_forward(dtype_of<T>, g, x.d.data, y.d.data, static_cast<std::int64_t*>(idx.d.data), gctx());
  GPUSIM_CHECK_CLOSE(y, T, "max_forward");
  CHECK(idx.device() == idx.host());
  cpu<PoolKernels>().max_backward(dtype_of<T>, g, gy.h.data, static_cast<const std::int64_t*>(idx.h.data), gx.h.data,
                                  hctx());
  cu<PoolKernels>().max_backward(dtype_of<T>, g, gy.d.data, static_cast<const std::int64_t*>(idx.d.data), gx.d.data,
                                 gctx());
  GPUSIM_CHECK_CLOSE(gx, T, "max_backward");
}

template <class T>
void resize_case(ResizeMode mode) {
  using exec::ResizeKernels;
  exec::ResizeGeometry g;
  g.planes = 2;
  g.scale = {1, 2, 3};
  g.global_in = {3, 9, 5};
  // the block holds inputs [1, 8) of dim 1 and all of the others; it produces outputs [4, 12)
  g.in_lo = {0, 1, 0};
  g.in_len = {3, 7, 5};
  g.out_lo = {0, 4, 0};
  g.out_len = {3, 8, 15};
  const std::vector<index_t> si{g.planes, 3, 7, 5}, so{g.planes, 3, 8, 15};
  Pair<T> x(si, 81u), y(so), gy(so, 82u), gx(si);
  cpu<ResizeKernels>().forward(dtype_of<T>, mode, g, x.h.data, y.h.data, hctx());
  cu<ResizeKernels>().forward(dtype_of<T>, mode, g, x.d.data, y.d.data, gctx());
  GPUSIM_CHECK_CLOSE(y, T, "resize forward");
  cpu<ResizeKernels>().backward(dtype_of<T>, mode, g, gy.h.data, gx.h.data, hctx());
  cu<ResizeKernels>().backward(dtype_of<T>, mode, g, gy.d.data, gx.d.data, gctx());
  GPUSIM_CHECK_CLOSE(gx, T, "resize backward");
}

}  // namespace

TEST_CASE("gpusim norm: batch, group, instance, layer statistics, apply, backward", "[gpusim][norm]") {
  GPUSIM_REQUIRE_GPU();
  for (auto [kind, G, name] : {std::tuple{exec::NormKind::batch, index_t{1}, "batch"},
                               std::tuple{exec::NormKind::group, index_t{2}, "group"},
                               std::tuple{exec::NormKind::group, index_t{4}, "instance"},
                               std::tuple{exec::NormKind::layer, index_t{1}, "layer"}}) {
    INFO("norm " << name);
    norm_case<float>(kind, G);
    norm_case<double>(kind, G);
  }
}

TEST_CASE("gpusim norm: long rows and few statistics (chunked sums, row kernels)", "[gpusim][norm]") {
  // S >= 128 takes the row kernels for apply and dx; few statistics over many elements split each
  // statistic over several blocks (chunk partials + a fixed-order total), with rows longer than a
  // block (incremental row walk) and shorter (division); the layer kind keeps one block per
  // statistic.
  GPUSIM_REQUIRE_GPU();
  for (auto [kind, G, name] : {std::tuple{exec::NormKind::batch, index_t{1}, "batch"},
                               std::tuple{exec::NormKind::group, index_t{2}, "group"},
                               std::tuple{exec::NormKind::layer, index_t{1}, "layer"}}) {
    INFO("norm " << name);
    norm_case<float>(kind, G, 2, 4, 2048);
    // (the layer kind has no chunked path; its 4000 statistics would only slow the simulator)
    if (kind != exec::NormKind::layer) norm_case<double>(kind, G, 40, 4, 100);
  }
  // The one-pass backward sums (batch and group kinds, rows >= 128): one chunk per row (S = 256),
  // odd row counts, and several chunks per row (S = 2048 above).
  norm_case<double>(exec::NormKind::batch, 1, 3, 5, 256);
  norm_case<float>(exec::NormKind::group, 5, 3, 5, 130);
}

TEST_CASE("gpusim norm: layer norm over tokens (S == 1: warp-per-row and column-chunk kernels)", "[gpusim][norm]") {
  // kernels/norm.cu's token kernels (one warp per row of C channels; dw / db as per-thread columns
  // over chunks of rows): rows over several blocks and several chunks (A = 100: 4 chunks of 25),
  // C below, between and above the warp and the block width, a fused activation, a residual.
  GPUSIM_REQUIRE_GPU();
  using exec::NormAct;
  for (index_t C : {index_t{7}, index_t{45}, index_t{300}}) {
    INFO("C " << C);
    norm_case<float>(exec::NormKind::layer, 1, 100, C, 1);
    norm_case<double>(exec::NormKind::layer, 1, 37, C, 1);
  }
  norm_case<float>(exec::NormKind::layer, 1, 100, 45, 1, NormAct::gelu);
  norm_case<double>(exec::NormKind::layer, 1, 40, 64, 1, NormAct::silu, true);
  norm_case<float>(exec::NormKind::layer, 1, 3, 33, 1, NormAct::none, true);
}

TEST_CASE("gpusim norm: a fused activation in apply, the backward sums and dx (flat and row kernels)", "[gpusim][norm]") {
  // y = act(xhat w + b) and gz = gy act'(z) recomputed in every backward kernel: the one-block
  // and chunked sums, the per-channel sums, the flat (S < 128) and row (S >= 128) apply / dx.
  GPUSIM_REQUIRE_GPU();
  using exec::NormAct;
  for (NormAct act : {NormAct::silu, NormAct::gelu, NormAct::gelu_tanh, NormAct::relu, NormAct::tanh,
                      NormAct::sigmoid}) {
    norm_case<float>(exec::NormKind::group, 2, 3, 4, 45, act);
    norm_case<double>(exec::NormKind::layer, 1, 3, 4, 45, act);
  }
  norm_case<float>(exec::NormKind::group, 2, 2, 4, 2048, NormAct::silu);
  norm_case<double>(exec::NormKind::batch, 1, 40, 4, 100, NormAct::silu);
  norm_case<float>(exec::NormKind::layer, 1, 2, 4, 300, NormAct::gelu);
  // With a residual added before the activation (flat and row kernels; and without an activation).
  norm_case<float>(exec::NormKind::group, 2, 3, 4, 45, NormAct::silu, true);
  norm_case<double>(exec::NormKind::group, 2, 2, 4, 2048, NormAct::silu, true);
  norm_case<float>(exec::NormKind::batch, 1, 3, 4, 45, NormAct::none, true);
  norm_case<float>(exec::NormKind::layer, 1, 2, 4, 300, NormAct::tanh, true);
}

TEST_CASE("gpusim norm: finishing the statistics on the device (mean, invstd with running statistics, eval, check)",
          "[gpusim][norm]") {
  GPUSIM_REQUIRE_GPU();
  finish_case<float>();
  finish_case<double>();
}

TEST_CASE("gpusim pool: avg (pad counted or not) and max, forward and backward", "[gpusim][pool]") {
  GPUSIM_REQUIRE_GPU();
  for (bool inc : {true, false}) {
    INFO("count_include_pad " << inc);
    pool_case<float>(inc);
    pool_case<double>(inc);
  }
}

TEST_CASE("gpusim resize: nearest and linear, forward and backward", "[gpusim][resize]") {
  GPUSIM_REQUIRE_GPU();
  for (ResizeMode m : {ResizeMode::nearest, ResizeMode::linear}) {
    INFO("mode " << static_cast<int>(m));
    resize_case<float>(m);
    resize_case<double>(m);
  }
}

}  // namespace st_gpusim_cuda_sim_norm_pool_resize
