// The attention kernel family on the CPU (the blocked kernels of src/exec/attention_cpu.cpp)
// against an explicit softmax(scale q k^T + bias) v and against the row-at-a-time reference
// (tests/support/attention_reference.hpp): causal offsets, fully masked rows and tiles, additive
// bias with -inf entries, token-major strides, sequences longer than a tile, Nq != Nk, D != Dv,
// absent gradients, and the lse merge.
#include <catch2/catch_test_macros.hpp>
#include <shardtensor/shardtensor.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <omp.h>

#include "shardtensor/exec/attention.hpp"
#include "support/attention_reference.hpp"

namespace st_exec_test_attention_kernel {

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
    // head-major [B, H, n, d] views of the vectors (rows from row0)
    auto in = [&](const std::vector<double>& x, index_t n, index_t d, index_t row0 = 0, index_t rows = -1) {
      return exec::attention_view(DType::f64, Device::cpu(), x.data() + row0 * d, g.B, g.H, rows < 0 ? n : rows, d,
                                  g.H * n * d, n * d, d);
    };
    auto lse_of = [&](std::vector<double>& x) {
      const index_t n = static_cast<index_t>(x.size());
      return Block::view(DType::f64, Device::cpu(), x.data(), &n, 1);
    };
    exec::attention_forward(g, m, in(q, g.Nq, g.D), in(k, g.Nk, g.D), in(v, g.Nk, g.Dv), nullptr,
                            in(out, g.Nq, g.Dv), lse_of(lse), ctx);
    CHECK(max_diff(out, ref.out) < 1e-12);
    CHECK(max_diff(lse, ref.lse) < 1e-12);
    if (causal) CHECK(std::isinf(lse[0]));
    const Block bdq = in(dq, g.Nq, g.D), bdk = in(dk, g.Nk, g.D), bdv = in(dv, g.Nk, g.Dv);
    exec::attention_backward(g, m, in(q, g.Nq, g.D), in(k, g.Nk, g.D), in(v, g.Nk, g.Dv), nullptr,
                             in(out, g.Nq, g.Dv), in(dout, g.Nq, g.Dv), lse_of(lse), &bdq, &bdk, &bdv, ctx);
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
    exec::attention_forward(g1, m, in(q, g.Nq, g.D), in(k, g.Nk, g.D, 0, 4), in(v, g.Nk, g.Dv, 0, 4), nullptr,
                            in(o1, g.Nq, g.Dv), lse_of(l1), ctx);
    exec::attention_forward(g2, m2, in(q, g.Nq, g.D), in(k, g.Nk, g.D, 4, g.Nk - 4), in(v, g.Nk, g.Dv, 4, g.Nk - 4),
                            nullptr, in(o2, g.Nq, g.Dv), lse_of(l2), ctx);
    exec::attention_merge(g, in(o1, g.Nq, g.Dv), lse_of(l1), in(o2, g.Nq, g.Dv), lse_of(l2), ctx);
    CHECK(max_diff(o1, ref.out) < 1e-12);
    CHECK(max_diff(l1, ref.lse) < 1e-12);
  }
}

