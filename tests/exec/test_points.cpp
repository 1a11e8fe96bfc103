// The points kernel family's CPU table (exec/points.hpp) against loop oracles written here:
// neighbour offsets / norms / distance weights / aggregation (sum, mean, max, weighted) and their
// backward passes (direct formulas, and finite differences for the derivatives), and the point
// <-> grid kernels (interpolation against clamped multilinear interpolation on the whole grid,
// its scatter by the adjoint identity, its point gradient and the splat's point gradient by
// finite differences, the splat against an all-cells loop, the mean and its backward). f32 and
// f64, 2-D and 3-D, empty rows and padding, and bad input.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <shardtensor/core/error.hpp>
#include <shardtensor/exec/points.hpp>
#include <shardtensor/runtime/context.hpp>

#include "support/host_blocks.hpp"

namespace st_exec_test_points {

using namespace shard;
using exec::PointAggregate;
using exec::PointGridGeometry;
using exec::PointListGeometry;
using exec::PointWeightFn;

namespace {

using st_support::block_of;
using st_support::vec_of;
template <class T>
Block zeros(const std::vector<index_t>& s) {
  index_t n = 1;
  for (index_t x : s) n *= x;
  return block_of<T>(s, std::vector<T>(static_cast<std::size_t>(n), T(0)));
}
template <class T>
std::vector<T> random_vec(std::size_t n, unsigned seed, double lo = -1, double hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(u(gen));
  return v;
}
template <class T>
double tol() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-12;
}
template <class T>
void require_close(const std::vector<T>& got, const std::vector<double>& want, double rtol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    REQUIRE(std::abs(static_cast<double>(got[i]) - want[i]) <= rtol * (1 + std::abs(want[i])));
  }
}

ExecContext& cpu() { return current_context(Device::cpu()); }

/// A neighbour list: n rows of k entries, row i with counts[i] valid entries (the rest -1).
struct Lists {
  index_t n, k;
  std::vector<index_t> idx, cnt;
};
Lists make_lists(index_t n, index_t k, unsigned seed) {
  std::mt19937 gen(seed);
  Lists l{n, k, std::vector<index_t>(static_cast<std::size_t>(n * k), -1), std::vector<index_t>(static_cast<std::size_t>(n))};
  for (index_t i = 0; i < n; ++i) {
    const index_t c = static_cast<index_t>(gen() % static_cast<unsigned>(k + 1));  // 0..k, empty rows included
    l.cnt[static_cast<std::size_t>(i)] = c;
    for (index_t j = 0; j < c; ++j) l.idx[static_cast<std::size_t>(i * k + j)] = static_cast<index_t>(gen() % 50);
  }
  return l;
}

}  // namespace

