#pragma once
/// \file error.hpp
/// shard::Error and the precondition-check macros used everywhere in shardtensor.
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace shard {

/// The one exception type shardtensor throws for violated preconditions and backend failures.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
/// World rank of this process for error messages (-1 before MPI is initialised / without MPI).
int error_rank() noexcept;

[[noreturn]] void throw_error(const char* op, const std::string& what, const char* file, int line);
}  // namespace detail

}  // namespace shard

/// Throws shard::Error("shardtensor: <op>: <message> [rank r] (file:line)") unless `cond` holds.
/// Usage: SHARD_CHECK(a == b, "redistribute", "shapes {} and {} differ", sa, sb);
#define SHARD_CHECK(cond, op, ...)                                                       \
  do {                                                                                   \
    if (!(cond)) [[unlikely]] {                                                          \
      ::shard::detail::throw_error(op, ::fmt::format(__VA_ARGS__), __FILE__, __LINE__); \
    }                                                                                    \
  } while (0)

/// Unconditionally throws shard::Error with a formatted message.
#define SHARD_FAIL(op, ...) ::shard::detail::throw_error(op, ::fmt::format(__VA_ARGS__), __FILE__, __LINE__)
