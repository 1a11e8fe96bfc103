#!/usr/bin/env bash
# ViT training step on one GPU against resolution (issue 32 item 4, the paper's ViT figures):
# shardtensor (examples/vit_surrogate --device cuda --attention ring) against the same ViT in
# PyTorch eager (bench/torch_vit_gpu.py: SDPA, autocast for bf16) on the same GPU, the inference
# latency of both (ours: bench/bench_vit --mode infer, median of 5 forwards), then the
# per-rank GPU peak at 1, 2 and 4 ranks sharing the GPU (the Fig. 4 shape: peak ~ single / P).
#   BUILD_DIR=build GRIDS="256 1024" PRECISIONS="bf16 fp32" PATCH=8 DIM=128 HEADS=2 LAYERS=2 \
#   WARMUP=2 STEPS=5 MEMGRID=1024 MEMPREC=bf16 RANKS="1 2 4" OUT_TSV=vit_gpu.tsv bash bench/run_gpu_vit.sh
# Precisions are vit_surrogate's: fp32 (TF32 off on both sides) and bf16 (our bf16 activations with
# f32 master parameters; torch: f32 parameters under torch.autocast(bfloat16)).
# Steady state against steady state: both sides run WARMUP untimed steps, then time STEPS steps as
# one window (the first step, with cuDNN's graph builds and algorithm search, is printed on its
# own); GPU peaks are over that window. Batch 1, one sample: tokens = (grid / patch)^2 in one
# sequence per head (head dim DIM / HEADS; 64 by default: cuDNN's fused attention for bf16, the
# tiled kernels for f32).
# Prints a markdown table row per (precision, grid) as it goes, a "ratio" line per case, then the
# memory rows "| mem P ranks ..." with peak / (single / P); OUT_TSV (optional) gets the numbers for
# plots (docs/perf/). Defaults fit gpu_check.sh's per-script BENCH_BUDGET (130 s) on an H100.
# GRAPH="bf16" (default; "" for none) at GRAPH_GRIDS ("256"): those also run ours with --cuda-graph and print
# "ratio vit_<prec>_grid<g>_cuda_graph: torch/ours step ..." (issue 30 item 4 on the ViT).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
GRIDS="${GRIDS:-256 1024}" PRECISIONS="${PRECISIONS:-bf16 fp32}" PATCH="${PATCH:-8}" DIM="${DIM:-128}"
HEADS="${HEADS:-2}" LAYERS="${LAYERS:-2}" WARMUP="${WARMUP:-2}" STEPS="${STEPS:-5}"
MEMGRID="${MEMGRID:-1024}" MEMPREC="${MEMPREC:-bf16}" RANKS="${RANKS:-1 2 4}" PY="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"  # cpu: a smoke run of our side (the torch side then reports nan)
GRAPH="${GRAPH:-bf16}"    # precisions also run with --cuda-graph (the step captured in a CUDA graph)
GRAPH_GRIDS="${GRAPH_GRIDS:-256}"  # ... at these grids (the budget: one extra run each)
OUT_TSV="${OUT_TSV:-${OUT:+$OUT/vit_gpu.tsv}}"  # gpu_check.sh runs with $OUT set: the file comes back
EX="$BUILD_DIR/examples/vit_surrogate"
BV="$BUILD_DIR/bench/bench_vit"
bash "$ROOT/bench/need_bench.sh" --timed "$BUILD_DIR" vit_surrogate bench_vit
[ -x "$EX" ] || { echo "run_gpu_vit: $EX not built"; exit 1; }
MPIRUN=(mpiexec --oversubscribe)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
date -u +"%Y-%m-%d %H:%M UTC"
tsv=$(mktemp)
echo -e "kind\tprecision\tgrid\ttokens\tranks\tours_s\ttorch_s\tours_first_s\ttorch_first_s\tours_peak_mib\ttorch_peak_mib\ttorch_infer_ms\tours_infer_ms" > "$tsv"

# ours: prints "s_per_step first_s peak_steady_mib" from vit_surrogate's steady-state line
ours() {  # ranks mesh grid precision [extra flags...]
  local np=$1 mesh=$2 grid=$3 prec=$4 line
  shift 4
  line=$("${MPIRUN[@]}" -n "$np" "$EX" --device "$DEVICE" --attention ring --mesh "$mesh" --grid "$grid" --patch "$PATCH" "$@" \
         --dim "$DIM" --heads "$HEADS" --layers "$LAYERS" --batch 1 --samples 1 --precision "$prec" \
         --steps "$((STEPS + WARMUP))" --warmup "$WARMUP" --log-every "$((STEPS + WARMUP))" 2>&1 |
         tee -a "$tsv.ours.log" | grep '^steady state:' | tail -1) || true
  "$PY" - "$line" <<'PY'
import re, sys
s = sys.argv[1]
def num(p):
    m = re.search(p, s)
    return m.group(1) if m else "nan"
print(num(r"([0-9.]+) s/step"), num(r"first step ([0-9.]+) s"), num(r"steady state ([0-9.]+) MiB\)"))
PY
}
kv() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
# ours, inference: the median forward (no grad, eval) of bench/bench_vit on one rank, ms
ours_infer() {  # grid precision
  local line
  line=$("${MPIRUN[@]}" -n 1 "$BV" --mode infer --device "$DEVICE" --precision "$2" --res "$1" --patch "$PATCH" \
         --dim "$DIM" --heads "$HEADS" --layers "$LAYERS" --warmup 1 --iters 5 2>&1 | grep '^RESULT ' | tail -1) || true
  local v; v=$(kv "$line" wall_ms); echo "${v:-nan}"
}

