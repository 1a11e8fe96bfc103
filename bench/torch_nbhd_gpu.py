#!/usr/bin/env python3
"""2-D neighbourhood attention in PyTorch with flex_attention and the window as a block mask, the
reference for bench_nbhd_gpu (issue 32 item 3; bench/run_gpu_nbhd.sh runs both).

Run:  python3 bench/torch_nbhd_gpu.py --n 64,128 [--window 7[,13]] [--heads 4] [--dim 32] [--reps 10]
                                      [--dtype f32|bf16|f16]
One field of n x n tokens flattened row-major (N = n^2), H heads of dim D, [1, H, N, D]; query (i, j)
attends to the keys (i + a, j + b) with a, b in [-(w // 2), w - 1 - w // 2] that lie inside the field:
the library's window and boundary rule (include/shardtensor/exec/neighborhood.hpp: keys outside
the domain are excluded from the softmax). flex_attention is compiled with torch.compile (as its
documentation requires for speed); the block mask comes from create_block_mask (default 128 x 128
blocks). Scale 1 / sqrt(D). TF32 off for f32.
Prints per (n, w) "RESULT nbhd_<dtype>_n<n>_w<w> fwd_ms <f> bwd_ms <b> total_ms <t> peak_mib <m>
compile_s <c> density <d>" (medians after one warm-up, which includes the compilation; peak =
torch.cuda.max_memory_allocated over the timed steps; density = the fraction of (query, key)
pairs the block mask leaves to compute). Prints "SKIP: ..." and exits 0 when flex_attention is
not available (torch < 2.5) or no GPU is visible.
"""
import argparse
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="64,128")
    ap.add_argument("--window", default="7")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        print(f"SKIP: flex_attention unavailable in torch {torch.__version__} ({e})")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    flex = torch.compile(flex_attention, dynamic=False)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}.get(a.dtype, torch.float32)
    for n in [int(x) for x in a.n.split(",") if x]:
        for w in [int(x) for x in a.window.split(",") if x]:
            if w <= n:
                case(n, w, a.heads, a.dim, a.reps, a.dtype, dt, flex, create_block_mask)
    return 0


def case(n, w, h, d, reps, name, dt, flex, create_block_mask):
    dev = "cuda"
    N = n * n
    lo, hi = w // 2, w - 1 - w // 2

    def mask_mod(b, hh, q_idx, kv_idx):
        qi, qj = q_idx // n, q_idx % n
        ki, kj = kv_idx // n, kv_idx % n
        di, dj = ki - qi, kj - qj
        return (di >= -lo) & (di <= hi) & (dj >= -lo) & (dj <= hi)

    bm = create_block_mask(mask_mod, B=None, H=None, Q_LEN=N, KV_LEN=N, device=dev)
    try:
        density = 1.0 - float(bm.sparsity()) / 100.0
    except Exception:  # sparsity() is informational only
        density = float("nan")
    mk = lambda: torch.randn(1, h, N, d, device=dev, dtype=dt).requires_grad_(True)
    q, k, v = mk(), mk(), mk()
    dout = torch.randn(1, h, N, d, device=dev, dtype=dt)
    torch.cuda.synchronize()
    t = time.perf_counter()
    o = flex(q, k, v, block_mask=bm)  # warm-up: compilation of forward and backward
    o.backward(dout)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t
    torch.cuda.reset_peak_memory_stats()
    fwd, bwd, tot = [], [], []
    for _ in range(reps):
        q.grad = k.grad = v.grad = None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        o = flex(q, k, v, block_mask=bm)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        o.backward(dout)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        fwd.append((t1 - t0) * 1e3)
        bwd.append((t2 - t1) * 1e3)
        tot.append((t2 - t0) * 1e3)
    med = lambda x: sorted(x)[len(x) // 2]
    peak = torch.cuda.max_memory_allocated() / 2**20
    print(f"torch {torch.__version__} flex_attention {name} n={n} (N={N}) w={w} H={h} D={d}: fwd {med(fwd):.3f} ms  "
          f"bwd {med(bwd):.3f} ms  total {med(tot):.3f} ms  peak {peak:.0f} MiB  compile {compile_s:.1f} s  "
          f"block-mask density {density:.4f}")
    print(f"RESULT nbhd_{name}_n{n}_w{w} fwd_ms {med(fwd):.3f} bwd_ms {med(bwd):.3f} total_ms {med(tot):.3f} "
          f"peak_mib {peak:.0f} compile_s {compile_s:.1f} density {density:.4f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
