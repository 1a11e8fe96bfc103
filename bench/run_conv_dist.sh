#!/usr/bin/env bash
# Strong scaling of the domain-parallel conv (issue 3, scope 8 b/c): builds bench_conv_dist and
# runs each case (conv2d 16->16 3x3 on 1x16x1024^2, conv3d 8->8 3x3x3 on 1x8x128^3, fp32,
# forward+backward) as its own launch (so each process peak RSS belongs to one case):
#   1 rank  x 1 thread     (one core: the baseline of the per-core efficiency)
#   1 rank  x T1 threads   (OMP_NUM_THREADS=T1, default 2: both cores)
#   NP ranks x TP threads  (OMP_NUM_THREADS=TP, default NP=2, TP=1)
# Every launch uses --bind-to none (Open MPI binds a single rank to ONE core by default, which
# would serialise its threads). Prints the table: median times; the strong-scaling efficiency
# eff = t(1 rank x 1 thread) / (NP * t(NP ranks x TP)); the speedup over one rank using the same
# cores, t(1 rank x T1) / t(NP ranks); per-rank peaks and the target 1.1 * peak1 / NP + halo.
#   bench/run_conv_dist.sh                       # ITERS=5
#   ITERS=9 NP=2 bench/run_conv_dist.sh --no-overlap
# Uses BUILD_DIR / JOBS / CMAKE_ARGS / MPIEXEC_FLAGS like scripts/run_tests.sh (scripts/common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
NP="${NP:-2}"
T1="${T1:-2}"
TP="${TP:-1}"
ITERS="${ITERS:-5}"
CASES="${CASES:-conv2d conv3d}"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  configure > /dev/null
  build bench_conv_dist > /dev/null
fi
csv="$(mktemp --suffix=.csv)"
trap 'rm -f "$csv"' EXIT
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(getconf _NPROCESSORS_ONLN) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),"\
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
MPIEXEC_FLAGS="$MPIEXEC_FLAGS --bind-to none"
for c in $CASES; do
  echo "# OMP_NUM_THREADS=1 mpiexec -n 1 bench_conv_dist --case $c --iters $ITERS $*"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 mpiexec -n 1 $MPIEXEC_FLAGS "$BUILD_DIR/bench/bench_conv_dist" --case "$c" --iters "$ITERS" \
    --csv "$csv" "$@" > /dev/null
  echo "# OMP_NUM_THREADS=$T1 mpiexec -n 1 bench_conv_dist --case $c --iters $ITERS $*"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS="$T1" mpiexec -n 1 $MPIEXEC_FLAGS "$BUILD_DIR/bench/bench_conv_dist" --case "$c" --iters "$ITERS" \
    --csv "$csv" "$@" > /dev/null
  echo "# OMP_NUM_THREADS=$TP mpiexec -n $NP bench_conv_dist --case $c --iters $ITERS $*"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS="$TP" mpiexec -n "$NP" $MPIEXEC_FLAGS "$BUILD_DIR/bench/bench_conv_dist" --case "$c" \
    --iters "$ITERS" --csv "$csv" "$@" > /dev/null
done
# csv: case,ranks,threads,overlap,total_med,total_min,fwd_med,bwd_med,peak_MiB,rss_MiB,halo_MiB,cpu_med
awk -F, -v np="$NP" '
  $2 == 1 && $3 == 1 { s1[$1] = $5; c1[$1] = $12; order[++n] = $1 }
  $2 == 1 && $3 != 1 { t1[$1] = $5; p1[$1] = $9; r1[$1] = $10; th1[$1] = $3 }
  $2 == np { tp[$1] = $5; fp[$1] = $7; bp[$1] = $8; pp[$1] = $9; rp[$1] = $10; hp[$1] = $11; thp[$1] = $3; cp[$1] = $12 }
  END {
    printf "%-7s %10s %10s %10s %8s %8s %7s %9s %8s %10s %10s %10s %9s %s\n", "case", "t1x1_ms", "t1xT_ms",
           "tP_ms", "fwdP", "bwdP", "eff", "vs_1xT", "eff_cpu", "peak1_MiB", "peakP_MiB", "target", "rssP/1", "ok"
    for (i = 1; i <= n; ++i) {
      c = order[i]
      eff = s1[c] / (np * tp[c])
      target = 1.1 * p1[c] / np + hp[c]
      printf "%-7s %10.1f %10.1f %10.1f %8.1f %8.1f %6.1f%% %8.2fx %7.1f%% %10.1f %10.1f %10.1f %9.2f %s\n", c, s1[c],
             t1[c], tp[c], fp[c], bp[c], 100 * eff, t1[c] / tp[c], 100 * c1[c] / cp[c], p1[c], pp[c], target, rp[c] / r1[c],
             (eff >= 0.9 ? "eff-ok" : "eff-LOW") "," (pp[c] <= target ? "mem-ok" : "mem-HIGH")
    }
    printf "# eff = t(1 rank x 1 thread) / (%d * t(%d ranks x %d thread)); vs_1xT = t(1 rank x %d threads) / t(%d ranks);\n",
           np, np, thp[order[1]], th1[order[1]], np
    printf "# eff_cpu = CPU time of an iteration at 1 rank x 1 thread / CPU time summed over the %d ranks\n", np
  }' "$csv"
