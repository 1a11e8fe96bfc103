#!/usr/bin/env bash
# Ring attention strong scaling (issue 7, benchmark 7.2): forward+backward of F::ring_attention,
# fp32, q/k/v [1, N, H, D] with tokens sharded over the ranks, 2 ranks x 1 thread against 1 rank x
# 1 thread (OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1). Prints one line per run and the table of
# medians, the speedup t1/t2, the wall-clock efficiency t1/(2 t2) and the CPU-time efficiency
# c1/(2 c2) (c = CPU time of the busiest rank per step: how evenly and with how little extra work
# the ring splits the step, whatever share of the cores a loaded machine gives the ranks).
#   bench/run_ring_attention.sh                              # SEQS="1024 2048 4096 8192 16384", H=1, D=64
#   SEQS="4096 8192" HEADS=8 ITERS=3 CAUSAL=1 bench/run_ring_attention.sh
# Uses BUILD_DIR / JOBS / CMAKE_ARGS / MPIEXEC_FLAGS like scripts/run_tests.sh (scripts/common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
SEQS="${SEQS:-1024 2048 4096 8192 16384}"
HEADS="${HEADS:-1}"
DIM="${DIM:-64}"
ITERS="${ITERS:-3}"
WARMUP="${WARMUP:-1}"
CAUSAL_FLAG=""
[ "${CAUSAL:-0}" = 1 ] && CAUSAL_FLAG="--causal"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
configure > /dev/null
build bench_ring_attention > /dev/null
csv="$(mktemp --suffix=.csv)"
trap 'rm -f "$csv"' EXIT
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(getconf _NPROCESSORS_ONLN) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),"\
     "load average $(cut -d' ' -f1-3 /proc/loadavg), OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
for n in $SEQS; do
  for np in 1 2; do
    # shellcheck disable=SC2086
    mpiexec -n "$np" $MPIEXEC_FLAGS "$BUILD_DIR/bench/bench_ring_attention" --seq "$n" --heads "$HEADS" --dim "$DIM" \
      --iters "$ITERS" --warmup "$WARMUP" $CAUSAL_FLAG --csv "$csv"
  done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
awk -F, '{ t[$2","$1] = $7; f[$2","$1] = $6; m[$2","$1] = $8; c[$2","$1] = $9; if (!($2 in seen)) { seen[$2] = 1; order[++k] = $2 } }
  END {
    printf "| seq | 1 rank fwd+bwd (ms) | 2 ranks fwd+bwd (ms) | speedup | efficiency (wall) | CPU ms/rank 1 -> 2 | efficiency (CPU) | peak MiB/rank 1 -> 2 |\n"
    printf "|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    for (i = 1; i <= k; ++i) { n = order[i]; a = t[n",1"]; b = t[n",2"];
      printf "| %d | %.1f | %.1f | %.2fx | %.0f%% | %.1f -> %.1f | %.0f%% | %.1f -> %.1f |\n", n, a, b, a / b, 100 * a / (2 * b),
             c[n",1"], c[n",2"], 100 * c[n",1"] / (2 * c[n",2"]), m[n",1"], m[n",2"] }
  }' "$csv"
