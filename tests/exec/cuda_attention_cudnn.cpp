// cuDNN's fused attention as the CUDA attention table's bf16 / f16 kernel (src/cuda/attention_cudnn.cpp)
// against our own f32 CUDA kernels on the same GPU and the f64 CPU reference
// (tests/support/attention_reference.hpp), both on the inputs rounded to the storage type: bf16 and
// f16, D 64 and 128, sequence lengths that are not multiples of 64, token-major strides,
// non-causal and causal with offsets (ring's diagonal block, a block whose shift is Nk - Nq, an
// earlier block with nothing masked, an arbitrary shift); forward out and lse, backward dq, dk, dv
// and the backward's ADD contract (a second backward onto the first one's gradients doubles them);
// the graph cache (a repeated shape builds no graph); the calls that must fall back to our own
// kernels (f32, a head dim not a multiple of 8, a bias, fully masked query rows) and still be right.
//
// Tolerances (u: unit roundoff of the storage type, bf16 2^-8, f16 2^-11), as max |error| / max
// |reference| over the tensor: the scores are fp32 products of rounded inputs (exact) with fp32 sums,
// so lse is compared at 1e-3 (its values are O(1..10): this is far above fp32 error and far below
// any convention slip, which moves lse by >= log 2 or by the scale). out: each P_ij enters the PV
// product rounded to the storage type (relative error u), and out is rounded once more; the errors
// are independent, so |error| stays a few u of |out|: 8u (bf16 3.1e-2, as tests/exec/cuda_attention.cpp
// uses). Gradients are computed from the same rounded out and the same lse on every side (the
// forward's error is not carried into the backward); dS and P are rounded to the storage type
// before their matmuls and dS = P (dP - delta) cancels: 16u. Without a GPU every case skips.
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/shardtensor.hpp>

#include <cmath>
#include <initializer_list>
#include <random>
#include <vector>

#include "cuda/attention_cudnn.hpp"
#include "shardtensor/runtime/device_runtime.hpp"
#include "shardtensor/exec/attention.hpp"
#include "support/attention_reference.hpp"

