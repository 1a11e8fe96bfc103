// The distributed FFT plan (include/shardtensor/dist/fft.hpp): planning (which dims are
// transformed in which local stage, which transposes in between), the cache, and the forward
// and adjoint executions on Blocks.
//
// Adjoints (PyTorch's convention: for a real loss L the gradient of a complex z is
// dL/dRe z + i dL/dIm z, so a linear map's gradient is its adjoint under Re<a, b>):
//  - c2c forward with scale s, spectral side truncated:  grad_in = s * F^H pad(g)
//    (the unnormalised inverse of the zero-padded gradient);
//  - c2c inverse with scale s, spectral side padded:     grad_in = trunc(s * F g);
//  - r2c (y = trunc(s * R x), R keeps k <= n/2 of the halved dim):
//    grad_x = Re(s * F^H pad(g)) over the full spectrum = s * C(w' pad(g)), where C is the c2r
//    transform (Hermitian completion) and w' = 1/2 on the bins that have a mirror image
//    (0 < k < n - k), 1 on k = 0 and, for even n, k = n/2. We double the two self-mirrored
//    planes and let C carry s/2 (no scale kernel needed: box_add of a plane onto itself);
//  - c2r (x = s * C pad(y)): grad_y = trunc(s * w R g) with w = 2 on the mirrored bins and 1
//    on k = 0, n/2: R g carries s, then the contiguous range of mirrored bins is doubled.
// The imaginary parts c2r ignores (k = 0 and n/2 of the halved dim after the other dims'
// inverse) get zero gradient, which is what the formulas give.
// Redistributions hold only Shard / Replicate placements (Partial is refused when planning), so
// the adjoint of src -> dst is dst -> src under the tape's convention that a Replicate
// gradient is the whole gradient on every rank.
#include "shardtensor/dist/fft.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dist/plan_cache.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/dist/consistency.hpp"
#include "shardtensor/dist/redistribute.hpp"
#include "shardtensor/exec/box.hpp"

namespace shard {

const char* fft_norm_name(FftNorm n) noexcept {
  switch (n) {
    case FftNorm::backward: return "backward";
    case FftNorm::ortho: return "ortho";
    case FftNorm::forward: return "forward";
  }
  return "?";
}

}  // namespace shard

