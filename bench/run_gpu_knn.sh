#!/usr/bin/env bash
# kNN at 1M points on one GPU against a torch twin (issue 31's acceptance). On a GPU machine:
#   N=1000000 K=16 REPS=3 BUILD_DIR=build bash bench/run_gpu_knn.sh
# Runs build/bench/bench_dist_neighbors --device cuda at 1 rank (uniform points in [0,1)^3, every
# point querying its K nearest among all N; the ring and spatial-halo schedules, which at 1 rank
# are both the local search) and bench/torch_knn.py --device cuda (torch.cdist + topk in chunks of
# CHUNK queries) on the same points (--dump), and prints one table: medians, the checksum each
# side printed (sum over queries of the K-th distance: equal when both answer the same question),
# and torch/ours (> 1: ours is faster). Without a GPU the benchmark prints SKIP and this exits 0.
# PYTHON (default python3) must import torch with CUDA.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
N="${N:-1000000}" K="${K:-16}" REPS="${REPS:-3}" CHUNK="${CHUNK:-2048}" PY="${PYTHON:-python3}"
BIN="$BUILD_DIR/bench/bench_dist_neighbors"
bash "$(dirname "${BASH_SOURCE[0]}")/need_bench.sh" "$BUILD_DIR" bench_dist_neighbors
MPIRUN=(mpiexec -n 1)
[ "$(id -u)" -eq 0 ] && MPIRUN=(mpiexec --allow-run-as-root -n 1)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
date -u +"%Y-%m-%d %H:%M UTC"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ours=$("${MPIRUN[@]}" "$BIN" --device cuda --n "$N" --k "$K" --reps "$REPS" --dist uniform --query knn \
        --dump "$tmp/points.f32" | tee /dev/stderr)
if grep -q '^SKIP' <<<"$ours"; then exit 0; fi
theirs=$("$PY" "$ROOT/bench/torch_knn.py" "$tmp/points.f32" --device cuda --k "$K" --reps "$REPS" \
          --chunk "$CHUNK" --query knn | tee /dev/stderr)
"$PY" - "$ours" "$theirs" "$N" "$K" <<'PY'
import sys
ours, theirs, n, k = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = {}
for l in ours.splitlines():
    f = l.split()
    if len(f) >= 12 and f[0] == "uniform" and f[1] == "knn":
        rows[f[2]] = (float(f[3]), float(f[10]), float(f[8]))  # median_ms, check_dist, peak_MiB
t = next((l.split() for l in theirs.splitlines() if l.startswith("knn ")), None)
if not rows or not t:
    print("run_gpu_knn: missing output (see above)"); sys.exit(1)
tm, tc = float(t[t.index("median_ms") + 1]), float(t[t.index("check_dist") + 1])
tp = t[t.index("gpu_peak_mib") + 1] if "gpu_peak_mib" in t else "-"
print()
print(f"kNN on one GPU, N={n}, k={k}, uniform in [0,1)^3, every point a query")
print("| case | median ms | check_dist | GPU peak MiB | torch/ours |")
print("|---|---:|---:|---:|---:|")
print(f"| torch cdist+topk | {tm:.1f} | {tc:.6f} | {tp} | 1.00 |")
for name, (m, c, p) in rows.items():
    agree = "" if abs(c - tc) <= 1e-4 * max(1.0, abs(tc)) else " (checksum differs)"
    print(f"| shardtensor {name} | {m:.1f} | {c:.6f}{agree} | {p:.1f} | {tm / m:.2f} |")
for name, (m, c, p) in rows.items():
    print(f"ratio knn_{name}: torch/ours {tm / m:.3f}")
PY
