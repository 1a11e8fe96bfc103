#!/usr/bin/env bash
# ViT memory and latency (issue 7, benchmarks 7.3 and 7.4) with bench/bench_vit.cpp: a 2-D ViT,
# fp32, one [1, 1, R, R] field sharded over an h x w mesh (1x1, 2x1, 2x2), patch 8, dim 32,
# 2 heads, 2 layers (small enough that the token sequence, not the parameters, dominates memory).
#  7.3 (memory): one training step (zero_grad, forward, mse_loss, backward, AdamW step) after one
#      warm-up step, at every resolution in RESS, at 1, 2 and 4 ranks x 1 thread, for every
#      attention form in FORMS; per-rank peak of shardtensor's live bytes (memory_stats) and VmHWM.
#      Memory does not depend on the load: each configuration runs once (MEM_ROUNDS=1).
#  7.4 (latency): forward under NoGradGuard at LAT_RES, 1, 2, 4 ranks x 1 thread and 1 rank x 2
#      threads, ROUNDS interleaved rounds of LAT_ITERS forwards (after a warm-up) per launch;
#      medians over the rounds of each launch's median. The machine has 2 cores: 4 ranks are
#      oversubscribed (wall time then measures the scheduler; the CPU columns say how much work).
# Every configuration is its own launch. Writes (OUTDIR, default docs/perf):
#   vit_results.log       the RESULT lines (one per launch) with the date and load
#   vit_memory_<form>.dat memory table (res, tokens, peak MiB at 1/2/4 ranks, VmHWM, ...)
#   vit_latency.dat       latency table
#   vit_memory.png, vit_latency.png (gnuplot bench/plot_vit_memory.gp, bench/plot_vit_latency.gp)
# and prints the markdown tables of docs/performance.md.
#   bench/run_vit.sh                         # RESS="128 256 512 1024" FORMS="ring neighborhood"
#   RESS="128 256" LAT_RES=512 ROUNDS=1 OUTDIR=/tmp/vit bench/run_vit.sh   (a quick check)
#   RESS="" FORMS=ring OUTDIR=/tmp/vitlat bench/run_vit.sh                  (latency only)
# Uses BUILD_DIR / JOBS / CMAKE_ARGS / MPIEXEC_FLAGS like scripts/run_tests.sh (scripts/common.sh);
# SKIP_BUILD=1 runs the existing binary; TABLES_ONLY=1 only redoes the tables and plots from the log.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
need_plots
RESS="${RESS-128 256 512 1024}"  # set but empty: latency only
FORMS="${FORMS:-ring neighborhood}"
LAT_RES="${LAT_RES:-1024}"
LAT_FORM="${LAT_FORM:-ring}"
LAT_ITERS="${LAT_ITERS:-3}"
ROUNDS="${ROUNDS:-3}"
MEM_ROUNDS="${MEM_ROUNDS:-1}"
MODEL="${MODEL:---patch 8 --dim 32 --heads 2 --layers 2 --window 7}"
OUTDIR="${OUTDIR:-$ROOT/docs/perf}"
export OPENBLAS_NUM_THREADS=1
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  configure > /dev/null
  build bench_vit > /dev/null