namespace st_exec_cuda_attention_cudnn {

using namespace shard;
namespace ca = shard::exec::cudnn_attention;

namespace {

#define SHARD_REQUIRE_GPU()                                                                        \
  do {                                                                                             \
    if (!cuda_compiled()) SKIP("shardtensor was built without CUDA (SHARDTENSOR_ENABLE_CUDA=OFF)"); \
    if (cuda_device_count() <= 0) SKIP("no CUDA device visible: GPU tests skipped");               \
  } while (0)

const Device kGpu = Device::cuda(0);

/// A device buffer holding a copy of a host vector.
template <class T>
struct DevBuf {
  const exec::DeviceRuntime& rt = exec::cuda_runtime("test");
  void* p = nullptr;
  std::size_t n = 0;
  explicit DevBuf(const std::vector<T>& h) : n(h.size()) {
    p = rt.allocate(std::max<std::size_t>(1, n * sizeof(T)), 0);
    if (n) rt.copy(p, kGpu, h.data(), Device::cpu(), n * sizeof(T), current_context(kGpu).stream(), true);
  }
  ~DevBuf() { rt.deallocate(p, 0); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n) rt.copy(h.data(), Device::cpu(), p, kGpu, n * sizeof(T), current_context(kGpu).stream(), true);
    return h;
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

template <class T>
std::vector<double> as_double(const std::vector<T>& x) {
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = static_cast<double>(x[i]);
  return y;
}
template <class T>
std::vector<T> as(const std::vector<double>& x) {
  std::vector<T> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = T(static_cast<float>(x[i]));
  return y;
}

/// max |a - b| / max |b| (infinities must match).
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0, s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    if (std::isnan(a[i])) return INFINITY;
    m = std::max(m, std::abs(a[i] - b[i]));
    s = std::max(s, std::abs(b[i]));
  }
  return s > 0 ? m / s : m;
}

/// Token-major [B, N, H, d] views.
exec::AttnIn tin(const void* p, const exec::AttnGeom& g, index_t n, index_t d) { return {p, n * g.H * d, d, g.H * d}; }
exec::AttnOut tout(void* p, const exec::AttnGeom& g, index_t n, index_t d) { return {p, n * g.H * d, d, g.H * d}; }
Block tb(DType dt, Device dev, const void* p, const exec::AttnGeom& g, index_t n, index_t d) {
  return exec::attention_view(dt, dev, p, g.B, g.H, n, d, n * g.H * d, d, g.H * d);
}
Block lb(Device dev, void* p, index_t n) { return Block::view(DType::f32, dev, p, &n, 1); }

/// Which path a case must take (when the cuDNN path is compiled in).
enum class Path { cudnn, own, either };

struct Case {
  exec::AttnGeom g;
  bool causal = false;
  index_t qp0 = 0, kp0 = 0;
  Path path = Path::cudnn;  ///< either: cuDNN may refuse the band at build time; both are right
};

/// Results of one side: out, lse, and the gradients of a backward from zero.
struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

template <class T>
constexpr double unit_roundoff() {
  return std::is_same_v<T, bf16> ? 1.0 / 256 : 1.0 / 2048;
}

/// One case in storage type T: cuDNN (through the front) vs our f32 CUDA kernels vs the f64 CPU
/// reference; then the ADD contract.
template <class T>
void check_case(const Case& c, unsigned seed) {
  const auto& g = c.g;
  constexpr DType dt = dtype_of<T>;
  CAPTURE(dtype_name(dt), g.B, g.H, g.Nq, g.Nk, g.D, c.causal, c.qp0, c.kp0);
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  auto fill = [&](index_t n) {  // values already representable in T
    std::vector<double> x(static_cast<std::size_t>(n));
    for (auto& e : x) e = static_cast<double>(T(static_cast<float>(nd(rng))));
    return x;
  };
  const auto q = fill(g.B * g.Nq * g.H * g.D), k = fill(g.B * g.Nk * g.H * g.D), v = fill(g.B * g.Nk * g.H * g.D),
             dout = fill(g.B * g.Nq * g.H * g.D);
  const std::size_t no = q.size(), nk = k.size(), nl = static_cast<std::size_t>(g.B * g.H * g.Nq);
  exec::AttnMask m;
  m.scale = 1.0 / std::sqrt(static_cast<double>(g.D));
  m.causal = c.causal;
  m.q_pos0 = c.qp0;
  m.k_pos0 = c.kp0;

  // The CPU reference (f64): forward, then the backward from the reference out rounded to T.
  namespace R = test::attention_reference;
  Result ref;
  ref.out.assign(no, 0.0);
  ref.lse.assign(nl, 0.0);
  R::forward<double>(g, tin(q.data(), g, g.Nq, g.D), tin(k.data(), g, g.Nk, g.D), tin(v.data(), g, g.Nk, g.D), m,
                     tout(ref.out.data(), g, g.Nq, g.D), ref.lse.data());
  const auto out_t = as_double(as<T>(ref.out));  // the out every backward below is given
  std::vector<double> lse_f(nl);                 // and the lse (float, as the GPU holds it)
  for (std::size_t i = 0; i < nl; ++i) lse_f[i] = static_cast<double>(static_cast<float>(ref.lse[i]));
  ref.dq.assign(no, 0.0);
  ref.dk.assign(nk, 0.0);
  ref.dv.assign(nk, 0.0);
  R::backward<double>(g, tin(q.data(), g, g.Nq, g.D), tin(k.data(), g, g.Nk, g.D), tin(v.data(), g, g.Nk, g.D),
                      tin(out_t.data(), g, g.Nq, g.D), tin(dout.data(), g, g.Nq, g.D), lse_f.data(), m,
                      tout(ref.dq.data(), g, g.Nq, g.D), tout(ref.dk.data(), g, g.Nk, g.D),
                      tout(ref.dv.data(), g, g.Nk, g.D));

  auto& ctx = current_context(kGpu);
  std::vector<float> lse_host(lse_f.begin(), lse_f.end());
  // One side on the GPU in storage type S (T: the cuDNN path; float: our own kernels).
  auto run = [&](auto tag) {
    using S = decltype(tag);
    constexpr DType sdt = dtype_of<S>;
    DevBuf<S> Q(as<S>(q)), K(as<S>(k)), V(as<S>(v)), DO(as<S>(dout)), O{std::vector<S>(no)};
    DevBuf<float> L{std::vector<float>(nl)};
    exec::attention_forward(g, m, tb(sdt, kGpu, Q.p, g, g.Nq, g.D), tb(sdt, kGpu, K.p, g, g.Nk, g.D),
                            tb(sdt, kGpu, V.p, g, g.Nk, g.D), nullptr, tb(sdt, kGpu, O.p, g, g.Nq, g.D),
                            lb(kGpu, L.p, static_cast<index_t>(nl)), ctx);
    Result r;
    r.out = as_double(O.host());
    r.lse = as_double(L.host());
    DevBuf<S> OB(as<S>(out_t)), DQ{std::vector<S>(no)}, DK{std::vector<S>(nk)}, DV{std::vector<S>(nk)};
    DevBuf<float> LB(lse_host);
    const Block dq = tb(sdt, kGpu, DQ.p, g, g.Nq, g.D), dk = tb(sdt, kGpu, DK.p, g, g.Nk, g.D),
                dv = tb(sdt, kGpu, DV.p, g, g.Nk, g.D);
    auto backward = [&] {
      exec::attention_backward(g, m, tb(sdt, kGpu, Q.p, g, g.Nq, g.D), tb(sdt, kGpu, K.p, g, g.Nk, g.D),
                               tb(sdt, kGpu, V.p, g, g.Nk, g.D), nullptr, tb(sdt, kGpu, OB.p, g, g.Nq, g.D),
                               tb(sdt, kGpu, DO.p, g, g.Nq, g.D), lb(kGpu, LB.p, static_cast<index_t>(nl)), &dq, &dk,
                               &dv, ctx);
    };
    backward();
    r.dq = as_double(DQ.host());
    r.dk = as_double(DK.host());
    r.dv = as_double(DV.host());
    if constexpr (!std::is_same_v<S, float>) {
      // ADD contract: a second backward onto the first one's gradients doubles them (2x is exact in
      // T; the second result is rounded once more: 2u of slack on top of a possibly
      // non-deterministic dQ).
      backward();
      const double u = unit_roundoff<T>();
      auto twice = [](std::vector<double> x) {
        for (auto& e : x) e *= 2;
        return x;
      };
      CHECK(rel_diff(as_double(DQ.host()), twice(r.dq)) <= 4 * u);
      CHECK(rel_diff(as_double(DK.host()), twice(r.dk)) <= 4 * u);
      CHECK(rel_diff(as_double(DV.host()), twice(r.dv)) <= 4 * u);
    }
    return r;
  };

  const auto before = ca::counters();
  const Result mine = run(T{});
  const auto after = ca::counters();
  const bool took_cudnn = after.forward_cudnn == before.forward_cudnn + 1;
  INFO("cuDNN path taken: " << took_cudnn << " (last reason declined: " << after.last_reason << ")");
  if (ca::compiled() && c.path == Path::cudnn) {
    CHECK(after.forward_cudnn == before.forward_cudnn + 1);
    CHECK(after.backward_cudnn == before.backward_cudnn + 2);
  } else if (c.path == Path::own) {
    CHECK(after.forward_cudnn == before.forward_cudnn);
    CHECK(after.backward_cudnn == before.backward_cudnn);
  } else if (ca::compiled() && !took_cudnn) {
    WARN("cuDNN declined this case (own kernels ran): " << after.last_reason);
  }
  const Result own = run(float{});  // f32: never cuDNN

  const double u = unit_roundoff<T>();
  const double t_out = 8 * u, t_grad = 16 * u, t_lse = 1e-3;
  // our f32 kernels against the CPU (the f32 tolerance of tests/exec/cuda_attention.cpp)
  CHECK(rel_diff(own.out, ref.out) <= 1e-5);
  CHECK(rel_diff(own.lse, ref.lse) <= 1e-5);
  CHECK(rel_diff(own.dq, ref.dq) <= 1e-4);
  // the storage-type path against both
  for (const Result* want : std::initializer_list<const Result*>{&ref, &own}) {
    CHECK(rel_diff(mine.out, want->out) <= t_out);
    CHECK(rel_diff(mine.lse, want->lse) <= t_lse);
    CHECK(rel_diff(mine.dq, want->dq) <= t_grad);
    CHECK(rel_diff(mine.dk, want->dk) <= t_grad);
    CHECK(rel_diff(mine.dv, want->dv) <= t_grad);
  }
}

}  // namespace

