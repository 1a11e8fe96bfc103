// The attention kernel family on CUDA (kernels/attention.cu) against the CPU implementation and
// the f64 row-at-a-time reference (tests/support/attention_reference.hpp): f64 and f32 against the
// CPU blocked kernels in the same dtype (1e-10 / 1e-5 relative), bf16 against the f64 reference on
// the bf16-rounded inputs (3e-2 relative, bf16 outputs); the tensor-core kernels (f16, bf16, TF32)
// against the same reference (5e-3 for f16 and TF32); token-major strides, sequences longer
// than a kernel tile, Nq != Nk, D != Dv, causal with offsets (fully masked rows and tiles), bias
// with -inf entries, absent gradients, and the lse merge. Skips without a GPU.
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/shardtensor.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "shardtensor/exec/attention.hpp"
#include "shardtensor/runtime/device_runtime.hpp"
#include "support/attention_reference.hpp"

namespace st_exec_cuda_attention {

using namespace shard;

namespace {

struct Case {
  exec::AttnGeom g;
  bool causal = false;
  index_t qp0 = 0, kp0 = 0;
  bool bias = false;
  bool want_dq = true, want_dk = true, want_dv = true;
};

double to_d(double x) { return x; }
double to_d(float x) { return x; }
double to_d(bf16 x) { return static_cast<double>(static_cast<float>(x)); }
double to_d(f16 x) { return static_cast<double>(static_cast<float>(x)); }
template <class T>
T from_d(double x) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
    return T(static_cast<float>(x));
  else
    return static_cast<T>(x);
}

/// A device buffer holding a copy of a host vector.
template <class T>
struct DevBuf {
  const exec::DeviceRuntime& rt = exec::cuda_runtime("test");
  void* p = nullptr;
  std::size_t n = 0;
  explicit DevBuf(const std::vector<T>& h) : n(h.size()) {
    p = rt.allocate(std::max<std::size_t>(1, n * sizeof(T)), 0);
    if (n) rt.copy(p, Device::cuda(0), h.data(), Device::cpu(), n * sizeof(T), current_context(Device::cuda(0)).stream(), true);
  }
  ~DevBuf() { rt.deallocate(p, 0); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n) rt.copy(h.data(), Device::cpu(), p, Device::cuda(0), n * sizeof(T), current_context(Device::cuda(0)).stream(), true);
    return h;
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0, s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    m = std::max(m, std::abs(a[i] - b[i]));
    s = std::max(s, std::abs(b[i]));
  }
  return s > 0 ? m / s : m;
}

/// Token-major [B, N, H, D] strides.
exec::AttnIn tin(const void* p, const exec::AttnGeom& g, index_t n, index_t d) { return {p, n * g.H * d, d, g.H * d}; }
exec::AttnOut tout(void* p, const exec::AttnGeom& g, index_t n, index_t d) { return {p, n * g.H * d, d, g.H * d}; }
/// The same token-major views as Blocks of dtype T on `dev` (what the front takes).
template <class T>
Block tb(Device dev, const void* p, const exec::AttnGeom& g, index_t n, index_t d) {
  return exec::attention_view(dtype_of<T>, dev, p, g.B, g.H, n, d, n * g.H * d, d, g.H * d);
}
/// A contiguous 1-D Block of n elements of L (the log-sum-exps).
template <class L>
Block lb(Device dev, void* p, index_t n) {
  return Block::view(dtype_of<L>, dev, p, &n, 1);
}
/// The full [B, H, Nq, Nk] bias of dtype T on `dev`.
template <class T>
Block biasb(Device dev, const void* p, const exec::AttnGeom& g) {
  const index_t shape[4] = {g.B, g.H, g.Nq, g.Nk};
  return Block::view(dtype_of<T>, dev, const_cast<void*>(p), shape, 4);
}