TEMPLATE_TEST_CASE("points: neighbour offsets, norms and their gradients match loop oracles", "[points][exec]", float,
                   double) {
  using T = TestType;
  const index_t n = 7, K = 4, D = 3;
  const Lists l = make_lists(n, K, 3);
  const auto G = random_vec<T>(static_cast<std::size_t>(n * K * D), 1), q = random_vec<T>(static_cast<std::size_t>(n * D), 2);
  const PointListGeometry geo{n, K, D};
  const Block bG = block_of<T>({n, K, D}, G), bq = block_of<T>({n, D}, q), bi = block_of<index_t>({n, K}, l.idx);
  Block off = zeros<T>({n, K, D});
  exec::points_offsets_forward(geo, bG, bq, bi, off, cpu());
  std::vector<double> want(G.size());
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < K; ++j)
      for (index_t d = 0; d < D; ++d) {
        const auto e = static_cast<std::size_t>((i * K + j) * D + d);
        want[e] = l.idx[static_cast<std::size_t>(i * K + j)] >= 0 ? double(G[e]) - double(q[static_cast<std::size_t>(i * D + d)]) : 0.0;
      }
  require_close(vec_of<T>(off), want, tol<T>());

  // backward
  const auto g = random_vec<T>(G.size(), 4);
  Block gG = zeros<T>({n, K, D}), gq = zeros<T>({n, D});
  exec::points_offsets_backward(geo, block_of<T>({n, K, D}, g), bi, &gG, &gq, cpu());
  std::vector<double> wG(G.size()), wq(q.size(), 0.0);
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < K; ++j)
      for (index_t d = 0; d < D; ++d) {
        const auto e = static_cast<std::size_t>((i * K + j) * D + d);
        const bool valid = l.idx[static_cast<std::size_t>(i * K + j)] >= 0;
        wG[e] = valid ? double(g[e]) : 0.0;
        if (valid) wq[static_cast<std::size_t>(i * D + d)] -= double(g[e]);
      }
  require_close(vec_of<T>(gG), wG, tol<T>());
  require_close(vec_of<T>(gq), wq, tol<T>());
  // either output alone
  Block gq2 = zeros<T>({n, D});
  exec::points_offsets_backward(geo, block_of<T>({n, K, D}, g), bi, nullptr, &gq2, cpu());
  REQUIRE(vec_of<T>(gq2) == vec_of<T>(gq));

  // norms: forward = sqrt of the sum of squares; backward = grad * o / |o| (0 at |o| = 0)
  std::vector<T> o = vec_of<T>(off);
  o[0] = o[1] = o[2] = T(0);  // one zero-length offset
  const Block bo = block_of<T>({n, K, D}, o);
  Block dist = zeros<T>({n, K});
  exec::points_norm_forward(geo, bo, dist, cpu());
  std::vector<double> wd(static_cast<std::size_t>(n * K));
  for (index_t e = 0; e < n * K; ++e) {
    double s = 0;
    for (index_t d = 0; d < D; ++d) s += double(o[static_cast<std::size_t>(e * D + d)]) * double(o[static_cast<std::size_t>(e * D + d)]);
    wd[static_cast<std::size_t>(e)] = std::sqrt(s);
  }
  require_close(vec_of<T>(dist), wd, tol<T>());
  const auto gd = random_vec<T>(static_cast<std::size_t>(n * K), 5);
  Block go = zeros<T>({n, K, D});
  exec::points_norm_backward(geo, bo, dist, block_of<T>({n, K}, gd), go, cpu());
  std::vector<double> wgo(o.size());
  const auto dv = vec_of<T>(dist);
  for (index_t e = 0; e < n * K; ++e)
    for (index_t d = 0; d < D; ++d) {
      const auto u = static_cast<std::size_t>(e);
      wgo[static_cast<std::size_t>(e * D + d)] = dv[u] > 0 ? double(gd[u]) * double(o[static_cast<std::size_t>(e * D + d)]) / double(dv[u]) : 0.0;
    }
  require_close(vec_of<T>(go), wgo, tol<T>());
}

TEMPLATE_TEST_CASE("points: distance weights and their derivative match the formulas", "[points][exec]", float,
                   double) {
  using T = TestType;
  const index_t n = 6, K = 5;
  const Lists l = make_lists(n, K, 9);
  const auto dist = random_vec<T>(static_cast<std::size_t>(n * K), 6, 0.0, 2.0);
  const auto g = random_vec<T>(dist.size(), 7);
  const PointListGeometry geo{n, K, 1};
  for (const PointWeightFn f : {PointWeightFn::inverse_distance(0.1), PointWeightFn::gaussian(0.7),
                                PointWeightFn::linear(1.2)}) {
    Block w = zeros<T>({n, K}), gdist = zeros<T>({n, K});
    exec::points_weights_forward(geo, f, block_of<T>({n, K}, dist), block_of<index_t>({n}, l.cnt), w, cpu());
    exec::points_weights_backward(geo, f, block_of<T>({n, K}, dist), block_of<index_t>({n}, l.cnt),
                                  block_of<T>({n, K}, g), gdist, cpu());
    std::vector<double> ww(dist.size()), wg(dist.size());
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < K; ++j) {
        const auto e = static_cast<std::size_t>(i * K + j);
        if (j >= l.cnt[static_cast<std::size_t>(i)]) continue;
        const double d = double(dist[e]), p = f.param;
        auto fn = [&](double x) {
          switch (f.kind) {
            case PointWeightFn::Kind::inverse_distance: return 1.0 / (x + p);
            case PointWeightFn::Kind::gaussian: return std::exp(-x * x / (2 * p * p));
            case PointWeightFn::Kind::linear: return std::max(0.0, 1.0 - x / p);
          }
          return 0.0;
        };
        ww[e] = fn(d);
        const double h = 1e-6;
        const bool kink = f.kind == PointWeightFn::Kind::linear && std::abs(d - p) < 2 * h;
        wg[e] = kink ? double(vec_of<T>(gdist)[e]) : (fn(d + h) - fn(d - h)) / (2 * h) * double(g[e]);
      }
    require_close(vec_of<T>(w), ww, tol<T>());
    require_close(vec_of<T>(gdist), wg, 1e-5);
  }
  // a non-positive parameter is refused
  Block w = zeros<T>({n, K});
  REQUIRE_THROWS_AS(exec::points_weights_forward(geo, PointWeightFn::gaussian(0.0), block_of<T>({n, K}, dist),
                                                 block_of<index_t>({n}, l.cnt), w, cpu()),
                    shard::Error);
}

