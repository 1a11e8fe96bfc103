#!/usr/bin/env bash
# GPU local attention vs torch.nn.functional.scaled_dot_product_attention (issue 7, benchmark 5;
# target: ours >= 0.8x torch's speed, fp32 and bf16). One command on a GPU machine:
#   bench/run_gpu_attention.sh [BUILD_DIR=build] [REPS=10] [PYTHON=python3] [NS="4096 16384"]
# Alternates ours / torch (two rounds) per case and prints per case the best median of each side,
# the speed ratio torch_time / our_time and both device memory high-water marks.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-${BUILD_DIR:-$here/../build}}
reps=${REPS:-10}
py=${PYTHON:-python3}
ns=${NS:-"4096 16384"}
bin=$build/bench/bench_attention_gpu
bash "$here/need_bench.sh" "$build" bench_attention_gpu
log=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
date -u +"%Y-%m-%d %H:%M UTC"
for round in 1 2; do
  for dt in f32 bf16; do
    for n in $ns; do
      "$bin" --n "$n" --dtype "$dt" --reps "$reps" | tee -a "$log/ours.txt"
      "$py" "$here/torch_attention_gpu.py" --n "$n" --dtype "$dt" --reps "$reps" | tee -a "$log/torch.txt"
    done
  done
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
print(f"{'case':22s} {'ours ms':>10s} {'torch ms':>10s} {'torch/ours':>10s} {'ours MiB':>9s} {'torch MiB':>9s}")
for name in ours:
    o, t = ours[name], torch.get(name)
    if t is None:
        continue
    print(f"{name:22s} {o['total_ms']:10.3f} {t['total_ms']:10.3f} {t['total_ms'] / o['total_ms']:10.2f} "
          f"{o['peak_mib']:9.0f} {t['peak_mib']:9.0f}")
PY