/// `tf32`: f32 with ExecSettings::allow_tf32 on the GPU (the TF32 tensor-core kernels), checked
/// like bf16 / f16 against the f64 reference on the same inputs.
template <class T, class L>
void check_case(const Case& c, unsigned seed, bool tf32 = false) {
  const auto& g = c.g;
  CAPTURE(g.B, g.H, g.Nq, g.Nk, g.D, g.Dv, c.causal, c.qp0, c.kp0, c.bias, c.want_dq, c.want_dk, c.want_dv, tf32);
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  auto fill = [&](index_t n, bool zero = false) {
    std::vector<T> x(static_cast<std::size_t>(n));
    for (auto& e : x) e = from_d<T>(zero ? 0.0 : nd(rng));
    return x;
  };
  constexpr bool is_bf16 = std::is_same_v<T, bf16>, is_f16 = std::is_same_v<T, f16>;
  constexpr bool lowp = is_bf16 || is_f16;
  const bool ref = lowp || tf32;  // against the f64 reference (else the CPU kernels in T)
  auto q = fill(g.B * g.Nq * g.H * g.D), k = fill(g.B * g.Nk * g.H * g.D), v = fill(g.B * g.Nk * g.H * g.Dv);
  auto dout = fill(g.B * g.Nq * g.H * g.Dv);
  // bf16 / f16: gradients start at zero (their rounding would hide the added part); else random
  auto dq0 = fill(g.B * g.Nq * g.H * g.D, lowp), dk0 = fill(g.B * g.Nk * g.H * g.D, lowp),
       dv0 = fill(g.B * g.Nk * g.H * g.Dv, lowp);
  std::vector<T> bias(c.bias ? static_cast<std::size_t>(g.B * g.H * g.Nq * g.Nk) : 0);
  for (std::size_t i = 0; i < bias.size(); ++i)
    bias[i] = from_d<T>(i % 5 == 2 ? -std::numeric_limits<double>::infinity() : nd(rng));
  if (c.bias)
    for (index_t j = 0; j < g.Nk; ++j) bias[static_cast<std::size_t>(2 * g.Nk + j)] = from_d<T>(-INFINITY);
  exec::AttnMask m;
  m.scale = 0.9 / std::sqrt(static_cast<double>(g.D));
  m.causal = c.causal;
  m.q_pos0 = c.qp0;
  m.k_pos0 = c.kp0;
  const index_t bsb = g.H * g.Nq * g.Nk, bsh = g.Nq * g.Nk, bsq = g.Nk;

  // expected: f32/f64 the CPU kernels in T; bf16 / f16 / TF32 the f64 reference on the (rounded) inputs
  std::vector<double> e_out, e_lse, e_dq, e_dk, e_dv;
  auto dvec = [](const auto& x) {
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = to_d(x[i]);
    return y;
  };
  const std::size_t nout = static_cast<std::size_t>(g.B * g.Nq * g.H * g.Dv), nl = static_cast<std::size_t>(g.B * g.H * g.Nq);
  if (ref) {
    auto qd = dvec(q), kd = dvec(k), vd = dvec(v), dod = dvec(dout), bd = dvec(bias);
    exec::AttnMask md = m;
    if (c.bias) {
      md.bias = bd.data();
      md.bias_sb = bsb, md.bias_sh = bsh, md.bias_sq = bsq, md.bias_sk = 1;
    }
    e_out.assign(nout, 0.0);
    e_lse.assign(nl, 0.0);
    e_dq.assign(qd.size(), 0.0);
    e_dk.assign(kd.size(), 0.0);
    e_dv.assign(vd.size(), 0.0);
    namespace R = test::attention_reference;
    R::forward<double>(g, tin(qd.data(), g, g.Nq, g.D), tin(kd.data(), g, g.Nk, g.D), tin(vd.data(), g, g.Nk, g.Dv),
                       md, tout(e_out.data(), g, g.Nq, g.Dv), e_lse.data());
    R::backward<double>(g, tin(qd.data(), g, g.Nq, g.D), tin(kd.data(), g, g.Nk, g.D), tin(vd.data(), g, g.Nk, g.Dv),
                        tin(e_out.data(), g, g.Nq, g.Dv), tin(dod.data(), g, g.Nq, g.Dv), e_lse.data(), md,
                        tout(e_dq.data(), g, g.Nq, g.D), tout(e_dk.data(), g, g.Nk, g.D),
                        tout(e_dv.data(), g, g.Nk, g.Dv));
  } else {
    std::vector<T> out(nout), dq = dq0, dk = dk0, dv = dv0;
    std::vector<L> lse(nl);
    auto& cpu = current_context(Device::cpu());
    const Device h = Device::cpu();
    const Block bb = biasb<T>(h, bias.data(), g);
    const Block* bp = c.bias ? &bb : nullptr;
    exec::attention_forward(g, m, tb<T>(h, q.data(), g, g.Nq, g.D), tb<T>(h, k.data(), g, g.Nk, g.D),
                            tb<T>(h, v.data(), g, g.Nk, g.Dv), bp, tb<T>(h, out.data(), g, g.Nq, g.Dv),
                            lb<L>(h, lse.data(), static_cast<index_t>(nl)), cpu);
    const Block bdq = tb<T>(h, dq.data(), g, g.Nq, g.D), bdk = tb<T>(h, dk.data(), g, g.Nk, g.D),
                bdv = tb<T>(h, dv.data(), g, g.Nk, g.Dv);
    exec::attention_backward(g, m, tb<T>(h, q.data(), g, g.Nq, g.D), tb<T>(h, k.data(), g, g.Nk, g.D),
                             tb<T>(h, v.data(), g, g.Nk, g.Dv), bp, tb<T>(h, out.data(), g, g.Nq, g.Dv),
                             tb<T>(h, dout.data(), g, g.Nq, g.Dv), lb<L>(h, lse.data(), static_cast<index_t>(nl)),
                             c.want_dq ? &bdq : nullptr, c.want_dk ? &bdk : nullptr, c.want_dv ? &bdv : nullptr, cpu);
    e_out = dvec(out);
    e_lse = dvec(lse);
    e_dq = dvec(dq), e_dk = dvec(dk), e_dv = dvec(dv);
    auto sub = [](std::vector<double>& a, const std::vector<double>& b) {
      for (std::size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
    };
    sub(e_dq, dvec(dq0)), sub(e_dk, dvec(dk0)), sub(e_dv, dvec(dv0));
  }

  // the GPU
  DevBuf<T> Q(q), K(k), V(v), DO(dout), B(bias), DQ(dq0), DK(dk0), DV(dv0), O{std::vector<T>(nout)};
  DevBuf<L> LS{std::vector<L>(nl)};
  auto& gpu = current_context(Device::cuda(0));
  struct Tf32 {  // allow_tf32 for this case only
    ExecContext& c;
    bool was;
    Tf32(ExecContext& ctx, bool on) : c(ctx), was(ctx.settings().allow_tf32) { c.settings().allow_tf32 = on; }
    ~Tf32() { c.settings().allow_tf32 = was; }
  } tf32_scope(gpu, tf32);
  const Device d0 = Device::cuda(0);
  const Block gbias = biasb<T>(d0, B.p, g);
  const Block* gbp = c.bias ? &gbias : nullptr;
  exec::attention_forward(g, m, tb<T>(d0, Q.p, g, g.Nq, g.D), tb<T>(d0, K.p, g, g.Nk, g.D),
                          tb<T>(d0, V.p, g, g.Nk, g.Dv), gbp, tb<T>(d0, O.p, g, g.Nq, g.Dv),
                          lb<L>(d0, LS.p, static_cast<index_t>(nl)), gpu);
  const Block gdq = tb<T>(d0, DQ.p, g, g.Nq, g.D), gdk = tb<T>(d0, DK.p, g, g.Nk, g.D),
              gdv = tb<T>(d0, DV.p, g, g.Nk, g.Dv);
  exec::attention_backward(g, m, tb<T>(d0, Q.p, g, g.Nq, g.D), tb<T>(d0, K.p, g, g.Nk, g.D),
                           tb<T>(d0, V.p, g, g.Nk, g.Dv), gbp, tb<T>(d0, O.p, g, g.Nq, g.Dv),
                           tb<T>(d0, DO.p, g, g.Nq, g.Dv), lb<L>(d0, LS.p, static_cast<index_t>(nl)),
                           c.want_dq ? &gdq : nullptr, c.want_dk ? &gdk : nullptr, c.want_dv ? &gdv : nullptr, gpu);
  // bf16 (u = 2^-9), f16 and TF32 (u = 2^-11): operands, P and dS rounded, float accumulation
  const double tol = is_bf16 ? 3e-2 : (is_f16 || tf32) ? 5e-3 : std::is_same_v<T, float> ? 1e-5 : 1e-10;
  CHECK(rel_diff(dvec(O.host()), e_out) <= tol);
  CHECK(rel_diff(dvec(LS.host()), e_lse) <= (is_bf16 ? 1e-2 : (is_f16 || tf32) ? 2e-3 : tol));
  auto grad = [&](const DevBuf<T>& d, const std::vector<T>& init, const std::vector<double>& want, bool wanted) {
    auto got = dvec(d.host());
    const auto i0 = dvec(init);
    if (!wanted) {
      CHECK(got == i0);
      return;
    }
    for (std::size_t i = 0; i < got.size(); ++i) got[i] -= i0[i];
    CHECK(rel_diff(got, want) <= tol * 4);
  };
  grad(DQ, dq0, e_dq, c.want_dq);
  grad(DK, dk0, e_dk, c.want_dk);
  grad(DV, dv0, e_dv, c.want_dv);
}

std::vector<Case> cases() {
  return {
      {{1, 2, 300, 333, 64, 64}},                            // several kernel tiles, non-multiples
      {{2, 3, 150, 600, 32, 48}, false, 0, 0, true},         // D != Dv, bias with -inf, a fully masked row
      {{1, 2, 257, 257, 64, 64}, true},                      // causal, square
      {{1, 2, 150, 600, 16, 16}, true, 450, 0, false},       // causal, queries = the last keys
      {{1, 1, 300, 300, 8, 8}, true, 0, 170, true},          // keys after the queries: masked rows / tiles
      {{1, 2, 100, 200, 96, 80}, false, 0, 0, false, true, false, true},   // DM = 128, no dk
      {{1, 1, 70, 90, 200, 160}, true, 20, 0, false, false, true, false},  // DM = 256, dk only
  };
}

}  // namespace

