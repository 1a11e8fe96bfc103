#pragma once
/// \file cli_common.hpp
/// Command-line handling shared by the examples (CLI11, Debian's libcli11-dev).
///
/// Exit codes, the same for every example:
///   0  success, and --help (usage printed on stdout);
///   1  a runtime failure: a shard::Error or another exception (printed; never an uncaught throw);
///   2  a usage error: an unknown flag, a value that is not a number, a number out of its range,
///      or sizes that do not fit the ranks (mesh vs rank count, a rank left with an empty domain
///      where the model cannot take one). The message names the flag and the rule.
///
/// Typical main (every rank parses the same argv, so every rank takes the same branch; only the
/// rank that `print` names writes messages):
///
///   CLI::App app{"what it does", "name"};
///   examples::cli::CommonArgs common;
///   examples::cli::add_common(app, common, {.min_grid = 4});
///   app.add_option("--width", width, "...")->check(CLI::Range(1, 1024));
///   bool print = true;  // set to (rank == 0) once MPI is up
///   return examples::cli::run_main("name", print, [&] {
///     if (int rc = examples::cli::parse(app, argc, argv, print); rc >= 0) return rc;
///     ... examples::cli::check_mesh(...) ... (throw UsageError for a bad combination)
///     return 0;
///   });
#include <CLI/CLI.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <shardtensor/core/error.hpp>
#include <shardtensor/core/shape.hpp>

namespace examples::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

/// An invalid combination of flags found after parsing (exit code 2).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// "AxB" / "AxBxC" -> extents: between `min_dims` and `max_dims` positive integers separated by
/// 'x'. Throws UsageError naming `flag`.
inline std::vector<int> parse_mesh(const std::string& s, int min_dims, int max_dims, const std::string& flag = "--mesh") {
  const std::string form = max_dims == 2 && min_dims == 2 ? "AxB" : "AxB[xC...]";
  std::vector<int> out;
  std::size_t pos = 0;
  while (true) {
    const auto x = s.find('x', pos);
    const std::string part = s.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    long v = 0;
    std::size_t used = 0;
    bool ok = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    if (ok) {
      try {
        v = std::stol(part, &used);
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (!ok || used != part.size() || v < 1 || v > INT_MAX)
      throw UsageError((flag.empty() ? "" : flag + " ") + "'" + s + "': expected " + form +
                       " with positive integer extents, got '" + part + "'");
    out.push_back(static_cast<int>(v));
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  if (static_cast<int>(out.size()) < min_dims || static_cast<int>(out.size()) > max_dims)
    throw UsageError((flag.empty() ? "" : flag + " ") + "'" + s + "': expected " + form + " (" + std::to_string(min_dims) +
                     (max_dims == min_dims ? "" : " to " + std::to_string(max_dims)) + " extents), got " +
                     std::to_string(out.size()));
  return out;
}

/// A CLI11 check that a value is a plain decimal integer (optional '-', digits): CLI11 alone would
/// read "010" as octal 8, "0x10" as 16, and "-1" as 2^64 - 1 for an unsigned flag.
inline CLI::Validator decimal_integer(bool allow_negative = true) {
  return CLI::Validator(
      [=](std::string& s) {
        const std::size_t start = allow_negative && !s.empty() && s[0] == '-' ? 1 : 0;
        if (s.size() == start || s.find_first_not_of("0123456789", start) != std::string::npos)
          return std::string(allow_negative ? "'" + s + "' is not an integer" : "'" + s + "' is not a non-negative integer");
        return std::string();
      },
      "");
}

/// A CLI11 check for a mesh string (see parse_mesh).
inline CLI::Validator mesh_check(int min_dims, int max_dims) {
  return CLI::Validator(
      [=](std::string& s) {
        try {
          parse_mesh(s, min_dims, max_dims, "");
        } catch (const UsageError& e) {
          return std::string(e.what());
        }
        return std::string();
      },
      min_dims == 2 && max_dims == 2 ? "AxB" : "AxB[x...]");
}

/// The flags every training example has.
struct CommonArgs {
  int steps = 200;
  shard::index_t grid = 64;
  std::uint64_t seed = 1;
  std::string mesh;            ///< empty: the example's default
  std::string device = "cpu";  ///< cpu | cuda
};

/// Limits of the common flags (an example passes what its model needs).
struct CommonLimits {
  shard::index_t min_grid = 1;
  shard::index_t max_grid = shard::index_t{1} << 20;
  int max_steps = 100000000;
  int mesh_min_dims = 2;
  int mesh_max_dims = 2;
  std::string mesh_help = "spatial mesh AxB (ranks along H x ranks along W)";
};

/// Adds --steps, --grid, --seed, --mesh and --device to `app`, with their ranges.
inline void add_common(CLI::App& app, CommonArgs& a, const CommonLimits& lim = {}) {
  app.add_option("--steps", a.steps, "training steps")
      ->check(decimal_integer())
      ->check(CLI::Range(1, lim.max_steps))->capture_default_str();
  app.add_option("--grid", a.grid, "grid points per side of the field")
      ->check(decimal_integer())
      ->check(CLI::Range(lim.min_grid, lim.max_grid))
      ->capture_default_str();
  app.add_option("--seed", a.seed, "seed of the data and the parameters (the same results at every rank count)")
      ->check(decimal_integer(false))
      ->capture_default_str();
  app.add_option("--mesh", a.mesh, lim.mesh_help)->check(mesh_check(lim.mesh_min_dims, lim.mesh_max_dims));
  app.add_option("--device", a.device, "cpu, or cuda (one GPU per rank: node-local rank modulo the visible GPUs)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
}

/// --precision into `value`: fp32, bf16, fp16 or autocast-bf16 (the examples' shared choices),
/// with the example's own description of what each does.
inline CLI::Option* add_precision(CLI::App& app, std::string& value, const std::string& help) {
  return app.add_option("--precision", value, help)
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "autocast-bf16"}))
      ->capture_default_str();
}

/// Parses argv. Returns -1 to go on, or the exit code to return from main: 0 after --help
/// (usage on stdout), 2 after a parse error (message + hint on stderr). Only prints when `print`.
inline int parse(CLI::App& app, int argc, char** argv, bool print) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (print) std::fputs(app.help().c_str(), stdout);
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    if (print) std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    if (print) std::fprintf(stderr, "%s: error: %s\nRun with --help for the flags.\n", app.get_name().c_str(), e.what());
    return kExitUsage;
  }
  return -1;
}