TEMPLATE_TEST_CASE("points: aggregate sum / mean / max, weighted, and their gradients", "[points][exec]", float,
                   double) {
  using T = TestType;
  const index_t n = 8, K = 4, C = 3;
  const Lists l = make_lists(n, K, 11);
  const auto v = random_vec<T>(static_cast<std::size_t>(n * K * C), 12), w = random_vec<T>(static_cast<std::size_t>(n * K), 13);
  const auto g = random_vec<T>(static_cast<std::size_t>(n * C), 14);
  const PointListGeometry geo{n, K, C};
  const Block bv = block_of<T>({n, K, C}, v), bw = block_of<T>({n, K}, w), bc = block_of<index_t>({n}, l.cnt);
  for (const PointAggregate red : {PointAggregate::sum, PointAggregate::mean, PointAggregate::max})
    for (const bool weighted : {false, true}) {
      INFO("reduce " << int(red) << ", weighted " << weighted);
      Block y = zeros<T>({n, C}), am = zeros<index_t>({n, C});
      exec::points_aggregate_forward(geo, red, bv, weighted ? &bw : nullptr, bc, y, am, cpu());
      Block gv = zeros<T>({n, K, C}), gw = zeros<T>({n, K});
      exec::points_aggregate_backward(geo, red, bv, weighted ? &bw : nullptr, bc, am, block_of<T>({n, C}, g), &gv,
                                      weighted ? &gw : nullptr, cpu());
      std::vector<double> wy(static_cast<std::size_t>(n * C), 0.0), wgv(v.size(), 0.0), wgw(w.size(), 0.0);
      for (index_t i = 0; i < n; ++i) {
        const index_t m = l.cnt[static_cast<std::size_t>(i)];
        for (index_t c = 0; c < C; ++c) {
          auto x = [&](index_t j) {
            const double wj = weighted ? double(w[static_cast<std::size_t>(i * K + j)]) : 1.0;
            return wj * double(v[static_cast<std::size_t>((i * K + j) * C + c)]);
          };
          const double gc = double(g[static_cast<std::size_t>(i * C + c)]);
          if (red == PointAggregate::max) {
            index_t best = -1;
            for (index_t j = 0; j < m; ++j)
              if (best < 0 || static_cast<T>(x(j)) > static_cast<T>(x(best))) best = j;
            wy[static_cast<std::size_t>(i * C + c)] = best < 0 ? 0.0 : double(static_cast<T>(x(best)));
            if (best >= 0) {
              const auto e = static_cast<std::size_t>(i * K + best);
              wgv[e * C + static_cast<std::size_t>(c)] += (weighted ? double(w[e]) : 1.0) * gc;
              wgw[e] += gc * double(v[e * C + static_cast<std::size_t>(c)]);
            }
            continue;
          }
          double s = 0;
          for (index_t j = 0; j < m; ++j) s += x(j);
          const double scale = red == PointAggregate::mean ? (m > 0 ? 1.0 / double(m) : 0.0) : 1.0;
          wy[static_cast<std::size_t>(i * C + c)] = s * scale;
          for (index_t j = 0; j < m; ++j) {
            const auto e = static_cast<std::size_t>(i * K + j);
            wgv[e * C + static_cast<std::size_t>(c)] = (weighted ? double(w[e]) : 1.0) * gc * scale;
            wgw[e] += gc * scale * double(v[e * C + static_cast<std::size_t>(c)]);
          }
        }
      }
      require_close(vec_of<T>(y), wy, tol<T>());
      require_close(vec_of<T>(gv), wgv, tol<T>());
      if (weighted) require_close(vec_of<T>(gw), wgw, tol<T>());
    }
  // a count outside [0, K] is refused by the CPU table
  auto bad = l.cnt;
  bad[0] = K + 1;
  Block y = zeros<T>({n, C}), am = zeros<index_t>({n, C});
  REQUIRE_THROWS_AS(exec::points_aggregate_forward(geo, PointAggregate::sum, bv, nullptr, block_of<index_t>({n}, bad),
                                                   y, am, cpu()),
                    shard::Error);
  // shape and dtype mismatches are refused by the front
  Block y_bad = zeros<T>({n, C + 1});
  REQUIRE_THROWS_AS(exec::points_aggregate_forward(geo, PointAggregate::sum, bv, nullptr, bc, y_bad, am, cpu()),
                    shard::Error);
  Block bi32 = Block::allocate(DType::i32, Device::cpu(), std::vector<index_t>{n});
  REQUIRE_THROWS_AS(exec::points_aggregate_forward(geo, PointAggregate::sum, bv, nullptr, bi32, y, am, cpu()),
                    shard::Error);
}