TEST_CASE("CUDA attention kernels: f64 and f32 equal the CPU kernels, bf16 the f64 reference", "[cuda][exec][attention]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped");
  unsigned seed = 5;
  for (const auto& c : cases()) {
    check_case<double, double>(c, seed++);
    check_case<float, float>(c, seed++);
    check_case<bf16, float>(c, seed++);
  }
}

/// Whether the profiler saw kernel row `name` with pass `pass` run.
bool saw(const Profiler& prof, const char* name, const char* pass) {
  for (const auto& r : prof.rows())
    if (r.category == "kernel" && r.name == name && r.pass == pass && r.calls > 0) return true;
  return false;
}

TEST_CASE("CUDA attention on the tensor cores: f16, bf16 and TF32 against the f64 reference", "[cuda][exec][attention][tc]") {
  // kernels/attention_tc.cu (wmma): f16 and bf16 (ExecSettings::native_low_precision, the default)
  // where cuDNN's fused attention declines or is off (SHARDTENSOR_CUDNN_ATTENTION=0, as
  // scripts/gpu_check.sh runs this case a second time), f32 under allow_tf32. Each case must have
  // run on the tensor cores (or cuDNN) unless its padded head dim is 128 and the device cannot give
  // the shared memory (reported).
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped");
  unsigned seed = 77;
  int n = 0, tc = 0, cudnn = 0, declined = 0;
  for (const auto& c : cases()) {
    if (c.g.D > 128 || c.g.Dv > 128) continue;
    const bool dm64 = c.g.D <= 64 && c.g.Dv <= 64;
    auto run = [&](auto tag, bool tf32, const char* what) {
      using T = decltype(tag);
      Profiler prof;
      check_case<T, float>(c, seed++, tf32);
      const bool t = saw(prof, "attention_tc", "forward") && (saw(prof, "attention_tc", "backward"));
      const bool d = saw(prof, "attention_cudnn", "forward") || saw(prof, "attention_cudnn", "backward");
      INFO(what << " case " << n << " (D " << c.g.D << ", Dv " << c.g.Dv << ")");
      if (dm64) CHECK((t || d));
      tc += t, cudnn += d, declined += !t && !d;
    };
    run(f16{}, false, "f16");
    run(bf16{}, false, "bf16");
    run(float{}, true, "TF32");
    ++n;
  }
  WARN("attention on the tensor cores: " << tc << " runs on our wmma kernels, " << cudnn << " on cuDNN, " << declined
                                        << " declined (padded head dim 128 without the shared memory)");
}

