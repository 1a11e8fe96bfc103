// dist/ on device blocks, run without a GPU: the fake CUDA backend (tests/support/
// fake_cuda_backend.hpp) makes Device::cuda(0) tensors live in host memory and run the CPU
// kernels. Every redistribute transition (1-D and 2-D meshes, uneven and empty shards, Partial),
// distribute (replicated and scattered from a root) / full_tensor, and the halo exchange and its
// adjoint (every boundary mode, split phase, overwrite) on such tensors must equal the host
// results and stay on the device. With MpiComm's direct transport (device pointers straight to
// MPI) nothing may be copied between host and device at all, so a whole-tensor host round-trip
// in dist/ is caught; with the staged transport the only host traffic is the communicator's own
// staging (checked: every device->host copy lands in pinned memory).
#include <catch2/catch_test_macros.hpp>

#include <limits>
#include <mutex>
#include <map>
#include <shardtensor/dist/halo.hpp>

#include "support/fake_cuda_backend.hpp"
#include "support/mpi_harness.hpp"

namespace st_dist_mpi_fake_device_dist {

using namespace shard;
using namespace shard::test;

namespace {

const Device kDev = Device::cuda(0);

/// The fake runtime, plus: device->host copies whose destination is not pinned memory (the
/// staging buffers of MpiComm are pinned; a dist/ round-trip through a host tensor is not).
struct TrackingRuntime final : exec::DeviceRuntime {
  mutable std::mutex mu;
  mutable std::map<const char*, std::size_t> pinned;  // live pinned allocations: start -> bytes
  mutable int unpinned_d2h = 0, unpinned_h2d = 0;

  const FakeDeviceRuntime& base() const { return fake_runtime(); }
  int device_count() const noexcept override { return base().device_count(); }
  void check_device(int d, const char* op) const override { base().check_device(d, op); }
  void* allocate(std::size_t b, int d) const override { return base().allocate(b, d); }
  void deallocate(void* p, int d) const noexcept override { base().deallocate(p, d); }
  void* allocate_pinned(std::size_t b) const override {
    void* p = base().allocate_pinned(b);
    std::lock_guard l(mu);
    pinned[static_cast<const char*>(p)] = b;
    return p;
  }
  void deallocate_pinned(void* p) const noexcept override {
    {
      std::lock_guard l(mu);
      pinned.erase(static_cast<const char*>(p));
    }
    base().deallocate_pinned(p);
  }
  /// True if p lies in a pinned allocation (staging copies write at offsets inside one).
  bool in_pinned(const void* p) const {
    std::lock_guard l(mu);
    const auto* c = static_cast<const char*>(p);
    auto it = pinned.upper_bound(c);
    if (it == pinned.begin()) return false;
    --it;
    return c < it->first + it->second;
  }
  void copy(void* dst, Device dd, const void* src, Device sd, std::size_t bytes, Stream s, bool sync) const override {
    if (dd.is_cpu() && sd.is_cuda() && bytes > 0 && !in_pinned(dst)) ++unpinned_d2h;
    if (dd.is_cuda() && sd.is_cpu() && bytes > 0 && !in_pinned(src)) ++unpinned_h2d;
    base().copy(dst, dd, src, sd, bytes, s, sync);
  }
  void memset(void* d, int v, std::size_t b, int dev, Stream s) const override { base().memset(d, v, b, dev, s); }
  Stream create_stream(int d) const override { return base().create_stream(d); }
  void destroy_stream(Stream s, int d) const noexcept override { base().destroy_stream(s, d); }
  void synchronize(Stream s, int d) const override { base().synchronize(s, d); }
  void* create_event(int d) const override { return base().create_event(d); }
  void destroy_event(void* e) const noexcept override { base().destroy_event(e); }
  void record_event(void* e, Stream s, int d) const override { base().record_event(e, s, d); }
  void wait_event(Stream s, void* e, int d) const override { base().wait_event(s, e, d); }
  void synchronize_event(void* e) const override { base().synchronize_event(e); }
  bool query_event(void* e) const override { return base().query_event(e); }
  void device_uuid(int d, char out[64]) const override { base().device_uuid(d, out); }
};

const TrackingRuntime& tracking_runtime() {
  static const TrackingRuntime rt;  // static: pools that cached a pointer to it stay valid
  return rt;
}

/// The fake backend with the tracking runtime on top (restored in reverse order).
class Backend {
 public:
  Backend() : prev_(exec::find_family(DeviceKind::cuda, exec::KernelFamily::runtime)) {
    exec::register_family(DeviceKind::cuda, exec::KernelFamily::runtime, &tracking_runtime());
    reset();
  }
  ~Backend() { exec::register_family(DeviceKind::cuda, exec::KernelFamily::runtime, prev_); }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  void reset() const {
    fake_.reset_counts();
    tracking_runtime().unpinned_d2h = tracking_runtime().unpinned_h2d = 0;
  }
  const FakeDeviceRuntime::Counts& counts() const { return fake_.counts(); }
  int unpinned_d2h() const { return tracking_runtime().unpinned_d2h; }
  int unpinned_h2d() const { return tracking_runtime().unpinned_h2d; }

