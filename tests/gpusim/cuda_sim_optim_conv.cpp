// gpusim lane: the optimizer family (kernels/optim.cu: SGD with momentum / Nesterov / weight
// decay, Adam and AdamW) against the CPU table, and conv's own kernels (kernels/conv.cu: bias add,
// deterministic bias gradient, the zero-padded shifted copy) through their launchers
// (src/kernels_api/conv.hpp; the conv table itself needs cuDNN, which a simulator cannot run)
// against the CPU conv table's backward_bias and host references; and the GEMM family's epilogues
// (kernels/gemm.cu: bias add, bias gradient; the GEMM itself is cuBLAS) through their launchers
// against host references; f32 and f64.
#include "exec/conv_kernels.hpp"
#include "exec/optim_kernels.hpp"
#include "gpusim_support.hpp"
#include "kernels_api/conv.hpp"
#include "kernels_api/gemm.hpp"

namespace st_gpusim_cuda_sim_optim_conv {

using namespace gpusim;

namespace {

template <class T>
void optim_case() {
  const auto& cu = exec::kernels_for<exec::OptimKernels>(gpu(), "test");
  const auto& cpu = exec::kernels_for<exec::OptimKernels>(Device::cpu(), "test");
  const index_t n = 333;
  for (int variant = 0; variant < 3; ++variant) {
    exec::SgdParams p;
    p.lr = 0.05;
    p.momentum = variant == 0 ? 0.0 : 0.9;
    p.nesterov = variant == 2;
    p.weight_decay = variant == 1 ? 0.01 : 0.0;
    Pair<T> w({n}, 91u), g({n}, 92u), buf({n}, 93u);
    for (int step = 0; step < 3; ++step) {
      cpu.sgd(dtype_of<T>, n, w.h.data, g.h.data, p.momentum ? buf.h.data : nullptr, p, hctx());
      cu.sgd(dtype_of<T>, n, w.d.data, g.d.data, p.momentum ? buf.d.data : nullptr, p, gctx());
    }
    GPUSIM_CHECK_CLOSE(w, T, "sgd variant " << variant);
    if (p.momentum) GPUSIM_CHECK_CLOSE(buf, T, "sgd momentum buffer " << variant);
  }
  for (bool decoupled : {false, true}) {
    Pair<T> w({n}, 94u), g({n}, 95u);
    Pair<double> m({n}, 96u), v({n}, 97u, 0.0, 1.0);
    exec::AdamParams p;
    p.lr = 1e-2;
    p.weight_decay = 0.02;
    p.decoupled = decoupled;
    for (int t = 1; t <= 3; ++t) {
      p.bc1 = 1 - std::pow(p.beta1, t);
      p.bc2 = 1 - std::pow(p.beta2, t);
      cpu.adam(dtype_of<T>, n, w.h.data, g.h.data, static_cast<double*>(m.h.data), static_cast<double*>(v.h.data), p,
               hctx());
      cu.adam(dtype_of<T>, n, w.d.data, g.d.data, static_cast<double*>(m.d.data), static_cast<double*>(v.d.data), p,
              gctx());
    }
    GPUSIM_CHECK_CLOSE(w, T, (decoupled ? "adamw w" : "adam w"));
    GPUSIM_CHECK_CLOSE(m, double, "adam m");
    GPUSIM_CHECK_CLOSE(v, double, "adam v");
  }
  // Live values (a captured step's lr and bias corrections, read from device memory when the
  // kernel runs): the device side gets garbage fields and the values through `live`, the CPU the
  // fields.
  {
    Pair<T> w({n}, 98u), g({n}, 99u), buf({n}, 100u);
    exec::SgdParams p;
    p.lr = 0.03;
    p.momentum = 0.9;
    cpu.sgd(dtype_of<T>, n, w.h.data, g.h.data, buf.h.data, p, hctx());
    Pair<double> live({1}, std::vector<double>{0.03});
    exec::SgdParams q = p;
    q.lr = 1e9;
    q.live = static_cast<const double*>(live.d.data);
    cu.sgd(dtype_of<T>, n, w.d.data, g.d.data, buf.d.data, q, gctx());
    GPUSIM_CHECK_CLOSE(w, T, "sgd with live lr");
  }
  {
    Pair<T> w({n}, 101u), g({n}, 102u);
    Pair<double> m({n}, 103u), v({n}, 104u, 0.0, 1.0);
    exec::AdamParams p;
    p.lr = 2e-3;
    p.weight_decay = 0.01;
    p.decoupled = true;
    p.bc1 = 1 - std::pow(p.beta1, 5);
    p.bc2 = 1 - std::pow(p.beta2, 5);
    cpu.adam(dtype_of<T>, n, w.h.data, g.h.data, static_cast<double*>(m.h.data), static_cast<double*>(v.h.data), p,
             hctx());
    Pair<double> live({3}, std::vector<double>{p.lr, p.bc1, p.bc2});
    exec::AdamParams q = p;
    q.lr = q.bc1 = q.bc2 = 1e9;
    q.live = static_cast<const double*>(live.d.data);
    cu.adam(dtype_of<T>, n, w.d.data, g.d.data, static_cast<double*>(m.d.data), static_cast<double*>(v.d.data), q,
            gctx());
    GPUSIM_CHECK_CLOSE(w, T, "adamw with live values");
    GPUSIM_CHECK_CLOSE(m, double, "adamw m with live values");
  }
}

template <class T>
void conv_kernels_case() {
  namespace kc = shard::kernels::conv;
  const int f64 = std::is_same_v<T, double> ? 1 : 0;
  void* stream = gctx().stream().handle;
  const index_t N = 2, C = 5, P = 77;
  Pair<T> y({N, C, P}, 101u), bias({C}, 102u), gb({C});
  // bias_add
  REQUIRE(kc::bias_add(f64, N, C, P, bias.d.data, y.d.data, stream) == 0);
  auto* hy = static_cast<T*>(y.h.data);
  const auto* hb = static_cast<const T*>(bias.h.data);
  for (index_t i = 0; i < N * C * P; ++i) hy[i] += hb[(i / P) % C];
  GPUSIM_CHECK_CLOSE(y, T, "bias_add");
  // bias_grad against the CPU conv table's backward_bias
  Pair<double> scratch({kc::bias_grad_scratch(C)});
  REQUIRE(kc::bias_grad(f64, N, C, P, y.d.data, gb.d.data, static_cast<double*>(scratch.d.data), stream) == 0);
  exec::kernels_for<exec::ConvKernels>(Device::cpu(), "test").backward_bias(dtype_of<T>, N, C, P, y.h.data, gb.h.data,
                                                                           hctx());
  GPUSIM_CHECK_CLOSE(gb, T, "bias_grad");
  // shift_copy: pad (offset -1, -2, 0) and crop (offset +1, 0, +2) of [planes=3, 4, 5, 6]
  const index_t src_ext[3] = {4, 5, 6};
  for (const auto& [dext, off] : {std::pair{std::array<index_t, 3>{6, 9, 6}, std::array<index_t, 3>{-1, -2, 0}},
                                  std::pair{std::array<index_t, 3>{3, 5, 4}, std::array<index_t, 3>{1, 0, 2}}}) {
    Pair<T> src({3, 4, 5, 6}, 103u), dst({3, dext[0], dext[1], dext[2]}, std::vector<double>{9.0});
    REQUIRE(kc::shift_copy(f64, 3, src_ext, dext.data(), off.data(), src.d.data, dst.d.data, stream) == 0);
    auto* hd = static_cast<T*>(dst.h.data);
    const auto* hs = static_cast<const T*>(src.h.data);
    for (index_t m = 0; m < 3; ++m)
      for (index_t a = 0; a < dext[0]; ++a)
        for (index_t b = 0; b < dext[1]; ++b)
          for (index_t c = 0; c < dext[2]; ++c) {
            const index_t i = a + off[0], j = b + off[1], k = c + off[2];
            const bool in = i >= 0 && i < 4 && j >= 0 && j < 5 && k >= 0 && k < 6;
            hd[((m * dext[0] + a) * dext[1] + b) * dext[2] + c] = in ? hs[((m * 4 + i) * 5 + j) * 6 + k] : T(0);
          }
    GPUSIM_CHECK_CLOSE(dst, T, "shift_copy offset " << off[0] << "," << off[1] << "," << off[2]);
  }
}

template <class T>
void gemm_epilogue_case() {
  namespace kg = shard::kernels::gemm;
  const int f64 = std::is_same_v<T, double> ? 1 : 0;
  void* stream = gctx().stream().handle;
  const index_t A = 3, O = 6, S = 41;
  Pair<T> y({A, O, S}, 111u), bias({O}, 112u), db({O});
  REQUIRE(kg::add_bias(f64, A, O, S, bias.d.data, y.d.data, stream) == 0);
  auto* hy = static_cast<T*>(y.h.data);
  const auto* hb = static_cast<const T*>(bias.h.data);
  for (index_t i = 0; i < A * O * S; ++i) hy[i] += hb[(i / S) % O];
  GPUSIM_CHECK_CLOSE(y, T, "gemm add_bias");
  REQUIRE(kg::bias_grad(f64, A, O, S, y.d.data, db.d.data, stream) == 0);
  auto* hd = static_cast<T*>(db.h.data);
  for (index_t o = 0; o < O; ++o) {
    double acc = 0;
    for (index_t a = 0; a < A; ++a)
      for (index_t q = 0; q < S; ++q) acc += static_cast<double>(hy[(a * O + o) * S + q]);
    hd[o] = static_cast<T>(acc);
  }
  GPUSIM_CHECK_CLOSE(db, T, "gemm bias_grad");
}

}  // namespace

TEST_CASE("gpusim gemm epilogues: bias add and bias gradient", "[gpusim][gemm_epilogue]") {
  GPUSIM_REQUIRE_GPU();
  SECTION("f32") { gemm_epilogue_case<float>(); }
  SECTION("f64") { gemm_epilogue_case<double>(); }
}

TEST_CASE("gpusim optim: SGD (momentum, Nesterov, weight decay), Adam and AdamW", "[gpusim][optim]") {
  GPUSIM_REQUIRE_GPU();
  SECTION("f32") { optim_case<float>(); }
  SECTION("f64") { optim_case<double>(); }
}

TEST_CASE("gpusim conv kernels: bias add, bias gradient, shifted copy", "[gpusim][conv]") {
  GPUSIM_REQUIRE_GPU();
  SECTION("f32") { conv_kernels_case<float>(); }
  SECTION("f64") { conv_kernels_case<double>(); }
}

}  // namespace st_gpusim_cuda_sim_optim_conv