fi
mkdir -p "$OUTDIR"
LOG="$OUTDIR/vit_results.log"
BIN="$BUILD_DIR/bench/bench_vit"
stamp() { echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC') load average $(cut -d' ' -f1-3 /proc/loadavg)"; }
if [ "${TABLES_ONLY:-0}" != 1 ]; then
{
  echo "# bench/run_vit.sh on $(getconf _NPROCESSORS_ONLN) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),"\
       "RESS='$RESS' FORMS='$FORMS' LAT_RES=$LAT_RES ROUNDS=$ROUNDS MODEL='$MODEL'"
  stamp
} | tee "$LOG"
run() {  # run NP THREADS ARGS...
  local np=$1 th=$2
  shift 2
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=$th mpiexec -n "$np" $MPIEXEC_FLAGS -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$BIN" $MODEL "$@" |
    grep '^RESULT' | tee -a "$LOG"
}
# 7.3: memory against resolution (interleaved over ranks and forms)
for r in $(seq 1 "$MEM_ROUNDS"); do
  for res in $RESS; do
    for form in $FORMS; do
      for np in 1 2 4; do run "$np" 1 --mode train --res "$res" --attention "$form" --warmup 1 --iters 1; done
    done
    stamp | tee -a "$LOG"
  done
done
# 7.4: inference latency against ranks (interleaved rounds)
for r in $(seq 1 "$ROUNDS"); do
  for cfg in "1 1" "2 1" "4 1" "1 2"; do
    # shellcheck disable=SC2086
    run $cfg --mode infer --res "$LAT_RES" --attention "$LAT_FORM" --warmup 1 --iters "$LAT_ITERS"
  done
  stamp | tee -a "$LOG"
done
fi

# --- tables and data files -------------------------------------------------------------------
kv='{ for (i = 2; i <= NF; ++i) { split($i, kvp, "="); f[kvp[1]] = kvp[2] } }'
for form in $FORMS; do
  awk "$kv"' f["mode"] == "train" && f["attention"] == form {
      k = f["res"]; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
      tok[k] = f["tokens"]; p[k "," f["ranks"]] = f["peak_MiB"]; h[k "," f["ranks"]] = f["hwm_MiB"]
      rp[k "," f["ranks"]] = f["repl_param_MiB"] }
    END {
      print "# ViT training step, per-rank peak MiB (max over ranks), attention " form
      print "# res tokens peak1 peak2 peak4 ideal2 ideal4 hwm1 hwm2 hwm4 ratio2 ratio4 repl_param_MiB"
      for (i = 1; i <= n; ++i) { k = order[i]; a = p[k ",1"]; b = p[k ",2"]; c = p[k ",4"]
        printf "%s %s %.3f %.3f %.3f %.3f %.3f %s %s %s %.3f %.3f %s\n", k, tok[k], a, b, c, a / 2, a / 4,
               h[k ",1"], h[k ",2"], h[k ",4"], b / (a / 2), c / (a / 4), rp[k ",1"] } }' form="$form" "$LOG" \
    > "$OUTDIR/vit_memory_$form.dat"
done
awk "$kv"' f["mode"] == "infer" {
    k = f["ranks"] "x" f["threads"]; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
    c[k]++; w[k, c[k]] = f["wall_ms"]; cm[k, c[k]] = f["cpu_ms_max"]; cs[k, c[k]] = f["cpu_ms_sum"]; pk[k] = f["peak_MiB"]
    res = f["res"]; tok = f["tokens"] }
  function med(arr, k, m,   i, j, t, v) { for (i = 1; i <= m; ++i) v[i] = arr[k, i]
    for (i = 1; i <= m; ++i) for (j = i + 1; j <= m; ++j) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return v[int(m / 2) + 1] }
  END {
    print "# ViT inference (forward, NoGradGuard) at " res "^2 (" tok " tokens); medians over " c[order[1]] " launches"
    print "# config ranks threads wall_ms cpu_ms_max cpu_ms_sum peak_MiB"
    for (i = 1; i <= n; ++i) { k = order[i]; split(k, rt, "x")
      printf "%s %s %s %.1f %.1f %.1f %.3f\n", k, rt[1], rt[2], med(w, k, c[k]), med(cm, k, c[k]), med(cs, k, c[k]), pk[k] } }' \
  "$LOG" > "$OUTDIR/vit_latency.dat"

for form in $FORMS; do
  echo
  echo "7.3, $form attention: per-rank peak MiB of shardtensor's live bytes (ratio = peak_P / (peak_1 / P)); VmHWM MiB"
  echo "| field | tokens | 1 rank | 2 ranks (ratio) | 4 ranks (ratio) | VmHWM 1 / 2 / 4 |"
  echo "|---:|---:|---:|---:|---:|---:|"
  grep -v '^#' "$OUTDIR/vit_memory_$form.dat" |
    awk '{ printf "| %s^2 | %s | %.2f | %.2f (%.3f) | %.2f (%.3f) | %s / %s / %s |\n", $1, $2, $3, $4, $11, $5, $12, $8, $9, $10 }'
done
echo
echo "7.4: inference latency at ${LAT_RES}^2 ($LAT_FORM attention), medians"
echo "| ranks x threads | wall ms | CPU ms (busiest rank) | CPU ms (sum over ranks) | speedup (wall) vs 1x1 | peak MiB/rank |"
echo "|---|---:|---:|---:|---:|---:|"
grep -v '^#' "$OUTDIR/vit_latency.dat" |
  awk 'NR == 1 { w1 = $4 } { printf "| %s x %s | %.1f | %.1f | %.1f | %.2fx | %.2f |\n", $2, $3, $4, $5, $6, w1 / $4, $7 }'

if command -v gnuplot > /dev/null; then
  gp_vars="outdir='$OUTDIR'; res='$LAT_RES'; forms='$FORMS'"
  if [ -n "$RESS" ]; then (cd "$ROOT" && gnuplot -e "$gp_vars" bench/plot_vit_memory.gp); fi
  (cd "$ROOT" && gnuplot -e "$gp_vars" bench/plot_vit_latency.gp)
  echo "plots: $OUTDIR/vit_memory.png $OUTDIR/vit_latency.png"
fi
