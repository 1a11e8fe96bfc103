#pragma once
/// \file conv_algo_select.hpp
/// The host-only logic of the CUDA conv table's algorithm choice (src/cuda/conv_cuda.cpp), kept
/// free of CUDA / cuDNN headers so that tests/exec/test_conv_algo_select.cpp checks it on the CPU.
///
/// Like PyTorch's cudnn.benchmark:
///  * the trial workspace of cudnnFind*AlgorithmEx is the largest workspace an algorithm of the
///    pass asks for, within what the caching allocator can actually give: the driver's free
///    memory plus the blocks the allocator holds cached (freed by shardtensor, reusable), less a
///    margin, within a user cap (SHARDTENSOR_CUDNN_WORKSPACE_MIB); where that allocation still
///    fails (fragmentation), the request is halved until it succeeds;
///  * among the timed candidates, the fastest that succeeded, fits the workspace actually given
///    (and the cap), and is deterministic where ExecSettings::deterministic asks for it, wins;
///  * the choice is cached per problem (conv_cuda.cpp's problem_key); its workspace is taken from
///    the caching allocator at each call and given back after it, so no workspace outlives its call
///    and the trial workspaces never add up.
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace shard::exec::conv_select {

/// One candidate as cudnnFind*AlgorithmEx reports it (converted from its perf struct).
struct Candidate {
  int algo = 0;
  int math = 0;                ///< cudnnMathType_t
  std::size_t workspace = 0;   ///< bytes the algorithm needs
  float time_ms = 0;           ///< measured time (cuDNN's Find)
  bool ok = false;             ///< status == CUDNN_STATUS_SUCCESS
  bool deterministic = false;  ///< determinism == CUDNN_DETERMINISTIC
};

/// The user cap of SHARDTENSOR_CUDNN_WORKSPACE_MIB = `value` in bytes: nullopt (no cap) for
/// unset or empty; a non-negative decimal number of MiB otherwise (0: workspace-free algorithms
/// only). Returns `error` non-empty (and nullopt) for anything else, so the caller can refuse it.
inline std::optional<std::size_t> parse_workspace_cap_mib(const char* value, std::string* error = nullptr) {
  if (!value || !*value) return std::nullopt;
  const std::string s(value);
  if (s.find_first_not_of("0123456789") != std::string::npos || s.size() > 12) {
    if (error) *error = "SHARDTENSOR_CUDNN_WORKSPACE_MIB='" + s + "' is not a non-negative integer number of MiB";
    return std::nullopt;
  }
  return static_cast<std::size_t>(std::strtoull(value, nullptr, 10)) << 20;
}

/// Memory kept free during the search for the allocations that follow it (cuDNN's own, the
/// context's scratch): 1/16 of what is available, at least 64 MiB.
inline std::size_t search_margin(std::size_t available) {
  return std::max<std::size_t>(available / 16, std::size_t{64} << 20);
}

/// Bytes to request for the trial workspace: what the allocator can give (`free_device`: the
/// driver's free memory; `cached`: bytes the caching allocator holds free for reuse) less the
/// margin, within `cap`.
inline std::size_t search_limit(std::size_t free_device, std::size_t cached, std::optional<std::size_t> cap) {
  const std::size_t available = free_device + cached;
  const std::size_t margin = search_margin(available);
  std::size_t limit = available > margin ? available - margin : 0;
  if (cap) limit = std::min(limit, *cap);
  return limit;
}

/// The trial workspace to request: the largest workspace any algorithm of the pass reports
/// (cudnnGetConvolution*WorkspaceSize per algorithm; `sizes`) that fits `limit` (search_limit),
/// as PyTorch's getMaxWorkspaceSize does, so a search does not take all free memory when no
/// algorithm would use it.
inline std::size_t trial_request(const std::vector<std::size_t>& sizes, std::size_t limit) {
  std::size_t want = 0;
  for (std::size_t s : sizes)
    if (s <= limit) want = std::max(want, s);
  return want;
}

/// The next, smaller request after an allocation of `bytes` failed: half, or 0 below 1 MiB
/// (then only workspace-free algorithms are tried).
inline std::size_t next_request(std::size_t bytes) { return bytes >= (std::size_t{2} << 20) ? bytes / 2 : 0; }

/// The fastest usable candidate: succeeded, needs at most `workspace_limit` bytes, deterministic
/// when `deterministic`. Ties in time go to the smaller workspace, then to the earlier one
/// (cuDNN's order). nullopt when none qualifies.
inline std::optional<Candidate> pick_fastest(const std::vector<Candidate>& cands, bool deterministic,
                                             std::size_t workspace_limit) {
  std::optional<Candidate> best;
  for (const Candidate& c : cands) {
    if (!c.ok || c.workspace > workspace_limit || (deterministic && !c.deterministic)) continue;
    if (!best || c.time_ms < best->time_ms || (c.time_ms == best->time_ms && c.workspace < best->workspace)) best = c;
  }
  return best;
}

}  // namespace shard::exec::conv_select
