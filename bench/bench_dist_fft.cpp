// requires: mpi, fftw-mpi (libfftw3-mpi-dev; bench/CMakeLists.txt skips this file without it)
// bench_dist_fft: the distributed FFT (dist/fft.hpp) against FFTW-MPI in the same run, on the
// same data, and the communication that mode truncation saves in a spectral convolution (issue 16).
//
// Part "fft": forward 3-D c2c (shard::fftn) and r2c (shard::rfftn) of an n^3 field, fp64 and fp32,
//   ours: slab Shard(0) on a 1-D mesh of all ranks (and, at 4 ranks, the pencil Shard(0), Shard(1)
//         on a 2x2 mesh, which FFTW-MPI has no counterpart of);
//   FFTW-MPI: fftw_mpi_plan_dft_3d / fftw_mpi_plan_dft_r2c_3d on the same slabs (FFTW's block
//         distribution of n0 equals ours when P divides n; checked), FFTW_ESTIMATE like our local
//         plans, out-of-place, (a) normal output order (x-slabs again: FFTW transposes back) and
//         (b) FFTW_MPI_TRANSPOSED_OUT (y-slabs stored [y][x][z]: one transpose, like ours, whose
//         output also stays transposed: Shard(1) of [x, y, z]).
//   Every variant is checked against the others first (ours moved to FFTW's layout, untimed): the
//   max relative difference max|a - b| / max|b| over all ranks is printed.
//   Timing: `--warmup` untimed rounds, then `--reps` rounds; in each round the variants run in a
//   new random order (the same on every rank), each after an MPI_Barrier, and a variant's time is
//   the max over ranks of its wall time. Reported: median (p10-p90) per variant and ours / FFTW.
//   FFTW's input is refreshed from ours (untimed) before each of its runs (FFTW-MPI plans may
//   use the input as scratch). Ours allocates its output (and intermediates) every call, as
//   shard::fftn does; FFTW works in preallocated arrays.
// Part "conv": an FNO layer's spectral convolution, fp32, x [1, 16, 128, 128] (2-D, modes 16x16)
//   and [1, 8, 64, 64, 64] (3-D, modes 16^3), slab Shard(2) (and pencil Shard(2), Shard(3) on 2x2
//   at 4 ranks): elements (and bytes) the forward + inverse plans send from this rank with and
//   without truncation (plan->elements_sent()), and the times of F::spectral_conv (no gradients),
//   of the truncated rfftn + exact inverse without the multiply, and of the untruncated
//   rfftn + inverse.
//
//   OMP_NUM_THREADS=1 mpiexec -n 4 build/bench/bench_dist_fft [--n 256] [--reps 7] [--warmup 2]
//       [--part fft|conv|all] [--only c2c-f64,r2c-f32] [--conv-reps 31] [--csv results.csv] [--describe]
//       [--stages]      (> 1 rank: also each stage of our slab plan timed alone)
//       [--by-hand-y]   (c2c, > 1 rank: also fftn over (y, z), redistribute to Shard(1), fftn over x)
// (Open MPI on this machine: --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader.)
#include <fftw3-mpi.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <shardtensor/dist/fft.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_util.hpp"

namespace {

using namespace shard;
using namespace shard::bench;
using autograd::Var;

MPI_Comm g_hand = MPI_COMM_NULL;  // the hand-written side's communicator (barriers, reductions)
int g_rank = 0, g_size = 1;
FILE* g_csv = nullptr;

double allmax(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, g_hand);
  return v;
}
long long allsum(long long v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_LONG_LONG, MPI_SUM, g_hand);
  return v;
}
/// A name as one CSV field (commas -> semicolons).
std::string csv_field(std::string s) {
  std::replace(s.begin(), s.end(), ',', ';');
  return s;
}
double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5)];
}

/// Deterministic value of global element `i` in [-1, 1) (splitmix64), the same at any layout.
inline double value_at(std::uint64_t i, std::uint64_t seed) {
  std::uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0;
}