namespace shard::detail {
namespace {

using exec::FftKind;

const char* kind_name(FftKind k) { return k == FftKind::c2c ? "c2c" : k == FftKind::r2c ? "r2c" : "c2r"; }

/// True when the transform runs in the forward direction (exp(-i...)): c2c forward and r2c.
bool forward_direction(FftKind k, bool inverse) { return k == FftKind::r2c || (k == FftKind::c2c && !inverse); }

double norm_scale(FftNorm norm, bool forward, double n) {
  if (n <= 0) return 1.0;
  switch (norm) {
    case FftNorm::backward: return forward ? 1.0 : 1.0 / n;
    case FftNorm::ortho: return 1.0 / std::sqrt(n);
    case FftNorm::forward: return forward ? 1.0 / n : 1.0;
  }
  return 1.0;
}

DType complex_of(DType real) { return real == DType::f32 ? DType::c64 : DType::c128; }
DType real_of(DType c) { return c == DType::c64 ? DType::f32 : DType::f64; }

/// Per requested dim: real extent n, full spectral extent F, kept extent K.
struct DimInfo {
  int dim = -1;
  index_t n = 0, full = 0, kept = 0;
  bool halved = false;
};

/// Validates the request against the input spec and completes dims / sizes / modes. Spec-only.
std::vector<DimInfo> check_request(const DistSpec& in, DType in_dtype, FftRequest& req) {
  const char* op = req.kind == FftKind::r2c ? "rfftn" : req.kind == FftKind::c2r ? "irfftn" : req.inverse ? "ifftn" : "fftn";
  const int R = in.ndim();
  SHARD_CHECK(!in.has_partial(), op, "input has a Partial placement ({}); resolve it first", in);
  SHARD_CHECK(req.kind == FftKind::c2c || !req.inverse, op, "{} has a fixed direction", kind_name(req.kind));
  if (req.kind == FftKind::r2c)
    SHARD_CHECK(in_dtype == DType::f32 || in_dtype == DType::f64, op, "needs a real input (f32 or f64), got {}",
                in_dtype);
  else
    SHARD_CHECK(in_dtype == DType::c64 || in_dtype == DType::c128, op, "needs a complex input (c64 or c128), got {}",
                in_dtype);
  SHARD_CHECK(!req.dims.empty(), op, "no dims to transform");
  // modes / sizes are given per dim in the caller's order: sort them with the dims.
  for (int d : req.dims) SHARD_CHECK(d >= 0 && d < R, op, "dim {} outside a rank-{} tensor (dims {})", d, R, req.dims);
  SHARD_CHECK(req.modes.empty() || req.modes.size() == req.dims.size(), op, "{} modes for {} dims", req.modes.size(),
              req.dims.size());
  SHARD_CHECK(req.sizes.empty() || req.sizes.size() == req.dims.size(), op, "{} sizes for {} dims", req.sizes.size(),
              req.dims.size());
  std::vector<std::size_t> order(req.dims.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return req.dims[a] < req.dims[b]; });
  std::vector<int> dims;
  std::vector<index_t> modes, sizes;
  for (auto i : order) {
    dims.push_back(req.dims[i]);
    if (!req.modes.empty()) modes.push_back(req.modes[i]);
    if (!req.sizes.empty()) sizes.push_back(req.sizes[i]);
  }
  for (std::size_t i = 1; i < dims.size(); ++i) SHARD_CHECK(dims[i] != dims[i - 1], op, "dims {} repeat a dim", req.dims);
  for (auto m : modes) SHARD_CHECK(m >= 0, op, "modes {} must be >= 0 (0 keeps all)", req.modes);
  const bool fwd = forward_direction(req.kind, req.inverse);
  const bool halving = req.kind != FftKind::c2c;
  std::vector<DimInfo> info;
  const auto& g = in.global_shape();
  for (std::size_t i = 0; i < dims.size(); ++i) {
    DimInfo di;
    di.dim = dims[i];
    di.halved = halving && i + 1 == dims.size();
    const index_t ext = g[static_cast<std::size_t>(di.dim)];
    const index_t m = modes.empty() ? 0 : modes[i];
    if (fwd) {
      di.n = ext;
      SHARD_CHECK(sizes.empty() || sizes[i] == ext, op, "sizes {} differ from the input's extents along dims {}",
                  req.sizes, req.dims);
    } else if (!sizes.empty()) {
      di.n = sizes[i];
    } else {
      SHARD_CHECK(m == 0, op, "with modes {} the real-space sizes must be given", req.modes);
      di.n = di.halved ? 2 * (ext - 1) : ext;
    }
    SHARD_CHECK(di.n >= 1, op, "dim {} has real-space extent {} (must be >= 1)", di.dim, di.n);
    di.full = di.halved ? di.n / 2 + 1 : di.n;
    if (m == 0) di.kept = di.full;
    else if (di.halved) di.kept = std::min(m, di.full);
    else di.kept = 2 * m < di.n ? 2 * m : di.n;
    if (!fwd)
      SHARD_CHECK(ext == di.kept, op,
                  "dim {} has extent {} but the spectrum of real extent {} with modes {} has {} entries", di.dim, ext,
                  di.n, m, di.kept);
    info.push_back(di);
  }
  req.dims = dims;
  req.modes.assign(dims.size(), 0);
  for (std::size_t i = 0; i < dims.size(); ++i) req.modes[i] = modes.empty() ? 0 : modes[i];
  req.sizes.clear();
  for (const auto& di : info) req.sizes.push_back(di.n);
  return info;
}

index_t extent(const DistSpec& s, int d) { return s.global_shape()[static_cast<std::size_t>(d)]; }

/// The planner (see the file comment of dist/fft.hpp).
std::shared_ptr<FftPlan> build_plan(const DistSpec& in, DType in_dtype, FftRequest req) {
  auto info = check_request(in, in_dtype, req);
  const char* op = req.kind == FftKind::r2c ? "rfftn" : req.kind == FftKind::c2r ? "irfftn" : req.inverse ? "ifftn" : "fftn";
  auto plan = std::make_shared<FftPlan>();
  plan->in = in;
  plan->in_dtype = in_dtype;
  plan->out_dtype = req.kind == FftKind::r2c ? complex_of(in_dtype) : req.kind == FftKind::c2r ? real_of(in_dtype) : in_dtype;
  const bool fwd = forward_direction(req.kind, req.inverse);
  double n_total = 1;
  for (const auto& di : info) n_total *= static_cast<double>(di.n);
  plan->scale = norm_scale(req.norm, fwd, n_total);
  const int R = in.ndim();
  const DeviceMesh& mesh = in.mesh();
  auto is_req = [&](int d) { return std::any_of(info.begin(), info.end(), [d](const DimInfo& x) { return x.dim == d; }); };
  auto info_of = [&](int d) -> const DimInfo& {
    return *std::find_if(info.begin(), info.end(), [d](const DimInfo& x) { return x.dim == d; });
  };
  const int halved = req.kind == FftKind::c2c ? -1 : info.back().dim;
  std::vector<int> undone;
  for (const auto& di : info) undone.push_back(di.dim);
  std::vector<bool> done(static_cast<std::size_t>(R), false);
  DistSpec cur = in;
  std::vector<std::pair<int, int>> restore;  // replicate fallback: (mesh dim, tensor dim) to re-shard
  // The mesh dims that really split tensor dim d (a mesh dim of size 1 splits nothing).
  auto sharders = [&](int d) {
    std::vector<int> out;
    for (int m : cur.sharding_mesh_dims(d))
      if (mesh.size(m) > 1) out.push_back(m);
    return out;
  };
  for (int guard = 0; !undone.empty(); ++guard) {
    SHARD_CHECK(guard < 64, op, "internal: no plan found for {} over dims {}", in, req.dims);
    auto complete = [&](int d) { return sharders(d).empty(); };
    std::vector<int> stage;
    for (int d : undone)
      if (complete(d)) stage.push_back(d);
    if (req.kind == FftKind::r2c && std::find(undone.begin(), undone.end(), halved) != undone.end() &&
        !complete(halved))
      stage.clear();  // r2c: the halved dim is transformed first
    if (req.kind == FftKind::c2r && stage.size() < undone.size())
      std::erase(stage, halved);  // c2r: the halved dim is transformed last
    if (!stage.empty()) {
      FftStage st;
      st.transform = true;
      st.src = cur;
      st.dims = stage;
      const bool has_halved = std::find(stage.begin(), stage.end(), halved) != stage.end();
      st.kind = has_halved ? req.kind : FftKind::c2c;
      st.inverse = !fwd && st.kind == FftKind::c2c;
      auto shape = cur.global_shape();
      st.kept.assign(static_cast<std::size_t>(R), -1);
      for (int d : stage) {
        const auto& di = info_of(d);
        shape[static_cast<std::size_t>(d)] = fwd ? di.kept : di.n;
        if (di.kept < di.full) st.kept[static_cast<std::size_t>(d)] = di.kept;
      }
      st.dst = derived_spec(cur, cur.placements(), shape);
      st.real_local = (fwd ? st.src : st.dst).local_box().len;
      for (int d : stage) st.real_local[static_cast<std::size_t>(d)] = info_of(d).n;
      if (has_halved) {
        st.halved_dim = halved;
        st.halved_real = info_of(halved).n;
      }
      for (int d : stage) {
        done[static_cast<std::size_t>(d)] = true;
        std::erase(undone, d);
      }
      cur = st.dst;
      plan->stages.push_back(std::move(st));
      // Replicate fallbacks whose dim is now transformed go back to Shard (a local slice).
      for (auto it = restore.begin(); it != restore.end();) {
        if (done[static_cast<std::size_t>(it->second)]) {
          FftStage rs;
          rs.src = cur;
          auto p = cur.placements();
          p[static_cast<std::size_t>(it->first)] = Shard(it->second);
          rs.dst = derived_spec(cur, p, cur.global_shape());
          rs.mesh_dim = it->first;
          cur = rs.dst;
          plan->stages.push_back(std::move(rs));
          it = restore.erase(it);
        } else {
          ++it;
        }
      }
      continue;
    }
    // A transpose: which undone dim to free.
    int dstar = -1;
    if (req.kind == FftKind::r2c && std::find(undone.begin(), undone.end(), halved) != undone.end()) {
      dstar = halved;
    } else {
      std::size_t best = 1000;
      for (int d : undone) {
        if (complete(d)) continue;
        if (req.kind == FftKind::c2r && d == halved && undone.size() > 1) {
          bool others_sharded = false;
          for (int e : undone) others_sharded = others_sharded || (e != halved && !complete(e));
          if (others_sharded) continue;
        }
        const std::size_t k = sharders(d).size();
        if (k <= best) {
          best = k;
          dstar = d;
        }
      }
    }
    SHARD_CHECK(dstar >= 0, op, "internal: no dim to transpose for {} over dims {}", in, req.dims);
    const int m = sharders(dstar).back();
    // Target dim, in order of preference.
    int target = -1;
    auto pick = [&](auto pred) {
      index_t best = -1;
      int t = -1;
      for (int d = 0; d < R; ++d) {
        if (d == dstar || !pred(d)) continue;
        if (extent(cur, d) >= best) {
          best = extent(cur, d);
          t = d;
        }
      }
      return t;
    };
    const index_t msize = mesh.size(m);
    auto batch = [&](int d) {
      return !is_req(d) && std::find(req.fixed.begin(), req.fixed.end(), d) == req.fixed.end();
    };
    target = pick([&](int d) { return is_req(d) && done[static_cast<std::size_t>(d)] && complete(d); });
    if (target < 0) target = pick([&](int d) { return batch(d) && complete(d) && extent(cur, d) >= msize; });
    if (target < 0) target = pick([&](int d) { return is_req(d) && done[static_cast<std::size_t>(d)]; });
    if (target < 0) target = pick([&](int d) { return is_req(d) && !done[static_cast<std::size_t>(d)]; });
    if (target < 0) target = pick([&](int d) { return batch(d); });
    FftStage rs;
    rs.src = cur;
    rs.mesh_dim = m;
    auto p = cur.placements();
    if (target >= 0) {
      p[static_cast<std::size_t>(m)] = Shard(target);
    } else {
      p[static_cast<std::size_t>(m)] = Replicate();
      rs.replicate_fallback = true;
      restore.emplace_back(m, dstar);
    }
    rs.dst = derived_spec(cur, p, cur.global_shape());
    cur = rs.dst;
    plan->stages.push_back(std::move(rs));
  }
  // The norm's factor rides on the last transform stage.
  for (auto it = plan->stages.rbegin(); it != plan->stages.rend(); ++it)
    if (it->transform) {
      it->scale = plan->scale;
      break;
    }
  plan->out = cur;
  plan->request = std::move(req);
  return plan;
}

void append_request_key(std::vector<index_t>& k, const FftRequest& r) {
  k.push_back(static_cast<index_t>(r.kind));
  k.push_back(r.inverse);
  k.push_back(static_cast<index_t>(r.norm));
  k.push_back(static_cast<index_t>(r.dims.size()));
  k.insert(k.end(), r.dims.begin(), r.dims.end());
  k.push_back(static_cast<index_t>(r.sizes.size()));
  k.insert(k.end(), r.sizes.begin(), r.sizes.end());
  k.push_back(static_cast<index_t>(r.modes.size()));
  k.insert(k.end(), r.modes.begin(), r.modes.end());
  k.push_back(static_cast<index_t>(r.fixed.size()));
  k.insert(k.end(), r.fixed.begin(), r.fixed.end());
}

PlanCache<FftPlan>& fft_plan_cache() {
  static auto* c = new PlanCache<FftPlan>(512);  // never destroyed: usable during static destruction
  return *c;
}

// ================================================================ execution

/// One spectral corner segment of a dim: [src, src + len) of the full extent <-> [dst, dst + len)
/// of the kept extent.
struct Seg {
  index_t full_lo, kept_lo, len;
};

std::vector<Seg> segments(index_t full, index_t kept, bool halved) {
  if (halved) return {{0, 0, kept}};
  const index_t m = kept / 2;
  return {{0, 0, m}, {full - m, m, m}};
}

/// Calls f(full_lo, kept_lo, len) for every corner box of the truncated dims (`kept` >= 0).
template <class F>
void for_each_corner(const std::vector<index_t>& full_shape, const std::vector<index_t>& kept, int halved_dim, F&& f) {
  const int R = static_cast<int>(full_shape.size());
  std::vector<index_t> flo(static_cast<std::size_t>(R), 0), klo(flo), len(full_shape);
  auto rec = [&](auto&& self, int d) -> void {
    if (d == R) {
      f(flo, klo, len);
      return;
    }
    const auto u = static_cast<std::size_t>(d);
    if (kept[u] < 0) {
      flo[u] = klo[u] = 0;
      len[u] = full_shape[u];
      self(self, d + 1);
      return;
    }
    for (const auto& s : segments(full_shape[u], kept[u], d == halved_dim)) {
      if (s.len == 0) continue;
      flo[u] = s.full_lo;
      klo[u] = s.kept_lo;
      len[u] = s.len;
      self(self, d + 1);
    }
  };
  rec(rec, 0);
}

bool truncates(const FftStage& st) {
  return std::any_of(st.kept.begin(), st.kept.end(), [](index_t k) { return k >= 0; });
}

std::vector<index_t> kept_shape(const FftStage& st, std::vector<index_t> full) {
  for (std::size_t d = 0; d < full.size(); ++d)
    if (st.kept[d] >= 0) full[d] = st.kept[d];
  return full;
}

Block contiguous(const Block& b, ExecContext& ctx) {
  if (b.is_contiguous()) return b;
  Block c = Block::allocate(b.dtype, b.device, b.shape_vec());
  exec::box_copy(c, b, ctx);
  return c;
}

/// The kept corners of `full` (spectral, full extents) as a new block.
Block truncate(const FftStage& st, const Block& full, ExecContext& ctx) {
  const auto fs = full.shape_vec();
  Block out = Block::allocate(full.dtype, full.device, kept_shape(st, fs));
  if (out.numel() == 0) return out;
  for_each_corner(fs, st.kept, st.halved_dim, [&](const auto& flo, const auto& klo, const auto& len) {
    exec::box_copy(exec::sub_box(out, klo, len), exec::sub_box(full, flo, len), ctx);
  });
  return out;
}

/// `kept` (spectral, kept extents) zero-padded to `full_shape`.
Block pad(const FftStage& st, const Block& kept, const std::vector<index_t>& full_shape, ExecContext& ctx) {
  Block out = Block::allocate(kept.dtype, kept.device, full_shape);
  if (out.numel() == 0) return out;
  exec::box_zero(out, ctx);
  for_each_corner(full_shape, st.kept, st.halved_dim, [&](const auto& flo, const auto& klo, const auto& len) {
    exec::box_copy(exec::sub_box(out, flo, len), exec::sub_box(kept, klo, len), ctx);
  });
  return out;
}

/// The local transform of kind (k, inverse) over the stage's dims with `scale`: in -> new block.
Block local_fft(const FftStage& st, FftKind k, bool inverse, double scale, const Block& in, DType out_dtype,
                ExecContext& ctx) {
  exec::FftGeometry g;
  g.kind = k;
  g.inverse = k == FftKind::c2c && inverse;
  g.shape = st.real_local;
  g.dims = st.dims;
  g.scale = scale;
  const auto out_shape = k == FftKind::r2c ? g.complex_shape() : g.shape;
  Block out = Block::allocate(out_dtype, in.device, out_shape);
  if (out.numel() == 0 || in.numel() == 0) {
    if (out.numel() > 0) exec::box_zero(out, ctx);
    return out;
  }
  if (k == FftKind::c2r && g.dims.size() > 1 && !in.device.is_cpu()) {
    // The adjoints above (and irfftn of any spectrum) rely on c2r over several dims meaning
    // "inverse c2c over the leading dims, then the 1-D c2r of the halved dim, whose zero /
    // Nyquist imaginary parts are ignored" for inputs that are not Hermitian-consistent. FFTW's
    // multi-dim c2r computes exactly that (checked: tests/nn/mpi_fft.cpp and the irfftn oracle
    // of tests/nn/mpi_fno.cpp compare one-call and staged transforms of arbitrary spectra);
    // cuFFT's multi-dim c2r assumes Hermitian input, so off the CPU the two steps are explicit.
    exec::FftGeometry lead{FftKind::c2c, true, g.complex_shape(), {g.dims.begin(), g.dims.end() - 1}, 1.0};
    Block tmp = Block::allocate(in.dtype, in.device, lead.shape);
    exec::fft(lead, contiguous(in, ctx), tmp, ctx);
    exec::FftGeometry last{FftKind::c2r, false, g.shape, {g.dims.back()}, scale};
    exec::fft(last, tmp, out, ctx);
    return out;
  }
  exec::fft(g, contiguous(in, ctx), out, ctx);
  return out;
}

/// Planes k = 0 and (even n) k = n/2 of the halved dim: each added onto itself (doubled).
void double_self_mirrored(const FftStage& st, const Block& b, ExecContext& ctx) {
  const auto u = static_cast<std::size_t>(st.halved_dim);
  const index_t n = st.halved_real, ext = b.shape[u];
  std::vector<index_t> lo(static_cast<std::size_t>(b.rank), 0), len = b.shape_vec();
  len[u] = 1;
  std::vector<index_t> ks{0};
  if (n % 2 == 0) ks.push_back(n / 2);  // n >= 2 here (n = 1 has the one bin k = 0)
  for (index_t k : ks) {
    if (k >= ext) continue;  // truncated away
    lo[u] = k;
    Block p = exec::sub_box(b, lo, len);
    exec::box_add(p, p, ctx);
  }
}

/// The bins 0 < k < n - k of the halved dim (a contiguous range [1, (n + 1) / 2)) doubled.
void double_mirrored(const FftStage& st, const Block& b, ExecContext& ctx) {
  const auto u = static_cast<std::size_t>(st.halved_dim);
  const index_t n = st.halved_real;
  const index_t hi = std::min<index_t>((n + 1) / 2, b.shape[u]);
  if (hi <= 1) return;
  std::vector<index_t> lo(static_cast<std::size_t>(b.rank), 0), len = b.shape_vec();
  lo[u] = 1;
  len[u] = hi - 1;
  Block p = exec::sub_box(b, lo, len);
  if (p.numel() > 0) exec::box_add(p, p, ctx);
}

DType stage_out_dtype(const FftStage& st, DType real) {
  return st.kind == FftKind::c2r ? real : complex_of(real);
}

Block forward_stage(const FftStage& st, const Block& in, DType real, ExecContext& ctx) {
  if (!st.transform) return redistribute(st.src, in, st.dst);
  const bool fwd = forward_direction(st.kind, st.inverse);
  if (fwd) {
    Block full = local_fft(st, st.kind, st.inverse, st.scale, in, stage_out_dtype(st, real), ctx);
    return truncates(st) ? truncate(st, full, ctx) : full;
  }
  exec::FftGeometry g{st.kind, false, st.real_local, st.dims, 1.0};
  const Block spec = truncates(st) ? pad(st, in, g.complex_shape(), ctx) : in;
  return local_fft(st, st.kind, st.inverse, st.scale, spec, stage_out_dtype(st, real), ctx);
}

Block adjoint_stage(const FftStage& st, const Block& g, DType real, ExecContext& ctx) {
  if (!st.transform) return redistribute(st.dst, g, st.src);
  const bool fwd = forward_direction(st.kind, st.inverse);
  exec::FftGeometry geo{st.kind, false, st.real_local, st.dims, 1.0};
  const auto cshape = geo.complex_shape();
  if (fwd) {
    // g lives on the (truncated) spectral side.
    if (st.kind == FftKind::c2c) {
      const Block gp = truncates(st) ? pad(st, g, cshape, ctx) : g;
      return local_fft(st, FftKind::c2c, true, st.scale, gp, complex_of(real), ctx);
    }
    // r2c: s * C(w' g) = (s / 2) * C(g with the self-mirrored planes doubled); C's input is a copy.
    Block gp = truncates(st) ? pad(st, g, cshape, ctx) : contiguous(g, ctx);
    if (gp.data == g.data) {
      Block c = Block::allocate(g.dtype, g.device, cshape);
      if (c.numel() > 0) exec::box_copy(c, g, ctx);
      gp = c;
    }
    if (gp.numel() > 0) double_self_mirrored(st, gp, ctx);
    return local_fft(st, FftKind::c2r, false, st.scale / 2, gp, real, ctx);
  }
  // Inverse direction: g lives on the real (c2r) or full complex (c2c inverse) side.
  if (st.kind == FftKind::c2c) {
    Block full = local_fft(st, FftKind::c2c, false, st.scale, g, complex_of(real), ctx);
    return truncates(st) ? truncate(st, full, ctx) : full;
  }
  Block full = local_fft(st, FftKind::r2c, false, st.scale, g, complex_of(real), ctx);
  Block out = truncates(st) ? truncate(st, full, ctx) : full;
  if (out.numel() > 0) double_mirrored(st, out, ctx);
  return out;
}

}  // namespace

