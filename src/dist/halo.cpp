// Halo exchange and its adjoint: the type-erased core behind dist/halo.hpp. The plan (who sends
// which slabs to whom) is in halo_plan.cpp; this file moves the data: strided pack/unpack kernels
// and the split-phase transfer (post a stage's isend/irecv, complete it, next stage).
#include <algorithm>
#include <cstring>
#include <numeric>

#include "halo_plan.hpp"

namespace shard::detail {

namespace {

using Run = HaloRun;
using Stage = HaloStage;

index_t prod(const std::vector<index_t>& v) {
  return std::accumulate(v.begin(), v.end(), index_t{1}, std::multiplies<>());
}

// ---------------------------------------------------------------- strided box kernels
template <class T, bool Add>
void box_kernel(const std::vector<index_t>& len, const T* src, const std::vector<index_t>& ss, T* dst,
                const std::vector<index_t>& ds) {
  const index_t n = prod(len);
  if (n == 0) return;
  const int R = static_cast<int>(len.size());
  const index_t inner = len[static_cast<std::size_t>(R - 1)], outer = n / inner;
  const index_t si = ss[static_cast<std::size_t>(R - 1)], di = ds[static_cast<std::size_t>(R - 1)];
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (index_t o = 0; o < outer; ++o) {
    index_t rem = o, os = 0, od = 0;
    for (int k = R - 2; k >= 0; --k) {
      const auto uk = static_cast<std::size_t>(k);
      const index_t i = rem % len[uk];
      rem /= len[uk];
      os += i * ss[uk];
      od += i * ds[uk];
    }
    const T* s = src + os;
    T* t = dst + od;
    if constexpr (Add) {
      for (index_t i = 0; i < inner; ++i) t[i * di] += s[i * si];
    } else if (si == 1 && di == 1) {
      std::memcpy(t, s, sizeof(T) * static_cast<std::size_t>(inner));
    } else {
      for (index_t i = 0; i < inner; ++i) t[i * di] = s[i * si];
    }
  }
}

/// A strided box inside a host buffer: element pointer (as bytes) and element strides.
struct BoxRef {
  char* ptr;
  std::vector<index_t> strides;
};

void copy_or_add(DType dt, bool add, const std::vector<index_t>& len, const BoxRef& src, const BoxRef& dst) {
  if (add) {
    switch (dt) {
      case DType::f32:
        return box_kernel<float, true>(len, reinterpret_cast<const float*>(src.ptr), src.strides,
                                       reinterpret_cast<float*>(dst.ptr), dst.strides);
      case DType::f64:
        return box_kernel<double, true>(len, reinterpret_cast<const double*>(src.ptr), src.strides,
                                        reinterpret_cast<double*>(dst.ptr), dst.strides);
      case DType::i32:
        return box_kernel<std::int32_t, true>(len, reinterpret_cast<const std::int32_t*>(src.ptr), src.strides,
                                              reinterpret_cast<std::int32_t*>(dst.ptr), dst.strides);
      case DType::i64:
        return box_kernel<std::int64_t, true>(len, reinterpret_cast<const std::int64_t*>(src.ptr), src.strides,
                                              reinterpret_cast<std::int64_t*>(dst.ptr), dst.strides);
      default: SHARD_FAIL("halo_exchange_adjoint", "dtype {} cannot be accumulated (f32, f64, i32, i64)", dt);
    }
  }
  switch (dtype_size(dt)) {
    case 1: return box_kernel<std::uint8_t, false>(len, reinterpret_cast<const std::uint8_t*>(src.ptr), src.strides,
                                                   reinterpret_cast<std::uint8_t*>(dst.ptr), dst.strides);
    case 2: return box_kernel<std::uint16_t, false>(len, reinterpret_cast<const std::uint16_t*>(src.ptr),
                                                    src.strides, reinterpret_cast<std::uint16_t*>(dst.ptr), dst.strides);
    case 4: return box_kernel<std::uint32_t, false>(len, reinterpret_cast<const std::uint32_t*>(src.ptr),
                                                    src.strides, reinterpret_cast<std::uint32_t*>(dst.ptr), dst.strides);
    default: return box_kernel<std::uint64_t, false>(len, reinterpret_cast<const std::uint64_t*>(src.ptr),
                                                     src.strides, reinterpret_cast<std::uint64_t*>(dst.ptr),
                                                     dst.strides);
  }
}

void fill_zero(DType dt, const std::vector<index_t>& len, const BoxRef& dst) {
  const index_t n = prod(len);
  if (n == 0) return;
  const auto es = static_cast<index_t>(dtype_size(dt));
  const int R = static_cast<int>(len.size());
  const index_t inner = len[static_cast<std::size_t>(R - 1)], outer = n / inner;
  const index_t di = dst.strides[static_cast<std::size_t>(R - 1)];
  for (index_t o = 0; o < outer; ++o) {
    index_t rem = o, od = 0;
    for (int k = R - 2; k >= 0; --k) {
      const auto uk = static_cast<std::size_t>(k);
      od += (rem % len[uk]) * dst.strides[uk];
      rem /= len[uk];
    }
    if (di == 1) std::memset(dst.ptr + od * es, 0, static_cast<std::size_t>(inner * es));
    else
      for (index_t i = 0; i < inner; ++i) std::memset(dst.ptr + (od + i * di) * es, 0, static_cast<std::size_t>(es));
  }
}


}  // namespace

// ---------------------------------------------------------------- the transfer
struct HaloTransfer::Impl {
  DType dt{};
  Direction dir{};
  std::size_t es = 0;
  std::vector<index_t> lo, len, ext;
  LocalBlock buf, result;
  std::vector<Stage> stages;  // in execution order (the adjoint's is reversed)
  std::size_t next = 0;       // first stage not yet posted
  bool inflight = false, done = false;
  int tag = 0;
  std::vector<Request> reqs;
  std::vector<LocalBlock> recv_bufs, send_bufs;

