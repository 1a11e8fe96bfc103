#pragma once
/// \file step_timing.hpp
/// Steady-state timing of the training examples (unet/vit/fno via surrogate_common.hpp, and
/// pointcloud_surrogate): `--warmup K` and a StepTimer.
///
/// The first K steps of a run are warm-up: they are excluded from the steady-state s/step and
/// throughput. The first step's time is printed on its own: on a GPU it includes cuDNN's
/// algorithm search, the caching allocator's first cudaMallocs and the NCCL set-up, which is
/// seconds at 1024^2. Default K: min(3, steps / 4) of the steps this run executes (0 for runs of
/// fewer than 4 steps, so the short agreement runs time every step).
///
/// Synchronisation: the timer synchronises the device only at the boundaries of the timed window
/// (after the first step, after the last warm-up step, after the last step), never inside a step;
/// log steps synchronise already, as they read the loss. On the host the synchronisations are
/// no-ops.
///
/// Memory (DESIGN.md §7: per-rank peak next to every timing): host RSS peak (getrusage), the
/// tensor allocator's host peak, and on a GPU the device high-water mark of the caching allocator,
/// both over the whole run and over the steady-state window alone (the device peak counter is
/// reset when the window opens, as bench/torch_unet_gpu.py resets torch.cuda's peak after its
/// warm-up, so the two steady-state peaks compare like with like). Each is the max over ranks.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>

#include <shardtensor/exec/profiler.hpp>
#include <shardtensor/shardtensor.hpp>

#include "cli_common.hpp"