int FftPlan::transposes() const {
  int n = 0;
  for (const auto& s : stages) n += s.transform ? 0 : 1;
  return n;
}

index_t FftPlan::elements_sent() const {
  index_t n = 0;
  for (const auto& s : stages) {
    if (s.transform) continue;
    auto rp = redistribute_plan(s.src, s.dst);
    for (const auto& step : rp->steps) {
      if (step.kind == RedistStepKind::alltoallv || step.kind == RedistStepKind::reduce_scatterv)
        for (auto c : step.send_counts) n += c;
      if (step.kind == RedistStepKind::allgatherv) {
        index_t mine = 1;
        for (auto e : step.in_shape) mine *= e;
        n += mine * static_cast<index_t>(std::max<std::size_t>(step.recv_counts.size(), 1) - 1);
      }
    }
  }
  return n;
}

std::string FftPlan::describe() const {
  std::string s;
  for (const auto& st : stages) {
    if (st.transform) {
      s += fmt::format("{}{} dims={} {} -> {}{}\n", kind_name(st.kind),
                       st.kind == FftKind::c2c ? (st.inverse ? " inverse" : " forward") : "", st.dims,
                       st.src.global_shape(), st.dst.global_shape(), st.scale != 1.0 ? fmt::format(" scale={}", st.scale) : "");
    } else {
      s += fmt::format("transpose mesh dim {}: {} -> {}\n", st.mesh_dim, st.src.placements(), st.dst.placements());
    }
  }
  return s;
}

