// The profiler's store and scopes (include/shardtensor/runtime/profiler.hpp). Part of the runtime
// layer (beside the registry and the device runtime it times with); the table, the environment
// and the exit report are in profiler_report.cpp.
//
// Rows live in a fixed array of slots of atomic counters, one per (category, name, pass),
// registered on a site's first use while profiling is on (a mutex, once per site); recording a
// scope adds to its slot with relaxed atomics. Device time: a scope on a device context records
// a timing event on the context's stream at its begin and its end (events from a pool, per
// device); the pair is queued and resolved when its end event has completed — polled at later
// scope ends, or waited for when the table is read. Nothing in the step waits for an event.
#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "runtime/profiler_store.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/context.hpp"
#include "shardtensor/runtime/device_runtime.hpp"

namespace shard::profile {
namespace detail {
std::atomic<unsigned> g_mode{4u};  // environment not read yet: the first scope reads it
}  // namespace detail

namespace {

constexpr unsigned kCollect = 1u, kRanges = 2u, kUnread = 4u;
constexpr int kMaxSlots = 1024;  // the library has about 120 sites
constexpr int kPollPerEnd = 4;   // pending event pairs polled at a scope's end

struct Slot {
  std::string category, name, pass;
  std::atomic<std::uint64_t> calls{0}, host_ns{0}, bytes{0}, device_ns{0}, device_calls{0};
  std::atomic<void*> range{nullptr};  // NVTX handle of "name/pass"
};

struct Store {
  std::array<Slot, kMaxSlots> slots;
  std::atomic<int> used{0};
  std::mutex reg_mu;  // registration
  std::map<std::tuple<std::string, std::string, std::string>, int> index;
  std::mutex ev_mu;  // pending device timings and the event pools
  struct Pending {
    int slot;
    const exec::DeviceRuntime* rt;
    int device;
    void* start;
    void* stop;
  };
  std::deque<Pending> pending;
  std::map<std::pair<const exec::DeviceRuntime*, int>, std::vector<void*>> free_events;
  RangeHooks hooks{};
  std::atomic<bool> hooked{false};
  std::atomic<bool> tool_attached{false};
  std::atomic<int> profilers{0};
  std::atomic<bool> env_on{false};
  std::mutex mode_mu;  // update_mode
};

// Never destroyed: scopes may run in static destructors and at-exit handlers.
Store& store() {
  static Store* s = new Store;
  return *s;
}

thread_local int t_exclusive_depth = 0;  // open outermost_only scopes on this thread (comm)
// The row of the innermost open recording scope on this thread: a scope of the same row opened
// directly inside it (an op front re-entering itself, e.g. on f32 working copies of a bf16 call)
// is not recorded again, so calls and times count the op once.
thread_local int t_open_slot = -1;

std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

int slot_of(Site& site) {
  int s = site.slot.load(std::memory_order_acquire);
  if (s >= 0) return s;
  Store& st = store();
  std::lock_guard<std::mutex> lk(st.reg_mu);
  auto key = std::make_tuple(std::string(site.category), std::string(site.name), std::string(site.pass ? site.pass : ""));
  if (st.used.load(std::memory_order_relaxed) >= kMaxSlots - 1 && st.index.find(key) == st.index.end())
    key = std::make_tuple(std::string("other"), std::string("(more sites than slots)"), std::string());
  auto it = st.index.find(key);
  if (it != st.index.end()) {
    s = it->second;
  } else {
    s = st.used.load(std::memory_order_relaxed);
    Slot& sl = st.slots[static_cast<std::size_t>(s)];
    sl.category = std::get<0>(key);
    sl.name = std::get<1>(key);
    sl.pass = std::get<2>(key);
    st.index.emplace(key, s);
    st.used.store(s + 1, std::memory_order_release);
  }
  site.slot.store(s, std::memory_order_release);
  return s;
}

// Recomputes the collect / ranges bits from the store's state (serialised, so a stale state never
// wins), keeping the "environment unread" bit as it is (an atomic read-modify-write).
void update_mode() noexcept {
  Store& st = store();
  std::lock_guard<std::mutex> lk(st.mode_mu);
  const bool collect = st.env_on.load() || st.profilers.load() > 0;
  const unsigned bits = (collect ? kCollect : 0u) | (st.hooked.load() && (collect || st.tool_attached.load()) ? kRanges : 0u);
  unsigned cur = detail::g_mode.load();
  while (!detail::g_mode.compare_exchange_weak(cur, (cur & kUnread) | bits)) {}
}

// Event pool: callers hold ev_mu.
void* take_event(Store& st, const exec::DeviceRuntime* rt, int device) {
  auto& v = st.free_events[{rt, device}];
  if (!v.empty()) {
    void* e = v.back();
    v.pop_back();
    return e;
  }
  return rt->create_timing_event(device);
}
void give_event(Store& st, const exec::DeviceRuntime* rt, int device, void* e) {
  if (e) st.free_events[{rt, device}].push_back(e);
}

// Resolves pending timings in order: all of them (waiting) or up to `limit` completed ones.
void resolve(Store& st, bool wait, int limit) {
  std::lock_guard<std::mutex> lk(st.ev_mu);
  int n = 0;
  while (!st.pending.empty() && (wait || n < limit)) {
    auto& p = st.pending.front();
    try {
      if (wait) p.rt->synchronize_event(p.stop);
      else if (!p.rt->query_event(p.stop)) break;
      const float ms = p.rt->elapsed_ms(p.start, p.stop);
      if (ms >= 0) {
        Slot& sl = st.slots[static_cast<std::size_t>(p.slot)];
        sl.device_ns.fetch_add(static_cast<std::uint64_t>(static_cast<double>(ms) * 1e6), std::memory_order_relaxed);
        sl.device_calls.fetch_add(1, std::memory_order_relaxed);
      }
    } catch (const std::exception&) {
      // A device error belongs to the op that caused it; the timing is dropped.
    }
    give_event(st, p.rt, p.device, p.start);
    give_event(st, p.rt, p.device, p.stop);
    st.pending.pop_front();
    ++n;
  }
}

const exec::DeviceRuntime* device_runtime(const ExecContext* ctx) {
  if (!ctx || ctx->device().is_cpu()) return nullptr;
  return static_cast<const exec::DeviceRuntime*>(exec::find_family(ctx->device().kind, exec::KernelFamily::runtime));
}

}  // namespace

void Scope::begin(Site& site, const ExecContext* ctx) {
  unsigned m = detail::g_mode.load(std::memory_order_relaxed);
  if (m & kUnread) {
    detail::ensure_env_read();
    m = detail::g_mode.load(std::memory_order_relaxed);
  }
  if ((m & (kCollect | kRanges)) == 0) return;
  if (site.outermost_only && t_exclusive_depth > 0) return;
  Store& st = store();
  slot_ = slot_of(site);  // the one step that may throw (an allocation): nothing is held yet
  if (slot_ == t_open_slot) return;  // re-entry of the same row: the enclosing scope counts it
  if (site.outermost_only) {
    ++t_exclusive_depth;
    state_ |= 4u;
    if (m & kCollect) detail::world_rank();  // cache the rank while MPI is up (for the exit table)
  }
  if (m & kCollect) {
    state_ |= 1u;
    if (const exec::DeviceRuntime* rt = device_runtime(ctx)) {
      // The device time is best effort: an error here (a broken stream) belongs to the op, which
      // meets it itself; the scope then records host time only.
      std::lock_guard<std::mutex> lk(st.ev_mu);
      void* ev = nullptr;
      try {
        ev = take_event(st, rt, ctx->device().index);
        if (ev && rt->record_timing_event(ev, ctx->stream(), ctx->device().index)) {
          ev0_ = ev;
          ctx_ = ctx;
        } else {
          give_event(st, rt, ctx->device().index, ev);
        }
      } catch (const std::exception&) {
        if (ev && ev != ev0_) rt->destroy_event(ev);
      }
    }
  }
  if ((m & kRanges) && st.hooked.load(std::memory_order_acquire)) {
    Slot& sl = st.slots[static_cast<std::size_t>(slot_)];
    void* h = sl.range.load(std::memory_order_acquire);
    if (!h) {
      try {
        const std::string msg = sl.pass.empty() ? sl.name : sl.name + "/" + sl.pass;
        h = st.hooks.name(msg.c_str());
        sl.range.store(h, std::memory_order_release);
      } catch (const std::exception&) {
      }
    }
    if (h) {
      st.hooks.push(h);
      state_ |= 2u;
    }
  }
  prev_slot_ = t_open_slot;  // last: nothing below throws, so end() always restores it
  t_open_slot = slot_;
  state_ |= 8u;
  if (state_ & 1u) t0_ = now_ns();  // ranges alone read no clock
}

void Scope::end() noexcept {
  Store& st = store();
  if (state_ & 2u) st.hooks.pop();
  if (state_ & 1u) {
    const std::uint64_t dt = now_ns() - t0_;
    Slot& sl = st.slots[static_cast<std::size_t>(slot_)];
    sl.calls.fetch_add(1, std::memory_order_relaxed);
    sl.host_ns.fetch_add(dt, std::memory_order_relaxed);
    if (bytes_) sl.bytes.fetch_add(bytes_, std::memory_order_relaxed);
    if (ev0_) {
      const exec::DeviceRuntime* rt = device_runtime(ctx_);
      const int dev = ctx_->device().index;
      bool queued = false;
      {
        std::lock_guard<std::mutex> lk(st.ev_mu);
        try {
          void* ev1 = take_event(st, rt, dev);
          if (ev1 && rt->record_timing_event(ev1, ctx_->stream(), dev)) {
            st.pending.push_back({slot_, rt, dev, ev0_, ev1});
            queued = true;
          } else {
            give_event(st, rt, dev, ev1);
          }
        } catch (const std::exception&) {
        }
        if (!queued) give_event(st, rt, dev, ev0_);
      }
      resolve(st, false, kPollPerEnd);
    }
  }
  if (state_ & 4u) --t_exclusive_depth;
  if (state_ & 8u) t_open_slot = prev_slot_;
  state_ = 0;
}

void note_alloc(Site& site, std::uint64_t bytes) noexcept {
  try {
    if (detail::g_mode.load(std::memory_order_relaxed) & kUnread) detail::ensure_env_read();
  } catch (const std::exception&) {
    return;  // a bad SHARDTENSOR_PROFILE is reported by the first profiled scope
  }
  if (!(detail::g_mode.load(std::memory_order_relaxed) & kCollect)) return;
  try {
    Slot& sl = store().slots[static_cast<std::size_t>(slot_of(site))];
    sl.calls.fetch_add(1, std::memory_order_relaxed);
    sl.bytes.fetch_add(bytes, std::memory_order_relaxed);
  } catch (const std::exception&) {
  }
}

void set_range_hooks(const RangeHooks& h, bool tool_attached) noexcept {
  Store& st = store();
  {
    std::lock_guard<std::mutex> lk(st.reg_mu);
    st.hooks = h;
    st.tool_attached.store(tool_attached);
  }
  st.hooked.store(h.name && h.push && h.pop, std::memory_order_release);
  update_mode();
}

namespace detail {

void set_env_enabled(bool on) noexcept {
  store().env_on.store(on);
  update_mode();
  if (on) register_exit_report();
}

bool env_enabled() noexcept { return store().env_on.load(); }

void clear_unread() noexcept {
  detail::g_mode.fetch_and(~kUnread);
  update_mode();
}

void profilers_delta(int d) noexcept {
  store().profilers.fetch_add(d);
  update_mode();
}

std::vector<ProfileRow> snapshot(bool wait) {
  Store& st = store();
  resolve(st, wait, 1 << 30);
  const int n = st.used.load(std::memory_order_acquire);
  std::vector<ProfileRow> out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const Slot& sl = st.slots[static_cast<std::size_t>(i)];
    ProfileRow& r = out[static_cast<std::size_t>(i)];
    r.category = sl.category;
    r.name = sl.name;
    r.pass = sl.pass;
    r.calls = sl.calls.load(std::memory_order_relaxed);
    r.host_us = static_cast<double>(sl.host_ns.load(std::memory_order_relaxed)) * 1e-3;
    r.bytes = sl.bytes.load(std::memory_order_relaxed);
    r.device_ms = static_cast<double>(sl.device_ns.load(std::memory_order_relaxed)) * 1e-6;
    r.device_calls = sl.device_calls.load(std::memory_order_relaxed);
  }
  return out;
}

}  // namespace detail
}  // namespace shard::profile