namespace {

/// The whole grid [1, C, n...] as a rank's block: offset 0, len = global, `ghost` cells per side.
PointGridGeometry whole_grid(int D, index_t C, index_t points, std::array<index_t, 3> n, index_t ghost) {
  PointGridGeometry g;
  g.dims = D;
  g.channels = C;
  g.points = points;
  for (int d = 0; d < D; ++d) {
    const auto u = static_cast<std::size_t>(d);
    g.global[u] = n[u];
    g.offset[u] = 0;
    g.len[u] = n[u];
    g.ghost[u] = ghost;
    g.lo[u] = -1.0 + 0.25 * d;
    g.h[u] = 2.0 / static_cast<double>(n[u]);
  }
  return g;
}

std::vector<index_t> ext_shape(const PointGridGeometry& g, index_t C) {
  std::vector<index_t> s{1, C};
  for (int d = 0; d < g.dims; ++d) s.push_back(g.ext(d));
  return s;
}

index_t ext_offset(const PointGridGeometry& g, index_t Ctot, index_t c, const index_t* i) {
  index_t o = c;
  (void)Ctot;
  for (int d = 0; d < g.dims; ++d) o = o * g.ext(d) + i[d];
  return o;
}

/// Clamped multilinear interpolation of the grid values V [C, n...] at p (the oracle).
double interp_oracle(const PointGridGeometry& g, const std::vector<double>& V, index_t c, const double* p) {
  const int D = g.dims;
  double acc = 0;
  for (int k = 0; k < (1 << D); ++k) {
    double w = 1;
    index_t o = c;
    for (int d = 0; d < D; ++d) {
      const auto u = static_cast<std::size_t>(d);
      const double x = (p[d] - g.lo[u]) / g.h[u] - 0.5;
      const double f = std::floor(x), t = x - f;
      const bool up = (k >> d) & 1;
      index_t i = static_cast<index_t>(f) + (up ? 1 : 0);
      i = std::clamp<index_t>(i, 0, g.global[u] - 1);
      w *= up ? t : 1 - t;
      o = o * g.global[u] + i;
    }
    acc += w * V[static_cast<std::size_t>(o)];
  }
  return acc;
}

template <class T>
std::vector<T> points_in(const PointGridGeometry& g, index_t np, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<T> p(static_cast<std::size_t>(np * g.dims));
  for (index_t i = 0; i < np; ++i)
    for (int d = 0; d < g.dims; ++d) {
      const auto u = static_cast<std::size_t>(d);
      std::uniform_real_distribution<double> un(g.lo[u], g.lo[u] + g.h[u] * static_cast<double>(g.global[u]));
      p[static_cast<std::size_t>(i * g.dims + d)] = static_cast<T>(un(gen));
    }
  return p;
}

}  // namespace

