// gpusim lane: the reduce family (kernels/reduce.cu, src/cuda/reduce_cuda.cpp; warp shuffles)
// against the CPU table: keepdim sum/max over inner, outer and middle dims, broadcast_scaled,
// max ties + backward, global sums (three kinds), mse and rel_l2 forward/backward; f32 and f64.
#include "exec/reduce_kernels.hpp"
#include "gpusim_support.hpp"

namespace st_gpusim_cuda_sim_reduce {

using namespace gpusim;
using exec::ReduceKernels;

namespace {
double* f64(const Block& b) { return static_cast<double*>(b.data); }
const ReduceKernels& cu() { return exec::kernels_for<ReduceKernels>(gpu(), "test"); }
const ReduceKernels& cpu() { return exec::kernels_for<ReduceKernels>(Device::cpu(), "test"); }

template <class T>
void reductions() {
  const std::vector<index_t> s{4, 37, 9};
  // values on a coarse grid so that max has ties
  std::vector<double> v = rand_vals(4 * 37 * 9, 51u, -4.0, 4.0);
  for (auto& e : v) e = std::round(e * 2.0) / 2.0;
  Pair<T> x(s, v), g0(s, 52u);
  for (const std::vector<index_t>& os : {std::vector<index_t>{4, 37, 1}, {1, 37, 9}, {4, 1, 9}, {1, 1, 1}}) {
    INFO("reduced shape " << os[0] << "," << os[1] << "," << os[2]);
    Pair<T> out(os), m(os), g(os, 53u), gx(s);
    Pair<double> ties(os);
    cpu().reduce_sum(x.h, out.h, 0.25, hctx());
    cu().reduce_sum(x.d, out.d, 0.25, gctx());
    GPUSIM_CHECK_CLOSE(out, T, "reduce_sum");
    cpu().reduce_max(x.h, m.h, hctx());
    cu().reduce_max(x.d, m.d, gctx());
    GPUSIM_CHECK_CLOSE(m, T, "reduce_max");
    cpu().broadcast_scaled(g.h, gx.h, 0.5, hctx());
    cu().broadcast_scaled(g.d, gx.d, 0.5, gctx());
    GPUSIM_CHECK_CLOSE(gx, T, "broadcast_scaled");
    cpu().max_ties(x.h, m.h, ties.h, hctx());
    cu().max_ties(x.d, m.d, ties.d, gctx());
    GPUSIM_CHECK_CLOSE(ties, double, "max_ties");
    cpu().max_backward(x.h, m.h, g.h, ties.h, gx.h, hctx());
    cu().max_backward(x.d, m.d, g.d, ties.d, gx.d, gctx());
    GPUSIM_CHECK_CLOSE(gx, T, "max_backward");
  }
  const index_t n = x.h.numel();
  for (int kind : {0, 1, 2}) {
    const double a = cpu().global_sum(kind, dtype_of<T>, n, x.h.data, g0.h.data, hctx());
    const double b = cu().global_sum(kind, dtype_of<T>, n, x.d.data, g0.d.data, gctx());
    INFO("global_sum kind " << kind << ": cpu " << a << " cuda " << b);
    CHECK(std::abs(a - b) <= 1e-9 * std::max(1.0, std::abs(a)));
    // The device-scalar form: T(scale * sum) stored on the device, no host read; n = 0 stores 0.
    for (index_t m : {n, index_t{0}, index_t{1}, index_t{300000}}) {
      if (m > n && kind != 0) continue;
      Pair<T> big(std::vector<index_t>{m > n ? m : 1}, 54u);
      const void* ah = m > n ? big.h.data : x.h.data;
      const void* ad = m > n ? big.d.data : x.d.data;
      Pair<T> o(std::vector<index_t>{1}, std::vector<double>{7.0});
      cpu().global_sum_into(kind, dtype_of<T>, m, ah, g0.h.data, 0.375, o.h.data, hctx());
      cu().global_sum_into(kind, dtype_of<T>, m, ad, g0.d.data, 0.375, o.d.data, gctx());
      INFO("global_sum_into kind " << kind << " n " << m);
      GPUSIM_CHECK_CLOSE(o, T, "global_sum_into");
      if (m == 0) CHECK(o.device()[0] == 0.0);
    }
  }
  Pair<T> gp(s), gt(s);
  cpu().mse_backward(0.125, nullptr, dtype_of<T>, n, x.h.data, g0.h.data, gp.h.data, gt.h.data, hctx());
  cu().mse_backward(0.125, nullptr, dtype_of<T>, n, x.d.data, g0.d.data, gp.d.data, gt.d.data, gctx());
  GPUSIM_CHECK_CLOSE(gp, T, "mse_backward gp");
  GPUSIM_CHECK_CLOSE(gt, T, "mse_backward gt");
  {  // the loss gradient read by the kernel from device memory (c = T(0.25 * g[0]))
    Pair<T> gs(std::vector<index_t>{1}, std::vector<double>{-3.5});
    cpu().mse_backward(0.25, gs.h.data, dtype_of<T>, n, x.h.data, g0.h.data, gp.h.data, nullptr, hctx());
    cu().mse_backward(0.25, gs.d.data, dtype_of<T>, n, x.d.data, g0.d.data, gp.d.data, nullptr, gctx());
    GPUSIM_CHECK_CLOSE(gp, T, "mse_backward gp (device factor)");
    CHECK(gp.host()[0] == static_cast<double>(static_cast<T>(-0.875) * (static_cast<T>(x.host()[0]) - static_cast<T>(g0.host()[0]))));
  }
  // rel_l2: 4 samples of 333 elements; sums and coefficients in device memory on the GPU.
  Pair<double> sums({8});
  cpu().rel_l2_sums(dtype_of<T>, 4, 333, x.h.data, g0.h.data, f64(sums.h), hctx());
  cu().rel_l2_sums(dtype_of<T>, 4, 333, x.d.data, g0.d.data, f64(sums.d), gctx());
  {
    const auto hs = sums.host(), ds = sums.device();
    for (int i = 0; i < 8; ++i) CHECK(std::abs(hs[static_cast<std::size_t>(i)] - ds[static_cast<std::size_t>(i)]) <=
                                      1e-9 * std::max(1.0, std::abs(hs[static_cast<std::size_t>(i)])));
  }
  Pair<double> coef({8}, {0.5, -0.25, 1.5, 0.75, -1.0, 0.125, 2.0, 0.3});
  cpu().rel_l2_backward(dtype_of<T>, 4, 333, x.h.data, g0.h.data, f64(coef.h), gp.h.data, gt.h.data, hctx());
  cu().rel_l2_backward(dtype_of<T>, 4, 333, x.d.data, g0.d.data, f64(coef.d), gp.d.data, gt.d.data, gctx());
  GPUSIM_CHECK_CLOSE(gp, T, "rel_l2_backward gp");
  GPUSIM_CHECK_CLOSE(gt, T, "rel_l2_backward gt");
  // The loss value and the backward's coefficients on the device, from the same sums (one with a
  // zero difference: coefficient 0), with an agreeing and a failing check (3 ranks).
  sums.upload();
  for (int check = 0; check < 3; ++check) {
    INFO("check " << check);
    Pair<double> chk({2}, check == 1 ? std::vector<double>{15.0, 75.0} : std::vector<double>{15.0, 77.0});
    const double* ch = check == 0 ? nullptr : f64(chk.h);
    const double* cd = check == 0 ? nullptr : f64(chk.d);
    Pair<T> v({1}), gl({1}, std::vector<double>{-0.75});
    cpu().rel_l2_value(dtype_of<T>, 4, 6, f64(sums.h), ch, 3, v.h.data, hctx());
    cu().rel_l2_value(dtype_of<T>, 4, 6, f64(sums.d), cd, 3, v.d.data, gctx());
    {  // the same operations, correctly rounded: bit for bit (NaN on both sides after a failed check)
      const double a = v.device()[0], b = v.host()[0];
      CHECK((a == b || (std::isnan(a) && std::isnan(b))));
    }
    Pair<double> c2({8});
    cpu().rel_l2_coefficients(dtype_of<T>, 4, 6, f64(sums.h), ch, 3, gl.h.data, f64(c2.h), hctx());
    cu().rel_l2_coefficients(dtype_of<T>, 4, 6, f64(sums.d), cd, 3, gl.d.data, f64(c2.d), gctx());
    const auto hc = c2.host(), dc = c2.device();
    for (std::size_t i = 0; i < 8; ++i) CHECK((hc[i] == dc[i] || (std::isnan(hc[i]) && std::isnan(dc[i]))));
    CHECK(std::isnan(v.device()[0]) == (check == 2));
  }
}
}  // namespace

TEST_CASE("gpusim reduce: sums, max, ties, global sums, mse, rel_l2", "[gpusim][reduce]") {
  GPUSIM_REQUIRE_GPU();
  SECTION("f32") { reductions<float>(); }
  SECTION("f64") { reductions<double>(); }
}

}  // namespace st_gpusim_cuda_sim_reduce
