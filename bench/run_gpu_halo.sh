#!/usr/bin/env bash
# Halo exchange on device: NCCL against the MPI fallback (issue 6, item 9). On a GPU machine:
#   NP=2 BUILD_DIR=build REPS=20 bash bench/run_gpu_halo.sh [extra bench_halo_gpu args]
# Runs build/bench/bench_halo_gpu at NP ranks (one GPU per rank where there are NP GPUs; with
# fewer GPUs ranks share one and the nccl line is skipped, NCCL refuses duplicate GPUs) and prints
# a table of forward / adjoint medians and the ratios mpi / nccl (> 1: NCCL is faster).
# Without a GPU the benchmark prints "SKIP ..." and this script exits 0.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
NP="${NP:-2}" REPS="${REPS:-20}"
BIN="$BUILD_DIR/bench/bench_halo_gpu"
bash "$(dirname "${BASH_SOURCE[0]}")/need_bench.sh" "$BUILD_DIR" bench_halo_gpu
MPIRUN=(mpiexec -n "$NP")
[ "$(id -u)" -eq 0 ] && MPIRUN=(mpiexec --allow-run-as-root -n "$NP")
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
date -u +"%Y-%m-%d %H:%M UTC"
out=$("${MPIRUN[@]}" "$BIN" --reps "$REPS" "$@" | tee /dev/stderr)
python3 - <<PY
import sys
rows = {}
for line in """$out""".splitlines():
    f = line.split()
    if f and f[0] == "RESULT":
        kv = dict(zip(f[2::2], f[3::2]))
        rows[f[1]] = kv
if not rows:
    sys.exit(0)
print()
print("| transport | ranks | bytes/rank | fwd ms | adjoint ms | fwd ratio vs nccl | adjoint ratio vs nccl |")
print("|---|---:|---:|---:|---:|---:|---:|")
n = rows.get("nccl")
for name, kv in rows.items():
    fr = ar = "-"
    if n:
        fr = f"{float(kv['fwd_ms']) / float(n['fwd_ms']):.2f}"
        ar = f"{float(kv['adj_ms']) / float(n['adj_ms']):.2f}"
    print(f"| {name} | {kv['ranks']} | {kv['bytes_per_rank']} | {kv['fwd_ms']} | {kv['adj_ms']} | {fr} | {ar} |")
PY