TEMPLATE_TEST_CASE("points: grid interpolation, its scatter and point gradient", "[points][exec]", float, double) {
  using T = TestType;
  for (const int D : {2, 3}) {
    INFO("D = " << D);
    const index_t C = 2, np = 9;
    const auto g = whole_grid(D, C, np, {4, 3, 5}, 1);
    index_t cells = 1;
    for (int d = 0; d < D; ++d) cells *= g.global[static_cast<std::size_t>(d)];
    const auto V = random_vec<double>(static_cast<std::size_t>(C * cells), 21);
    // the extended block: the grid padded by one replicated cell per side
    const auto es = ext_shape(g, C);
    index_t ecells = 1;
    for (int d = 0; d < D; ++d) ecells *= g.ext(d);
    std::vector<T> E(static_cast<std::size_t>(C * ecells));
    for (index_t c = 0; c < C; ++c)
      for (index_t e = 0; e < ecells; ++e) {
        index_t r = e, gi = c;
        std::array<index_t, 3> i{};
        for (int d = D - 1; d >= 0; --d) {
          i[static_cast<std::size_t>(d)] = r % g.ext(d);
          r /= g.ext(d);
        }
        for (int d = 0; d < D; ++d)
          gi = gi * g.global[static_cast<std::size_t>(d)] +
               std::clamp<index_t>(i[static_cast<std::size_t>(d)] - 1, 0, g.global[static_cast<std::size_t>(d)] - 1);
        E[static_cast<std::size_t>(c * ecells + e)] = static_cast<T>(V[static_cast<std::size_t>(gi)]);
      }
    std::vector<double> Vr(V.size());  // V rounded to T, the values the kernel sees
    for (std::size_t i = 0; i < V.size(); ++i) Vr[i] = double(static_cast<T>(V[i]));
    auto P = points_in<T>(g, np, 22);
    P[0] = static_cast<T>(g.lo[0]);  // on the domain's edge (a clamped corner)
    const Block bE = block_of<T>(es, E), bP = block_of<T>({np, D}, P);
    Block out = zeros<T>({np, C});
    exec::points_grid_interp(g, bE, bP, out, cpu());
    std::vector<double> want(static_cast<std::size_t>(np * C));
    for (index_t i = 0; i < np; ++i) {
      double p[3];
      for (int d = 0; d < D; ++d) p[d] = double(P[static_cast<std::size_t>(i * D + d)]);
      for (index_t c = 0; c < C; ++c) want[static_cast<std::size_t>(i * C + c)] = interp_oracle(g, Vr, c, p);
    }
    require_close(vec_of<T>(out), want, 10 * tol<T>());

    // scatter: <interp(E), G> == <E, scatter(G)> for the extended block as the variable
    const auto G = random_vec<T>(static_cast<std::size_t>(np * C), 23);
    Block gext = zeros<double>(es);
    exec::points_grid_interp_scatter(g, bP, block_of<T>({np, C}, G), gext, cpu());
    double lhs = 0, rhs = 0;
    const auto o = vec_of<T>(out);
    const auto ge = vec_of<double>(gext);
    for (std::size_t i = 0; i < o.size(); ++i) lhs += double(o[i]) * double(G[i]);
    for (std::size_t i = 0; i < E.size(); ++i) rhs += double(E[i]) * ge[i];
    REQUIRE(std::abs(lhs - rhs) <= 10 * tol<T>() * (1 + std::abs(lhs)));

    // point gradient against central differences of <interp(p), G> (in double)
    Block gp = zeros<T>({np, D});
    exec::points_grid_interp_grad_points(g, bE, bP, block_of<T>({np, C}, G), gp, cpu());
    const auto gpv = vec_of<T>(gp);
    for (index_t i = 1; i < np; ++i)
      for (int d = 0; d < D; ++d) {
        double p[3];
        for (int e = 0; e < D; ++e) p[e] = double(P[static_cast<std::size_t>(i * D + e)]);
        const double h = 1e-6;
        auto f = [&](double x) {
          double q[3] = {p[0], p[1], p[2]};
          q[d] = x;
          double s = 0;
          for (index_t c = 0; c < C; ++c) s += interp_oracle(g, Vr, c, q) * double(G[static_cast<std::size_t>(i * C + c)]);
          return s;
        };
        const double fd = (f(p[d] + h) - f(p[d] - h)) / (2 * h);
        INFO("point " << i << " dim " << d);
        REQUIRE(std::abs(double(gpv[static_cast<std::size_t>(i * D + d)]) - fd) <= 1e-4 * (1 + std::abs(fd)));
      }
  }
}

