// The communication plan of a halo exchange (see halo_plan.hpp) and the validation of a HaloSpec.
#include "halo_plan.hpp"

#include <algorithm>
#include <map>

#include "plan_cache.hpp"

namespace shard::detail {

index_t halo_source_index(index_t g, index_t n, Boundary mode) {
  if (g >= 0 && g < n) return g;
  switch (mode) {
    case Boundary::zero: return -1;
    case Boundary::periodic: return ((g % n) + n) % n;  // widths <= n: one wrap
    case Boundary::reflect: return g < 0 ? -g : 2 * (n - 1) - g;  // widths <= n-1: one mirror
    case Boundary::replicate: return g < 0 ? 0 : n - 1;
  }
  return -1;
}

namespace {

struct OwnedRun {
  index_t owner;  // part owning the sources; -1: no source (zero boundary)
  HaloRun run;
};

/// The ghost runs of `part` along a dim with layout L, in ascending ghost order.
std::vector<OwnedRun> ghost_runs(const ShardLayout& L, index_t part, index_t lo, index_t hi, Boundary mode) {
  const index_t n = L.extent(), off = L.offset(part), len = L.size(part);
  std::vector<OwnedRun> out;
  auto add = [&](index_t e) {
    const index_t s = halo_source_index(off - lo + e, n, mode);
    index_t q = -1, src = 0;
    if (s >= 0) {
      q = L.owner(s);
      src = s - L.offset(q);
    }
    if (!out.empty()) {
      auto& b = out.back();
      if (b.owner == q && b.run.ghost + b.run.len == e) {
        if (q < 0) {
          ++b.run.len;
          return;
        }
        const index_t step = src - (b.run.src + (b.run.len - 1) * b.run.step);
        if ((step == 1 || step == -1) && (b.run.len == 1 || step == b.run.step)) {
          b.run.step = step;
          ++b.run.len;
          return;
        }
      }
    }
    out.push_back({q, HaloRun{e, 1, src, 1}});
  };
  for (index_t e = 0; e < lo; ++e) add(e);
  for (index_t e = lo + len; e < lo + len + hi; ++e) add(e);
  return out;
}

HaloStage build_stage(const DistSpec& spec, const HaloSpec& h, int d) {
  HaloStage st;
  st.d = d;
  const auto ud = static_cast<std::size_t>(d);
  const auto& L = spec.layout(d);
  const auto& mesh = spec.mesh();
  const index_t me = spec.part_of(d, mesh.coords());
  if (L.parts() > 1) {
    // Part index == rank in the communicator of these mesh dims (row-major, ascending mesh dims).
    st.mesh_dims = spec.sharding_mesh_dims(d);
    int n = 1;
    for (int m : st.mesh_dims) n *= mesh.size(m);
    SHARD_CHECK(n == L.parts(), "halo_exchange", "mesh dims {} ({} ranks) do not match the {} parts of dim {}",
                st.mesh_dims, n, L.parts(), d);
  }
  std::map<int, HaloPeerRuns> in, out;
  auto push = [](std::map<int, HaloPeerRuns>& m, int peer, const HaloRun& r) {
    auto& pr = m[peer];
    pr.peer = peer;
    pr.runs.push_back(r);
    pr.positions += r.len;
  };
  for (const auto& [q, r] : ghost_runs(L, me, h.lo[ud], h.hi[ud], h.modes[ud])) {
    if (q < 0) st.zero.push_back(r);
    else if (q == me) st.self.push_back(r);
    else push(in, static_cast<int>(q), r);
  }
  if (!st.mesh_dims.empty()) {
    // What every other part needs from me (everyone computes the same runs, so both ends agree).
    for (index_t p = 0; p < L.parts(); ++p) {
      if (p == me) continue;
      for (const auto& [q, r] : ghost_runs(L, p, h.lo[ud], h.hi[ud], h.modes[ud]))
        if (q == me) push(out, static_cast<int>(p), r);
    }
  }
  for (auto& [p, r] : in) st.in.push_back(std::move(r));
  for (auto& [p, r] : out) st.out.push_back(std::move(r));
  return st;
}

}  // namespace

std::vector<HaloStage> plan_halo_stages(const DistSpec& spec, const HaloSpec& halo) {
  const int R = spec.ndim();
  const auto len = spec.local_box().len;
  const auto ext = halo_extended_shape(spec, halo);
  // Sharded dims first (their slabs then exclude the local ghosts), ascending.
  std::vector<int> order;
  for (int pass = 0; pass < 2; ++pass)
    for (int d = 0; d < R; ++d) {
      const auto ud = static_cast<std::size_t>(d);
      const bool sharded = spec.layout(d).parts() > 1;
      if (halo.lo[ud] + halo.hi[ud] > 0 && sharded == (pass == 0)) order.push_back(d);
    }
  std::vector<HaloStage> stages;
  std::vector<bool> extended(static_cast<std::size_t>(R), false);
  for (int d : order) {
    HaloStage st = build_stage(spec, halo, d);
    st.region_lo.resize(static_cast<std::size_t>(R));
    st.region_len.resize(static_cast<std::size_t>(R));
    st.cross = 1;
    for (int k = 0; k < R; ++k) {
      const auto uk = static_cast<std::size_t>(k);
      st.region_lo[uk] = extended[uk] ? 0 : halo.lo[uk];
      st.region_len[uk] = extended[uk] ? ext[uk] : len[uk];
      if (k != d) st.cross *= st.region_len[uk];
    }
    extended[static_cast<std::size_t>(d)] = true;
    stages.push_back(std::move(st));
  }
  return stages;
}

// ---------------------------------------------------------------- validation
void validate_halo(const DistSpec& spec, const HaloSpec& h, const char* op) {
  const int R = spec.ndim();
  SHARD_CHECK(h.ndim() == R && static_cast<int>(h.hi.size()) == R && static_cast<int>(h.modes.size()) == R, op,
              "{} for a rank-{} tensor {} of global shape {}: need one width below, one above and one mode per "
              "tensor dim",
              h, R, spec, spec.global_shape());
  for (int d = 0; d < R; ++d) {
    const auto ud = static_cast<std::size_t>(d);
    SHARD_CHECK(h.lo[ud] >= 0 && h.hi[ud] >= 0, op, "negative ghost width along dim {} in {}", d, h);
    const index_t w = std::max(h.lo[ud], h.hi[ud]);
    if (w == 0) continue;
    const index_t n = spec.global_shape()[ud];
    const index_t limit = h.modes[ud] == Boundary::reflect ? n - 1 : n;
    SHARD_CHECK(w <= limit, op,
                "halo width {} along dim {} is wider than the global domain: extent {} allows at most {} with {} "
                "boundary ({}, {})",
                w, d, n, std::max<index_t>(limit, 0), h.modes[ud], h, spec);
  }
}

std::vector<index_t> halo_extended_shape(const DistSpec& spec, const HaloSpec& h) {
  auto s = spec.local_box().len;
  for (std::size_t d = 0; d < s.size(); ++d) s[d] += h.lo[d] + h.hi[d];
  return s;
}

// ---------------------------------------------------------------- the plan cache
Block HaloPlan::acquire_staging(std::size_t bytes, Device dev) const {
  {
    std::lock_guard lock(mu_);
    for (auto it = pool_.begin(); it != pool_.end(); ++it)
      if (it->device == dev && it->bytes() >= bytes) {
        Block b = std::move(*it);
        pool_.erase(it);
        return b;
      }
  }
  const index_t n = static_cast<index_t>(std::max<std::size_t>(bytes, 1));
  return Block::allocate(DType::u8, dev, &n, 1);
}

void HaloPlan::release_staging(Block b) const {
  constexpr std::size_t kMaxPooled = 4;  // concurrent transfers of one plan worth keeping buffers for
  std::lock_guard lock(mu_);
  if (pool_.size() < kMaxPooled) pool_.push_back(std::move(b));
}

std::shared_ptr<const HaloPlan> halo_plan(const DistSpec& spec, const HaloSpec& halo, const char* op) {
  validate_halo(spec, halo, op);
  static auto* cache = new PlanCache<HaloPlan>(512);  // never destroyed: usable during static destruction
  std::vector<index_t> key = mesh_key(spec.mesh());
  key.insert(key.end(), spec.global_shape().begin(), spec.global_shape().end());
  for (const auto& p : spec.placements()) {
    key.push_back(static_cast<index_t>(p.kind));
    key.push_back(p.is_shard() ? p.dim : -1);
  }
  for (const auto& l : spec.layouts())
    for (index_t p = 0; p < l.parts(); ++p) key.push_back(l.size(p));
  key.insert(key.end(), halo.lo.begin(), halo.lo.end());
  key.insert(key.end(), halo.hi.begin(), halo.hi.end());
  for (auto m : halo.modes) key.push_back(static_cast<index_t>(m));
  return cache->get(std::move(key), spec.mesh(), [&] {
    auto plan = std::make_shared<HaloPlan>();
    plan->stages = plan_halo_stages(spec, halo);
    for (const auto& st : plan->stages) plan->staging_elements = std::max(plan->staging_elements, st.staged_elements());
    return plan;
  });
}

}  // namespace shard::detail