TEST_CASE("CUDA attention merge equals the whole, and oversized head dims are errors", "[cuda][exec][attention]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: GPU tests skipped");
  // split the keys in two blocks on the GPU, merge, compare with the whole (f32)
  const exec::AttnGeom g{1, 2, 130, 300, 32, 32};
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  auto fill = [&](index_t n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (auto& e : x) e = nd(rng);
    return x;
  };
  auto q = fill(g.Nq * g.H * g.D), k = fill(g.Nk * g.H * g.D), v = fill(g.Nk * g.H * g.Dv);
  const std::size_t no = static_cast<std::size_t>(g.Nq * g.H * g.Dv), nl = static_cast<std::size_t>(g.H * g.Nq);
  DevBuf<float> Q(q), K(k), V(v), O{std::vector<float>(no)}, O1{std::vector<float>(no)}, O2{std::vector<float>(no)};
  DevBuf<float> L{std::vector<float>(nl)}, L1{std::vector<float>(nl)}, L2{std::vector<float>(nl)};
  auto& gpu = current_context(Device::cuda(0));
  exec::AttnMask m;
  m.scale = 0.2;
  m.causal = true;
  m.q_pos0 = 100;
  const Device d0 = Device::cuda(0);
  const auto nli = static_cast<index_t>(nl);
  exec::attention_forward(g, m, tb<float>(d0, Q.p, g, g.Nq, g.D), tb<float>(d0, K.p, g, g.Nk, g.D),
                          tb<float>(d0, V.p, g, g.Nk, g.Dv), nullptr, tb<float>(d0, O.p, g, g.Nq, g.Dv),
                          lb<float>(d0, L.p, nli), gpu);
  exec::AttnGeom g1 = g, g2 = g;
  g1.Nk = 120;
  g2.Nk = g.Nk - 120;
  exec::AttnMask m2 = m;
  m2.k_pos0 = 120;
  // rows [row0, row0 + n) of the token-major [1, g.Nk, H, d] keys / values
  auto rows = [&](void* p, index_t row0, index_t n, index_t d) {
    return exec::attention_view(DType::f32, d0, static_cast<float*>(p) + row0 * g.H * d, g.B, g.H, n, d,
                                g.Nk * g.H * d, d, g.H * d);
  };
  exec::attention_forward(g1, m, tb<float>(d0, Q.p, g, g.Nq, g.D), rows(K.p, 0, g1.Nk, g.D), rows(V.p, 0, g1.Nk, g.Dv),
                          nullptr, tb<float>(d0, O1.p, g, g.Nq, g.Dv), lb<float>(d0, L1.p, nli), gpu);
  exec::attention_forward(g2, m2, tb<float>(d0, Q.p, g, g.Nq, g.D), rows(K.p, 120, g2.Nk, g.D),
                          rows(V.p, 120, g2.Nk, g.Dv), nullptr, tb<float>(d0, O2.p, g, g.Nq, g.Dv),
                          lb<float>(d0, L2.p, nli), gpu);
  exec::attention_merge(g, tb<float>(d0, O1.p, g, g.Nq, g.Dv), lb<float>(d0, L1.p, nli),
                        tb<float>(d0, O2.p, g, g.Nq, g.Dv), lb<float>(d0, L2.p, nli), gpu);
  auto dv = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  CHECK(rel_diff(dv(O1.host()), dv(O.host())) < 1e-5);
  CHECK(rel_diff(dv(L1.host()), dv(L.host())) < 1e-5);
  exec::AttnGeom big{1, 1, 4, 4, 300, 8};
  CHECK_THROWS_AS(exec::attention_forward(big, m, tb<float>(d0, Q.p, big, 4, 300), tb<float>(d0, K.p, big, 4, 300),
                                          tb<float>(d0, V.p, big, 4, 8), nullptr, tb<float>(d0, O.p, big, 4, 8),
                                          lb<float>(d0, L.p, 4), gpu),
                  Error);
}

}  // namespace st_exec_cuda_attention
