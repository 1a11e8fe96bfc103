#!/usr/bin/env python3
"""PyTorch (cuDNN) reference for bench_conv_gpu: fp32 forward + backward (input, weight and bias
gradients) of conv2d 64->64 3x3 pad 1 on 1x64x2048^2 and conv3d 32->32 3^3 pad 1 on 1x32x256^3,
TF32 off, cudnn.benchmark on (algorithm search, like shardtensor's cudnnFind), 2 warm-up steps.

Run:  python3 bench/torch_conv_gpu.py [--reps 10] [--case all|conv2d|conv3d] [--deterministic 0|1]
Prints per case "RESULT <case> fwd_ms <f> bwd_ms <b> total_ms <t> peak_mib <m> first_peak_mib <m0>"
(medians; peak_mib = torch.cuda.max_memory_allocated over the timed steps, first_peak_mib over
the warm-up), the same format as bench_conv_gpu.
"""
import argparse
import time

import torch


def bench(name, shape, cout, k, conv, reps):
    dev = torch.device("cuda")
    x = torch.rand(*shape, device=dev) * 2 - 1
    x.requires_grad_(True)
    m = conv(shape[1], cout, k, padding=1, bias=True).to(dev)
    ys = list(shape)
    ys[1] = cout
    gy = torch.rand(*ys, device=dev) * 2 - 1
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fwd, bwd, tot = [], [], []
    first_peak = 0
    for r in range(reps + 2):
        x.grad = None
        m.weight.grad = None
        m.bias.grad = None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = m(x)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        y.backward(gy)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        del y
        if r == 1:
            first_peak = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        if r >= 2:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
            tot.append((t2 - t0) * 1e3)
    med = lambda v: sorted(v)[len(v) // 2]
    peak = torch.cuda.max_memory_allocated() / 2**20
    print(f"torch {name}: fwd {med(fwd):.2f} ms  bwd {med(bwd):.2f} ms  total {med(tot):.2f} ms "
          f"(min {min(tot):.2f})  device peak {peak:.0f} MiB (warm-up {first_peak / 2**20:.0f} MiB)")
    print(f"RESULT {name} fwd_ms {med(fwd):.3f} bwd_ms {med(bwd):.3f} total_ms {med(tot):.3f} "
          f"peak_mib {peak:.0f} first_peak_mib {first_peak / 2**20:.0f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--case", default="all")
    ap.add_argument("--deterministic", type=int, default=0)
    a = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = bool(a.deterministic)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}, "
          f"fp32, TF32 off, deterministic {bool(a.deterministic)}, {a.reps} timed steps after 2 warm-up steps")
    if a.case in ("all", "conv2d"):
        bench("conv2d_64x64_3x3_1x64x2048^2", (1, 64, 2048, 2048), 64, 3, torch.nn.Conv2d, a.reps)
        torch.cuda.empty_cache()
    if a.case in ("all", "conv3d"):
        bench("conv3d_32x32_3^3_1x32x256^3", (1, 32, 256, 256, 256), 32, 3, torch.nn.Conv3d, a.reps)


if __name__ == "__main__":
    main()
