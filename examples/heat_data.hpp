#pragma once
/// \file heat_data.hpp
/// Training pairs for the surrogate example, generated domain-parallel: a random smooth initial
/// temperature u0 on a periodic [0,1)^2 grid, and u(T) after `steps` explicit steps of the heat
/// equation u_t = kappa * Laplace(u) (5-point stencil, one periodic halo exchange per step).
/// Every value depends only on (seed, sample, global grid index), so the same seed gives the same
/// global pairs at any rank count and any mesh.
#include <cmath>
#include <shardtensor/dist/halo.hpp>
#include <shardtensor/shardtensor.hpp>

namespace heat {

/// Parameters of the generator.
struct Config {
  shard::index_t grid = 64;  ///< grid points per side
  int modes = 4;             ///< Fourier modes per initial condition
  int steps = 40;            ///< explicit time steps from u0 to the target
  double cfl = 0.2;          ///< kappa * dt / h^2 (stable for <= 0.25)
};

/// Initial condition of `sample` at global (i, j): a sum of `modes` random Fourier modes.
inline double initial_value(std::uint64_t seed, shard::index_t sample, const Config& c, shard::index_t i,
                            shard::index_t j) {
  const double two_pi = 6.283185307179586;
  const double x = static_cast<double>(i) / static_cast<double>(c.grid);
  const double y = static_cast<double>(j) / static_cast<double>(c.grid);
  double u = 0;
  for (int m = 0; m < c.modes; ++m) {
    auto r = [&](int k) {
      return shard::random_value(seed, static_cast<std::uint64_t>((sample * c.modes + m) * 4 + k),
                                 shard::RandomInit::uniform(0, 1));
    };
    const int kx = 1 + static_cast<int>(r(0) * 4), ky = static_cast<int>(r(1) * 4);
    u += (r(2) - 0.5) * 2.0 / (1 + m) * std::sin(two_pi * (kx * x + ky * y) + two_pi * r(3));
  }
  return u;
}

/// A batch of `n` pairs (u0, uT) starting at sample index `first`, shaped [n, 1, grid, grid] and
/// laid out by `placements` on `mesh` (spatial dims 2 and 3 sharded; dim 0 may be sharded over a
/// data-parallel mesh dim). The time stepping runs in double. Collective.
template <class T>
std::pair<shard::DistTensor<T, 4>, shard::DistTensor<T, 4>> make_batch(const shard::DeviceMesh& mesh,
                                                                       const std::vector<shard::Placement>& placements,
                                                                       std::uint64_t seed, shard::index_t first,
                                                                       shard::index_t n, const Config& c) {
  using namespace shard;
  const Shape<4> gshape{n, 1, c.grid, c.grid};
  auto u = DistTensor<double, 4>::zeros(gshape, mesh, placements);
  const auto off = u.local_offset();
  {
    const auto& l = u.local();
    for (index_t b = 0; b < l.size(0); ++b)
      for (index_t i = 0; i < l.size(2); ++i)
        for (index_t j = 0; j < l.size(3); ++j) l(b, 0, i, j) = initial_value(seed, first + off[0] + b, c, off[2] + i, off[3] + j);
  }
  auto to_t = [&](const DistTensor<double, 4>& x) {
    auto out = Tensor<T, 4>::empty(x.local().shape());
    const index_t cnt = out.numel();
    for (index_t k = 0; k < cnt; ++k) out.data()[k] = static_cast<T>(x.local().data()[k]);
    return DistTensor<T, 4>(x.spec(), out);
  };
  auto u0 = to_t(u);
  const auto halo = HaloSpec::symmetric({0, 0, 1, 1}, Boundary::periodic);
  for (int s = 0; s < c.steps; ++s) {
    auto ext = halo_exchange(u, halo);
    const auto& l = u.local();
    for (index_t b = 0; b < l.size(0); ++b)
      for (index_t i = 0; i < l.size(2); ++i)
        for (index_t j = 0; j < l.size(3); ++j) {
          const double center = ext(b, 0, i + 1, j + 1);
          const double lap = ext(b, 0, i, j + 1) + ext(b, 0, i + 2, j + 1) + ext(b, 0, i + 1, j) +
                             ext(b, 0, i + 1, j + 2) - 4 * center;
          l(b, 0, i, j) = center + c.cfl * lap;
        }
  }
  return {u0, to_t(u)};
}

}  // namespace heat
