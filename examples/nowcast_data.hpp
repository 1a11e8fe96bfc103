#pragma once
/// \file nowcast_data.hpp
/// Synthetic radar / satellite frames for the nowcasting example (nowcast_surrogate.cpp),
/// generated domain-parallel from the global index: every value depends only on (seed, frame,
/// channel, global y, global x), so each rank computes its own block and the fields are the same
/// at every rank count and mesh.
///
/// The hidden state is a population of convective cells (Gaussian blobs). In each frame s a
/// number of candidate cells (proportional to the area, `density` per cell^2) initiates with a
/// probability that follows a diurnal cycle (low at s = 0 mod `day`, highest at day/2). A cell has
/// a birth frame, a position (also in a margin around the grid, so cells drift in), a velocity
/// (the mean steering wind plus a per-cell perturbation), a lifetime, a peak amplitude and a
/// radius; its precipitation envelope grows and decays as sin(pi * age / life).
///
/// Channels (one [time, channel, y, x] frame set):
///   radar      (1 channel): reflectivity in dBZ, 10 log10(1 + 3000 q^1.6) with q the sum of the
///              cells' precipitation (0 dBZ clear air, ~35 dBZ at q = 1, ~40 at q = 2) plus
///              +-0.5 dBZ noise, clamped at 0.
///   satellite  (3 channels), seen `parallax` cells displaced (cloud tops are high) and with a
///              cloud stage that starts `lead` frames before the precipitation (satellites see
///              growing cumulus before radar sees rain):
///     0 ir_bt  10.3 um brightness temperature [K]: 290 - 85 tanh(1.2 c), c the cloud field
///              (each cell blurred to 1.6x its radius: the anvil), +-0.5 K noise;
///     1 wv_bt  6.9 um water-vapour brightness temperature [K]: 245 - 30 tanh(0.8 w), w broader
///              still (2.5x) and parallax-shifted 1.5x further (higher emission level), +-0.5 K;
///     2 vis    0.64 um reflectance: sun(t) * (0.08 + 0.8 (1 - exp(-2 c))), sun(t) the diurnal
///              illumination (0 at night), +-0.01 noise.
/// The noise is a counter-based hash of (seed, frame, channel, global index). None of the
/// satellite channels is the radar field: they are blurred, shifted, saturating, lead it in
/// time and are blind at night (vis), so the next radar frame is not a function of one input.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <shardtensor/shardtensor.hpp>

