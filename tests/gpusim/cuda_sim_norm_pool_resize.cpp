// gpusim lane: the norm family (kernels/norm.cu: batch, group, layer statistics; apply; backward
// sums and dx; f64 load/store; instance norm is group norm with G = C), pooling (kernels/pool.cu:
// avg with/without pad counting, max with argmax, backward) and resize (kernels/resize.cu:
// nearest and linear, forward and backward, a block inside a larger global extent), against the
// CPU tables; f32 and f64.
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

template <class T>
void norm_case(exec::NormKind kind, index_t G) {
  using exec::NormKernels;
  exec::NormGeom g;
  g.kind = kind;
  g.A = 3;
  g.C = 4;
  g.S = 45;
  g.G = G;
  const std::vector<index_t> s{g.A, g.C, g.S};
  const auto K = static_cast<std::size_t>(g.stats());
  Pair<T> x(s, 61u, -2.0, 3.0), gy(s, 62u), w({g.C}, 63u, 0.5, 1.5), b({g.C}, 64u), y(s), dx(s);
  std::vector<double> hs(K), ds(K);
  cpu<NormKernels>().sums(dtype_of<T>, g, x.h.data, nullptr, hs.data(), hctx());
  cu<NormKernels>().sums(dtype_of<T>, g, x.d.data, nullptr, ds.data(), gctx());
  close_host(hs, ds, 1e-10, "sums");
  const double cnt = static_cast<double>(g.A * g.C * g.S) / static_cast<double>(K);
  std::vector<double> mean(K), invstd(K);
  for (std::size_t k = 0; k < K; ++k) mean[k] = hs[k] / cnt;
  cpu<NormKernels>().sums(dtype_of<T>, g, x.h.data, mean.data(), hs.data(), hctx());
  cu<NormKernels>().sums(dtype_of<T>, g, x.d.data, mean.data(), ds.data(), gctx());
  close_host(hs, ds, 1e-10, "centred sums");
  for (std::size_t k = 0; k < K; ++k) invstd[k] = 1.0 / std::sqrt(hs[k] / cnt + 1e-5);
  cpu<NormKernels>().apply(dtype_of<T>, g, x.h.data, mean.data(), invstd.data(), w.h.data, b.h.data, y.h.data, hctx());
  cu<NormKernels>().apply(dtype_of<T>, g, x.d.data, mean.data(), invstd.data(), w.d.data, b.d.data, y.d.data, gctx());
  GPUSIM_CHECK_CLOSE(y, T, "apply");
  std::vector<double> hsg(K), hsgx(K), hdw(4), hdb(4), dsg(K), dsgx(K), ddw(4), ddb(4);
  cpu<NormKernels>().backward_sums(dtype_of<T>, g, x.h.data, gy.h.data, mean.data(), invstd.data(), w.h.data,
                                   hsg.data(), hsgx.data(), hdw.data(), hdb.data(), hctx());
  cu<NormKernels>().backward_sums(dtype_of<T>, g, x.d.data, gy.d.data, mean.data(), invstd.data(), w.d.data,
                                  dsg.data(), dsgx.data(), ddw.data(), ddb.data(), gctx());
  close_host(hsg, dsg, 1e-9, "backward sg");
  close_host(hsgx, dsgx, 1e-9, "backward sgx");
  close_host(hdw, ddw, 1e-9, "backward dw");
  close_host(hdb, ddb, 1e-9, "backward db");
  cpu<NormKernels>().backward_dx(dtype_of<T>, g, x.h.data, gy.h.data, mean.data(), invstd.data(), w.h.data, hsg.data(),
                                 hsgx.data(), 1.0 / cnt, dx.h.data, hctx());
  cu<NormKernels>().backward_dx(dtype_of<T>, g, x.d.data, gy.d.data, mean.data(), invstd.data(), w.d.data, hsg.data(),
                                hsgx.data(), 1.0 / cnt, dx.d.data, gctx());
  GPUSIM_CHECK_CLOSE(dx, T, "backward_dx");
  // f64 load / store
  std::vector<double> h64(4), d64(4);
  cpu<NormKernels>().load_f64(dtype_of<T>, 4, w.h.data, h64.data(), hctx());
  cu<NormKernels>().load_f64(dtype_of<T>, 4, w.d.data, d64.data(), gctx());
  close_host(h64, d64, 0, "load_f64");
  const double st[4] = {1.25, -2.5, 3.0, 0.0625};
  cpu<NormKernels>().store_f64(dtype_of<T>, 4, st, w.h.data, hctx());
  cu<NormKernels>().store_f64(dtype_of<T>, 4, st, w.d.data, gctx());
  GPUSIM_CHECK_CLOSE(w, T, "store_f64");
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