TEST_CASE("attention kernel: bad dtype and device mismatch are errors", "[exec][attention]") {
  auto& ctx = shard::current_context(Device::cpu());
  exec::AttnGeom g{1, 1, 1, 1, 1, 1};
  float x = 1, l = 0;
  const index_t one[4] = {1, 1, 1, 1};
  auto b = [&](DType dt, Device dev, void* p, int rank) { return Block::view(dt, dev, p, one, rank); };
  const Block xf = b(DType::f32, Device::cpu(), &x, 4), lf = b(DType::f32, Device::cpu(), &l, 3);
  // Integer operands are refused; bf16 and f16 run on the CPU through f32 working copies (mixed
  // precision, exec/precision.hpp), with f32 lse.
  const Block xi = b(DType::i32, Device::cpu(), &x, 4);
  CHECK_THROWS_AS(exec::attention_forward(g, {}, xi, xi, xi, nullptr, xi, lf, ctx), Error);
  for (const DType dt : {DType::bf16, DType::f16}) {
    std::uint16_t h[4] = {0x3f80, 0x3f80, 0x3f80, 0};  // bf16 1.0 (an f16 reads 1.875)
    const Block hb = b(dt, Device::cpu(), h, 4);
    const Block out = b(dt, Device::cpu(), h + 3, 4);
    CHECK_NOTHROW(exec::attention_forward(g, {}, hb, hb, hb, nullptr, out, lf, ctx));
    CHECK(h[3] == h[0]);  // one key: out = v
    CHECK_THROWS_AS(exec::attention_forward(g, {}, hb, xf, hb, nullptr, out, lf, ctx), Error);  // mixed dtypes
  }
  // an operand on another device than the context, a mismatched shape or dtype, a wrong lse
  const Block xg = b(DType::f32, Device::cuda(0), &x, 4);
  CHECK_THROWS_AS(exec::attention_forward(g, {}, xf, xg, xf, nullptr, xf, lf, ctx), Error);
  const index_t two[4] = {1, 1, 2, 1};
  const Block x2 = Block::view(DType::f32, Device::cpu(), &x, two, 4);
  CHECK_THROWS_AS(exec::attention_forward(g, {}, xf, xf, x2, nullptr, xf, lf, ctx), Error);
  const Block xd = b(DType::f64, Device::cpu(), &x, 4);
  CHECK_THROWS_AS(exec::attention_forward(g, {}, xf, xd, xf, nullptr, xf, lf, ctx), Error);
  CHECK_THROWS_AS(exec::attention_forward(g, {}, xf, xf, xf, nullptr, xf, xd, ctx), Error);
  CHECK_NOTHROW(exec::attention_forward(g, {}, xf, xf, xf, nullptr, xf, lf, ctx));
}

namespace {

enum class BiasMode { none, full, broadcast };

struct Case {
  exec::AttnGeom g;
  bool token_major = false;
  bool causal = false;
  index_t qp0 = 0, kp0 = 0;
  BiasMode bias = BiasMode::none;
  bool want_dq = true, want_dk = true, want_dv = true;
};

/// Strides of a [B, H, N, D] operand stored head-major or token-major ([B, N, H, D]).
struct Layout {
  index_t sb, sh, sn;
};
Layout layout(const exec::AttnGeom& g, index_t n, index_t d, bool token_major) {
  return token_major ? Layout{n * g.H * d, d, g.H * d} : Layout{g.H * n * d, n * d, d};
}

/// Copies head-major x [B,H,N,D] into a buffer of T with layout l.
template <class T>
std::vector<T> to_layout(const std::vector<double>& x, const exec::AttnGeom& g, index_t n, index_t d, Layout l) {
  std::vector<T> y(x.size());
  for (index_t b = 0; b < g.B; ++b)
    for (index_t h = 0; h < g.H; ++h)
      for (index_t i = 0; i < n; ++i)
        for (index_t e = 0; e < d; ++e)
          y[static_cast<std::size_t>(b * l.sb + h * l.sh + i * l.sn + e)] =
              static_cast<T>(x[static_cast<std::size_t>(((b * g.H + h) * n + i) * d + e)]);
  return y;
}
template <class T>
std::vector<double> from_layout(const std::vector<T>& y, const exec::AttnGeom& g, index_t n, index_t d, Layout l) {
  std::vector<double> x(y.size());
  for (index_t b = 0; b < g.B; ++b)
    for (index_t h = 0; h < g.H; ++h)
      for (index_t i = 0; i < n; ++i)
        for (index_t e = 0; e < d; ++e)
          x[static_cast<std::size_t>(((b * g.H + h) * n + i) * d + e)] =
              static_cast<double>(y[static_cast<std::size_t>(b * l.sb + h * l.sh + i * l.sn + e)]);
  return x;
}

/// max |a - b| / max |b| (entries that are both -inf count as equal).
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0, s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i]) || std::isinf(a[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    m = std::max(m, std::abs(a[i] - b[i]));
    s = std::max(s, std::abs(b[i]));
  }
  return s > 0 ? m / s : m;
}

