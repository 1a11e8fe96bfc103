// The attention kernel family on the CPU against an explicit softmax(scale q k^T + bias) v,
// including causal offsets, a fully masked row, token-major strides and the lse merge.
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/shardtensor.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "shardtensor/exec/attention.hpp"

using namespace shard;

namespace {

struct Naive {
  std::vector<double> out, lse, dq, dk, dv;
};

// q [B,H,Nq,D] k [B,H,Nk,D] v [B,H,Nk,Dv] head-major contiguous; explicit P matrix.
Naive naive(const exec::AttnGeom& g, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const std::vector<double>& dout, double scale, bool causal, index_t qp0,
            index_t kp0, const std::vector<double>* bias) {
  Naive r;
  r.out.assign(static_cast<std::size_t>(g.B * g.H * g.Nq * g.Dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(g.B * g.H * g.Nq), -std::numeric_limits<double>::infinity());
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  for (index_t bh = 0; bh < g.B * g.H; ++bh)
    for (index_t i = 0; i < g.Nq; ++i) {
      std::vector<double> s(static_cast<std::size_t>(g.Nk));
      double mx = -INFINITY;
      for (index_t j = 0; j < g.Nk; ++j) {
        double d = 0;
        for (index_t x = 0; x < g.D; ++x) d += q[(bh * g.Nq + i) * g.D + x] * k[(bh * g.Nk + j) * g.D + x];
        d *= scale;
        if (bias) d += (*bias)[i * g.Nk + j];
        if (causal && kp0 + j > qp0 + i) d = -INFINITY;
        s[j] = d;
        mx = std::max(mx, d);
      }
      if (mx == -INFINITY) continue;
      double l = 0;
      for (auto& x : s) l += std::exp(x - mx);
      const double lse = mx + std::log(l);
      r.lse[bh * g.Nq + i] = lse;
      std::vector<double> p(s.size());
      for (std::size_t j = 0; j < s.size(); ++j) p[j] = std::exp(s[j] - lse);
      for (index_t j = 0; j < g.Nk; ++j)
        for (index_t x = 0; x < g.Dv; ++x) r.out[(bh * g.Nq + i) * g.Dv + x] += p[j] * v[(bh * g.Nk + j) * g.Dv + x];
      // backward
      double delta = 0;
      for (index_t x = 0; x < g.Dv; ++x) delta += dout[(bh * g.Nq + i) * g.Dv + x] * r.out[(bh * g.Nq + i) * g.Dv + x];
      for (index_t j = 0; j < g.Nk; ++j) {
        double dp = 0;
        for (index_t x = 0; x < g.Dv; ++x) {
          dp += dout[(bh * g.Nq + i) * g.Dv + x] * v[(bh * g.Nk + j) * g.Dv + x];
          r.dv[(bh * g.Nk + j) * g.Dv + x] += p[j] * dout[(bh * g.Nq + i) * g.Dv + x];
        }
        const double ds = p[j] * (dp - delta) * scale;
        for (index_t x = 0; x < g.D; ++x) {
          r.dq[(bh * g.Nq + i) * g.D + x] += ds * k[(bh * g.Nk + j) * g.D + x];
          r.dk[(bh * g.Nk + j) * g.D + x] += ds * q[(bh * g.Nq + i) * g.D + x];
        }
      }
    }
  return r;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) && a[i] == b[i]) continue;
    m = std::max(m, std::abs(a[i] - b[i]));
  }
  return m;
}

}  // namespace

