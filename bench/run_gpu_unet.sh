#!/usr/bin/env bash
# U-Net training step on one GPU: shardtensor (examples/unet_surrogate --device cuda, 1 rank)
# against the same U-Net in PyTorch eager (bench/torch_unet_gpu.py) on the same GPU, fp32, TF32 off.
# Steady state against steady state: both sides run WARMUP untimed steps first (the first step,
# with cuDNN's algorithm search / cudnn.benchmark, is printed on its own) and then time STEPS
# steps as one window; the device high-water mark of each side is taken over that window.
# Prints both result lines and then
#   unet step (steady state, STEPS steps after WARMUP warm-up): shardtensor X ms, torch Y ms, speed
#   ratio torch/ours R; first step: ours A s, torch B s; GPU peak MiB steady state: ours .. torch ..
#   (memory ratio ours/torch ..); whole run: ours .. torch ..
#   BUILD_DIR=build GRID=1024 WIDTH=32 DEPTH=3 BATCH=4 WARMUP=3 STEPS=20 bash bench/run_gpu_unet.sh
# Extra arguments go to unet_surrogate (e.g. --precision bf16). PYTHON (python3) runs the torch side.
# FUSION_AB=1 (default) also runs ours with SHARDTENSOR_FUSED_NORM_ACT=0 (each norm, skip add and
# activation as separate ops) and prints "fusion A/B: ..." with both steady-state times and peaks.
# GRAPH_AB=1 (default) also runs ours with --cuda-graph (the step captured into a CUDA graph after
# the warm-up and replayed, shard::CapturedStep) and prints "cuda graph A/B: ..." (eager and graph
# steady state, peaks, torch/ours-graph) and the line the runs printed about the capture.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
GRID="${GRID:-1024}" WIDTH="${WIDTH:-32}" DEPTH="${DEPTH:-3}" BATCH="${BATCH:-4}" STEPS="${STEPS:-20}"
WARMUP="${WARMUP:-3}" PY="${PYTHON:-python3}"
EX="$BUILD_DIR/examples/unet_surrogate"
bash "$ROOT/bench/need_bench.sh" --timed "$BUILD_DIR" unet_surrogate
[ -x "$EX" ] || { echo "run_gpu_unet: $EX not built"; exit 1; }
MPIRUN="mpiexec -n 1"
[ "$(id -u)" -eq 0 ] && MPIRUN="mpiexec --allow-run-as-root -n 1"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
date -u +"%Y-%m-%d %H:%M UTC"
# ours: --steps counts the warm-up too; one progress line at the end (log steps read the loss)
ours=$($MPIRUN "$EX" --device cuda --grid "$GRID" --width "$WIDTH" --depth "$DEPTH" --batch "$BATCH" \
       --samples "$BATCH" --steps "$((STEPS + WARMUP))" --warmup "$WARMUP" --log-every "$((STEPS + WARMUP))" "$@" |
       tee /dev/stderr)
steady=$(echo "$ours" | grep '^steady state:' | tail -1)
if [ "${FUSION_AB:-1}" = 1 ]; then
  sep=$(SHARDTENSOR_FUSED_NORM_ACT=0 $MPIRUN "$EX" --device cuda --grid "$GRID" --width "$WIDTH" --depth "$DEPTH" \
        --batch "$BATCH" --samples "$BATCH" --steps "$((STEPS + WARMUP))" --warmup "$WARMUP" \
        --log-every "$((STEPS + WARMUP))" "$@" | grep '^steady state:' | tail -1 || true)
  python3 - "$steady" "$sep" <<'PY'
import re, sys
def get(s):
    t = re.search(r"([0-9.]+) s/step", s)
    m = re.search(r"steady state ([0-9.]+) MiB\)", s)
    return (float(t.group(1)) if t else float("nan")), (float(m.group(1)) if m else float("nan"))
