#!/usr/bin/env bash
# GPU local attention vs torch.nn.functional.scaled_dot_product_attention (issue 7, benchmark 5;
# issue 32 item 1: bf16 on cuDNN's fused attention, targets torch/ours >= 0.9 forward + backward and
# >= 1.0 forward alone). One command on a GPU machine:
#   bench/run_gpu_attention.sh [BUILD_DIR=build] [REPS=10] [PYTHON=python3] [NS="4096 16384"] [DIMS="64 128"]
#                              [DTYPES="f32 bf16"] [ROUNDS=1]
# Per round and dtype: ours (one process over every N x D case), for bf16 also ours with
# SHARDTENSOR_CUDNN_ATTENTION=0 (the own kernels: case bf16own, the tensor-core ones; bf16simt with
# SHARDTENSOR_ATTENTION_TC=0 too), for f32 also ours with SHARDTENSOR_ATTENTION_TILED=0 (the row
# kernels the tiled ones replaced: case f32rows) and with allow_tf32 (case f32tf32, against torch's
# default f32), then torch. Prints per case the
# best median of each side over the rounds, which kernel ours ran (cuDNN SDPA or own), the speed
# ratios torch_time / our_time (forward + backward, and forward alone) and both device memory
# high-water marks, then one "ratio" line per case.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-${BUILD_DIR:-$here/../build}}
reps=${REPS:-10}
py=${PYTHON:-python3}
ns=${NS:-"4096 16384"}
dims=${DIMS:-"64 128"}
dtypes=${DTYPES:-"f32 bf16"}
rounds=${ROUNDS:-1}
bin=$build/bench/bench_attention_gpu
bash "$here/need_bench.sh" "$build" bench_attention_gpu
log=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
date -u +"%Y-%m-%d %H:%M UTC"
ncsv=$(echo $ns | tr ' ' ','); dcsv=$(echo $dims | tr ' ' ',')
n1=${ns%% *}  # the A/B rows (row kernels, SIMT kernels) at the first N only: they are the slow ones
for round in $(seq "$rounds"); do
  for dt in $dtypes; do
    "$bin" --n "$ncsv" --dim "$dcsv" --dtype "$dt" --reps "$reps" | tee -a "$log/ours.txt"
    if [[ $dt == bf16 || $dt == f16 ]]; then
      # own kernels: the tensor-core (wmma) ones, and the SIMT tiled ones they replace
      SHARDTENSOR_CUDNN_ATTENTION=0 "$bin" --n "$ncsv" --dim "$dcsv" --dtype "$dt" --reps "$reps" --tag own |
        tee -a "$log/ours.txt"
      SHARDTENSOR_CUDNN_ATTENTION=0 SHARDTENSOR_ATTENTION_TC=0 "$bin" --n "$n1" --dim "$dcsv" --dtype "$dt" \
        --reps "$reps" --tag simt | tee -a "$log/ours.txt"
    fi
    if [[ $dt == f32 ]]; then  # the row kernels the tiled ones replaced (head dims <= 64): the A/B
      SHARDTENSOR_ATTENTION_TILED=0 "$bin" --n "$n1" --dim "$dcsv" --dtype "$dt" --reps "$reps" --tag rows |
        tee -a "$log/ours.txt"
      # TF32 tensor-core kernels (allow_tf32), against torch's f32 SDPA as it runs by default
      "$bin" --n "$ncsv" --dim "$dcsv" --dtype "$dt" --reps "$reps" --tf32 1 --tag tf32 | tee -a "$log/ours.txt"
    fi
    "$py" "$here/torch_attention_gpu.py" --n "$ncsv" --dim "$dcsv" --dtype "$dt" --reps "$reps" | tee -a "$log/torch.txt"
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
print(f"{'case':24s} {'kernel':6s} {'ours ms':>9s} {'torch ms':>9s} {'torch/ours':>10s} {'fwd ours':>9s} "
      f"{'fwd torch':>9s} {'fwd t/o':>8s} {'ours MiB':>9s} {'torch MiB':>9s}")
lines = []
for name in ours:
    o = ours[name]
    # the own-kernel and row-kernel rows against the same torch case
    t = torch.get(name.replace("bf16own", "bf16").replace("bf16simt", "bf16").replace("f16own", "f16")
                  .replace("f16simt", "f16").replace("f32rows", "f32").replace("f32tf32", "f32"))
    if t is None:
        continue
    kern = ("cudnn" if o.get("cudnn", 0) else "tc" if o.get("tc", 0) else "tiled" if o.get("tiled", 0)
            else "rows")
    r, rf = t["total_ms"] / o["total_ms"], t["fwd_ms"] / o["fwd_ms"]
    print(f"{name:24s} {kern:6s} {o['total_ms']:9.3f} {t['total_ms']:9.3f} {r:10.2f} {o['fwd_ms']:9.3f} "
          f"{t['fwd_ms']:9.3f} {rf:8.2f} {o['peak_mib']:9.0f} {t['peak_mib']:9.0f}")
    lines.append(f"ratio {name} ({kern}): torch/ours fwd+bwd {r:.2f}, fwd {rf:.2f}")
print("\n".join(lines))
PY