namespace examples::timing {

/// --warmup's value when the flag is not given: min(3, steps / 4).
inline constexpr int kAutoWarmup = -1;

/// Adds `--warmup K` (a non-negative decimal integer; default: min(3, steps / 4)).
inline CLI::Option* add_warmup_flag(CLI::App& app, int& warmup) {
  return app
      .add_option("--warmup", warmup,
                  "steps excluded from the steady-state s/step and throughput (the first step's time, which on a "
                  "GPU includes cuDNN's algorithm search, is printed on its own); 0 times every step")
      ->check(cli::decimal_integer(false))
      ->check(CLI::Range(0, 1 << 30))
      ->default_str("min(3, steps/4)");
}

/// Adds `--profile-window`: the library profiler's per-op table (shard::Profiler) over the
/// steady-state window alone, rank 0's printed on stdout after the `steady state:` line between
/// `=== shardtensor profile ...` and `=== end shardtensor profile` (SHARDTENSOR_PROFILE=1 covers the
/// whole run, warm-up and algorithm search included). Reading the table waits for the device
/// events, after the window is closed.
inline CLI::Option* add_profile_flag(CLI::App& app, bool& profile_window) {
  return app.add_flag("--profile-window", profile_window,
                      "print shardtensor's per-op profile table (rank 0) over the steady-state window, i.e. the steps "
                      "after --warmup");
}

/// The warm-up of a run of `steps` steps: the flag's value, or the default.
inline long resolve_warmup(int flag, long steps) {
  return flag >= 0 ? static_cast<long>(flag) : std::min(3L, std::max(0L, steps) / 4);
}

/// Refuses an explicit --warmup that leaves no timed step of the `steps` this run is asked for
/// (cli::UsageError, exit 2). `steps_flag` names the flag that sets them (--steps, --stop-after).
inline void check_warmup(int flag, long steps, const std::string& steps_flag) {
  if (flag >= 0 && flag >= steps)
    throw cli::UsageError("--warmup " + std::to_string(flag) + " leaves no timed step: it must be smaller than " +
                          steps_flag + " " + std::to_string(steps) +
                          " (the steady-state s/step is measured over the steps after the warm-up)");
}

inline double mib(std::size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

/// Per-rank memory peaks, max over ranks (collective).
struct Peaks {
  double rss_mib = 0;           ///< process peak RSS
  double tensors_mib = 0;       ///< tensor allocator's host high-water mark over the run
  double gpu_mib = 0;           ///< device high-water mark over the run (0 on the host)
  double gpu_steady_mib = 0;    ///< device high-water mark over the steady-state window
};

/// Times the steps of one run: call step_done() after each step (every rank, same steps) and
/// finish() once after the last (collective).
class StepTimer {
 public:
  using clock = std::chrono::steady_clock;

  /// `steps`: the steps this run executes; `warmup`: resolved (resolve_warmup). A warm-up of
  /// `steps` or more leaves no timed window (possible after --resume near the end; finish() says so).
  StepTimer(shard::Device dev, long steps, long warmup)
      : dev_(dev), steps_(std::max(0L, steps)), warmup_(std::max(0L, warmup)) {
    sync();  // work queued before the loop (data, parameters) is not the first step's
    t0_ = window_start_ = clock::now();
    if (warmup_ == 0) open_window(t0_);
  }

  long warmup() const { return warmup_; }

  /// Collect the library's profile table over the timed window (see add_profile_flag). Call
  /// before the first step.
  void profile_window(bool on) { profile_ = on; if (on && warmup_ == 0) start_profiler(); }

  /// After step `done` (1-based count of this run's steps) has been queued. Synchronises the
  /// device only after the first step, after the last warm-up step and after the last step.
  void step_done(long done) {
    const bool first = done == 1, opens = done == warmup_ && warmup_ > 0, last = done == steps_;
    if (!(first || opens || last)) return;
    sync();
    const auto now = clock::now();
    if (first) first_s_ = seconds(t0_, now);
    if (opens) open_window(now);
    if (last) {
      end_ = now;
      timed_ = warmup_ < steps_ ? steps_ - warmup_ : 0;
      table_ = profile_report();  // the window's rows only (the device is idle: nothing to wait for)
    }
  }

  /// The device high-water mark over the whole run so far (the counter is reset when the window
  /// opens; this adds back what it held before).
  std::size_t gpu_peak_bytes() const {
    return dev_.is_cuda() ? std::max(gpu_peak_before_, shard::memory_stats(shard::DeviceKind::cuda).peak_bytes) : 0;
  }

  /// Collective: the slowest rank's times and the per-rank peaks (max over ranks). Prints on
  /// rank 0 (`print`) one line:
  ///   steady state: N steps after K warm-up: S s/step, X samples/s[, Y Mpoints/s]; first step F s;
  ///   peak/rank: rss R MiB, tensors T MiB[, gpu G MiB (steady state G' MiB)]
  /// `samples_per_step`: samples per step over all ranks; `points_per_sample`: grid or cloud
  /// points per sample (0: not printed).
  void finish(shard::Communicator& world, double samples_per_step, double points_per_sample, bool print) {
    double v[6] = {first_s_, timed_ > 0 ? seconds(window_start_, end_) : 0.0,
                   mib(shard::process_peak_rss_bytes()),
                   mib(shard::memory_stats(shard::DeviceKind::cpu).peak_bytes), mib(gpu_peak_bytes()),
                   dev_.is_cuda() && timed_ > 0 ? mib(shard::memory_stats(shard::DeviceKind::cuda).peak_bytes) : 0.0};
    world.allreduce(v, v, 6, shard::DType::f64, shard::ReduceOp::max);
    peaks_ = {v[2], v[3], v[4], v[5]};
    first_s_ = v[0];
    window_s_ = v[1];
    const std::string& table = table_;
    if (!print) return;
    const std::string mem = fmt::format("peak/rank: rss {:.1f} MiB, tensors {:.1f} MiB{}", v[2], v[3],
                                        dev_.is_cuda() ? fmt::format(", gpu {:.1f} MiB (steady state {:.1f} MiB)", v[4], v[5])
                                                       : std::string());
#ifdef SHARDTENSOR_EXAMPLE_OPT_FLAGS
    // README command (b)'s build (examples/CMakeLists.txt): the host side is not at -O3.
    std::printf("note: this example was compiled with SHARDTENSOR_EXAMPLE_OPT_FLAGS=%s (a test build): "
                "do not report its timings\n", SHARDTENSOR_EXAMPLE_OPT_FLAGS);
#endif
    if (steps_ == 0) {
      std::printf("steady state: no step run; %s\n", mem.c_str());
    } else if (timed_ == 0) {
      std::printf("steady state: none (the %ld step(s) run are all within --warmup %ld); first step %.4f s; %s\n",
                  steps_, warmup_, first_s_, mem.c_str());
    } else {
      const double sps = window_s_ / static_cast<double>(timed_);
      const double samples_s = samples_per_step / sps;
      std::printf("steady state: %ld steps after %ld warm-up: %.4f s/step, %.2f samples/s%s; first step %.4f s; %s\n",
                  timed_, warmup_, sps, samples_s,
                  points_per_sample > 0 ? fmt::format(", {:.3f} Mpoints/s", samples_s * points_per_sample / 1e6).c_str() : "",
                  first_s_, mem.c_str());
    }
    if (profile_)
      std::printf("=== shardtensor profile: steady-state window (%ld steps after %ld warm-up), rank 0\n%s%s"
                  "=== end shardtensor profile\n",
                  timed_, warmup_, table.c_str(), !table.empty() && table.back() != '\n' ? "\n" : "");
    std::fflush(stdout);
  }

  const Peaks& peaks() const { return peaks_; }
  /// Steady-state seconds per step after finish() (0 without a timed window).
  double seconds_per_step() const { return timed_ > 0 ? window_s_ / static_cast<double>(timed_) : 0.0; }

 private:
  static double seconds(clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
  void sync() const {
    if (dev_.is_cuda()) shard::current_context(dev_).synchronize();
  }
  void start_profiler() { profiler_ = std::make_unique<shard::Profiler>(); }
  std::string profile_report() const {
    if (!profile_) return {};
    if (profiler_) return profiler_->report();
    return "(no steady-state window: no table)\n";
  }
  void open_window(clock::time_point now) {
    window_start_ = now;
    if (profile_) start_profiler();  // (warm-up 0: started by profile_window(), before the first step)
    if (dev_.is_cuda()) {
      gpu_peak_before_ = std::max(gpu_peak_before_, shard::memory_stats(shard::DeviceKind::cuda).peak_bytes);
      shard::reset_peak_memory(shard::DeviceKind::cuda);
    }
  }

  shard::Device dev_;
  long steps_, warmup_;
  clock::time_point t0_{}, window_start_{}, end_{};
  long timed_ = 0;
  double first_s_ = 0, window_s_ = 0;
  std::size_t gpu_peak_before_ = 0;
  Peaks peaks_{};
  bool profile_ = false;
  std::string table_;
  std::unique_ptr<shard::Profiler> profiler_;
};

}  // namespace examples::timing