(ft, fm), (st, sm) = get(sys.argv[1]), get(sys.argv[2])
print(f"fusion A/B (norm + activation + skip add): fused {ft*1e3:.2f} ms, GPU peak {fm:.1f} MiB; separate ops "
      f"{st*1e3:.2f} ms, GPU peak {sm:.1f} MiB; time fused/separate {ft/st:.3f}, peak fused/separate {fm/sm:.3f}")
PY
fi
graph_steady=""
if [ "${GRAPH_AB:-1}" = 1 ]; then
  graph_out=$($MPIRUN "$EX" --device cuda --cuda-graph --grid "$GRID" --width "$WIDTH" --depth "$DEPTH" \
              --batch "$BATCH" --samples "$BATCH" --steps "$((STEPS + WARMUP))" --warmup "$WARMUP" \
              --log-every "$((STEPS + WARMUP))" "$@" || true)
  echo "$graph_out" | grep '^cuda graph:' || echo "cuda graph: no capture line (the run failed?)"
  echo "$graph_out" | grep -E '^final_loss=' | sed 's/^/graph run /' || true
  graph_steady=$(echo "$graph_out" | grep '^steady state:' | tail -1 || true)
fi
torch_line=$("$PY" "$ROOT/bench/torch_unet_gpu.py" --grid "$GRID" --width "$WIDTH" --depth "$DEPTH" \
             --batch "$BATCH" --warmup "$WARMUP" --steps "$STEPS" | grep '^torch_unet ')
echo "$torch_line"
"$PY" - "$steady" "$torch_line" "$STEPS" "$WARMUP" <<'PY'
import re, sys
steady, torch_line, steps, warmup = sys.argv[1:5]
def num(pat, s):
    m = re.search(pat, s)
    return float(m.group(1)) if m else None
o = num(r"([0-9.]+) s/step", steady)
of = num(r"first step ([0-9.]+) s", steady)
og = num(r"gpu ([0-9.]+) MiB", steady)
ogs = num(r"steady state ([0-9.]+) MiB\)", steady)
kv = dict(f.split("=", 1) for f in torch_line.split()[1:] if "=" in f)
t = float(kv.get("s_per_step", "nan"))
tf = float(kv.get("first_step_s", "nan"))
tm, tma = float(kv.get("peak_mib", "nan")), float(kv.get("peak_all_mib", "nan"))
if o is None:
    print(f"unet step: no 'steady state:' line from unet_surrogate (got: {steady!r})")
    sys.exit(1)
fmt = lambda v: "?" if v is None else f"{v:.1f}"
print(f"unet step (steady state, {steps} steps after {warmup} warm-up): shardtensor {o*1e3:.2f} ms, torch {t*1e3:.2f} ms, "
      f"speed ratio torch/ours {t/o:.3f}; first step: ours {of:.3f} s, torch {tf:.3f} s; GPU peak MiB steady state: "
      f"ours {fmt(ogs)} torch {tm:.1f} (memory ratio ours/torch {(ogs or float('nan'))/tm:.3f}); whole run: "
      f"ours {fmt(og)} torch {tma:.1f}")
PY
if [ -n "$graph_steady" ]; then
  "$PY" - "$steady" "$graph_steady" "$torch_line" <<'PY'
import re, sys
def num(pat, s):
    m = re.search(pat, s)
    return float(m.group(1)) if m else float("nan")
e, g = num(r"([0-9.]+) s/step", sys.argv[1]), num(r"([0-9.]+) s/step", sys.argv[2])
em, gm = num(r"steady state ([0-9.]+) MiB\)", sys.argv[1]), num(r"steady state ([0-9.]+) MiB\)", sys.argv[2])
kv = dict(f.split("=", 1) for f in sys.argv[3].split()[1:] if "=" in f)
t = float(kv.get("s_per_step", "nan"))
print(f"cuda graph A/B: eager {e*1e3:.2f} ms, graph {g*1e3:.2f} ms (eager/graph {e/g:.3f}); GPU peak eager {em:.1f} "
      f"MiB, graph {gm:.1f} MiB; speed ratio torch/ours-graph {t/g:.3f}")
PY
fi
