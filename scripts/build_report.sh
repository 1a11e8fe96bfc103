#!/usr/bin/env bash
# Where the time of README command (b) goes (issue 33): the compile time per TU and per target
# from Ninja's log, and the ctest time per test from run_tests.sh's ctest log.
#   scripts/build_report.sh [BUILD_DIR] [N]     (defaults: build, 20)
# Compile times are wall seconds per compiler process as Ninja saw them: with -j2 on 2 cores they
# add up to about twice the build's wall time, and a loaded machine inflates them all alike.
# The ctest log is $BUILD_DIR/ctest.log (run_tests.sh writes it).
set -euo pipefail
B="${1:-build}"
N="${2:-20}"
if [ -f "$B/.ninja_log" ]; then
  # v5 lines: start_ms end_ms mtime output hash; a rebuilt output keeps its last entry.
  awk -v N="$N" 'NR > 1 && $1 ~ /^[0-9]+$/ { d[$4] = ($2 - $1) / 1000.0 }
    END {
      for (o in d) {
        t = o
        if (match(o, /CMakeFiles\/[^\/]*\.dir\//)) { t = substr(o, RSTART + 11, RLENGTH - 16) }
        else if (o ~ /\.gch$/) t = "pch"
        else t = "link/other"
        tgt[t] += d[o]; cnt[t]++; total += d[o]
      }
      printf "compile: %d outputs, %.0f s summed over compiler processes\n", length(d), total
      printf "top %d translation units (s):\n", N
      for (o in d) print d[o], o | "sort -rn | head -n " N " | awk '\''{printf \"  %8.1f  %s\\n\", $1, $2}'\''"
      close("sort -rn | head -n " N " | awk '\''{printf \"  %8.1f  %s\\n\", $1, $2}'\''")
      printf "per target (s, TUs):\n"
      for (t in tgt) print tgt[t], cnt[t], t | "sort -rn | awk '\''{printf \"  %8.1f  %4d  %s\\n\", $1, $2, $3}'\''"
    }' "$B/.ninja_log"
else
  echo "build_report: no $B/.ninja_log (configure with -G Ninja: run_tests.sh does when ninja is installed)"
fi
if [ -f "$B/ctest.log" ]; then
  echo "top $N ctest tests (s):"
  # Test names may hold spaces (the Catch2 cases): the name is what comes before the dot leader.
  sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: (.*[^ .]) \.+.* ([0-9.]+) sec$/\2\t\1/p' "$B/ctest.log" |
    sort -rn | head -n "$N" | awk -F '\t' '{printf "  %8.1f  %s\n", $1, $2}'
  sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: (.*[^ .]) \.+.* ([0-9.]+) sec$/\2/p' "$B/ctest.log" |
    awk '{s += $1; n++} END {printf "ctest: %d tests, %.0f s summed (run in parallel: see the wall time)\n", n, s}'
fi
