#!/usr/bin/env bash
# GroupNorm and layer_norm over tokens (ln_tok_*) on the GPU against PyTorch (issue 30, scope 3;
# issue 32 for the ViT's LayerNorm), fp32. On a GPU machine:
#   bench/run_gpu_norm.sh [BUILD_DIR=build] [REPS=20] [PYTHON=python3]
# Runs build/bench/bench_norm_gpu and bench/torch_norm_gpu.py, alternating (ours, torch, ours,
# torch), and prints per case the best median of each side, the achieved GB/s (bytes the op must
# move: 2 x bytes(x) forward, 3 x backward; with a residual, gn_res_silu_*: 3 x and 5 x) and the
# ratio torch_time / our_time (>= 1: ours is
# faster). Without a GPU both sides print SKIP and this script exits 0.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-${BUILD_DIR:-$here/../build}}
reps=${REPS:-20}
py=${PYTHON:-python3}
bin=$build/bench/bench_norm_gpu
bash "$here/need_bench.sh" "$build" bench_norm_gpu
log=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
date -u +"%Y-%m-%d %H:%M UTC"
for round in 1 2; do
  "$bin" --reps "$reps" | tee -a "$log/ours.txt"
  "$py" "$here/torch_norm_gpu.py" --reps "$reps" | tee -a "$log/torch.txt" || true
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
        tot = kv["fwd_ms"] + kv["bwd_ms"]
        if name not in best or tot < best[name]["fwd_ms"] + best[name]["bwd_ms"]:
            best[name] = kv
    return best
ours, torch = parse(sys.argv[1]), parse(sys.argv[2])
if not ours:
    sys.exit(0)
print()
print("| case | ours fwd ms | torch fwd ms | fwd torch/ours | ours bwd ms | torch bwd ms | bwd torch/ours | ours GB/s fwd / bwd | torch GB/s fwd / bwd |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for name, o in ours.items():
    t = torch.get(name)
    if t:
        print(f"| {name} | {o['fwd_ms']:.3f} | {t['fwd_ms']:.3f} | {t['fwd_ms'] / o['fwd_ms']:.2f} | {o['bwd_ms']:.3f} | "
              f"{t['bwd_ms']:.3f} | {t['bwd_ms'] / o['bwd_ms']:.2f} | {o['fwd_gbs']:.0f} / {o['bwd_gbs']:.0f} | "
              f"{t['fwd_gbs']:.0f} / {t['bwd_gbs']:.0f} |")
    else:
        print(f"| {name} | {o['fwd_ms']:.3f} | - | - | {o['bwd_ms']:.3f} | - | - | {o['fwd_gbs']:.0f} / {o['bwd_gbs']:.0f} | - |")
PY
