#!/usr/bin/env bash
# Builds bench_redistribute and runs it: redistribute Shard(0)->Shard(1) and Shard(0)->Replicate
# of an N x N fp32 DistTensor against hand-written MPI_Alltoallv / MPI_Allgatherv of the same
# bytes, interleaved in one run; prints the table of medians, the ratios and per-rank memory, and
# (with gnuplot) plots the medians with their p10-p90 range to docs/perf/redistribute_<N>_np<NP>.png.
#   bench/run_redistribute.sh                    # N=4096, 2 ranks, 60 repetitions
#   NP=4 N=8192 REPS=30 bench/run_redistribute.sh
# Uses BUILD_DIR / JOBS / CMAKE_ARGS / MPIEXEC_FLAGS like scripts/run_tests.sh (scripts/common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
need_plots
NP="${NP:-2}"
N="${N:-4096}"
REPS="${REPS:-60}"
PLOT="${PLOT:-$ROOT/docs/perf/redistribute_${N}_np${NP}.png}"
configure > /dev/null
build bench_redistribute > /dev/null
csv="$(mktemp --suffix=.csv)"
trap 'rm -f "$csv"' EXIT
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(getconf _NPROCESSORS_ONLN) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),"\
     "load average $(cut -d' ' -f1-3 /proc/loadavg), OMP_NUM_THREADS=$OMP_NUM_THREADS"
echo "# mpiexec -n $NP $MPIEXEC_FLAGS bench_redistribute --n $N --reps $REPS"
# shellcheck disable=SC2086
mpiexec -n "$NP" $MPIEXEC_FLAGS "$BUILD_DIR/bench/bench_redistribute" --n "$N" --reps "$REPS" --csv "$csv"
if command -v gnuplot > /dev/null && [ -s "$csv" ]; then
  mkdir -p "$(dirname "$PLOT")"
  gnuplot <<GP
set terminal pngcairo size 900,420 noenhanced
set output "$PLOT"
set datafile separator ","
set title "redistribute of a ${N}x${N} fp32 DistTensor at ${NP} ranks: median, p10-p90 (ms)"
set style fill solid 0.6
set boxwidth 0.6
set yrange [0:*]
set xtics rotate by -20
set grid ytics
plot "$csv" every ::1 using 0:2:xtic(1) with boxes notitle, \
     "" every ::1 using 0:2:3:4 with yerrorbars lc rgb "black" pt 0 notitle
GP
  echo "# plot: $PLOT"
fi
