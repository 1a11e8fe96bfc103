#!/usr/bin/env python3
"""PyTorch CPU reference for bench_conv_local: conv2d 16->16 3x3 pad 1 on 1x16x1024x1024 and
conv3d 8->8 3x3x3 pad 1 on 1x8x128^3, fp32, forward + backward (input, weight, bias grads).

Run:  /usr/bin/python3 bench/torch_conv_ref.py [--threads 2] [--reps 5]
Prints per case: median forward / backward / total wall time in ms, the minimum total, the
achieved GFLOP/s (3 * 2 * Cout * Cin * kvol * out_positions flops per step), and the process CPU
time per step (all threads; steadier than wall time on a shared machine).
"""
import argparse
import time

import torch


def bench(name, shape, cin, cout, k, conv, reps):
    x = torch.randn(*shape, requires_grad=True)
    m = conv(cin, cout, k, padding=1, bias=True)
    gy = None
    fwd, bwd, tot, cpu = [], [], [], []
    for r in range(reps + 1):
        x.grad = None
        m.weight.grad = None
        m.bias.grad = None
        c0 = time.process_time()
        t0 = time.perf_counter()
        y = m(x)
        t1 = time.perf_counter()
        if gy is None:
            gy = torch.randn_like(y)
        y.backward(gy)
        t2 = time.perf_counter()
        c2 = time.process_time()
        if r > 0:  # first repetition is warm-up
            cpu.append(c2 - c0)
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            tot.append(t2 - t0)
    kvol = k ** (len(shape) - 2)
    flops = 3 * 2 * cout * cin * kvol * y[0, 0].numel() * shape[0]
    med = lambda v: sorted(v)[len(v) // 2] * 1e3
    print(f"torch {name}: fwd {med(fwd):.1f} ms  bwd {med(bwd):.1f} ms  total median {med(tot):.1f} ms "
          f"min {min(tot) * 1e3:.1f} ms  {flops / (min(tot)) / 1e9:.1f} GFLOP/s")
    print(f"torch {name}: CPU time (all threads) per step {med(cpu):.1f} ms -> "
          f"{flops / (sorted(cpu)[len(cpu) // 2]) / 1e9:.1f} GFLOP per CPU-second")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, mkldnn {torch.backends.mkldnn.is_available()}")
    with torch.no_grad():
        pass
    bench("conv2d 16->16 3x3 1x16x1024x1024", (1, 16, 1024, 1024), 16, 16, 3, torch.nn.Conv2d, a.reps)
    bench("conv3d 8->8 3x3x3 1x8x128^3", (1, 8, 128, 128, 128), 8, 8, 3, torch.nn.Conv3d, a.reps)


if __name__ == "__main__":
    main()