namespace {
/// Collective consistency check of a distributed FFT (debug mode, dist/consistency.hpp).
void check_fft_call(const char* op, const FftPlan& p) {
  const FftRequest& r = p.request;
  CollectiveFingerprint(op).dtype(p.in_dtype).spec(p.in).text("kind", kind_name(r.kind)).field("inverse", r.inverse)
      .field("fft dims", r.dims).field("sizes", r.sizes).field("modes", r.modes).text("norm", fft_norm_name(r.norm))
      .field("fixed dims", r.fixed).spec(p.out, "output ").agree(p.in.mesh());
}
}  // namespace

std::shared_ptr<const FftPlan> fft_plan(const DistSpec& in, DType in_dtype, const FftRequest& req) {
  // The plan holds specs (and so the mesh object): key by the mesh object too, so results are
  // reported on the caller's mesh (a mesh is its object, not its communicator and shape).
  std::vector<index_t> key = mesh_key(in.mesh());
  key.push_back(static_cast<index_t>(reinterpret_cast<std::uintptr_t>(in.mesh().id())));
  key.push_back(0);
  key.push_back(static_cast<index_t>(in_dtype));
  append_spec_key(key, in);
  append_request_key(key, req);
  return fft_plan_cache().get(std::move(key), in.mesh(), [&] { return build_plan(in, in_dtype, req); });
}

