#!/usr/bin/env bash
# Builds bench_dist_fft (needs libfftw3-mpi-dev) and runs it ROUNDS times at each rank count of
# RANKS, the rank counts interleaved within a round (so a burst of load hits one round, not one
# rank count). Every run's stdout goes to OUT_DIR/<part>_n<N>_np<P>_r<round>.txt with the load
# average before it; all CSV rows go to OUT_DIR/<part>_n<N>.csv as
#   round,load1,part,kind,dtype,n,ranks,variant,median_ms,p10_ms,p90_ms
# Then: /usr/bin/python3 bench/plot_dist_fft.py OUT_DIR/fft_n<N>.csv docs/perf/dist_fft.png
#   bench/run_dist_fft.sh                          # N=256, ranks 1 2 4, 3 rounds, part fft
#   N=128 ROUNDS=1 PART=conv bench/run_dist_fft.sh
# 4 ranks on a 2-core machine are oversubscribed (2 ranks per core): compare within a run. When
# ranks outnumber free cores, add "--mca mpi_yield_when_idle 1" to MPIEXEC_FLAGS: a rank spinning
# in a collective otherwise holds its core for a scheduler slice (small cases then take ~16 ms).
# Uses BUILD_DIR / JOBS / CMAKE_ARGS / MPIEXEC_FLAGS like scripts/run_tests.sh; SKIP_BUILD=1 skips the build.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
N="${N:-256}"
RANKS="${RANKS:-1 2 4}"
ROUNDS="${ROUNDS:-3}"
REPS="${REPS:-7}"
PART="${PART:-fft}"
OUT_DIR="${OUT_DIR:-$BUILD_DIR/dist_fft_results}"
EXTRA="${EXTRA:-}"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  configure > /dev/null
  build bench_dist_fft > /dev/null
fi
mkdir -p "$OUT_DIR"
csv="$OUT_DIR/${PART}_n${N}.csv"
: > "$csv"
tmp="$(mktemp --suffix=.csv)"
trap 'rm -f "$tmp"' EXIT
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(getconf _NPROCESSORS_ONLN) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), OMP_NUM_THREADS=$OMP_NUM_THREADS"
for round in $(seq 1 "$ROUNDS"); do
  for np in $RANKS; do
    load="$(cut -d' ' -f1 /proc/loadavg)"
    out="$OUT_DIR/${PART}_n${N}_np${np}_r${round}.txt"
    echo "# round $round, $np ranks, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%H:%M:%S UTC')" | tee "$out"
    : > "$tmp"
    # shellcheck disable=SC2086
    mpiexec -n "$np" $MPIEXEC_FLAGS "$BUILD_DIR/bench/bench_dist_fft" --n "$N" --reps "$REPS" --part "$PART" \
      --csv "$tmp" --describe $EXTRA >> "$out" 2>&1
    grep -v '^#\|dims=\|^transpose' "$out" | grep -E 'ratio|ours/|median|rel diff|elements' || true
    sed "s/^/$round,$load,/" "$tmp" >> "$csv"
  done
done
echo "# CSV: $csv"
