#!/usr/bin/env bash
# GPU conv vs PyTorch (cuDNN), fp32, TF32 off (issue 6, item 9). One command on a GPU machine:
#   bench/run_gpu_conv.sh [BUILD_DIR=build] [REPS=10] [PYTHON=python3]
# Runs build/bench/bench_conv_gpu and bench/torch_conv_gpu.py, alternating (ours, torch, ours,
# torch) so both see the same GPU state, and prints per case the best median of each side, the
# speed ratio torch_time / our_time (>= 0.95 is the target) and both device memory high-water marks.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-${BUILD_DIR:-$here/../build}}
reps=${REPS:-10}
py=${PYTHON:-python3}
bin=$build/bench/bench_conv_gpu
bash "$here/need_bench.sh" "$build" bench_conv_gpu
log=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
date -u +"%Y-%m-%d %H:%M UTC"
for round in 1 2; do
  "$bin" --reps "$reps" | tee -a "$log/ours.txt"
  "$py" "$here/torch_conv_gpu.py" --reps "$reps" | tee -a "$log/torch.txt"
done
python3 - "$log/ours.txt" "$log/torch.txt" <<'PY'
import sys
def parse(path):
    best = {}
    for line in open(path):
        if not line.startswith("RESULT "):
            continue
        f = line.split()
        name, kv = f[1], dict(zip(f[2::2], map(float, f[3::2])))
        if name not in best or kv["total_ms"] < best[name]["total_ms"]:
            best[name] = kv
    return best
ours, torch = parse(sys.argv[1]), parse(sys.argv[2])
print()
print(f"| case | ours fwd+bwd ms | torch fwd+bwd ms | speed ratio (torch/ours) | ours peak MiB | torch peak MiB |")
print(f"|---|---:|---:|---:|---:|---:|")
for name in ours:
    o, t = ours[name], torch.get(name)
    if t is None:
        print(f"| {name} | {o['total_ms']:.2f} | - | - | {o['peak_mib']:.0f} | - |")
        continue
    print(f"| {name} | {o['total_ms']:.2f} (fwd {o['fwd_ms']:.2f}) | {t['total_ms']:.2f} (fwd {t['fwd_ms']:.2f}) | "
          f"{t['total_ms'] / o['total_ms']:.3f} | {o['peak_mib']:.0f} | {t['peak_mib']:.0f} |")
PY
