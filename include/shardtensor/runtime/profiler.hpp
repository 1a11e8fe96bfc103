#pragma once
/// \file profiler.hpp
/// The in-library profiler (issue 30 item 1): one process-wide table of rows keyed by
/// (category, name, pass) — e.g. ("op", "conv", "forward"), ("comm", "allreduce", ""),
/// ("halo", "forward", "") — with calls, host wall time, device time (CUDA events on the
/// context's stream, resolved lazily: nothing in the step waits for them), payload bytes of
/// collectives and the allocator's traffic. docs/performance.md, "Profiling", has the columns.
///
/// Turn it on with SHARDTENSOR_PROFILE=1 (a table per rank at exit, on stderr or in
/// SHARDTENSOR_PROFILE_FILE with %r replaced by the rank) or, for a region of a program, with a
/// `shard::Profiler`:
///
///     shard::Profiler prof;           // collects from here
///     train_step();
///     std::cout << prof.report();     // what happened since prof was made (or reset())
///
/// Every profiled scope is also an NVTX range (domain "shardtensor", message "name/pass") when
/// shardtensor::cuda is loaded and profiling is on or an NVTX tool (Nsight) is attached.
/// Off, a scope costs one relaxed atomic load and a branch. The library's scopes sit in its
/// .cpp files (SHARD_PROFILE_SCOPE); a program may add its own with the same macro.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace shard {

class ExecContext;

/// One row of the table: everything recorded under (category, name, pass) while collecting.
struct ProfileRow {
  std::string category;  ///< "op", "comm", "halo", "redistribute", "ring", "optim", "autograd", "alloc", ...
  std::string name;      ///< kernel family / collective / plan ("conv", "allreduce", "cpu" for alloc rows)
  std::string pass;      ///< "forward", "backward_input", ... ("" when the name says it all)
  std::uint64_t calls = 0;
  double host_us = 0;                  ///< wall time of the scopes on the host, summed (inclusive)
  double device_ms = 0;                ///< GPU time between the scopes' events, summed
  std::uint64_t device_calls = 0;      ///< scopes timed on a device (device_ms covers these)
  std::uint64_t bytes = 0;             ///< payload bytes (collectives) / bytes allocated (alloc rows)
  std::string label() const { return pass.empty() ? name : name + "/" + pass; }
};

/// Collects while it lives (nests with other Profilers and with SHARDTENSOR_PROFILE=1: each
/// sees what happened since it was made or reset()). Reading it (rows/report) waits for the
/// device events of finished scopes, so call it outside the timed region.
class Profiler {
 public:
  Profiler();
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;
  /// Rows with at least one call since construction / reset(), by category then host time.
  std::vector<ProfileRow> rows() const;
  /// The table as text (a header line, a column line, one line per row).
  std::string report() const;
  /// Starts counting afresh.
  void reset();

 private:
  std::vector<ProfileRow> base_;
};

/// The table of `rows` as report() prints it; `title` goes in the first line.
std::string format_profile(const std::vector<ProfileRow>& rows, const std::string& title);

/// What SHARDTENSOR_PROFILE=`value` means: false for unset/""/"0"/"off", true for "1"/"on";
/// anything else throws shard::Error (the library reads the variable once, at the first
/// profiled scope, and a bad value fails there).
bool parse_profile_env(const char* value);

namespace profile {

/// A profiled site: static storage, constant-initialised (no guard), registered on its first
/// use while profiling is on.
struct Site {
  const char* category;
  const char* name;
  const char* pass;
  bool outermost_only = false;  ///< not recorded inside another scope of the same category on the thread
  std::atomic<int> slot{-1};
};

namespace detail {
/// Bit 0: collect rows; bit 1: NVTX ranges; bit 2: the environment not read yet.
extern std::atomic<unsigned> g_mode;
}  // namespace detail

/// True while rows are collected (cheap).
inline bool collecting() noexcept { return (detail::g_mode.load(std::memory_order_relaxed) & 1u) != 0; }

/// RAII scope of a site. `ctx` (may be null) names the device and stream for the device timing.
class Scope {
 public:
  Scope(Site& site, const ExecContext* ctx) noexcept(false) {
    if (detail::g_mode.load(std::memory_order_relaxed) != 0) [[unlikely]]
      begin(site, ctx);
  }
  ~Scope() {
    if (state_ != 0) [[unlikely]]
      end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  /// True when this scope records a row (so the caller may compute what add_bytes needs).
  bool recording() const noexcept { return (state_ & 1u) != 0; }
  void add_bytes(std::uint64_t b) noexcept { bytes_ += b; }

 private:
  void begin(Site& site, const ExecContext* ctx);
  void end() noexcept;
  unsigned state_ = 0;  ///< bit 0 row, bit 1 range pushed, bit 2 outermost-only depth held, bit 3 innermost row set
  int slot_ = -1;
  int prev_slot_ = -1;  ///< the thread's innermost recording row before this scope
  std::uint64_t t0_ = 0;
  std::uint64_t bytes_ = 0;
  const ExecContext* ctx_ = nullptr;
  void* ev0_ = nullptr;
};

/// Allocator traffic (src/runtime/memory.cpp, the host pool's mmap, the CUDA runtime's cudaMalloc).
/// `where`: "cpu" or "cuda"; `what`: "request", "os_map", "cudaMalloc".
void note_alloc(Site& site, std::uint64_t bytes) noexcept;
inline void count_alloc(Site& site, std::uint64_t bytes) noexcept {
  if (detail::g_mode.load(std::memory_order_relaxed) != 0) [[unlikely]]
    note_alloc(site, bytes);
}

/// NVTX glue, installed by shardtensor::cuda when it is loaded (src/cuda/nvtx_ranges.cpp).
struct RangeHooks {
  void* (*name)(const char* message);  ///< a registered message handle for a site (once per site)
  void (*push)(void* handle);
  void (*pop)();
};
/// Installs `h`; `tool_attached` turns the ranges on even while rows are not collected.
void set_range_hooks(const RangeHooks& h, bool tool_attached) noexcept;

}  // namespace profile
}  // namespace shard

#define SHARD_PROFILE_CAT2(a, b) a##b
#define SHARD_PROFILE_CAT(a, b) SHARD_PROFILE_CAT2(a, b)
/// A profiled scope to the end of the enclosing block: SHARD_PROFILE_SCOPE("op", "conv", "forward", &ctx).
#define SHARD_PROFILE_SCOPE(category, name, pass, ctx)                                                      \
  static constinit ::shard::profile::Site SHARD_PROFILE_CAT(shard_prof_site_, __LINE__){category, name, pass}; \
  ::shard::profile::Scope SHARD_PROFILE_CAT(shard_prof_scope_, __LINE__)(SHARD_PROFILE_CAT(shard_prof_site_, __LINE__), ctx)
/// A collective: recorded only as the outermost communication call on the thread (a backend that
/// forwards to another is counted once), with `bytes` payload bytes (evaluated only when recording).
#define SHARD_PROFILE_COMM(name, ctx, bytes)                                                                    \
  static constinit ::shard::profile::Site shard_prof_comm_site_{"comm", name, "", true};                       \
  ::shard::profile::Scope shard_prof_comm_scope_(shard_prof_comm_site_, ctx);                                  \
  if (shard_prof_comm_scope_.recording()) shard_prof_comm_scope_.add_bytes(static_cast<std::uint64_t>(bytes))
