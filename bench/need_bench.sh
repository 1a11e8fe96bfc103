#!/usr/bin/env bash
# Usage: bench/need_bench.sh [--timed] <build dir> <target>...
# Builds each benchmark (or example) executable that <build dir> does not have yet. README command
# (b) configures with SHARDTENSOR_BENCH_SYNTAX_ONLY=ON, where `all` only syntax-checks the
# benchmarks (bench/CMakeLists.txt); the bench/run_*.sh scripts call this before running theirs.
# --timed: the caller reports the examples' timings, so a build whose examples were compiled with
# SHARDTENSOR_EXAMPLE_OPT_FLAGS (command (b) sets -O1) is refused, with the command that fixes it.
set -euo pipefail
timed=0
[ "${1:-}" = --timed ] && { timed=1; shift; }
dir=$1
shift
if [ "$timed" = 1 ] && [ -f "$dir/CMakeCache.txt" ]; then
  opt=$(sed -n 's/^SHARDTENSOR_EXAMPLE_OPT_FLAGS:STRING=//p' "$dir/CMakeCache.txt")
  if [ -n "$opt" ]; then
    echo "need_bench: the examples in $dir were compiled with SHARDTENSOR_EXAMPLE_OPT_FLAGS=$opt (README command (b)'s" \
         "test build); their timings are not for reporting. Reconfigure: cmake -B $dir -DSHARDTENSOR_EXAMPLE_OPT_FLAGS=" >&2
    exit 1
  fi
fi
for t in "$@"; do
  bin=$(find "$dir/bench" "$dir/examples" -maxdepth 1 -type f -name "$t" 2>/dev/null | head -1)
  [ -n "$bin" ] && [ -x "$bin" ] && continue
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    echo "need_bench: $dir is not a configured build directory and has no $t" >&2
    exit 1
  fi
  echo "need_bench: building $t in $dir" >&2
  cmake --build "$dir" --target "$t" >&2
done
