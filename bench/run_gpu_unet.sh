#!/usr/bin/env bash
# U-Net training step on one GPU: shardtensor (examples/unet_surrogate --device cuda, 1 rank)
# against the same U-Net in PyTorch (bench/torch_unet_gpu.py) on the same GPU, fp32, TF32 off.
# Prints both lines and the ratio torch_time / ours (>= 0.9 is the issue's target).
#   BUILD_DIR=build GRID=1024 WIDTH=32 DEPTH=3 BATCH=4 STEPS=20 bash bench/run_gpu_unet.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
GRID="${GRID:-1024}" WIDTH="${WIDTH:-32}" DEPTH="${DEPTH:-3}" BATCH="${BATCH:-4}" STEPS="${STEPS:-20}"
EX="$BUILD_DIR/examples/unet_surrogate"
[ -x "$EX" ] || { echo "run_gpu_unet: $EX not built"; exit 1; }
MPIRUN="mpiexec -n 1"
[ "$(id -u)" -eq 0 ] && MPIRUN="mpiexec --allow-run-as-root -n 1"
ours=$($MPIRUN "$EX" --device cuda --grid "$GRID" --width "$WIDTH" --depth "$DEPTH" --batch "$BATCH" \
       --samples "$BATCH" --steps "$STEPS" --log-every "$STEPS" | tee /dev/stderr)
t_ours=$(echo "$ours" | sed -n 's/.*(\([0-9.]*\) s\/step).*/\1/p')
gpu_ours=$(echo "$ours" | sed -n 's/.*gpu \([0-9.]*\) MiB.*/\1/p' | tail -1)
torch_line=$(python3 "$ROOT/bench/torch_unet_gpu.py" --grid "$GRID" --width "$WIDTH" --depth "$DEPTH" \
             --batch "$BATCH" --steps "$STEPS")
echo "$torch_line"
t_torch=$(echo "$torch_line" | sed -n 's/.*s_per_step=\([0-9.]*\).*/\1/p')
mem_torch=$(echo "$torch_line" | sed -n 's/.*peak_mib=\([0-9.]*\).*/\1/p')
python3 - "$t_ours" "$t_torch" "$gpu_ours" "$mem_torch" <<'PY'
import sys
o, t, mo, mt = sys.argv[1:5]
print(f"unet step: shardtensor {float(o)*1e3:.2f} ms, torch {float(t)*1e3:.2f} ms, speed ratio torch/ours "
      f"{float(t)/float(o):.3f}; GPU peak MiB: ours {mo or '?'} torch {mt}")
PY