std::shared_ptr<const FftPlan> inverse_fft_plan(const DistSpec& target, DType target_dtype, const FftRequest& forward,
                                                FftNorm norm) {
  std::vector<index_t> key = mesh_key(target.mesh());
  key.push_back(static_cast<index_t>(reinterpret_cast<std::uintptr_t>(target.mesh().id())));
  key.push_back(1);
  key.push_back(static_cast<index_t>(target_dtype));
  key.push_back(static_cast<index_t>(norm));
  append_spec_key(key, target);
  append_request_key(key, forward);
  return fft_plan_cache().get(std::move(key), target.mesh(), [&] {
    auto fwd = fft_plan(target, target_dtype, forward);
    auto inv = std::make_shared<FftPlan>();
    inv->request = fwd->request;
    auto& r = inv->request;
    r.kind = fwd->request.kind == FftKind::r2c ? FftKind::c2r : fwd->request.kind == FftKind::c2r ? FftKind::r2c : FftKind::c2c;
    r.inverse = r.kind == FftKind::c2c && !fwd->request.inverse;
    r.norm = norm;
    inv->in = fwd->out;
    inv->out = fwd->in;
    inv->in_dtype = fwd->out_dtype;
    inv->out_dtype = fwd->in_dtype;
    double n_total = 1;
    for (auto n : fwd->request.sizes) n_total *= static_cast<double>(n);
    inv->scale = norm_scale(norm, forward_direction(r.kind, r.inverse), n_total);
    for (auto it = fwd->stages.rbegin(); it != fwd->stages.rend(); ++it) {
      FftStage st = *it;
      std::swap(st.src, st.dst);
      if (st.transform) {
        st.kind = it->kind == FftKind::r2c ? FftKind::c2r : it->kind == FftKind::c2r ? FftKind::r2c : FftKind::c2c;
        st.inverse = st.kind == FftKind::c2c && !it->inverse;
        st.scale = 1.0;
      }
      inv->stages.push_back(std::move(st));
    }
    for (auto it = inv->stages.rbegin(); it != inv->stages.rend(); ++it)
      if (it->transform) {
        it->scale = inv->scale;
        break;
      }
    return std::shared_ptr<const FftPlan>(std::move(inv));
  });
}