/// Explicit softmax with a full P matrix per row and a bias callback, head-major double.
template <class BiasF>
Naive naive_bias(const exec::AttnGeom& g, const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v, const std::vector<double>& dout, double scale, bool causal,
                 index_t qp0, index_t kp0, BiasF bias) {
  Naive r;
  const double ninf = -std::numeric_limits<double>::infinity();
  r.out.assign(static_cast<std::size_t>(g.B * g.H * g.Nq * g.Dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(g.B * g.H * g.Nq), ninf);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  for (index_t bh = 0; bh < g.B * g.H; ++bh)
    for (index_t i = 0; i < g.Nq; ++i) {
      std::vector<double> s(static_cast<std::size_t>(g.Nk));
      double mx = ninf;
      for (index_t j = 0; j < g.Nk; ++j) {
        double d = 0;
        for (index_t x = 0; x < g.D; ++x) d += q[(bh * g.Nq + i) * g.D + x] * k[(bh * g.Nk + j) * g.D + x];
        d = d * scale + bias(bh / g.H, bh % g.H, i, j);
        if (causal && kp0 + j > qp0 + i) d = ninf;
        s[j] = d;
        mx = std::max(mx, d);
      }
      if (mx == ninf) continue;
      double l = 0;
      for (auto& x : s) l += std::exp(x - mx);
      const double lse = mx + std::log(l);
      r.lse[bh * g.Nq + i] = lse;
      std::vector<double> p(s.size());
      for (std::size_t j = 0; j < s.size(); ++j) p[j] = std::exp(s[j] - lse);
      for (index_t j = 0; j < g.Nk; ++j)
        for (index_t x = 0; x < g.Dv; ++x) r.out[(bh * g.Nq + i) * g.Dv + x] += p[j] * v[(bh * g.Nk + j) * g.Dv + x];
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

/// Runs the CPU kernels in T on case c and checks them against the f64 reference (and, for
/// small cases, the explicit softmax) to `tol` relative.
template <class T>
void check_case(const Case& c, double tol, unsigned seed) {
  const auto& g = c.g;
  CAPTURE(g.B, g.H, g.Nq, g.Nk, g.D, g.Dv, c.token_major, c.causal, c.qp0, c.kp0, static_cast<int>(c.bias), c.want_dq,
          c.want_dk, c.want_dv);
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  // inputs rounded to T, so that the f64 reference sees exactly the kernel's inputs
  auto fill = [&](index_t n) {
    std::vector<double> x(static_cast<std::size_t>(n));
    for (auto& e : x) e = static_cast<double>(static_cast<T>(nd(rng)));
    return x;
  };
  auto q = fill(g.B * g.H * g.Nq * g.D), k = fill(g.B * g.H * g.Nk * g.D), v = fill(g.B * g.H * g.Nk * g.Dv);
  auto dout = fill(g.B * g.H * g.Nq * g.Dv);
  auto dq0 = fill(g.B * g.H * g.Nq * g.D), dk0 = fill(g.B * g.H * g.Nk * g.D), dv0 = fill(g.B * g.H * g.Nk * g.Dv);
  const double ninf = -std::numeric_limits<double>::infinity();
  // bias: full [B,H,Nq,Nk] or broadcast [Nq,Nk]; some -inf entries and (full) one fully masked row
  const index_t bn = c.bias == BiasMode::full ? g.B * g.H * g.Nq * g.Nk : g.Nq * g.Nk;
  std::vector<double> bias(static_cast<std::size_t>(c.bias == BiasMode::none ? 0 : bn));
  for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = i % 7 == 3 ? ninf : static_cast<double>(static_cast<T>(nd(rng)));
  if (c.bias == BiasMode::full && g.Nq > 1)
    for (index_t j = 0; j < g.Nk; ++j) bias[static_cast<std::size_t>(1 * g.Nk + j)] = ninf;  // (b0,h0) row 1
  auto bias_at = [&](index_t b, index_t h, index_t i, index_t j) {
    if (c.bias == BiasMode::none) return 0.0;
    if (c.bias == BiasMode::full) return bias[static_cast<std::size_t>(((b * g.H + h) * g.Nq + i) * g.Nk + j)];
    return bias[static_cast<std::size_t>(i * g.Nk + j)];
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(g.D)) * 1.3;

  // f64 reference (row at a time, head-major)
  exec::AttnMask md;
  md.scale = scale;
  md.causal = c.causal;
  md.q_pos0 = c.qp0;
  md.k_pos0 = c.kp0;
  if (c.bias != BiasMode::none) {
    md.bias = bias.data();
    if (c.bias == BiasMode::full) {
      md.bias_sb = g.H * g.Nq * g.Nk;
      md.bias_sh = g.Nq * g.Nk;
    }
    md.bias_sq = g.Nk;
    md.bias_sk = 1;
  }
  const Layout hq = layout(g, g.Nq, g.D, false), hk = layout(g, g.Nk, g.D, false), hv = layout(g, g.Nk, g.Dv, false),
               ho = layout(g, g.Nq, g.Dv, false);
  std::vector<double> ref_out(static_cast<std::size_t>(g.B * g.H * g.Nq * g.Dv)),
      ref_lse(static_cast<std::size_t>(g.B * g.H * g.Nq)), ref_dq(q.size(), 0.0), ref_dk(k.size(), 0.0),
      ref_dv(v.size(), 0.0);
  namespace R = test::attention_reference;
  auto in = [](const std::vector<double>& x, Layout l) { return exec::AttnIn{x.data(), l.sb, l.sh, l.sn}; };
  auto outp = [](std::vector<double>& x, Layout l) { return exec::AttnOut{x.data(), l.sb, l.sh, l.sn}; };
  R::forward<double>(g, in(q, hq), in(k, hk), in(v, hv), md, outp(ref_out, ho), ref_lse.data());
  R::backward<double>(g, in(q, hq), in(k, hk), in(v, hv), in(ref_out, ho), in(dout, ho), ref_lse.data(), md,
                      outp(ref_dq, hq), outp(ref_dk, hk), outp(ref_dv, hv));
  // the reference itself against the explicit softmax
  if (g.Nq * g.Nk * g.B * g.H <= 200000) {
    const auto nv = naive_bias(g, q, k, v, dout, scale, c.causal, c.qp0, c.kp0, bias_at);
    CHECK(rel_diff(ref_out, nv.out) < 1e-12);
    CHECK(rel_diff(ref_lse, nv.lse) < 1e-12);
    CHECK(rel_diff(ref_dq, nv.dq) < 1e-12);
    CHECK(rel_diff(ref_dk, nv.dk) < 1e-12);
    CHECK(rel_diff(ref_dv, nv.dv) < 1e-12);
  }

  // the kernel in T with the case's layout
  const Layout lq = layout(g, g.Nq, g.D, c.token_major), lk = layout(g, g.Nk, g.D, c.token_major),
               lv = layout(g, g.Nk, g.Dv, c.token_major), lo = layout(g, g.Nq, g.Dv, c.token_major);
  auto qt = to_layout<T>(q, g, g.Nq, g.D, lq), kt = to_layout<T>(k, g, g.Nk, g.D, lk),
       vt = to_layout<T>(v, g, g.Nk, g.Dv, lv), dot = to_layout<T>(dout, g, g.Nq, g.Dv, lo);
  auto dqt = to_layout<T>(dq0, g, g.Nq, g.D, lq), dkt = to_layout<T>(dk0, g, g.Nk, g.D, lk),
       dvt = to_layout<T>(dv0, g, g.Nk, g.Dv, lv);
  std::vector<T> outt(static_cast<std::size_t>(g.B * g.H * g.Nq * g.Dv), T(-7)), lset(ref_lse.size(), T(-7));
  std::vector<T> biast(bias.size());
  for (std::size_t i = 0; i < bias.size(); ++i) biast[i] = static_cast<T>(bias[i]);
  exec::AttnMask mt = md;
  mt.bias = nullptr;  // the front takes the bias as a Block
  Block biasb;
  if (c.bias != BiasMode::none) {
    const index_t bshape[4] = {g.B, g.H, g.Nq, g.Nk}, bstrides[4] = {md.bias_sb, md.bias_sh, md.bias_sq, md.bias_sk};
    biasb = Block::view(dtype_of<T>, Device::cpu(), biast.data(), bshape, 4, bstrides);
  }
  auto tin = [&](const std::vector<T>& x, Layout l, index_t n, index_t d) {
    return exec::attention_view(dtype_of<T>, Device::cpu(), x.data(), g.B, g.H, n, d, l.sb, l.sh, l.sn);
  };
  const index_t nlse = static_cast<index_t>(lset.size());
  const Block lseb = Block::view(dtype_of<T>, Device::cpu(), lset.data(), &nlse, 1);
  const Block* bp = c.bias != BiasMode::none ? &biasb : nullptr;
  auto& ctx = shard::current_context(Device::cpu());
  exec::attention_forward(g, mt, tin(qt, lq, g.Nq, g.D), tin(kt, lk, g.Nk, g.D), tin(vt, lv, g.Nk, g.Dv), bp,
                          tin(outt, lo, g.Nq, g.Dv), lseb, ctx);
  const auto out = from_layout(outt, g, g.Nq, g.Dv, lo);
  std::vector<double> lse(lset.begin(), lset.end());
  CHECK(rel_diff(out, ref_out) <= tol);
  CHECK(rel_diff(lse, ref_lse) <= tol);
  // backward from the reference's out/lse rounded to T (the contract: the FINAL out and lse)
  const Block bdq = tin(dqt, lq, g.Nq, g.D), bdk = tin(dkt, lk, g.Nk, g.D), bdv = tin(dvt, lv, g.Nk, g.Dv);
  exec::attention_backward(g, mt, tin(qt, lq, g.Nq, g.D), tin(kt, lk, g.Nk, g.D), tin(vt, lv, g.Nk, g.Dv), bp,
                           tin(outt, lo, g.Nq, g.Dv), tin(dot, lo, g.Nq, g.Dv), lseb, c.want_dq ? &bdq : nullptr,
                           c.want_dk ? &bdk : nullptr, c.want_dv ? &bdv : nullptr, ctx);
  auto grad_check = [&](const std::vector<T>& got_t, const std::vector<double>& init, const std::vector<double>& ref,
                        index_t n, index_t d, Layout l, bool want) {
    const auto got = from_layout(got_t, g, n, d, l);
    if (!want) {
      CHECK(got == init);  // untouched
      return;
    }
    std::vector<double> added(got.size());
    for (std::size_t i = 0; i < got.size(); ++i) added[i] = got[i] - init[i];
    CHECK(rel_diff(added, ref) <= tol);
  };
  grad_check(dqt, dq0, ref_dq, g.Nq, g.D, lq, c.want_dq);
  grad_check(dkt, dk0, ref_dk, g.Nk, g.D, lk, c.want_dk);
  grad_check(dvt, dv0, ref_dv, g.Nk, g.Dv, lv, c.want_dv);
}

std::vector<Case> cases() {
  std::vector<Case> r;
  // longer than a tile (64 x 256) in both dims, non-multiples, Nq != Nk, D != Dv
  for (const bool tm : {false, true}) {
    r.push_back({{1, 2, 150, 600, 24, 16}, tm, false, 0, 0, BiasMode::none});
    r.push_back({{2, 1, 300, 170, 16, 24}, tm, false, 0, 0, BiasMode::full});
    // causal: square, queries = last rows of the keys, keys starting after the queries (fully
    // masked rows and whole q tiles), partially masked tiles
    r.push_back({{1, 3, 200, 200, 16, 16}, tm, true, 0, 0, BiasMode::none});
    r.push_back({{1, 2, 150, 600, 16, 8}, tm, true, 450, 0, BiasMode::broadcast});
    r.push_back({{1, 1, 200, 300, 8, 8}, tm, true, 0, 100, BiasMode::none});
    r.push_back({{2, 1, 130, 520, 8, 12}, tm, true, 300, 17, BiasMode::full});
  }
  // absent gradients (and the split-head dQ path: B * H = 1 < threads)
  r.push_back({{1, 1, 100, 700, 16, 16}, true, true, 600, 0, BiasMode::none, true, false, true});
  r.push_back({{1, 1, 100, 700, 16, 16}, false, false, 0, 0, BiasMode::full, false, true, false});
  r.push_back({{1, 3, 100, 700, 16, 16}, true, false, 0, 0, BiasMode::none, false, false, true});
  // tiny and degenerate: single query, single key, no keys visible at all
  r.push_back({{1, 2, 1, 1, 4, 3}, true, false, 0, 0, BiasMode::none});
  r.push_back({{1, 2, 5, 9, 4, 3}, false, true, 0, 50, BiasMode::none});
  return r;
}

}  // namespace

TEST_CASE("blocked CPU attention kernel, f64, equals the reference and the explicit softmax", "[exec][attention]") {
  unsigned seed = 11;
  for (const auto& c : cases()) check_case<double>(c, 1e-12, seed++);
}

TEST_CASE("blocked CPU attention kernel, f32, equals the f64 reference to 1e-5", "[exec][attention]") {
  unsigned seed = 101;
  for (const auto& c : cases()) check_case<float>(c, 1e-5, seed++);
}

TEST_CASE("blocked CPU attention kernel on 1 and 2 threads equals the reference", "[exec][attention]") {
  // 1 thread (no split heads) and 2 threads (B * H = 3: key tiles split, partial dQ buffers)
  const int saved = omp_get_max_threads();
  for (const int nt : {1, 2}) {
    omp_set_num_threads(nt);
    check_case<double>({{1, 3, 130, 300, 16, 16}, true, true, 0, 0, BiasMode::none}, 1e-12, 7);
  }
  omp_set_num_threads(saved);
}

}  // namespace st_exec_test_attention_kernel
