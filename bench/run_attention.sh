#!/usr/bin/env bash
# Issue 7, benchmark 1: the local attention kernel (bench_attention) against PyTorch's
# softmax(q k^T / sqrt(d)) v with autograd (bench/torch_attention_ref.py, Debian python3-torch),
# fp32, 1 process x 2 threads, B = 1, 8 heads x head dim 64, forward + backward.
# Runs are interleaved (ours, torch, ours, torch, ...) over ROUNDS rounds, one case per process
# (peak RSS growth per case; torch repeats TORCH_REPS=1 times after a warm-up), and the RESULT lines are summarised as medians at the end.
#
#   bench/run_attention.sh [build-dir]          (ROUNDS=3 NS="4096 16384" by default)
#
# Torch at 16k tokens would hold ~8 GiB per [8, N, N] fp32 matrix (over this machine's memory
# with its autograd intermediates), so at N >= TORCH_PER_HEAD_FROM tokens it runs ONE head
# (--heads 1 --per-head 1) and the table scales its time by the head count (8x) and reports its
# memory as measured for one head (the 8-head batched peak is quadratic: see the 4k row).
set -euo pipefail
BUILD=${1:-build}
bash "$(dirname "$0")/need_bench.sh" "$BUILD" bench_attention
ROUNDS=${ROUNDS:-3}
NS=${NS:-"4096 16384"}
TORCH_PER_HEAD_FROM=${TORCH_PER_HEAD_FROM:-16384}
PY=${PY:-/usr/bin/python3}
OUT=${OUT:-/tmp/attention_bench_$$.log}
export OMP_NUM_THREADS=2
: > "$OUT"
echo "# $(date -u) $(uptime)" | tee -a "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for n in $NS; do
    reps=3; warm=1
    if [ "$n" -ge 16384 ]; then reps=1; warm=0; fi
    peak=0; [ "$r" = 1 ] && peak=1
    "$BUILD/bench/bench_attention" --n "$n" --reps "$reps" --warmup "$warm" --peak "$peak" | tee -a "$OUT"
    if [ "$n" -ge "$TORCH_PER_HEAD_FROM" ]; then
      "$PY" bench/torch_attention_ref.py --n "$n" --heads 1 --per-head 1 --reps 1 --warmup 0 --threads 2 | tee -a "$OUT"
    else
      "$PY" bench/torch_attention_ref.py --n "$n" --reps "${TORCH_REPS:-1}" --warmup 1 --threads 2 | tee -a "$OUT"
    fi
    echo "# $(uptime)" | tee -a "$OUT"
  done
done
echo "== medians over $ROUNDS rounds (wall ms, CPU ms, peak RSS growth MB); torch per-head rows x8 heads"
"$PY" - "$OUT" <<'PYEOF'
import re, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("RESULT"):
        continue
    f = dict(kv.split("=") for kv in line.split()[2:])
    who = line.split()[1]
    key = (who, int(f["N"]), f.get("per_head", "0"))
    rows.setdefault(key, []).append(f)
ours = {}
for (who, n, ph), fs in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0])):
    scale = 8 if ph == "1" else 1
    t = st.median(float(f["total_ms"]) for f in fs) * scale
    c = st.median(float(f["cpu_ms"]) for f in fs) * scale
    m = st.median(float(f["rss_mb"]) for f in fs)
    tag = who + (" (1 head x8)" if ph == "1" else "")
    if who == "ours":
        ours[n] = (t, c)
        print(f"N={n:6d} {tag:18s} wall {t:10.1f}  cpu {c:10.1f}  rss {m:8.1f}  (runs {len(fs)})")
    else:
        ot, oc = ours.get(n, (float('nan'), float('nan')))
        print(f"N={n:6d} {tag:18s} wall {t:10.1f}  cpu {c:10.1f}  rss {m:8.1f}  (runs {len(fs)})  "
              f"ours faster x{t / ot:.1f} (wall), x{c / oc:.1f} (cpu)")
PYEOF