TEST_CASE("cuDNN attention: bf16 / f16 forward and backward equal our f32 kernels and the CPU",
          "[cuda][cudnn][attention]") {
  SHARD_REQUIRE_GPU();
  if (!ca::compiled())
    WARN("built without cudnn-frontend: these cases run the own kernels (configure with SHARDTENSOR_CUDNN_FRONTEND_DIR)");
  const std::vector<Case> cases = {
      {{2, 3, 200, 200, 64, 64}},                          // non-causal, N not a multiple of 64
      {{1, 2, 130, 130, 128, 128}, true, 260, 260},        // ring's diagonal block (equal offsets)
      {{1, 2, 100, 228, 64, 64}, true, 128, 0},            // shift Nk - Nq: bottom-right causal
      {{1, 2, 100, 100, 64, 64}, true, 300, 0},            // an earlier block: nothing masked
      {{1, 2, 150, 150, 128, 128}, true, 0, 0},            // Ulysses' full causal
      {{1, 2, 120, 120, 64, 64}, true, 5, 0, Path::either},  // shift 5: top-left band, right bound 5
  };
  unsigned seed = 11;
  for (const auto& c : cases) {
    check_case<bf16>(c, seed++);
    check_case<f16>(c, seed++);
  }
}

TEST_CASE("cuDNN attention: a repeated shape reuses its graph", "[cuda][cudnn][attention]") {
  SHARD_REQUIRE_GPU();
  if (!ca::compiled()) SKIP("built without cudnn-frontend (SHARDTENSOR_CUDNN_FRONTEND_DIR)");
  const Case c{{1, 2, 96, 96, 64, 64}};
  check_case<bf16>(c, 1);
  const auto built = ca::counters().graphs_built;
  check_case<bf16>(c, 2);  // same shapes, other data and buffers
  CHECK(ca::counters().graphs_built == built);
}