namespace nowcast {

using shard::index_t;

inline constexpr int kSatChannels = 3;
inline constexpr const char* kSatNames[kSatChannels] = {"ir_bt", "wv_bt", "vis"};

/// Parameters of the generator (fixed defaults; the grid and frame count come from the flags).
struct Config {
  index_t ny = 64, nx = 64;   ///< grid (cells of ~1 km)
  int day = 48;               ///< frames per diurnal cycle (e.g. 30 min frames)
  double wind_y = 0.35;       ///< mean steering wind, cells per frame
  double wind_x = 0.6;
  double wind_spread = 0.25;  ///< per-cell velocity perturbation (+- this)
  double density = 1.0 / 1500;  ///< candidate initiations per cell^2 per frame
  int min_life = 6, max_life = 16;  ///< lifetimes, frames
  int lead = 2;               ///< frames the cloud stage precedes the rain
  double parallax_y = -1.5, parallax_x = 2.5;  ///< satellite displacement, cells (ir, vis; wv x1.5)
  double noise_dbz = 0.5, noise_bt = 0.5, noise_vis = 0.01;
  /// Cells are born this far outside the grid too (they drift in).
  index_t margin() const {
    const double speed = std::hypot(wind_y, wind_x) + wind_spread;
    return static_cast<index_t>(std::ceil(speed * (max_life + lead) + 12));
  }
};

struct Cell {
  double y0, x0, vy, vx;  ///< position at birth, velocity (cells per frame)
  double birth, life;     ///< birth frame, lifetime (frames)
  double amp, sigma;      ///< peak precipitation, radius (cells)
};

/// Initiation probability of frame s: a diurnal cycle between 0.2 and 1.
inline double initiation_probability(const Config& c, long s) {
  const double ph = 6.283185307179586 * static_cast<double>(s) / c.day;
  return 0.2 + 0.8 * 0.5 * (1 - std::cos(ph));
}
/// Solar illumination of frame t (0 at night, 1 at noon): the vis channel's scale.
inline double sun(const Config& c, double t) {
  const double ph = 6.283185307179586 * t / c.day;
  return std::max(0.0, -std::cos(ph));  // noon at t = day/2 (phase pi), as the initiation peak
}

/// The cells born in frame s (the same list on every rank).
inline void cells_born(const Config& c, std::uint64_t seed, long s, std::vector<Cell>& out) {
  const index_t m = c.margin();
  const double ey = static_cast<double>(c.ny + 2 * m), ex = static_cast<double>(c.nx + 2 * m);
  const long n = std::max<long>(1, std::lround(c.density * ey * ex));
  const double p = initiation_probability(c, s);
  for (long k = 0; k < n; ++k) {
    // A counter per (frame, candidate, draw); frames may be negative (cells alive at frame 0).
    const std::uint64_t base = (static_cast<std::uint64_t>(s + (1L << 40)) * 1000003ull + static_cast<std::uint64_t>(k)) * 8;
    auto r = [&](int i) { return shard::random_value(seed ^ 0x6e6f7763617374ull, base + i, shard::RandomInit::uniform(0, 1)); };
    if (r(0) >= p) continue;
    Cell cell;
    cell.y0 = -static_cast<double>(m) + r(1) * ey;
    cell.x0 = -static_cast<double>(m) + r(2) * ex;
    cell.vy = c.wind_y + (2 * r(3) - 1) * c.wind_spread;
    cell.vx = c.wind_x + (2 * r(4) - 1) * c.wind_spread;
    cell.birth = static_cast<double>(s);
    cell.life = c.min_life + r(5) * (c.max_life - c.min_life);
    cell.amp = 0.3 + 1.9 * std::pow(r(6), 1.5);  // mostly weak, a few strong
    cell.sigma = 1.5 + 2.5 * r(7);
    out.push_back(cell);
  }
}

/// Adds w * exp(-r^2 / (2 s^2)) around (cy, cx) to the local block `acc` (rows [y0, y0+h),
/// columns [x0, x0+w)), within 4 s of the centre.
inline void add_blob(std::vector<double>& acc, index_t y0, index_t h, index_t x0, index_t w, double cy, double cx,
                     double s, double wgt) {
  if (wgt == 0) return;
  const double rad = 4 * s;
  const index_t ilo = std::max<index_t>(y0, static_cast<index_t>(std::floor(cy - rad)));
  const index_t ihi = std::min<index_t>(y0 + h, static_cast<index_t>(std::ceil(cy + rad)) + 1);
  const index_t jlo = std::max<index_t>(x0, static_cast<index_t>(std::floor(cx - rad)));
  const index_t jhi = std::min<index_t>(x0 + w, static_cast<index_t>(std::ceil(cx + rad)) + 1);
  const double inv = 1.0 / (2 * s * s);
  for (index_t i = ilo; i < ihi; ++i) {
    const double dy = static_cast<double>(i) - cy;
    for (index_t j = jlo; j < jhi; ++j) {
      const double dx = static_cast<double>(j) - cx;
      acc[static_cast<std::size_t>((i - y0) * w + (j - x0))] += wgt * std::exp(-(dy * dy + dx * dx) * inv);
    }
  }
}

/// Noise in [-1, 1) for (frame, channel, global y, global x).
inline double noise(std::uint64_t seed, long t, int ch, index_t gy, index_t gx, const Config& c) {
  const std::uint64_t idx =
      ((static_cast<std::uint64_t>(t) * 8 + static_cast<std::uint64_t>(ch)) * static_cast<std::uint64_t>(c.ny) +
       static_cast<std::uint64_t>(gy)) * static_cast<std::uint64_t>(c.nx) + static_cast<std::uint64_t>(gx);
  return 2 * shard::random_value(seed ^ 0x6e6f697365ull, idx, shard::RandomInit::uniform(0, 1)) - 1;
}

/// Frame t of the local block rows [y0, y0+h) x columns [x0, x0+w): `radar` gets h*w dBZ values,
/// `sat` kSatChannels*h*w values (channel-major), both row-major.
inline void frame(const Config& c, std::uint64_t seed, long t, index_t y0, index_t h, index_t x0, index_t w,
                  float* radar, float* sat) {
  const std::size_t n = static_cast<std::size_t>(h * w);
  std::vector<double> q(n, 0.0), cl(n, 0.0), wv(n, 0.0);
  std::vector<Cell> cells;
  // Cells alive in frame t: precipitation for ages [0, life], cloud for [-lead, life].
  for (long s = t - c.max_life - 1; s <= t + c.lead; ++s) cells_born(c, seed, s, cells);
  const double pi = 3.141592653589793, tt = static_cast<double>(t);
  for (const Cell& k : cells) {
    const double age = tt - k.birth;
    const double cy = k.y0 + k.vy * age, cx = k.x0 + k.vx * age;
    if (age >= 0 && age <= k.life) add_blob(q, y0, h, x0, w, cy, cx, k.sigma, k.amp * std::sin(pi * age / k.life));
    const double cage = age + c.lead, clife = k.life + c.lead;
    if (cage >= 0 && cage <= clife) {
      const double env = std::sin(pi * cage / clife);
      const double sc = 1.6 * k.sigma, sw = 2.5 * k.sigma;
      // Blurring a blob of radius s to radius S keeps its integral: peak scales by (s/S)^2.
      add_blob(cl, y0, h, x0, w, cy + c.parallax_y, cx + c.parallax_x, sc, k.amp * env * (k.sigma * k.sigma) / (sc * sc) * 2.0);
      add_blob(wv, y0, h, x0, w, cy + 1.5 * c.parallax_y, cx + 1.5 * c.parallax_x, sw,
               k.amp * env * (k.sigma * k.sigma) / (sw * sw) * 4.0);
    }
  }
  const double s_t = sun(c, tt);
  for (index_t i = 0; i < h; ++i)
    for (index_t j = 0; j < w; ++j) {
      const std::size_t p = static_cast<std::size_t>(i * w + j);
      const index_t gy = y0 + i, gx = x0 + j;
      const double dbz = 10 * std::log10(1 + 3000 * std::pow(q[p], 1.6)) + c.noise_dbz * noise(seed, t, 0, gy, gx, c);
      radar[p] = static_cast<float>(std::max(0.0, dbz));
      sat[p] = static_cast<float>(290 - 85 * std::tanh(1.2 * cl[p]) + c.noise_bt * noise(seed, t, 1, gy, gx, c));
      sat[n + p] = static_cast<float>(245 - 30 * std::tanh(0.8 * wv[p]) + c.noise_bt * noise(seed, t, 2, gy, gx, c));
      sat[2 * n + p] = static_cast<float>(s_t * (0.08 + 0.8 * (1 - std::exp(-2 * cl[p]))) +
                                          c.noise_vis * noise(seed, t, 3, gy, gx, c));
    }
}

}  // namespace nowcast