TEST_CASE("attention kernel (CPU, f64) equals explicit softmax, incl. causal and a fully masked row", "[exec][attention]") {
  const exec::AttnGeom g{2, 3, 7, 9, 5, 4};
  std::mt19937 rng(3);
  std::normal_distribution<double> nd;
  auto fill = [&](std::size_t n) {
    std::vector<double> x(n);
    for (auto& e : x) e = nd(rng);
    return x;
  };
  auto q = fill(static_cast<std::size_t>(g.B * g.H * g.Nq * g.D));
  auto k = fill(static_cast<std::size_t>(g.B * g.H * g.Nk * g.D));
  auto v = fill(static_cast<std::size_t>(g.B * g.H * g.Nk * g.Dv));
  auto dout = fill(static_cast<std::size_t>(g.B * g.H * g.Nq * g.Dv));
  for (const bool causal : {false, true}) {
    // causal with q positions starting 1 before k: query 0 sees nothing (a fully masked row)
    const index_t qp0 = 3, kp0 = 4;
    const double scale = 0.37;
    auto ref = naive(g, q, k, v, dout, scale, causal, qp0, kp0, nullptr);
    std::vector<double> out(ref.out.size()), lse(ref.lse.size()), dq(q.size(), 0.0), dk(k.size(), 0.0),
        dv(v.size(), 0.0);
    exec::AttnMask m;
    m.scale = scale;
    m.causal = causal;
    m.q_pos0 = qp0;
    m.k_pos0 = kp0;
    auto& ctx = shard::current_context(Device::cpu());
    auto in = [&](const std::vector<double>& x, index_t n, index_t d) {
      return exec::AttnIn{x.data(), g.H * n * d, n * d, d};
    };
    auto outp = [&](std::vector<double>& x, index_t n, index_t d) {
      return exec::AttnOut{x.data(), g.H * n * d, n * d, d};
    };
    exec::attention_forward(DType::f64, g, in(q, g.Nq, g.D), in(k, g.Nk, g.D), in(v, g.Nk, g.Dv), m,
                            outp(out, g.Nq, g.Dv), lse.data(), Device::cpu(), ctx);
    CHECK(max_diff(out, ref.out) < 1e-12);
    CHECK(max_diff(lse, ref.lse) < 1e-12);
    if (causal) CHECK(std::isinf(lse[0]));
    exec::attention_backward(DType::f64, g, in(q, g.Nq, g.D), in(k, g.Nk, g.D), in(v, g.Nk, g.Dv),
                             in(out, g.Nq, g.Dv), in(dout, g.Nq, g.Dv), lse.data(), m, outp(dq, g.Nq, g.D),
                             outp(dk, g.Nk, g.D), outp(dv, g.Nk, g.Dv), Device::cpu(), ctx);
    CHECK(max_diff(dq, ref.dq) < 1e-12);
    CHECK(max_diff(dk, ref.dk) < 1e-12);
    CHECK(max_diff(dv, ref.dv) < 1e-12);
    // split the keys in two blocks and merge: equals the whole
    exec::AttnGeom g1 = g, g2 = g;
    g1.Nk = 4;
    g2.Nk = g.Nk - 4;
    std::vector<double> o1(out.size()), l1(lse.size()), o2(out.size()), l2(lse.size());
    exec::AttnMask m2 = m;
    m2.k_pos0 = kp0 + 4;
    exec::attention_forward(DType::f64, g1, in(q, g.Nq, g.D), in(k, g.Nk, g.D), in(v, g.Nk, g.Dv), m,
                            outp(o1, g.Nq, g.Dv), l1.data(), Device::cpu(), ctx);
    exec::attention_forward(DType::f64, g2, in(q, g.Nq, g.D), {k.data() + 4 * g.D, g.H * g.Nk * g.D, g.Nk * g.D, g.D},
                            {v.data() + 4 * g.Dv, g.H * g.Nk * g.Dv, g.Nk * g.Dv, g.Dv}, m2, outp(o2, g.Nq, g.Dv),
                            l2.data(), Device::cpu(), ctx);
    exec::attention_merge(DType::f64, g, outp(o1, g.Nq, g.Dv), l1.data(), in(o2, g.Nq, g.Dv), l2.data(),
                          Device::cpu(), ctx);
    CHECK(max_diff(o1, ref.out) < 1e-12);
    CHECK(max_diff(l1, ref.lse) < 1e-12);
  }
}

TEST_CASE("attention kernel: bad dtype and device mismatch are errors", "[exec][attention]") {
  auto& ctx = shard::current_context(Device::cpu());
  exec::AttnGeom g{1, 1, 1, 1, 1, 1};
  float x = 1, l = 0;
  CHECK_THROWS_AS(exec::attention_forward(DType::bf16, g, {&x}, {&x}, {&x}, {}, {&x}, &l, Device::cpu(), ctx), Error);
  CHECK_THROWS_AS(exec::attention_forward(DType::i32, g, {&x}, {&x}, {&x}, {}, {&x}, &l, Device::cpu(), ctx), Error);
}