TEMPLATE_TEST_CASE("points: grid splat, its backward and the mean", "[points][exec]", float, double) {
  using T = TestType;
  for (const int D : {2, 3})
    for (const bool linear : {false, true}) {
      INFO("D = " << D << ", linear " << linear);
      const index_t C = 2, np = 7, ghost = 2;
      auto g = whole_grid(D, C, np, {5, 4, 3}, ghost);
      g.radius = 0.6;
      g.linear_weight = linear;
      const auto P = points_in<T>(g, np, 31);
      const auto F = random_vec<T>(static_cast<std::size_t>(np * C), 32);
      const Block bP = block_of<T>({np, D}, P), bF = block_of<T>({np, C}, F);
      // the oracle: every cell of the domain within the radius, placed at ext index i + ghost
      auto splat = [&](const std::vector<double>& p, std::vector<double>& ext) {
        std::array<index_t, 3> i{};
        index_t cells = 1;
        for (int d = 0; d < D; ++d) cells *= g.global[static_cast<std::size_t>(d)];
        for (index_t pt = 0; pt < np; ++pt)
          for (index_t e = 0; e < cells; ++e) {
            index_t r = e;
            for (int d = D - 1; d >= 0; --d) {
              i[static_cast<std::size_t>(d)] = r % g.global[static_cast<std::size_t>(d)];
              r /= g.global[static_cast<std::size_t>(d)];
            }
            double d2 = 0;
            for (int d = 0; d < D; ++d) {
              const auto u = static_cast<std::size_t>(d);
              const double x = p[static_cast<std::size_t>(pt * D + d)] - (g.lo[u] + (double(i[u]) + 0.5) * g.h[u]);
              d2 += x * x;
            }
            if (d2 > g.radius * g.radius) continue;
            const double w = linear ? 1 - std::sqrt(d2) / g.radius : 1.0;
            if (!(w > 0)) continue;
            index_t ii[3];
            for (int d = 0; d < D; ++d) ii[d] = i[static_cast<std::size_t>(d)] + ghost;
            for (index_t c = 0; c < C; ++c)
              ext[static_cast<std::size_t>(ext_offset(g, C + 1, c, ii))] += w * double(F[static_cast<std::size_t>(pt * C + c)]);
            ext[static_cast<std::size_t>(ext_offset(g, C + 1, C, ii))] += w;
          }
      };
      std::vector<double> p(P.begin(), P.end());
      const auto es = ext_shape(g, C + 1);
      Block ext = zeros<double>(es);
      exec::points_grid_splat(g, bP, bF, /*with_weight=*/true, ext, cpu());
      std::vector<double> want(static_cast<std::size_t>(ext.numel()), 0.0);
      splat(p, want);
      require_close(vec_of<double>(ext), want, 1e-12);

      // backward: gfeatures by the adjoint identity, gpoints by differences of <splat(p), G>
      const auto G = random_vec<double>(want.size(), 33);
      Block gf = zeros<T>({np, C}), gp = zeros<T>({np, D});
      exec::points_grid_splat_backward(g, block_of<double>(es, G), bP, bF, true, &gf, &gp, cpu());
      // <splat(F), G> over the feature channels (not the weight channel C) == <F, gfeatures>
      index_t ecells = 1;
      for (int d = 0; d < D; ++d) ecells *= g.ext(d);
      double lhs = 0, rhs = 0;
      for (std::size_t i = 0; i < static_cast<std::size_t>(C * ecells); ++i) lhs += want[i] * G[i];
      const auto gfv = vec_of<T>(gf);
      for (std::size_t i = 0; i < F.size(); ++i) rhs += double(F[i]) * double(gfv[i]);
      REQUIRE(std::abs(lhs - rhs) <= 10 * tol<T>() * (1 + std::abs(rhs)));
      const auto gpv = vec_of<T>(gp);
      for (index_t i = 0; i < np; ++i)
        for (int d = 0; d < D; ++d) {
          const double h = 1e-7;
          auto f = [&](double x) {
            std::vector<double> q = p;
            q[static_cast<std::size_t>(i * D + d)] = x;
            std::vector<double> e(want.size(), 0.0);
            splat(q, e);
            double s = 0;
            for (std::size_t k = 0; k < e.size(); ++k) s += e[k] * G[k];
            return s;
          };
          const double x0 = p[static_cast<std::size_t>(i * D + d)];
          const double fd = (f(x0 + h) - f(x0 - h)) / (2 * h);
          INFO("point " << i << " dim " << d);
          if (!linear) REQUIRE(double(gpv[static_cast<std::size_t>(i * D + d)]) == 0.0);
          else REQUIRE(std::abs(double(gpv[static_cast<std::size_t>(i * D + d)]) - fd) <= 1e-3 * (1 + std::abs(fd)));
        }
    }
  // mean: quotients, 0 where the weight sum is 0; backward G / S and -<G, q> / S
  const index_t C = 2, cells = 5;
  std::vector<double> sums{1, 2, 3, 4, 5, /**/ 6, 7, 8, 9, 10, /**/ 2, 0, 4, 0.5, 1};
  Block bs = block_of<double>({C + 1, cells}, sums);
  exec::points_grid_mean(C, cells, bs, cpu());
  const auto q = vec_of<double>(bs);
  for (index_t c = 0; c < C; ++c)
    for (index_t k = 0; k < cells; ++k) {
      const double S = sums[static_cast<std::size_t>(C * cells + k)];
      REQUIRE(q[static_cast<std::size_t>(c * cells + k)] == (S > 0 ? sums[static_cast<std::size_t>(c * cells + k)] / S : 0.0));
    }
  std::vector<double> gin{0.5, -1, 2, 3, 1, /**/ 1, 1, -2, 0.25, 4, /**/ 0, 0, 0, 0, 0};
  Block cg = block_of<double>({C + 1, cells}, gin);
  exec::points_grid_mean_backward(C, cells, bs, true, cg, cpu());
  const auto cgv = vec_of<double>(cg);
  for (index_t k = 0; k < cells; ++k) {
    const double S = sums[static_cast<std::size_t>(C * cells + k)];
    double gs = 0;
    for (index_t c = 0; c < C; ++c) {
      const auto e = static_cast<std::size_t>(c * cells + k);
      gs -= gin[e] * q[e];
      REQUIRE(cgv[e] == (S > 0 ? gin[e] / S : 0.0));
    }
    REQUIRE(cgv[static_cast<std::size_t>(C * cells + k)] == (S > 0 ? gs / S : 0.0));
  }
}