TEST_CASE("cuDNN attention: what it cannot do falls back to our kernels", "[cuda][cudnn][attention]") {
  SHARD_REQUIRE_GPU();
  auto& ctx = current_context(kGpu);
  // f32, D = 60 (not a multiple of 8), a bias, fully masked query rows: the own kernels run
  auto declined = [&](DType dt, exec::AttnGeom g, exec::AttnMask m, bool bias, const char* reason) {
    CAPTURE(dtype_name(dt), g.D, m.causal, m.q_pos0, m.k_pos0, bias);
    const std::size_t es = dtype_size(dt);
    const std::size_t no = static_cast<std::size_t>(g.B * g.Nq * g.H * g.D), nk = static_cast<std::size_t>(g.B * g.Nk * g.H * g.D);
    DevBuf<char> Q{std::vector<char>(no * es)}, K{std::vector<char>(nk * es)}, V{std::vector<char>(nk * es)},
        O{std::vector<char>(no * es)}, L{std::vector<char>(static_cast<std::size_t>(g.B * g.H * g.Nq) * 4)},
        Bi{std::vector<char>(static_cast<std::size_t>(g.B * g.H * g.Nq * g.Nk) * es)};
    const index_t bshape[4] = {g.B, g.H, g.Nq, g.Nk};
    const Block bb = Block::view(dt, kGpu, Bi.p, bshape, 4);
    const auto before = ca::counters();
    exec::attention_forward(g, m, tb(dt, kGpu, Q.p, g, g.Nq, g.D), tb(dt, kGpu, K.p, g, g.Nk, g.D),
                            tb(dt, kGpu, V.p, g, g.Nk, g.D), bias ? &bb : nullptr, tb(dt, kGpu, O.p, g, g.Nq, g.D),
                            lb(kGpu, L.p, g.B * g.H * g.Nq), ctx);
    const auto after = ca::counters();
    CHECK(after.forward_cudnn == before.forward_cudnn);
    CHECK(after.forward_declined == before.forward_declined + 1);
    INFO(after.last_reason);
    CHECK((!ca::compiled() || after.last_reason.find(reason) != std::string::npos));
  };
  exec::AttnMask m;
  m.scale = 0.125;
  declined(DType::f32, {1, 2, 64, 64, 64, 64}, m, false, "dtype f32");
  declined(DType::bf16, {1, 2, 64, 64, 60, 60}, m, false, "multiple of 8");
  declined(DType::f16, {1, 2, 64, 64, 64, 64}, m, true, "bias");
  exec::AttnMask late = m;
  late.causal = true;
  late.k_pos0 = 10;  // queries 0..9 see no key
  declined(DType::bf16, {1, 2, 64, 64, 64, 64}, late, false, "fully masked");
  // the results of declined bf16 / f16 cases are right too (same checks, own kernels)
  check_case<bf16>({{1, 2, 70, 90, 56, 56}, true, 0, 30, Path::own}, 97);  // fully masked rows
  check_case<f16>({{1, 2, 70, 90, 60, 60}, false, 0, 0, Path::own}, 98);   // D = 60
  // D = 72 is a multiple of 8 (<= 128): cuDNN takes it
  check_case<bf16>({{1, 2, 70, 90, 72, 72}}, 99);
}

#undef SHARD_REQUIRE_GPU  // file-local: unity builds put several test files in one TU

}  // namespace st_exec_cuda_attention_cudnn
