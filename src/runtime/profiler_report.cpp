// The profiler's table, shard::Profiler, SHARDTENSOR_PROFILE and the table printed at exit
// (include/shardtensor/runtime/profiler.hpp; the store is profiler.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "runtime/profiler_store.hpp"
#include "shardtensor/config.hpp"
#include "shardtensor/core/error.hpp"
#if SHARDTENSOR_HAS_MPI
#include <mpi.h>
#endif

namespace shard {
namespace profile::detail {
namespace {

std::atomic<int> g_rank{-1};

// Rows in reading order: categories in the order of a step's layers, then host time.
int category_order(const std::string& c) {
  static const char* const order[] = {"op", "halo", "ring", "redistribute", "comm", "autograd", "optim", "alloc"};
  for (int i = 0; i < 8; ++i)
    if (c == order[i]) return i;
  return 8;
}

void sort_rows(std::vector<ProfileRow>& rows) {
  std::stable_sort(rows.begin(), rows.end(), [](const ProfileRow& a, const ProfileRow& b) {
    const int ca = category_order(a.category), cb = category_order(b.category);
    return ca != cb ? ca < cb : a.host_us > b.host_us;
  });
}

std::string bytes_text(std::uint64_t b) {
  if (b >= (std::uint64_t{1} << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1 << 30));
  if (b >= (std::uint64_t{1} << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1 << 20));
  if (b >= (std::uint64_t{1} << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(b) / (1 << 10));
  return fmt::format("{} B", b);
}

void print_at_exit() {
  static std::atomic<bool> done{false};
  if (!env_enabled() || done.exchange(true)) return;
  try {
    const int r = world_rank();
    std::vector<ProfileRow> rows;
    for (auto& row : snapshot(true))
      if (row.calls > 0) rows.push_back(std::move(row));
    sort_rows(rows);
    const std::string table = format_profile(rows, fmt::format("shardtensor profile, rank {} (SHARDTENSOR_PROFILE=1, "
                                                               "whole run)", r));
    std::string out;  // every line prefixed with the rank, written at once
    std::size_t pos = 0;
    while (pos < table.size()) {
      const std::size_t nl = table.find('\n', pos);
      const std::size_t end = nl == std::string::npos ? table.size() : nl + 1;
      out += fmt::format("[rank {}] ", r);
      out.append(table, pos, end - pos);
      pos = end;
    }
    std::FILE* f = stderr;
    const char* path = std::getenv("SHARDTENSOR_PROFILE_FILE");
    std::string name;
    if (path && *path) {
      name = path;
      for (std::size_t p = name.find("%r"); p != std::string::npos; p = name.find("%r", p))
        name.replace(p, 2, std::to_string(r));
      f = std::fopen(name.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "shardtensor: cannot write the profile to SHARDTENSOR_PROFILE_FILE=%s (%s)\n",
                     name.c_str(), std::strerror(errno));
        f = stderr;
      }
    }
    std::fwrite(out.data(), 1, out.size(), f);
    if (f != stderr) std::fclose(f);
    else std::fflush(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardtensor: the profile table could not be written: %s\n", e.what());
  }
}

}  // namespace

int world_rank() noexcept {
#if SHARDTENSOR_HAS_MPI
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) {
    int r = 0;
    if (MPI_Comm_rank(MPI_COMM_WORLD, &r) == MPI_SUCCESS) {
      g_rank.store(r, std::memory_order_relaxed);
      return r;
    }
  }
#endif
  const int cached = g_rank.load(std::memory_order_relaxed);
  if (cached >= 0) return cached;
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK"}) {
    const char* e = std::getenv(v);
    if (e && *e) return std::atoi(e);
  }
  return 0;
}

void ensure_env_read() {
  static std::once_flag once;
  std::call_once(once, [] {  // a throw leaves it unread: the next scope throws again
    set_env_enabled(parse_profile_env(std::getenv("SHARDTENSOR_PROFILE")));
    clear_unread();
  });
}

void register_exit_report() noexcept {
  // Registered when collection starts, after the CUDA runtime and MPI have usually registered
  // their own teardown, so this runs first (at-exit handlers run in reverse order). A rank
  // whose MPI is already finalised takes its rank from the cache or the launcher.
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(print_at_exit); });
}

}  // namespace profile::detail

bool parse_profile_env(const char* v) {
  if (!v || !*v || std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0) return false;
  if (std::strcmp(v, "1") == 0 || std::strcmp(v, "on") == 0) return true;
  SHARD_FAIL("SHARDTENSOR_PROFILE", "'{}' is not a setting (use 1 or on to print the profile table at exit, 0 or off "
             "or unset for none)", v);
}

std::string format_profile(const std::vector<ProfileRow>& rows, const std::string& title) {
  std::size_t w = 10;
  for (const auto& r : rows) w = std::max(w, r.label().size());
  std::string s = title + "\n";
  s += fmt::format("{:<13} {:<{}} {:>9} {:>13} {:>11} {:>12} {:>12}\n", "category", "name/pass", w, "calls",
                   "host us", "host us/call", "device ms", "bytes");
  for (const auto& r : rows) {
    const std::string dev = r.device_calls ? fmt::format("{:.3f}", r.device_ms) : std::string("-");
    const bool has_bytes = r.bytes > 0 || r.category == "comm";
    const bool timed = r.category != "alloc";
    s += fmt::format("{:<13} {:<{}} {:>9} {:>13} {:>11} {:>12} {:>12}\n", r.category, r.label(), w, r.calls,
                     timed ? fmt::format("{:.1f}", r.host_us) : std::string("-"),
                     timed && r.calls ? fmt::format("{:.2f}", r.host_us / static_cast<double>(r.calls)) : std::string("-"),
                     dev, has_bytes ? profile::detail::bytes_text(r.bytes) : std::string("-"));
  }
  if (rows.empty()) s += "(no profiled scope ran)\n";
  return s;
}

Profiler::Profiler() {
  profile::detail::ensure_env_read();
  profile::detail::profilers_delta(+1);
  base_ = profile::detail::snapshot(true);
}

Profiler::~Profiler() { profile::detail::profilers_delta(-1); }

void Profiler::reset() { base_ = profile::detail::snapshot(true); }

std::vector<ProfileRow> Profiler::rows() const {
  auto now = profile::detail::snapshot(true);
  std::vector<ProfileRow> out;
  for (std::size_t i = 0; i < now.size(); ++i) {
    ProfileRow r = std::move(now[i]);
    if (i < base_.size()) {
      const ProfileRow& b = base_[i];
      r.calls -= b.calls;
      r.host_us -= b.host_us;
      r.bytes -= b.bytes;
      r.device_ms -= b.device_ms;
      r.device_calls -= b.device_calls;
    }
    if (r.calls > 0) out.push_back(std::move(r));
  }
  profile::detail::sort_rows(out);
  return out;
}

std::string Profiler::report() const {
  return format_profile(rows(), fmt::format("shardtensor profile, rank {}", profile::detail::world_rank()));
}

}  // namespace shard