/// Fills a DistTensor's local block (contiguous, rank 3) from value_at of the global index.
template <class T>
void fill3(DistTensor<T, 3>& x, index_t n) {
  const Box b = x.spec().local_box();
  T* p = const_cast<T*>(x.local().data());
  for (index_t i = 0; i < b.len[0]; ++i)
    for (index_t j = 0; j < b.len[1]; ++j)
      for (index_t k = 0; k < b.len[2]; ++k) {
        const auto g = static_cast<std::uint64_t>(((b.lo[0] + i) * n + (b.lo[1] + j)) * n + (b.lo[2] + k));
        const std::size_t l = static_cast<std::size_t>((i * b.len[1] + j) * b.len[2] + k);
        if constexpr (detail::is_std_complex<T>::value) {
          using R = typename T::value_type;
          p[l] = T(static_cast<R>(value_at(g, 1)), static_cast<R>(value_at(g, 2)));
        } else {
          p[l] = static_cast<T>(value_at(g, 1));
        }
      }
}

/// A timed variant: `prep` runs before the barrier (untimed), `run` is timed.
struct Variant {
  std::string name;
  std::function<void()> prep, run;
  std::vector<double> ms;
};

/// Warm-up rounds, then `reps` rounds in a new random order each (same seed on every rank).
void time_variants(std::vector<Variant>& v, int reps, int warmup) {
  std::mt19937 rng(12345);
  std::vector<std::size_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  for (int r = 0; r < warmup + reps; ++r) {
    std::shuffle(order.begin(), order.end(), rng);
    for (auto i : order) {
      auto& x = v[i];
      if (x.prep) x.prep();
      MPI_Barrier(g_hand);
      const double t0 = now_ms();
      x.run();
      const double dt = allmax(now_ms() - t0);
      if (r >= warmup) x.ms.push_back(dt);
    }
  }
}

// ------------------------------------------------------------------ FFTW-MPI in one precision
template <class R>
struct Fw;
template <>
struct Fw<double> {
  using cplx = fftw_complex;
  using plan = fftw_plan;
  static void* alloc_c(std::size_t n) { return fftw_alloc_complex(n); }
  static void free(void* p) { fftw_free(p); }
  static plan c2c(index_t n, void* in, void* out, unsigned f) {
    return fftw_mpi_plan_dft_3d(n, n, n, static_cast<cplx*>(in), static_cast<cplx*>(out), g_hand, FFTW_FORWARD, f);
  }
  static plan r2c(index_t n, void* in, void* out, unsigned f) {
    return fftw_mpi_plan_dft_r2c_3d(n, n, n, static_cast<double*>(in), static_cast<cplx*>(out), g_hand, f);
  }
  static void exec(plan p) { fftw_execute(p); }
  static void destroy(plan p) { fftw_destroy_plan(p); }
};
template <>
struct Fw<float> {
  using cplx = fftwf_complex;
  using plan = fftwf_plan;
  static void* alloc_c(std::size_t n) { return fftwf_alloc_complex(n); }
  static void free(void* p) { fftwf_free(p); }
  static plan c2c(index_t n, void* in, void* out, unsigned f) {
    return fftwf_mpi_plan_dft_3d(n, n, n, static_cast<cplx*>(in), static_cast<cplx*>(out), g_hand, FFTW_FORWARD, f);
  }
  static plan r2c(index_t n, void* in, void* out, unsigned f) {
    return fftwf_mpi_plan_dft_r2c_3d(n, n, n, static_cast<float*>(in), static_cast<cplx*>(out), g_hand, f);
  }
  static void exec(plan p) { fftwf_execute(p); }
  static void destroy(plan p) { fftwf_destroy_plan(p); }
};

/// max |a - b| and max |b| over a [d0, d1, d2] block of `a` read as a[i][j][k] and `b` read
/// through `bidx(i, j, k)`.
template <class C, class Idx>
void diff_into(const C* a, const C* b, index_t d0, index_t d1, index_t d2, Idx bidx, double& md, double& mb) {
  for (index_t i = 0; i < d0; ++i)
    for (index_t j = 0; j < d1; ++j)
      for (index_t k = 0; k < d2; ++k) {
        const C x = a[(i * d1 + j) * d2 + k], y = b[bidx(i, j, k)];
        md = std::max(md, static_cast<double>(std::abs(x - y)));
        mb = std::max(mb, static_cast<double>(std::abs(y)));
      }
}

