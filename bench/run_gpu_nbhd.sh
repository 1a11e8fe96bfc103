#!/usr/bin/env bash
# GPU neighbourhood attention vs torch's flex_attention with the same 2-D window as a block mask
# (issue 32 item 3: target torch/ours >= 0.8). One command on a GPU machine:
#   bench/run_gpu_nbhd.sh [BUILD_DIR=build] [NS="128 256"] [WINDOWS="7"] [DTYPES="bf16 f32"] [HEADS=4] [DIM=32]
#                         [REPS=10] [ROUNDS=1] [PYTHON=python3]
# Per round and dtype: ours (bench_nbhd_gpu, one process over every n x w case; bf16 / f16 on the
# tensor-core kernels, and again with SHARDTENSOR_NBHD_TC=0: case <dt>rows; f32 also with allow_tf32:
# case f32tf32), then torch
# (bench/torch_nbhd_gpu.py, which compiles flex_attention once per shape: compile_s is printed, not
# timed). Prints per case the best median of each side over the rounds, the ratios torch/ours
# (forward + backward, forward alone), both device peaks and the block mask's density, then one
# "ratio" line per case. Defaults fit gpu_check.sh's BENCH_BUDGET (130 s), compilation included.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-${BUILD_DIR:-$here/../build}}
reps=${REPS:-10}
py=${PYTHON:-python3}
ns=${NS:-"128 256"}
ws=${WINDOWS:-"7"}
dtypes=${DTYPES:-"bf16 f32"}
heads=${HEADS:-4}
dim=${DIM:-32}
rounds=${ROUNDS:-1}
bin=$build/bench/bench_nbhd_gpu
bash "$here/need_bench.sh" "$build" bench_nbhd_gpu
log=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
date -u +"%Y-%m-%d %H:%M UTC"
ncsv=$(echo $ns | tr ' ' ','); wcsv=$(echo $ws | tr ' ' ',')
for round in $(seq "$rounds"); do
  for dt in $dtypes; do
    "$bin" --n "$ncsv" --window "$wcsv" --heads "$heads" --dim "$dim" --dtype "$dt" --reps "$reps" | tee -a "$log/ours.txt"
    if [[ $dt == f32 ]]; then  # TF32 tensor-core kernels (allow_tf32), against torch's f32 as it runs by default
      "$bin" --n "$ncsv" --window "$wcsv" --heads "$heads" --dim "$dim" --dtype "$dt" --reps "$reps" --tf32 1 \
        --tag tf32 | tee -a "$log/ours.txt"
    else  # the warp-per-row kernels the tensor-core ones replace (A/B)
      SHARDTENSOR_NBHD_TC=0 "$bin" --n "$ncsv" --window "$wcsv" --heads "$heads" --dim "$dim" --dtype "$dt" \
        --reps "$reps" --tag rows | tee -a "$log/ours.txt"
    fi
    "$py" "$here/torch_nbhd_gpu.py" --n "$ncsv" --window "$wcsv" --heads "$heads" --dim "$dim" --dtype "$dt" \
      --reps "$reps" | tee -a "$log/torch.txt" || echo "torch side failed (see above)"
  done
done
python3 - "$log/ours.txt" "$log/torch.txt" <<'PY'
import sys
def parse(path):
    best = {}
    try:
        lines = open(path).readlines()
    except OSError:
        return best
    for line in lines:
        if not line.startswith("RESULT "):
            continue
        f = line.split()
        name, kv = f[1], dict(zip(f[2::2], map(float, f[3::2])))
        if name not in best or kv["total_ms"] < best[name]["total_ms"]:
            best[name] = kv
    return best
ours, torch = parse(sys.argv[1]), parse(sys.argv[2])
print(f"{'case':22s} {'ours ms':>9s} {'torch ms':>9s} {'torch/ours':>10s} {'fwd ours':>9s} {'fwd torch':>9s} "
      f"{'fwd t/o':>8s} {'ours MiB':>9s} {'torch MiB':>9s} {'density':>8s}")
out = []
for name, o in ours.items():
    t = torch.get(name.replace("bf16rows", "bf16").replace("f16rows", "f16").replace("f32tf32", "f32"))
    if t is None:
        print(f"{name:22s} {o['total_ms']:9.3f}   (no torch row)")
        continue
    r, rf = t["total_ms"] / o["total_ms"], t["fwd_ms"] / o["fwd_ms"]
    print(f"{name:22s} {o['total_ms']:9.3f} {t['total_ms']:9.3f} {r:10.2f} {o['fwd_ms']:9.3f} {t['fwd_ms']:9.3f} "
          f"{rf:8.2f} {o['peak_mib']:9.0f} {t['peak_mib']:9.0f} {t.get('density', float('nan')):8.4f}")
    kern = "tc" if o.get("tc", 0) else "rows"
    out.append(f"ratio {name} ({kern}): torch flex_attention / ours fwd+bwd {r:.2f}, fwd {rf:.2f}")
print("\n".join(out))
PY
