#pragma once
/// \file bench_util.hpp
/// Scaffolding shared by the plain-main benchmark drivers in bench/ (argument parsing, wall and
/// CPU clocks, medians, peak memory). Header-only; no MPI here (drivers reduce over ranks with the
/// mesh's communicator).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace shard::bench {

/// The value after `--name` on the command line, or `def`.
inline const char* arg_str(int argc, char** argv, const char* name, const char* def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return def;
}
/// Integer / floating-point forms of arg_str.
inline long long arg_int(int argc, char** argv, const char* name, long long def) {
  const char* s = arg_str(argc, argv, name, nullptr);
  return s ? std::atoll(s) : def;
}
inline double arg_double(int argc, char** argv, const char* name, double def) {
  const char* s = arg_str(argc, argv, name, nullptr);
  return s ? std::atof(s) : def;
}
/// True if `--name` appears on the command line.
inline bool has_flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

/// Comma-separated integers ("4096,16384"); empty items are skipped.
inline std::vector<long> int_list(const std::string& s) {
  std::vector<long> r;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t e = std::min(s.find(',', at), s.size());
    if (e > at) r.push_back(std::stol(s.substr(at, e - at)));
    at = e + 1;
  }
  return r;
}

/// Median (upper median for an even count; 0 for none).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// The 1-minute load average (/proc/loadavg; -1 if unreadable): printed beside every timing.
inline double load_average() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

/// Wall clock in milliseconds (steady).
inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
/// CPU time of this process (all its threads) in milliseconds.
inline double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

/// A field of /proc/self/status in KiB ("VmHWM", "VmRSS"), 0 where unknown.
inline double proc_status_kib(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double v = 0;
  const std::size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') {
      v = std::atof(line + n + 1);
      break;
    }
  std::fclose(f);
  return v;
}

/// Bytes -> MiB.
inline double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

}  // namespace shard::bench
