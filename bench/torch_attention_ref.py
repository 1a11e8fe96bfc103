#!/usr/bin/env python3
"""PyTorch CPU reference for bench_attention (issue 7, benchmark 1): softmax(q @ k^T / sqrt(d)) @ v
with autograd, fp32, B = 1, H heads, N tokens, head dim D, forward + backward (dq, dk, dv).

Run:  /usr/bin/python3 bench/torch_attention_ref.py --n 4096 [--heads 8] [--dim 64] [--threads 2]
                                                   [--reps 3] [--per-head 0|1] [--max-gb 8]
                                                   [--warmup 1|0]
One case per process, so that the peak-RSS growth (resource.getrusage max RSS, from before the
operands are allocated) belongs to it. The explicit attention matrix makes memory quadratic in N:
with --per-head 1 the heads run one after another (an eighth of the [H, N, N] matrices alive at
once; what one would do to fit 16k tokens into this machine's memory); the run refuses (prints
SKIP) when its estimate of the peak (5 live N x N fp32 matrices per head in flight) exceeds
--max-gb, so that it never pushes the shared machine into the OOM killer.
"""
import argparse
import math
import resource
import time

import torch


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def step(q, k, v, dout, per_head):
    d = q.shape[-1]
    if not per_head:
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
        o = a @ v
        o.backward(dout)
        return
    for h in range(q.shape[1]):
        qh, kh, vh = q[:, h], k[:, h], v[:, h]
        a = torch.softmax(qh @ kh.transpose(-1, -2) / math.sqrt(d), dim=-1)
        o = a @ vh
        o.backward(dout[:, h])
        del a, o


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--per-head", type=int, default=0)
    ap.add_argument("--max-gb", type=float, default=8.0)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    n, h, d = a.n, a.heads, a.dim
    live = 5 * n * n * 4 * (1 if a.per_head else h) / 2**30
    if live > a.max_gb:
        print(f"SKIP torch N={n} H={h} per_head={a.per_head}: estimated peak {live:.1f} GB > --max-gb {a.max_gb}")
        return
    rss0 = rss_mb()
    torch.manual_seed(0)
    # [B, H, N, D] (the layout torch's matmul wants; a token-major input would need a transpose copy)
    q = torch.randn(1, h, n, d, requires_grad=True)
    k = torch.randn(1, h, n, d, requires_grad=True)
    v = torch.randn(1, h, n, d, requires_grad=True)
    dout = torch.randn(1, h, n, d)
    tot, cpu = [], []
    for r in range(1 - a.warmup, a.reps + 1):
        q.grad = k.grad = v.grad = None
        c0 = time.process_time()
        t0 = time.perf_counter()
        step(q, k, v, dout, a.per_head)
        t1 = time.perf_counter()
        c1 = time.process_time()
        if r > 0:
            tot.append(t1 - t0)
            cpu.append(c1 - c0)
    med = lambda x: sorted(x)[len(x) // 2]
    flops = 12 * n * n * d * h  # model flops: forward 2 GEMMs, backward 4
    print(f"torch {torch.__version__} N={n} H={h} D={d} threads={torch.get_num_threads()} per_head={a.per_head}: "
          f"total median {med(tot) * 1e3:.1f} ms  min {min(tot) * 1e3:.1f} ms  "
          f"{flops / med(tot) / 1e9:.1f} GFLOP/s (12 N^2 D H)")
    print(f"torch N={n}: CPU time (all threads) per step {med(cpu) * 1e3:.1f} ms")
    print(f"torch N={n}: peak RSS growth {rss_mb() - rss0:.1f} MB")
    print(f"RESULT torch N={n} per_head={a.per_head} total_ms={med(tot) * 1e3:.2f} cpu_ms={med(cpu) * 1e3:.2f} "
          f"rss_mb={rss_mb() - rss0:.1f}")


if __name__ == "__main__":
    main()