Block execute_fft(const FftPlan& plan, const Block& in, ExecContext& ctx) {
  if (ctx.settings().check_collectives) [[unlikely]] check_fft_call("fft", plan);
  SHARD_CHECK(in.dtype == plan.in_dtype, "fft", "input dtype {} but the plan was made for {}", in.dtype, plan.in_dtype);
  SHARD_CHECK(in.shape_vec() == plan.in.local_box().len, "fft", "local block of shape {} but the plan expects {}",
              in.shape_vec(), plan.in.local_box().len);
  const DType real = plan.in_dtype == DType::f32 || plan.in_dtype == DType::c64 ? DType::f32 : DType::f64;
  Block cur = in;
  for (const auto& st : plan.stages) cur = forward_stage(st, cur, real, ctx);
  return cur;
}

Block execute_fft_adjoint(const FftPlan& plan, const Block& grad_out, ExecContext& ctx) {
  if (ctx.settings().check_collectives) [[unlikely]] check_fft_call("fft adjoint", plan);
  SHARD_CHECK(grad_out.dtype == plan.out_dtype, "fft backward", "gradient dtype {} but the output is {}",
              grad_out.dtype, plan.out_dtype);
  SHARD_CHECK(grad_out.shape_vec() == plan.out.local_box().len, "fft backward",
              "gradient block of shape {} but the output block is {}", grad_out.shape_vec(), plan.out.local_box().len);
  const DType real = plan.in_dtype == DType::f32 || plan.in_dtype == DType::c64 ? DType::f32 : DType::f64;
  Block cur = grad_out;
  for (auto it = plan.stages.rbegin(); it != plan.stages.rend(); ++it) cur = adjoint_stage(*it, cur, real, ctx);
  return cur;
}

std::size_t fft_plan_cache_size() noexcept { return fft_plan_cache().size(); }

}  // namespace shard::detail