  bool fwd() const { return dir == Direction::forward; }

  /// The slab box of run r of stage st: at the ghost positions or (src=true) the source positions.
  std::pair<std::vector<index_t>, BoxRef> box(const Stage& st, const Run& r, bool src) const {
    auto l = st.region_len;
    l[static_cast<std::size_t>(st.d)] = r.len;
    auto start = st.region_lo;
    start[static_cast<std::size_t>(st.d)] = src ? lo[static_cast<std::size_t>(st.d)] + r.src : r.ghost;
    index_t off = 0;
    for (std::size_t k = 0; k < start.size(); ++k) off += start[k] * buf.strides[k];
    BoxRef b{static_cast<char*>(buf.data) + off * static_cast<index_t>(es), buf.strides};
    if (src) b.strides[static_cast<std::size_t>(st.d)] *= r.step;
    return {l, b};
  }
  /// Copies (or adds) between the slabs of `runs` in the buffer and a contiguous staging buffer.
  void stage_io(const Stage& st, const std::vector<Run>& runs, bool src_side, char* staging, bool to_staging,
                bool add) {
    for (const auto& r : runs) {
      auto [l, b] = box(st, r, src_side);
      BoxRef s{staging, {}};
      s.strides.resize(l.size());
      index_t acc = 1;
      for (int k = static_cast<int>(l.size()) - 1; k >= 0; --k) {
        s.strides[static_cast<std::size_t>(k)] = acc;
        acc *= l[static_cast<std::size_t>(k)];
      }
      if (to_staging) copy_or_add(dt, false, l, b, s);
      else copy_or_add(dt, add, l, s, b);
      staging += prod(l) * static_cast<index_t>(es);
    }
  }

  void post(const Stage& st) {
    const int t = tag + st.d;
    // Forward: receive my ghosts from their owners, send the ghosts I own. Adjoint: the reverse.
    const auto& recv_from = fwd() ? st.in : st.out;
    const auto& send_to = fwd() ? st.out : st.in;
    if (st.cross > 0) {
      for (const auto& p : recv_from) {
        recv_bufs.push_back(LocalBlock::allocate(dt, {p.positions * st.cross}));
        reqs.push_back(st.comm->irecv(recv_bufs.back().data, p.positions * st.cross, dt, p.peer, t));
      }
      for (const auto& p : send_to) {
        send_bufs.push_back(LocalBlock::allocate(dt, {p.positions * st.cross}));
        // Forward packs the owner's sources; the adjoint packs the ghost cells' gradients.
        stage_io(st, p.runs, fwd(), static_cast<char*>(send_bufs.back().data), true, false);
        reqs.push_back(st.comm->isend(send_bufs.back().data, p.positions * st.cross, dt, p.peer, t));
      }
    }
    for (const auto& r : st.self) {
      auto [l, g] = box(st, r, false);
      auto [l2, s] = box(st, r, true);
      if (fwd()) copy_or_add(dt, false, l, s, g);
      else copy_or_add(dt, true, l, g, s);
    }
    if (fwd())
      for (const auto& r : st.zero) {
        auto [l, g] = box(st, r, false);
        fill_zero(dt, l, g);
      }
  }

