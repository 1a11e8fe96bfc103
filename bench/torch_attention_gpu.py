#!/usr/bin/env python3
"""torch.nn.functional.scaled_dot_product_attention on the GPU, for bench_attention_gpu (issues 7
and 32): B = 1, H heads, N tokens, head dim D, forward + backward, fp32 (TF32 off) or bf16 (torch
picks its flash / cuDNN kernel).

Run:  python3 bench/torch_attention_gpu.py --n 4096[,16384] [--heads 8] [--dim 64[,128]] [--reps 10] [--dtype f32|bf16|f16]
Prints per (n, dim) "RESULT attn_<dtype>_N<n>_D<d> fwd_ms <f> bwd_ms <b> total_ms <t> peak_mib <m>"
(medians after one warm-up; peak = torch.cuda.max_memory_allocated over the steps of the case).
Needs torch >= 2.0.
"""
import argparse
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="4096")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", default="64")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--dtype", default="f32")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}.get(a.dtype, torch.float32)
    for n in [int(x) for x in a.n.split(",") if x]:
        for d in [int(x) for x in a.dim.split(",") if x]:
            case(n, a.heads, d, a.reps, a.dtype, dt)


def case(n, h, d, reps, name, dt):
    dev = "cuda"
    # token-major storage [1, N, H, D] viewed as [1, H, N, D], as our kernel reads it
    mk = lambda: torch.randn(1, n, h, d, device=dev, dtype=dt).transpose(1, 2).requires_grad_(True)
    q, k, v = mk(), mk(), mk()
    dout = torch.randn(1, h, n, d, device=dev, dtype=dt)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fwd, bwd, tot = [], [], []
    for r in range(reps + 1):
        q.grad = k.grad = v.grad = None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        o = F.scaled_dot_product_attention(q, k, v)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        o.backward(dout)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if r > 0:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
            tot.append((t2 - t0) * 1e3)
    med = lambda x: sorted(x)[len(x) // 2]
    peak = torch.cuda.max_memory_allocated() / 2**20
    print(f"torch {torch.__version__} sdpa {name} N={n} H={h} D={d}: fwd {med(fwd):.3f} ms  bwd {med(bwd):.3f} ms  "
          f"total {med(tot):.3f} ms  peak {peak:.0f} MiB")
    print(f"RESULT attn_{name}_N{n}_D{d} fwd_ms {med(fwd):.3f} bwd_ms {med(bwd):.3f} total_ms {med(tot):.3f} "
          f"peak_mib {peak:.0f}", flush=True)
    del q, k, v, dout, o
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
