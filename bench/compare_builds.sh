#!/usr/bin/env bash
# Runs the CPU benchmarks of two builds (e.g. an old commit's and the current one) interleaved in
# one run, so that a shared, loaded machine slows both alike: round r runs A then B (odd r) or B
# then A (even r). Each command's full output is kept, prefixed by its build label, in LOG; the
# summary lines (medians) are printed at the end for docs/performance.md.
#
#   bench/compare_builds.sh OLD_BUILD_DIR NEW_BUILD_DIR [ROUNDS]      (LOG=... to choose the log)
#
# Both build dirs need the bench targets built (bench_conv_local, bench_conv_dist,
# bench_redistribute, bench_attention, bench_ring_attention, bench_norm_pool). One rank per core:
# OMP_NUM_THREADS=1 under mpiexec; the single-process benches use 1 thread too.
set -uo pipefail
A=${1:?old build dir}
B=${2:?new build dir}
ROUNDS=${3:-3}
for _d in "$A" "$B"; do
  bash "$(dirname "$0")/need_bench.sh" "$_d" bench_conv_local bench_conv_dist bench_redistribute bench_attention \
    bench_ring_attention bench_norm_pool || exit 1
done
LOG=${LOG:-$(mktemp --suffix=.compare.log)}
MPI="mpiexec --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader -n 2 -x OMP_NUM_THREADS=1"
export OMP_NUM_THREADS=1
cmds=(
  "bench/bench_conv_local --case 2d --reps 3 --peak 0"
  "bench/bench_conv_local --case 3d --reps 3 --peak 0"
  "MPI bench/bench_conv_dist --case conv2d --iters 3"
  "MPI bench/bench_redistribute --n 2048 --reps 20"
  "bench/bench_attention --n 2048 --reps 3 --peak 0"
  "MPI bench/bench_ring_attention --seq 4096 --iters 3"
  "bench/bench_norm_pool --benchmark_repetitions=3 --benchmark_report_aggregates_only=true"
)
run_one() {  # label builddir command
  local label=$1 dir=$2 c=$3 pre=""
  if [[ $c == MPI\ * ]]; then pre=$MPI; c=${c#MPI }; fi
  echo "### $label :: $c"
  local -a words
  read -ra words <<<"$c"
  words[0]=$dir/${words[0]}
  # shellcheck disable=SC2086
  $pre "${words[@]}" 2>&1 | sed "s/^/[$label] /"
}
{
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
       "$(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# old=$A new=$B rounds=$ROUNDS"
  for ((r = 1; r <= ROUNDS; ++r)); do
    for c in "${cmds[@]}"; do
      if ((r % 2)); then run_one old "$A" "$c"; run_one new "$B" "$c"
      else run_one new "$B" "$c"; run_one old "$A" "$c"; fi
    done
    echo "# round $r done, load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
} >"$LOG" 2>&1
echo "log: $LOG"