echo "| precision | grid | tokens | ours s/step | torch s/step | torch/ours | ours first s | torch first s | ours GPU MiB | torch GPU MiB | ours infer ms | torch infer ms |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for prec in $PRECISIONS; do
  for grid in $GRIDS; do
    tokens=$(( (grid / PATCH) * (grid / PATCH) ))
    read -r os of om < <(ours 1 1x1 "$grid" "$prec")
    tl=$("$PY" "$ROOT/bench/torch_vit_gpu.py" --grid "$grid" --patch "$PATCH" --dim "$DIM" --heads "$HEADS" \
         --layers "$LAYERS" --batch 1 --warmup "$WARMUP" --steps "$STEPS" --precision "${prec/fp32/f32}" 2>&1 |
         grep '^torch_vit ' || echo "torch_vit failed")
    oi=$(ours_infer "$grid" "$prec")
    ts=$(kv "$tl" s_per_step); tf=$(kv "$tl" first_step_s); tm=$(kv "$tl" peak_mib); ti=$(kv "$tl" infer_ms)
    r=$("$PY" -c "import sys; o,t=float(sys.argv[1]),float(sys.argv[2]); print(f'{t/o:.3f}')" "${os:-nan}" "${ts:-nan}" 2>/dev/null || echo nan)
    ri=$("$PY" -c "import sys; o,t=float(sys.argv[1]),float(sys.argv[2]); print(f'{t/o:.3f}')" "$oi" "${ti:-nan}" 2>/dev/null || echo nan)
    echo "| $prec | $grid | $tokens | $os | ${ts:-nan} | $r | $of | ${tf:-nan} | $om | ${tm:-nan} | $oi | ${ti:-nan} |"
    echo "ratio vit_${prec}_grid${grid} (tokens $tokens, ring attention at 1 rank): torch/ours step $r, inference $ri"
    if [ "$DEVICE" = cuda ] && [[ " $GRAPH " == *" $prec "* ]] && [[ " $GRAPH_GRIDS " == *" $grid "* ]]; then
      read -r gs gf gm < <(ours 1 1x1 "$grid" "$prec" --cuda-graph)
      rg=$("$PY" -c "import sys; o,t=float(sys.argv[1]),float(sys.argv[2]); print(f'{t/o:.3f}')" "${gs:-nan}" "${ts:-nan}" 2>/dev/null || echo nan)
      echo "ratio vit_${prec}_grid${grid}_cuda_graph (the step captured in a CUDA graph): torch/ours step $rg (ours $gs s, GPU peak $gm MiB; eager $os s)"
      grep '^cuda graph:' "$tsv.ours.log" | tail -2 | sed 's/^/  /'
    fi
    echo -e "step\t$prec\t$grid\t$tokens\t1\t$os\t${ts:-nan}\t$of\t${tf:-nan}\t$om\t${tm:-nan}\t${ti:-nan}\t$oi" >> "$tsv"
  done
done

# Per-rank peak at P ranks sharing the GPU (MPI staging between ranks; no scaling claim: one GPU).
single=""
for np in $RANKS; do
  case $np in 1) mesh=1x1 ;; 2) mesh=2x1 ;; 3) mesh=3x1 ;; 4) mesh=2x2 ;; *) mesh="${np}x1" ;; esac
  read -r os of om < <(ours "$np" "$mesh" "$MEMGRID" "$MEMPREC")
  [ "$np" = 1 ] && single=$om
  q=$("$PY" -c "import sys; s,m,p=float(sys.argv[1]),float(sys.argv[2]),int(sys.argv[3]); print(f'{m/(s/p):.3f}')" \
      "${single:-nan}" "$om" "$np" 2>/dev/null || echo nan)
  echo "| mem $np ranks | $MEMPREC | grid $MEMGRID | mesh $mesh | per-rank GPU peak $om MiB | peak / (single / P) $q | s/step $os |"
  echo "ratio vit_mem_${MEMPREC}_grid${MEMGRID}_P${np}: per-rank peak / (single / P) $q"
  echo -e "mem\t$MEMPREC\t$MEMGRID\t$(( (MEMGRID / PATCH) * (MEMGRID / PATCH) ))\t$np\t$os\tnan\t$of\tnan\t$om\tnan\tnan\tnan" >> "$tsv"
done
[ -n "$OUT_TSV" ] && cp "$tsv" "$OUT_TSV"
echo "run_gpu_vit: numbers in ${OUT_TSV:-$tsv}; our runs' output in $tsv.ours.log"
