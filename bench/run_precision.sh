#!/usr/bin/env bash
# Mixed precision, whole training steps (issue 18 item 8): unet_surrogate and vit_surrogate at
# --precision fp32 / bf16 / fp16 / autocast-bf16, interleaved rounds, one process per rank. Prints per model and
# precision the median samples/s of the last progress line, the per-rank tensor peak (max over
# ranks, shardtensor's allocator high-water mark) and the final loss; then the ratios to fp32.
#   bench/run_precision.sh [BUILD_DIR=build] [NP=2] [ROUNDS=3] [STEPS=30]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD_DIR:-$here/../build}
bash "$here/need_bench.sh" --timed "$build" unet_surrogate vit_surrogate
np=${NP:-2}
rounds=${ROUNDS:-3}
steps=${STEPS:-30}
mpi=(mpiexec --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader --mca mpi_yield_when_idle 1 -n "$np")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
log=$(mktemp -d)
echo "run_precision: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1 /proc/loadavg), np $np, $rounds rounds, $steps steps"
unet=(--steps "$steps" --grid 128 --width 32 --depth 2 --batch 4 --samples 8 --log-every "$steps" --seed 1)
vit=(--steps "$steps" --grid 128 --patch 4 --dim 64 --heads 4 --layers 2 --batch 4 --samples 8 --log-every "$steps" --seed 1)
for r in $(seq "$rounds"); do
  for p in fp32 bf16 fp16 autocast-bf16; do
    "${mpi[@]}" "$build/examples/unet_surrogate" "${unet[@]}" --precision "$p" > "$log/unet_${p}_$r.txt"
    "${mpi[@]}" "$build/examples/vit_surrogate" "${vit[@]}" --precision "$p" > "$log/vit_${p}_$r.txt"
  done
done
python3 - "$log" "$rounds" <<'PY'
import re, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
def parse(path):
    txt = open(path).read()
    m = re.findall(r"([0-9.]+) samples/s .*?tensors ([0-9.]+) MiB", txt)
    f = re.search(r"final_loss=([0-9.eE+-]+)", txt)
    return float(m[-1][0]), float(m[-1][1]), float(f.group(1))
print("| model | precision | samples/s | tensor peak MiB/rank | final loss | speed vs fp32 | memory vs fp32 |")
print("|---|---|---:|---:|---:|---:|---:|")
for model in ("unet", "vit"):
    res = {}
    for p in ("fp32", "bf16", "fp16", "autocast-bf16"):
        runs = [parse(f"{d}/{model}_{p}_{r}.txt") for r in range(1, rounds + 1)]
        res[p] = (statistics.median(x[0] for x in runs), statistics.median(x[1] for x in runs), runs[0][2])
    for p, (s, m, l) in res.items():
        print(f"| {model} | {p} | {s:.2f} | {m:.1f} | {l:.4e} | {s / res['fp32'][0]:.2f} | {m / res['fp32'][1]:.2f} |")
PY