/// Checks that a mesh of `shape` (times `extra` data-parallel groups) holds exactly `ranks`.
inline void check_mesh_ranks(const std::vector<int>& shape, int extra, int ranks, const std::string& what) {
  long prod = extra;
  for (int s : shape) prod *= s;
  if (prod != ranks) {
    std::string dims;
    for (std::size_t i = 0; i < shape.size(); ++i) {  // (appends: GCC 12's -Wrestrict misfires on "x" + string)
      if (i) dims += 'x';
      dims += std::to_string(shape[i]);
    }
    throw UsageError(what + " " + dims + (extra != 1 ? " x " + std::to_string(extra) + " data groups" : "") + " = " +
                     std::to_string(prod) + " ranks, but " + std::to_string(ranks) + " were started");
  }
}

/// Balanced parts of extent n over p (DESIGN.md's one rule): the first n % p get n / p + 1.
inline std::vector<shard::index_t> balanced_bounds(shard::index_t n, int p) {
  std::vector<shard::index_t> b(static_cast<std::size_t>(p) + 1, 0);
  for (int i = 0; i < p; ++i) b[static_cast<std::size_t>(i) + 1] = b[static_cast<std::size_t>(i)] + n / p + (i < n % p ? 1 : 0);
  return b;
}

/// For models that cannot take a rank without cells (the U-Net can, so unet_surrogate does not
/// use it): refuses an extent `n` split over `parts` ranks (balanced) that leaves a rank with no
/// cell, at the full resolution or after any of `halvings` 2x downsamplings that map part
/// boundaries g to ceil(g / 2) and the extent to floor(n / 2). `what` names the flag or dim.
/// Throws UsageError.
inline void check_no_empty_parts(shard::index_t n, int parts, int halvings, const std::string& what) {
  const shard::index_t n0 = n;
  auto b = balanced_bounds(n, parts);
  for (int level = 0; level <= halvings; ++level) {
    for (int i = 0; i < parts; ++i) {
      if (b[static_cast<std::size_t>(i) + 1] <= b[static_cast<std::size_t>(i)])
        throw UsageError(what + ": extent " + std::to_string(n0) + " over " + std::to_string(parts) +
                         " ranks leaves rank " + std::to_string(i) + " of that dim with no cells" +
                         (level ? " after " + std::to_string(level) + " halving(s) (extent " +
                                      std::to_string(b.back()) + ")"
                                : std::string()) +
                         (halvings > 0 ? "; the model needs at least one cell per rank at every level (use a "
                                         "larger grid, fewer ranks along it, or a smaller depth)"
                                       : "; the model needs at least one cell per rank (use a larger grid, or "
                                         "fewer ranks along it)"));
    }
    n /= 2;
    for (auto& g : b) g = std::min((g + 1) / 2, n);
  }
}

/// Refuses an extent `n` too small for `halvings` 2x downsamplings of a U-Net (nn/unet.hpp: every
/// level must hold at least 2 cells before it is halved, extent n -> floor(n / 2)). Throws
/// UsageError naming both flags.
inline void check_halvings(shard::index_t n, int halvings, const std::string& extent_flag,
                           const std::string& halvings_flag) {
  shard::index_t e = n;
  for (int level = 0; level < halvings; ++level, e /= 2)
    if (e < 2)
      throw UsageError(extent_flag + " " + std::to_string(n) + " is too small for " + halvings_flag + " " +
                       std::to_string(halvings) + ": extent " + std::to_string(e) + " at level " + std::to_string(level) +
                       " cannot be halved (the grid needs at least 2^" + std::to_string(halvings) + " = " +
                       std::to_string(shard::index_t{1} << std::min(halvings, 62)) + " points per side)");
}

/// Runs `body` (returns the exit code) and turns every exception into a message and an exit
/// code: UsageError -> 2, shard::Error and any other exception -> 1. Usage errors are printed
/// only when `print` (every rank finds them alike; the body may set it once it knows its rank);
/// runtime errors on every rank that has one.
template <class F>
int run_main(const char* prog, const bool& print, F&& body) noexcept {
  try {
    return body();
  } catch (const UsageError& e) {
    if (print) std::fprintf(stderr, "%s: error: %s\nRun with --help for the flags.\n", prog, e.what());
    return kExitUsage;
  } catch (const shard::Error& e) {
    std::fprintf(stderr, "%s: %s\n", prog, e.what());
    return kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", prog, e.what());
    return kExitFailure;
  } catch (...) {
    std::fprintf(stderr, "%s: error: unknown exception\n", prog);
    return kExitFailure;
  }
}

}  // namespace examples::cli
