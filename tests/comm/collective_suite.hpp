#pragma once
// The collective suite of the device-buffer tests: every Communicator call (blocking and
// non-blocking, and the conveniences) on rank-dependent, integer-valued data, so that every
// reduction is exact and a device run must equal the host run bit for bit. Buffers live on
// `mem` (the host, or a GPU: uploaded before and downloaded after through the public
// allocate_bytes/copy_bytes); the calls get `ctx`. Gaps between the segments of receive buffers
// hold a sentinel that must survive.
#include <algorithm>
#include <numeric>
#include <vector>

#include <shardtensor/shardtensor.hpp>
#include <shardtensor/tensor/memory.hpp>

namespace shard::test {

/// A buffer of host values mirrored on `mem` (the host vector itself when `mem` is the CPU).
template <class T> class DevBuf {
 public:
  DevBuf(std::vector<T> v, Device mem) : host_(std::move(v)), mem_(mem) {
    if (mem_.is_cpu()) return;
    dev_ = allocate_bytes(std::max<std::size_t>(bytes(), 1), mem_);
    if (bytes()) copy_bytes(dev_.get(), mem_, host_.data(), Device::cpu(), bytes());
  }
  T* ptr() { return mem_.is_cpu() ? host_.data() : static_cast<T*>(dev_.get()); }
  /// The values now (waits for `ctx`'s stream first).
  const std::vector<T>& get(ExecContext* ctx) {
    if (mem_.is_cpu()) return host_;
    if (ctx) ctx->synchronize();
    if (bytes()) copy_bytes(host_.data(), Device::cpu(), dev_.get(), mem_, bytes());
    return host_;
  }

 private:
  std::size_t bytes() const { return host_.size() * sizeof(T); }
  std::vector<T> host_;
  Device mem_;
  std::shared_ptr<void> dev_;
};

inline constexpr double kGap = -7.0;  ///< sentinel left in receive-buffer gaps

/// Displacements of `counts` with `gap` unused elements after each segment.
inline std::vector<index_t> gapped(const std::vector<index_t>& counts, index_t gap) {
  std::vector<index_t> d(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1] + gap;
  return d;
}
/// One past the last element of the last segment.
inline index_t end_of(const std::vector<index_t>& c, const std::vector<index_t>& d) {
  return c.empty() ? 0 : d.back() + c.back();
}

/// Runs every call of `c` with buffers on `mem` and context `ctx`; all outputs, concatenated.
inline std::vector<double> run_all(Communicator& c, ExecContext* ctx, Device mem = Device::cpu()) {
  const int r = c.rank(), p = c.size();
  const auto P = static_cast<std::size_t>(p);
  std::vector<double> out;
  auto put = [&](auto& b) {
    const auto& v = b.get(ctx);
    out.insert(out.end(), v.begin(), v.end());
  };
  auto buf = [&](auto v) { return DevBuf<typename decltype(v)::value_type>(std::move(v), mem); };
  const index_t n = 7;
  std::vector<double> xv(n);
  for (index_t i = 0; i < n; ++i) xv[static_cast<std::size_t>(i)] = (r + 1) * (i + 1) * (i % 2 ? -1.0 : 1.0) * 2;
  auto x = buf(xv);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
    auto y = buf(std::vector<double>(n)), z = buf(xv), w = buf(std::vector<double>(n));
    c.allreduce(x.ptr(), y.ptr(), n, DType::f64, op, ctx);
    c.allreduce(z.ptr(), z.ptr(), n, DType::f64, op, ctx);
    c.iallreduce(x.ptr(), w.ptr(), n, DType::f64, op, ctx).wait();
    put(y), put(z), put(w);
    auto xi = buf(std::vector<std::int64_t>(xv.begin(), xv.end())), yi = buf(std::vector<std::int64_t>(n));
    c.allreduce(xi.ptr(), yi.ptr(), n, DType::i64, op, ctx);
    put(yi);
    auto xf = buf(std::vector<float>(xv.begin(), xv.end())), yf = buf(std::vector<float>(n));
    c.allreduce(xf.ptr(), yf.ptr(), n, DType::f32, op, ctx);
    put(yf);
  }
  for (int root = 0; root < p; ++root) {
    auto b = buf(std::vector<float>{1.0f * r, 2.0f * r + 1});
    c.broadcast(b.ptr(), 2, DType::f32, root, ctx);
    put(b);
  }
  {
    auto g = buf(std::vector<double>(2 * P, kGap));
    c.allgather(x.ptr(), 2, g.ptr(), DType::f64, ctx);
    put(g);
  }
  std::vector<index_t> counts(P);
  for (std::size_t q = 0; q < P; ++q) counts[q] = static_cast<index_t>(q % 3 + 1);
  const auto mine = counts[static_cast<std::size_t>(r)];
  {  // allgatherv into a buffer with gaps, blocking and non-blocking; packed (equal counts)
    const auto dg = gapped(counts, 2);
    auto g = buf(std::vector<double>(static_cast<std::size_t>(end_of(counts, dg) + 1), kGap));
    auto h = buf(std::vector<double>(static_cast<std::size_t>(end_of(counts, dg) + 1), kGap));
    c.allgatherv(x.ptr(), mine, g.ptr(), counts, dg, DType::f64, ctx);
    c.iallgatherv(x.ptr(), mine, h.ptr(), counts, dg, DType::f64, ctx).wait();
    put(g), put(h);
    std::vector<index_t> eq(P, 3), ed(P);
    for (std::size_t q = 0; q < P; ++q) ed[q] = static_cast<index_t>(3 * q);
    auto e = buf(std::vector<double>(3 * P, kGap));
    c.allgatherv(x.ptr(), 3, e.ptr(), eq, ed, DType::f64, ctx);
    put(e);
  }
  {  // reduce_scatterv (unequal counts: sum, avg, max) and reduce_scatter (equal counts)
    const index_t tot = std::accumulate(counts.begin(), counts.end(), index_t{0});
    std::vector<double> sv(static_cast<std::size_t>(tot));
    for (std::size_t i = 0; i < sv.size(); ++i) sv[i] = static_cast<double>((r + 2) * (static_cast<int>(i) + 1) * 4);
    auto s = buf(sv);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      auto rs = buf(std::vector<double>(static_cast<std::size_t>(mine)));
      c.reduce_scatterv(s.ptr(), rs.ptr(), counts, DType::f64, op, ctx);
      put(rs);
    }
    std::vector<double> ev(P * 2);
    for (std::size_t i = 0; i < ev.size(); ++i) ev[i] = static_cast<double>(r * 10 + static_cast<int>(i));
    auto e = buf(ev), rq = buf(std::vector<double>(2));
    c.reduce_scatter(e.ptr(), rq.ptr(), 2, DType::f64, ReduceOp::max, ctx);
    put(rq);
  }
  {  // alltoallv with gaps on both sides, blocking and non-blocking; alltoall
    std::vector<index_t> sc(P), rc(P);
    for (std::size_t q = 0; q < P; ++q) {
      sc[q] = static_cast<index_t>((static_cast<std::size_t>(r) + q) % 3);
      rc[q] = static_cast<index_t>((q + static_cast<std::size_t>(r)) % 3);
    }
    const auto sd = gapped(sc, 1), rd = gapped(rc, 3);
    std::vector<double> sv(static_cast<std::size_t>(end_of(sc, sd)));
    for (std::size_t i = 0; i < sv.size(); ++i) sv[i] = static_cast<double>(100 * r + static_cast<int>(i));
    auto s = buf(sv);
    auto a = buf(std::vector<double>(static_cast<std::size_t>(end_of(rc, rd) + 2), kGap));
    auto b = buf(std::vector<double>(static_cast<std::size_t>(end_of(rc, rd) + 2), kGap));
    c.alltoallv(s.ptr(), sc, sd, a.ptr(), rc, rd, DType::f64, ctx);
    c.ialltoallv(s.ptr(), sc, sd, b.ptr(), rc, rd, DType::f64, ctx).wait();
    put(a), put(b);
    std::vector<std::int32_t> ev(P * 2);
    for (std::size_t i = 0; i < ev.size(); ++i) ev[i] = r * 1000 + static_cast<int>(i);
    auto e = buf(ev), f = buf(std::vector<std::int32_t>(P * 2));
    c.alltoall(e.ptr(), f.ptr(), 2, DType::i32, ctx);
    put(f);
  }
  {  // sendrecv: periodic ring and open chain (-1 peers at the ends)
    auto rv = buf(std::vector<double>(3, kGap)), rw = buf(std::vector<double>(3, kGap));
    c.sendrecv(x.ptr(), 3, (r + 1) % p, rv.ptr(), 3, (r + p - 1) % p, DType::f64, 5, ctx);
    c.sendrecv(x.ptr(), 3, r + 1 < p ? r + 1 : -1, rw.ptr(), 3, r - 1, DType::f64, 6, ctx);
    put(rv), put(rw);
  }
  {  // isend/irecv with both neighbours, distinct tags (NCCL matches in order per peer pair)
    auto r1 = buf(std::vector<double>(n, kGap)), r2 = buf(std::vector<double>(2, kGap));
    auto q1 = c.irecv(r1.ptr(), n, DType::f64, (r + p - 1) % p, 11, ctx);
    auto q2 = c.irecv(r2.ptr(), 2, DType::f64, (r + 1) % p, 12, ctx);
    auto s1 = c.isend(x.ptr(), n, DType::f64, (r + 1) % p, 11, ctx);
    auto s2 = c.isend(x.ptr() + 1, 2, DType::f64, (r + p - 1) % p, 12, ctx);
    q1.wait(), q2.wait(), s1.wait(), s2.wait();
    put(r1), put(r2);
  }
  c.barrier(ctx);
  return out;
}

}  // namespace shard::test