// ------------------------------------------------------------------------------ box ownership

namespace {

/// The slab of x among cuts c by a linear scan: the k with c[k] <= x < c[k + 1]; x == c.back()
/// goes to the last non-empty slab; -1 outside or NaN.
int slab_oracle(const std::vector<double>& c, double x) {
  if (!(x >= c.front() && x <= c.back())) return -1;
  const int slabs = static_cast<int>(c.size()) - 1;
  if (x == c.back()) {
    for (int k = slabs - 1; k >= 0; --k)
      if (c[static_cast<std::size_t>(k)] < c[static_cast<std::size_t>(k) + 1]) return k;
    return 0;
  }
  for (int k = 0; k < slabs; ++k)
    if (c[static_cast<std::size_t>(k)] <= x && x < c[static_cast<std::size_t>(k) + 1]) return k;
  return -1;
}

}  // namespace

TEMPLATE_TEST_CASE("points owner: owners, counts and bucketed rows against a scan", "[points]", float, double) {
  using T = TestType;
  ExecContext& ctx = current_context(Device::cpu());
  // dims: x cut into 3 slabs (the middle one empty), y unsplit, z into 2; ranks 3 x 1 x 2
  const std::vector<std::vector<double>> cuts{{0.0, 0.5, 0.5, 1.0}, {-1.0, 2.0}, {-1.0, 0.25, 1.0}};
  const std::vector<index_t> strides{2, 0, 1};
  exec::PointBoxPartition part;
  part.ranks = 6;
  part.offsets = {0};
  for (const auto& c : cuts) {
    part.cuts.insert(part.cuts.end(), c.begin(), c.end());
    part.offsets.push_back(static_cast<index_t>(part.cuts.size()));
  }
  part.strides = strides;
  const index_t n = 300, D = 3;
  auto v = random_vec<T>(static_cast<std::size_t>(n * D), 5, -1.2, 1.2);
  // on the cuts, on the upper faces, outside, NaN
  const T special[][3] = {{T(0.5), T(0), T(0.25)}, {T(1), T(2), T(1)}, {T(0), T(-1), T(-1)},
                          {T(1.5), T(0), T(0)},   {T(0.2), T(0), std::numeric_limits<T>::quiet_NaN()}};
  for (int s = 0; s < 5; ++s)
    for (int d = 0; d < 3; ++d) v[static_cast<std::size_t>(s * 3 + d)] = special[s][d];
  const Block pts = block_of<T>({n, D}, v);
  Block owner = zeros<std::int64_t>({n});
  Block counts = zeros<std::int64_t>({part.ranks + 1});
  exec::points_owner(part, pts, &owner, counts, ctx);
  std::vector<std::int64_t> want(static_cast<std::size_t>(n)), want_counts(static_cast<std::size_t>(part.ranks + 1), 0);
  for (index_t i = 0; i < n; ++i) {
    std::int64_t r = 0;
    for (int d = 0; d < 3 && r >= 0; ++d) {
      const int k = slab_oracle(cuts[static_cast<std::size_t>(d)], static_cast<double>(v[static_cast<std::size_t>(i * D + d)]));
      r = k < 0 ? -1 : r + k * strides[static_cast<std::size_t>(d)];
    }
    want[static_cast<std::size_t>(i)] = r;
    ++want_counts[static_cast<std::size_t>(r < 0 ? part.ranks : r)];
  }
  CHECK(want[0] == 2 * 2 + 1);  // x = 0.5 -> slab 2 (slab 1 is empty), z = 0.25 -> slab 1
  CHECK(want[1] == 2 * 2 + 1);  // the upper faces
  CHECK(want[3] == -1);
  CHECK(want[4] == -1);
  CHECK(vec_of<std::int64_t>(owner) == want);
  CHECK(vec_of<std::int64_t>(counts) == want_counts);

  std::vector<std::int64_t> off{0};
  for (int r = 0; r < part.ranks; ++r) off.push_back(off.back() + want_counts[static_cast<std::size_t>(r)]);
  Block rows = zeros<std::int64_t>({off.back()});
  exec::points_bucket_rows(part.ranks, owner, block_of<std::int64_t>({part.ranks + 1}, off), rows, ctx);
  std::vector<std::int64_t> want_rows;
  for (int r = 0; r < part.ranks; ++r)
    for (index_t i = 0; i < n; ++i)
      if (want[static_cast<std::size_t>(i)] == r) want_rows.push_back(i);
  CHECK(vec_of<std::int64_t>(rows) == want_rows);

  // counts only (no owner block), and a malformed partition
  Block counts2 = zeros<std::int64_t>({part.ranks + 1});
  exec::points_owner(part, pts, nullptr, counts2, ctx);
  CHECK(vec_of<std::int64_t>(counts2) == want_counts);
  exec::PointBoxPartition bad = part;
  bad.offsets.back() += 1;
  CHECK_THROWS_AS(exec::points_owner(bad, pts, nullptr, counts2, ctx), Error);
  CHECK_THROWS_AS(exec::points_owner(part, block_of<T>({n / 3, 1}, std::vector<T>(static_cast<std::size_t>(n / 3))),
                                     nullptr, counts2, ctx),
                  Error);
}

}  // namespace st_exec_test_points
