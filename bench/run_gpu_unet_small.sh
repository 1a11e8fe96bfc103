#!/usr/bin/env bash
# The launch-bound U-Net step (issue 30's target: with the CUDA graph >= 2x torch eager at 64^2 and
# 256^2): bench/run_gpu_unet.sh at each of GRIDS (default "64 256"; width 32, depth 3, batch 4, fp32,
# TF32 off), ours eager, ours with --cuda-graph (shard::CapturedStep) and torch eager, steady state
# against steady state. Prints, per grid, the lines of run_gpu_unet.sh (its "unet step ... speed
# ratio torch/ours" line is the eager one; "cuda graph A/B: ... speed ratio torch/ours-graph" the
# graph's).
#   BUILD_DIR=build GRIDS="64 256" STEPS=50 WARMUP=5 bash bench/run_gpu_unet_small.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for g in ${GRIDS:-64 256}; do
  echo "== grid $g"
  FUSION_AB=0 GRAPH_AB=1 GRID="$g" STEPS="${STEPS:-50}" WARMUP="${WARMUP:-5}" bash "$ROOT/bench/run_gpu_unet.sh" "$@" 2>/dev/null |
    grep -E '^(unet step|cuda graph|torch_unet|graph run)' | sed "s/^/grid $g: /"
done