/// One (kind, precision) case of part "fft".
template <class R>
void fft_case(bool r2c, index_t n, const DeviceMesh& mesh1, const DeviceMesh* mesh2, int reps, int warmup,
              bool describe, bool manual_y, bool stages) {
  using C = std::complex<R>;
  using W = Fw<R>;
  const char* kind = r2c ? "r2c" : "c2c";
  const char* dt = std::is_same_v<R, double> ? "f64" : "f32";
  const index_t nc = r2c ? n / 2 + 1 : n;  // complex extent of the last dim
  const int P = g_size;

  // ---- ours: input on the slab (and pencil) layout
  DistTensor<C, 3> xc;
  DistTensor<R, 3> xr;
  DistTensor<C, 3> xc2;
  DistTensor<R, 3> xr2;
  if (r2c) {
    xr = DistTensor<R, 3>::zeros({n, n, n}, mesh1, {Shard(0)});
    fill3(xr, n);
    if (mesh2) {
      xr2 = DistTensor<R, 3>::zeros({n, n, n}, *mesh2, {Shard(0), Shard(1)});
      fill3(xr2, n);
    }
  } else {
    xc = DistTensor<C, 3>::zeros({n, n, n}, mesh1, {Shard(0)});
    fill3(xc, n);
    if (mesh2) {
      xc2 = DistTensor<C, 3>::zeros({n, n, n}, *mesh2, {Shard(0), Shard(1)});
      fill3(xc2, n);
    }
  }
  const std::vector<int> dims{0, 1, 2};
  auto ours_slab = [&] { return r2c ? shard::rfftn(xr, dims) : shard::fftn(xc, dims); };
  auto ours_pencil = [&] { return r2c ? shard::rfftn(xr2, dims) : shard::fftn(xc2, dims); };
  const FftRequest req{r2c ? exec::FftKind::r2c : exec::FftKind::c2c, false, dims, {}, {}, FftNorm::backward, {}};
  const DType in_dt = r2c ? dtype_of<R> : dtype_of<C>;
  auto plan1 = detail::fft_plan(r2c ? xr.spec() : xc.spec(), in_dt, req);
  std::shared_ptr<const detail::FftPlan> plan2;
  if (mesh2) plan2 = detail::fft_plan(r2c ? xr2.spec() : xc2.spec(), in_dt, req);
  if (describe && g_rank == 0) {
    std::printf("# ours slab %s %s plan (%d transposes, %lld elements sent by rank 0):\n%s", kind, dt,
                plan1->transposes(), static_cast<long long>(plan1->elements_sent()), plan1->describe().c_str());
    std::printf("#   out placements %s\n", fmt::format("{}", plan1->out.placements()).c_str());
    if (plan2)
      std::printf("# ours pencil 2x2 %s %s plan (%d transposes, %lld elements sent by rank 0):\n%s#   out placements %s\n",
                  kind, dt, plan2->transposes(), static_cast<long long>(plan2->elements_sent()),
                  plan2->describe().c_str(), fmt::format("{}", plan2->out.placements()).c_str());
  }

  // ---- FFTW-MPI: local sizes (must be our slabs), buffers, plans
  ptrdiff_t ln0 = 0, l0s = 0, tn0 = 0, t0s = 0, ln1 = 0, l1s = 0;
  const ptrdiff_t alloc_n = fftw_mpi_local_size_3d(n, n, nc, g_hand, &ln0, &l0s);
  const ptrdiff_t alloc_t = fftw_mpi_local_size_3d_transposed(n, n, nc, g_hand, &tn0, &t0s, &ln1, &l1s);
  const std::size_t alloc = static_cast<std::size_t>(std::max<ptrdiff_t>({alloc_n, alloc_t, 1}));
  const Box mine = (r2c ? xr.spec() : xc.spec()).local_box();
  const bool same_slabs = mine.lo[0] == l0s && mine.len[0] == ln0;
  if (allsum(same_slabs ? 0 : 1) != 0)
    throw Error("bench_dist_fft: FFTW-MPI's slab distribution differs from ours (choose n divisible by the ranks)");
  // r2c: the real input is padded to 2 * nc in the last dim (FFTW-MPI requires it out-of-place too).
  void* fin = W::alloc_c(alloc);
  void* fout = W::alloc_c(alloc);
  void* fout_t = W::alloc_c(alloc);
  std::memset(fin, 0, alloc * sizeof(C));
  std::memset(fout, 0, alloc * sizeof(C));
  std::memset(fout_t, 0, alloc * sizeof(C));
  const double tp0 = now_ms();
  auto pn = r2c ? W::r2c(n, fin, fout, FFTW_ESTIMATE) : W::c2c(n, fin, fout, FFTW_ESTIMATE);
  auto pt = r2c ? W::r2c(n, fin, fout_t, FFTW_ESTIMATE | FFTW_MPI_TRANSPOSED_OUT)
                : W::c2c(n, fin, fout_t, FFTW_ESTIMATE | FFTW_MPI_TRANSPOSED_OUT);
  const double fftw_plan_ms = allmax(now_ms() - tp0);
  if (!pn || !pt) throw Error("bench_dist_fft: FFTW-MPI planning failed");
  auto refresh = [&] {  // ours' input -> FFTW's (padded for r2c)
    if (r2c) {
      const R* s = xr.local().data();
      R* d = static_cast<R*>(fin);
      for (index_t r = 0; r < ln0 * n; ++r) std::memcpy(d + r * 2 * nc, s + r * n, sizeof(R) * static_cast<std::size_t>(n));
    } else {
      std::memcpy(fin, xc.local().data(), sizeof(C) * static_cast<std::size_t>(ln0 * n * n));
    }
  };

  // ---- correctness: ours (slab, pencil) moved to FFTW's layouts vs FFTW's outputs
  double t_first = now_ms();
  auto y1 = ours_slab();
  t_first = allmax(now_ms() - t_first);  // plan made above: this is the first execution
  refresh();
  W::exec(pn);
  refresh();
  W::exec(pt);
  const C* fo = static_cast<const C*>(fout);
  const C* ft = static_cast<const C*>(fout_t);
  auto rel = [&](const DistTensor<C, 3>& y, bool transposed) {
    // FFTW normal: [ln0 x][n y][nc z] of the x-slab; transposed: [ln1 y][n x][nc z] of the y-slab.
    const int m = y.mesh().ndim();
    std::vector<Placement> pl(static_cast<std::size_t>(m), transposed ? Shard(1) : Shard(0));
    const auto yz = y.redistribute(pl);
    const auto z = yz.local().contiguous();
    const Box b = yz.spec().local_box();
    double md = 0, mb = 0;
    bool ok = true;
    if (transposed) {
      ok = b.lo[1] == l1s && b.len[1] == ln1;
      if (ok) diff_into(z.data(), ft, n, ln1, nc, [&](index_t i, index_t j, index_t k) { return (j * n + i) * nc + k; }, md, mb);
    } else {
      ok = b.lo[0] == l0s && b.len[0] == ln0;
      if (ok) diff_into(z.data(), fo, ln0, n, nc, [&](index_t i, index_t j, index_t k) { return (i * n + j) * nc + k; }, md, mb);
    }
    if (allsum(ok ? 0 : 1) != 0) return std::nan("");
    const double top = allmax(mb);
    if (!(top > 0)) return std::nan("");  // an all-zero reference would hide a wrong comparison
    return allmax(md) / top;
  };
  const double e_n = rel(y1, false), e_t = rel(y1, true);
  double e_p = -1;
  if (mesh2) e_p = rel(ours_pencil(), true);
  y1 = DistTensor<C, 3>();

  // ---- timing
  std::vector<Variant> v;
  v.push_back({"ours slab", {}, [&] { auto y = ours_slab(); }, {}});
  v.push_back({"FFTW-MPI", refresh, [&] { W::exec(pn); }, {}});
  v.push_back({"FFTW-MPI TRANSPOSED_OUT", refresh, [&] { W::exec(pt); }, {}});
  if (mesh2) v.push_back({"ours pencil 2x2", {}, [&] { auto y = ours_pencil(); }, {}});
  if (manual_y && !r2c && P > 1) {
    // The planner's c2c slab transposes onto the innermost dim z (ties go to the last dim); this
    // variant composes the same transform by hand with the transpose onto y, as FFTW does.
    auto by_hand = [&] {
      auto a = shard::fftn(xc, {1, 2});
      return shard::fftn(a.redistribute({Shard(1)}), {0});
    };
    const double e_m = rel(by_hand(), true);
    if (g_rank == 0) std::printf("  (by hand, transpose onto y: max rel diff vs TRANSPOSED_OUT %.2e)\n", e_m);
    v.push_back({"ours by hand, y-transpose", {}, [by_hand] { auto y = by_hand(); }, {}});
  }
  // Stage breakdown of our slab plan (its own transpose target), each stage timed alone.
  DistTensor<C, 3> st_a, st_b;
  std::vector<Placement> st_pl;
  if (stages && P > 1 && plan1->stages.size() == 3) {
    st_pl = plan1->stages[1].dst.placements();
    st_a = r2c ? shard::rfftn(xr, {1, 2}) : shard::fftn(xc, {1, 2});
    st_b = st_a.redistribute(st_pl);
    v.push_back({"stage 1: local fft (y,z)", {}, [&] { auto y = r2c ? shard::rfftn(xr, {1, 2}) : shard::fftn(xc, {1, 2}); }, {}});
    v.push_back({"stage 2: transpose", {}, [&] { auto y = st_a.redistribute(st_pl); }, {}});
    v.push_back({"stage 3: local fft x", {}, [&] { auto y = shard::fftn(st_b, {0}); }, {}});
  }
  time_variants(v, reps, warmup);

  const double mo = median(v[0].ms), mf = median(v[1].ms), mt = median(v[2].ms);
  if (g_rank == 0) {
    std::printf("%s %s %lld^3, %d ranks: max rel diff ours vs FFTW-MPI %.2e, vs TRANSPOSED_OUT %.2e", kind, dt,
                static_cast<long long>(n), P, e_n, e_t);
    if (mesh2) std::printf(", pencil vs TRANSPOSED_OUT %.2e", e_p);
    std::printf("; FFTW-MPI planning (2 plans) %.1f ms, ours first call %.1f ms\n", fftw_plan_ms, t_first);
    for (auto& x : v) {
      std::printf("  %-26s median %9.2f ms  (p10 %9.2f, p90 %9.2f)\n", x.name.c_str(), median(x.ms), pct(x.ms, 0.1),
                  pct(x.ms, 0.9));
      if (g_csv)
        std::fprintf(g_csv, "fft,%s,%s,%lld,%d,%s,%.4f,%.4f,%.4f\n", kind, dt, static_cast<long long>(n), P,
                     csv_field(x.name).c_str(), median(x.ms), pct(x.ms, 0.1), pct(x.ms, 0.9));
    }
    std::printf("  ours/FFTW-MPI %.3f   ours/TRANSPOSED_OUT %.3f", mo / mf, mo / mt);
    if (mesh2) std::printf("   pencil/TRANSPOSED_OUT %.3f", median(v[3].ms) / mt);
    std::printf("\n");
    std::fflush(stdout);
  }
  W::destroy(pn);
  W::destroy(pt);
  W::free(fin);
  W::free(fout);
  W::free(fout_t);
}