 private:
  FakeCudaBackend fake_;
  const void* prev_;
};

const std::vector<Placement> kPlacements = {Shard(0),         Shard(1), Replicate(), Partial(ReduceOp::sum),
                                            Partial(ReduceOp::max), Partial(ReduceOp::avg)};

std::vector<std::vector<Placement>> all_placements(int n) {
  std::vector<std::vector<Placement>> out = {{}};
  for (int m = 0; m < n; ++m) {
    std::vector<std::vector<Placement>> next;
    for (const auto& prefix : out)
      for (const auto& p : kPlacements) {
        next.push_back(prefix);
        next.back().push_back(p);
      }
    out = std::move(next);
  }
  return out;
}

std::string describe(const std::vector<Placement>& ps) {
  std::string s = "[";
  for (std::size_t i = 0; i < ps.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", ps[i]);
  return s + "]";
}

bool has_avg(const std::vector<Placement>& ps) {
  for (const auto& p : ps)
    if (p.is_partial() && p.op == ReduceOp::avg) return true;
  return false;
}

/// Failures collected without Catch's per-assertion cost, reported once.
struct Tally {
  int checked = 0;
  std::vector<std::string> failures;
  template <class Describe> void expect(bool ok, Describe&& what, const char* check) {
    ++checked;
    if (!ok && failures.size() < 10) failures.push_back(what() + ": " + check);
  }
  void report() const {
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
    CHECK(checked > 0);
  }
};

template <class T, int R> bool same(const Tensor<T, R>& dev, const Tensor<T, R>& host, double allowed = 0.0) {
  if (!(dev.device() == kDev) || dev.shape() != host.shape()) return false;
  return max_rel_diff(dev.to(Device::cpu()), host) <= allowed;
}

void set_transport(const CommPtr& comm, MpiDeviceTransport t) {
  if (auto* mpi = dynamic_cast<MpiComm*>(comm.get())) mpi->set_device_transport(t);
}
const char* transport_name(MpiDeviceTransport t) { return t == MpiDeviceTransport::direct ? "direct" : "staged"; }

/// distribute (replicated, and from root 0) -> redistribute -> full_tensor on the host and on the
/// device; the device results equal the host ones, stay on the device, and move no data between
/// host and device (direct) or only through pinned staging (staged).
template <class T>
void device_round_trip(Tally& tally, const Backend& be, MpiDeviceTransport tr, const DeviceMesh& mesh,
                       const Tensor<T, 2>& full, const std::vector<Placement>& src, const std::vector<Placement>& dst,
                       const ShardSizes& src_sizes = {}, const ShardSizes& dst_sizes = {}) {
  using DT = DistTensor<T, 2>;
  const auto what = [&] {
    return fmt::format("{} mesh {} global {} {} {} -> {} sizes {} -> {} (rank {})", transport_name(tr), mesh.shape(),
                       full.shape(), dtype_of<T>, describe(src), describe(dst), src_sizes, dst_sizes, mesh.rank());
  };
  const bool avg = has_avg(src) || has_avg(dst);
  const double allowed = avg ? 4 * std::numeric_limits<T>::epsilon() : 0.0;
  // Host oracle.
  const auto ha = DT::distribute(full, mesh, src, -1, src_sizes);
  const auto hb = ha.redistribute(dst, dst_sizes);
  const auto hf = hb.full_tensor();
  const auto hr = DT::distribute(full, mesh, src, 0, src_sizes);  // scattered from root 0

  const auto dfull = full.to(kDev);
  const auto dempty = Tensor<T, 2>::empty({0, 0}, kDev);
  be.reset();
  const auto da = DT::distribute(dfull, mesh, src, -1, src_sizes);
  const auto da_before = da.local().clone();
  const auto db = da.redistribute(dst, dst_sizes);
  const auto df = db.full_tensor();
  const auto dr = DT::distribute(mesh.rank() == 0 ? dfull : dempty, mesh, src, 0, src_sizes);
  const int d2h = be.counts().d2h, h2d = be.counts().h2d, ud2h = be.unpinned_d2h(), uh2d = be.unpinned_h2d();

  tally.expect(db.placements() == dst && db.spec() == hb.spec(), what, "spec");
  tally.expect(same(da.local(), ha.local()), what, "distribute (replicated) local block");
  tally.expect(same(db.local(), hb.local(), allowed), what, "redistribute local block");
  tally.expect(same(df, hf, allowed), what, "full_tensor");
  tally.expect(same(dr.local(), hr.local()), what, "distribute (root 0) local block");
  tally.expect(same(da.local(), da_before.to(Device::cpu())), what, "source intact");
  // No whole-tensor host round-trip: direct transport moves nothing across (avg reductions
  // divide on the host inside the communicator, through pinned staging); staged transport only
  // through the communicator's pinned staging buffers.
  if (tr == MpiDeviceTransport::direct && !avg) tally.expect(d2h == 0 && h2d == 0, what, "no host<->device copies");
  tally.expect(ud2h == 0 && uh2d == 0, what, "host traffic only through pinned staging");
}

}  // namespace

TEST_CASE("fake device: every redistribute transition on 1-D and 2-D meshes equals the host path",
          "[dist][redistribute][mpi][device]") {
  for_each_comm_size([](CommPtr comm) {
    const int p = comm->size();
    const auto fd = [] {
      auto t = Tensor<double, 2>::empty({9, 7});
      t.fill_random(51);
      return t;
    }();
    const auto ff = [] {
      auto t = Tensor<float, 2>::empty({2, 5});  // empty shards at 3-4 ranks
      t.fill_random(52);
      return t;
    }();
    const auto fe = [] {
      auto t = Tensor<double, 2>::empty({8, 8});
      t.fill_random(53);
      return t;
    }();
    for (auto tr : {MpiDeviceTransport::direct, MpiDeviceTransport::staged}) {
      set_transport(comm, tr);  // inherited by the mesh's dim communicators
      Backend be;
      {
        DeviceMesh mesh(comm);
        Tally tally;
        const auto ps = all_placements(1);
        for (const auto& src : ps)
          for (const auto& dst : ps) {
            device_round_trip(tally, be, tr, mesh, fd, src, dst);
            device_round_trip(tally, be, tr, mesh, ff, src, dst);
          }
        // Explicit uneven sizes with an empty shard, source and target.
        if (p >= 2) {
          std::vector<index_t> sz(static_cast<std::size_t>(p), 0);
          sz[0] = 6;
          sz.back() = 2;  // 3-4 ranks: empty shards in between
          const ShardSizes s0 = {sz, {}};
          for (const auto& dst : ps) {
            device_round_trip(tally, be, tr, mesh, fe, {Shard(0)}, dst, s0, {});
            if (dst[0].is_shard() && dst[0].dim == 0) device_round_trip(tally, be, tr, mesh, fe, {Replicate()}, dst, {}, s0);
          }
        }
        INFO("1-D mesh");
        tally.report();
      }
      std::vector<std::vector<int>> shapes = {{1, p}, {p, 1}};
      if (p == 1) shapes.pop_back();
      if (p == 4) shapes.push_back({2, 2});
      const auto ps2 = all_placements(2);
      for (const auto& ms : shapes) {
        DeviceMesh mesh(comm, ms);
        Tally tally;
        std::size_t k = 0;
        for (const auto& src : ps2)
          for (const auto& dst : ps2) {
            // Every pair on every 2-D mesh (staged: every 5th), dtype and global shape rotating.
            const std::size_t i = k++;
            if (tr == MpiDeviceTransport::staged && i % 5 != 0) continue;
            if (i % 3 == 0) device_round_trip(tally, be, tr, mesh, fd, src, dst);
            else if (i % 3 == 1) device_round_trip(tally, be, tr, mesh, ff, src, dst);
            else device_round_trip(tally, be, tr, mesh, fe, src, dst);
          }
        INFO(fmt::format("2-D mesh {}", ms));
        tally.report();
      }
    }
  });
}

namespace {

constexpr Boundary kModes[] = {Boundary::zero, Boundary::periodic, Boundary::reflect, Boundary::replicate};

struct Layout {
  std::vector<int> mesh;
  std::vector<Placement> placements;
  ShardSizes sizes;
};

std::vector<Layout> halo_layouts(int P) {
  std::vector<Layout> v;
  v.push_back({{P}, {Shard(1)}, {}});
  v.push_back({{P}, {Shard(2)}, {}});
  v.push_back({{P}, {Shard(0)}, {}});
  if (P == 3) v.push_back({{P}, {Shard(1)}, {{}, {3, 0, 4}, {}}});
  if (P == 4) v.push_back({{P}, {Shard(2)}, {{}, {}, {0, 2, 0, 7}}});
  for (int a = 1; a <= P; ++a) {
    if (P % a || P == 1) continue;
    v.push_back({{a, P / a}, {Shard(1), Shard(2)}, {}});
    v.push_back({{a, P / a}, {Shard(1), Shard(1)}, {}});
    v.push_back({{a, P / a}, {Shard(2), Replicate()}, {}});
  }
  if (P % 2 == 0) v.push_back({{2, P / 2}, {Partial(), Shard(1)}, {}});
  if (P == 4) v.push_back({{2, 2}, {Shard(1), Shard(2)}, {{}, {7, 0}, {1, 8}}});
  return v;
}

template <class T>
void device_halo_case(Tally& tally, const Backend& be, MpiDeviceTransport tr, const DeviceMesh& mesh,
                      const Layout& lay, const HaloSpec& h, std::uint64_t seed) {
  using D3 = DistTensor<T, 3>;
  const auto what = [&] {
    return fmt::format("{} mesh {} {} {} {} (rank {})", transport_name(tr), mesh.shape(), describe(lay.placements),
                       h, dtype_of<T>, mesh.rank());
  };
  const auto x = D3::random({2, 7, 9}, mesh, lay.placements, seed, {}, lay.sizes);
  auto g = Tensor<T, 3>::empty(halo_exchange(x, h).shape());
  g.fill_random(seed * 7919 + static_cast<std::uint64_t>(mesh.rank()) + 1);
  // Host oracle.
  const auto ext = halo_exchange(x, h);
  const auto gx = halo_exchange_adjoint(x.spec(), g, h);

  const auto dx = x.to(kDev);
  const auto dg = g.to(kDev);
  const auto dg_copy = dg.clone();
  be.reset();
  auto started = halo_exchange_start(dx, h);
  const bool interior_ok = started.interior().device() == kDev;
  const auto dext = started.finish();
  const auto dgx = halo_exchange_adjoint(dx.spec(), dg, h);
  const auto dgx_over = halo_exchange_adjoint(dx.spec(), dg_copy, h, /*overwrite_grad_ext=*/true);
  const int d2h = be.counts().d2h, h2d = be.counts().h2d, ud2h = be.unpinned_d2h(), uh2d = be.unpinned_h2d();

  tally.expect(interior_ok && started.device() == kDev, what, "split phase on the device");
  tally.expect(same(dext, ext), what, "forward equals host");
  tally.expect(same(dgx, gx), what, "adjoint equals host");
  tally.expect(same(dgx_over, gx), what, "adjoint (overwrite) equals host");
  tally.expect(same(dg, g), what, "grad_ext intact without overwrite");
  if (tr == MpiDeviceTransport::direct) tally.expect(d2h == 0 && h2d == 0, what, "no host<->device copies");
  tally.expect(ud2h == 0 && uh2d == 0, what, "host traffic only through pinned staging");
}

}  // namespace

TEST_CASE("fake device: halo exchange and adjoint, every boundary mode, equal the host path",
          "[dist][halo][mpi][device]") {
  for_each_comm_size([](CommPtr comm) {
    for (auto tr : {MpiDeviceTransport::direct, MpiDeviceTransport::staged}) {
      set_transport(comm, tr);
      Backend be;
      for (const auto& lay : halo_layouts(comm->size())) {
        DeviceMesh mesh(comm, lay.mesh);
        Tally tally;
        std::uint64_t seed = 1;
        for (Boundary mode : kModes) {
          const Boundary m2 = kModes[(static_cast<int>(mode) + 1) % 4];
          auto mx = [](index_t n, Boundary b) { return b == Boundary::reflect ? n - 1 : n; };
          const std::vector<HaloSpec> hs = {
              HaloSpec{{0, 1, 1}, {0, 1, 1}, {Boundary::zero, mode, m2}},
              HaloSpec{{0, 0, 2}, {0, 3, 0}, {Boundary::zero, mode, m2}},
              HaloSpec{{0, 5, 3}, {0, 2, 6}, {Boundary::zero, mode, m2}},  // wider than a shard (multi-hop)
              HaloSpec{{0, mx(7, mode), mx(9, m2)}, {0, mx(7, mode), mx(9, m2)}, {Boundary::zero, mode, m2}},
              HaloSpec{{1, 0, 1}, {1, 2, 0}, {Boundary::periodic, mode, m2}}};
          for (const auto& h : hs) {
            device_halo_case<double>(tally, be, tr, mesh, lay, h, ++seed);
            device_halo_case<float>(tally, be, tr, mesh, lay, h, ++seed);
          }
        }
        INFO(fmt::format("mesh {} {}", lay.mesh, describe(lay.placements)));
        tally.report();
      }
    }
  });
}

}  // namespace st_dist_mpi_fake_device_dist