  void complete(const Stage& st) {
    wait_all(reqs);  // receives complete in any order; unpacking below is in peer order
    if (st.cross > 0) {
      const auto& recv_from = fwd() ? st.in : st.out;
      for (std::size_t i = 0; i < recv_from.size(); ++i)
        stage_io(st, recv_from[i].runs, !fwd(), static_cast<char*>(recv_bufs[i].data), false, !fwd());
    }
    reqs.clear();
    recv_bufs.clear();
    send_bufs.clear();
  }

  /// Runs stages up to the first one that talks to other ranks, which is left posted.
  void advance() {
    while (next < stages.size()) {
      const Stage& st = stages[next++];
      post(st);
      if (st.comm) {
        inflight = true;
        return;
      }
      complete(st);
    }
  }

  void finish() {
    if (done) return;
    if (inflight) {
      inflight = false;
      complete(stages[next - 1]);
    }
    while (next < stages.size()) {
      const Stage& st = stages[next++];
      post(st);
      complete(st);
    }
    if (fwd()) {
      result = buf;
    } else {
      result = LocalBlock::allocate(dt, len);
      copy_box(dt, buf, lo, result, std::vector<index_t>(len.size(), 0), len);
    }
    buf = fwd() ? buf : LocalBlock{};
    done = true;
  }
};

HaloTransfer::HaloTransfer(DType dt, const DistSpec& spec, const HaloSpec& halo, Direction dir, const LocalBlock& in,
                           bool consume_input)
    : impl_(std::make_unique<Impl>()) {
  const char* op = dir == Direction::forward ? "halo_exchange" : "halo_exchange_adjoint";
  validate_halo(spec, halo, op);
  auto& m = *impl_;
  m.dt = dt;
  m.dir = dir;
  m.es = dtype_size(dt);
  m.tag = dir == Direction::forward ? kHaloTagForward : kHaloTagAdjoint;
  m.lo = halo.lo;
  m.len = spec.local_box().len;
  m.ext = halo_extended_shape(spec, halo);
  const int R = spec.ndim();
  if (dir == Direction::forward) {
    SHARD_CHECK(in.shape == m.len, op, "local block of shape {} does not match {} (expects {} on this rank)", in.shape,
                spec, m.len);
  } else {
    const bool ok = in.shape == m.ext;
    spec.mesh().comm()->check_all(
        ok, op,
        ok ? std::string()
           : fmt::format("gradient of the extended block has shape {}, expected {} (local {} + {}) for {}", in.shape,
                         m.ext, m.len, halo, spec));
    SHARD_CHECK(dt == DType::f32 || dt == DType::f64 || dt == DType::i32 || dt == DType::i64, op,
                "dtype {} cannot be accumulated (f32, f64, i32, i64)", dt);
  }
  m.stages = plan_halo_stages(spec, halo);
  if (dir == Direction::adjoint) std::reverse(m.stages.begin(), m.stages.end());
  const std::vector<index_t> zero(static_cast<std::size_t>(R), 0);
  if (dir == Direction::adjoint && consume_input && in.is_contiguous()) {
    m.buf = in;  // the caller handed the gradient over: work in place
  } else {
    m.buf = LocalBlock::allocate(dt, m.ext);
    if (dir == Direction::forward) copy_box(dt, in, zero, m.buf, m.lo, m.len);
    else copy_box(dt, in, zero, m.buf, zero, m.ext);
  }
  m.advance();
}

HaloTransfer::~HaloTransfer() {
  if (impl_ && !impl_->done) {
    try {
      impl_->finish();
    } catch (...) {  // never throw from a destructor; the peers got their messages
    }
  }
}

const LocalBlock& HaloTransfer::finish() {
  impl_->finish();
  return impl_->result;
}

const LocalBlock& HaloTransfer::buffer() const { return impl_->fwd() || !impl_->done ? impl_->buf : impl_->result; }

bool HaloTransfer::finished() const { return impl_->done; }

}  // namespace shard::detail