// ------------------------------------------------------------------ part "conv"
template <int R>
void conv_case(const char* name, const Shape<R>& shape, const std::vector<index_t>& modes, const DeviceMesh& mesh,
               std::vector<Placement> pl, int reps, int warmup, bool describe) {
  using T = float;
  using C = std::complex<T>;
  constexpr int RW = R + 1;
  const index_t cin = shape[1], cout = shape[1];
  auto x = DistTensor<T, R>::random(shape, mesh, pl, 7);
  Shape<RW> wshape{};
  wshape[0] = cin;
  wshape[1] = cout;
  for (int d = 2; d < R; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const bool last = d == R - 1;
    const index_t m = modes[u - 2];
    wshape[u] = last ? m : std::min<index_t>(2 * m, shape[u]);
  }
  wshape[RW - 1] = 2;
  std::vector<Placement> rep(static_cast<std::size_t>(mesh.ndim()), Replicate());
  Var<T, R> xv(x, false);
  Var<T, RW> wv(DistTensor<T, RW>::random(wshape, mesh, rep, 8), false);

  std::vector<int> dims;
  for (int d = 2; d < R; ++d) dims.push_back(d);
  const FftRequest cut{exec::FftKind::r2c, false, dims, {}, modes, FftNorm::backward, {1}};
  const FftRequest full{exec::FftKind::r2c, false, dims, {}, {}, FftNorm::backward, {1}};
  auto fc = detail::fft_plan(x.spec(), dtype_of<T>, cut), ff = detail::fft_plan(x.spec(), dtype_of<T>, full);
  auto ic = detail::inverse_fft_plan(x.spec(), dtype_of<T>, cut, FftNorm::backward);
  auto iff = detail::inverse_fft_plan(x.spec(), dtype_of<T>, full, FftNorm::backward);
  const long long ec = allsum(fc->elements_sent() + ic->elements_sent());
  const long long ef = allsum(ff->elements_sent() + iff->elements_sent());
  const long long ec0 = fc->elements_sent() + ic->elements_sent(), ef0 = ff->elements_sent() + iff->elements_sent();
  if (describe && g_rank == 0)
    std::printf("# %s forward plan, truncated:\n%s# untruncated:\n%s", name, fc->describe().c_str(), ff->describe().c_str());

  {
    // Does F::spectral_conv's multiply output land in the inverse plan's input layout (else it
    // redistributes in between)? Its inverse plan is made for Cout channels like `ic` here.
    const DistSpec ys = F::detail::spectral_mul_spec(fc->out, wv.value().spec(), dtype_of<C>, dtype_of<T>);
    const bool same = ys == ic->in;
    if (g_rank == 0 && (describe || !same))
      std::printf("# %s: spectral_mul output %s the inverse plan's input%s\n", name, same ? "==" : "!=",
                  same ? "" : fmt::format(" ({} vs {})", ys, ic->in).c_str());
  }
  ExecContext& ctx = current_context(Device::cpu());
  const Block xb = as_block(x.local());
  // Check: the truncated round trip through the inverse plan lands in x's layout.
  {
    Block b = detail::execute_fft(*ic, detail::execute_fft(*fc, xb, ctx), ctx);
    if (b.shape_vec() != x.spec().local_box().len) throw Error("bench_dist_fft: inverse plan lands in the wrong layout");
  }
  std::vector<Variant> v;
  v.push_back({"F::spectral_conv (truncated)", {}, [&] { auto y = F::spectral_conv(xv, wv, modes); }, {}});
  v.push_back({"rfftn+inverse, truncated", {}, [&] { Block b = detail::execute_fft(*ic, detail::execute_fft(*fc, xb, ctx), ctx); }, {}});
  v.push_back({"rfftn+inverse, no truncation", {}, [&] { Block b = detail::execute_fft(*iff, detail::execute_fft(*ff, xb, ctx), ctx); }, {}});
  time_variants(v, reps, warmup);
  if (g_rank == 0) {
    const double cb = static_cast<double>(sizeof(C));
    std::printf("conv %s, %d ranks, %s: transposes fwd+inv %d (truncated) / %d (full)\n", name, g_size,
                fmt::format("{}", pl).c_str(), fc->transposes() + ic->transposes(), ff->transposes() + iff->transposes());
    std::printf("  elements sent (fwd+inv), rank 0: truncated %lld (%.2f MiB), full %lld (%.2f MiB), ratio %.4f\n", ec0,
                mib(static_cast<double>(ec0) * cb), ef0, mib(static_cast<double>(ef0) * cb),
                ef0 ? static_cast<double>(ec0) / static_cast<double>(ef0) : 0.0);
    std::printf("  elements sent (fwd+inv), all ranks: truncated %lld (%.2f MiB), full %lld (%.2f MiB)\n", ec,
                mib(static_cast<double>(ec) * cb), ef, mib(static_cast<double>(ef) * cb));
    for (auto& t : v) {
      std::printf("  %-32s median %9.3f ms  (p10 %9.3f, p90 %9.3f)\n", t.name.c_str(), median(t.ms), pct(t.ms, 0.1),
                  pct(t.ms, 0.9));
      if (g_csv)
        std::fprintf(g_csv, "conv,%s,f32,%lld,%d,%s,%.4f,%.4f,%.4f\n", csv_field(name).c_str(), static_cast<long long>(ec0 * sizeof(C)),
                     g_size, csv_field(t.name).c_str(), median(t.ms), pct(t.ms, 0.1), pct(t.ms, 0.9));
    }
    std::printf("  spectral_conv / untruncated round trip %.3f\n", median(v[0].ms) / median(v[2].ms));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  fftw_mpi_init();
  fftwf_mpi_init();
  int exit_code = 0;
  try {
    const index_t n = arg_int(argc, argv, "--n", 256);
    const int reps = static_cast<int>(arg_int(argc, argv, "--reps", 7));
    const int warmup = static_cast<int>(arg_int(argc, argv, "--warmup", 2));
    const int conv_reps = static_cast<int>(arg_int(argc, argv, "--conv-reps", 31));
    const std::string part = arg_str(argc, argv, "--part", "all");
    const std::string only = arg_str(argc, argv, "--only", "");  // e.g. "c2c-f64"
    const bool describe = has_flag(argc, argv, "--describe");
    const bool stages = has_flag(argc, argv, "--stages");  // > 1 rank: time our slab plan's stages alone
    const bool manual_y = has_flag(argc, argv, "--by-hand-y");  // c2c: also the y-transpose composed by hand
    auto comm = std::make_shared<MpiComm>(MPI_COMM_WORLD);  // shardtensor works on its own duplicate
    MPI_Comm_dup(MPI_COMM_WORLD, &g_hand);
    MPI_Comm_rank(g_hand, &g_rank);
    MPI_Comm_size(g_hand, &g_size);
    if (const char* csv = arg_str(argc, argv, "--csv", nullptr); csv && g_rank == 0) g_csv = std::fopen(csv, "a");
    DeviceMesh mesh1(comm);
    std::unique_ptr<DeviceMesh> mesh2;
    if (g_size == 4) mesh2 = std::make_unique<DeviceMesh>(comm, std::vector<int>{2, 2});
    if (g_rank == 0)
      std::printf("# bench_dist_fft: %d ranks, n %lld, %d reps (+%d warm-up), median of the per-rep max over ranks\n",
                  g_size, static_cast<long long>(n), reps, warmup);
    if (part == "fft" || part == "all") {
      auto want = [&](const char* k) { return only.empty() || only.find(k) != std::string::npos; };
      if (want("c2c-f64")) fft_case<double>(false, n, mesh1, mesh2.get(), reps, warmup, describe, manual_y, stages);
      if (want("c2c-f32")) fft_case<float>(false, n, mesh1, mesh2.get(), reps, warmup, describe, manual_y, stages);
      if (want("r2c-f64")) fft_case<double>(true, n, mesh1, mesh2.get(), reps, warmup, describe, manual_y, stages);
      if (want("r2c-f32")) fft_case<float>(true, n, mesh1, mesh2.get(), reps, warmup, describe, manual_y, stages);
    }
    if (part == "conv" || part == "all") {
      conv_case<4>("2-D [1,16,128,128] modes 16x16", {1, 16, 128, 128}, {16, 16}, mesh1, {Shard(2)}, conv_reps, warmup,
                   describe);
      conv_case<5>("3-D [1,8,64,64,64] modes 16^3", {1, 8, 64, 64, 64}, {16, 16, 16}, mesh1, {Shard(2)}, conv_reps, warmup,
                   describe);
      if (mesh2)
        conv_case<5>("3-D [1,8,64,64,64] modes 16^3 pencil", {1, 8, 64, 64, 64}, {16, 16, 16}, *mesh2,
                     {Shard(2), Shard(3)}, conv_reps, warmup, describe);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dist_fft: %s\n", e.what());
    exit_code = 1;
  }
  if (g_csv) std::fclose(g_csv);
  if (g_hand != MPI_COMM_NULL) MPI_Comm_free(&g_hand);
  fftw_mpi_cleanup();
  fftwf_mpi_cleanup();
  MPI_Finalize();
  return exit_code;
}
