#!/usr/bin/env python3
"""PyTorch CPU reference for bench_fft (issue 16): the same 3-D transforms of n^3 points over all
three dims, c2c forward (torch.fft.fftn) and r2c (torch.fft.rfftn), f64 and f32, one thread
(torch.set_num_threads(1)), output tensors preallocated (out=, as bench_fft's blocks).

Run:  OMP_NUM_THREADS=1 /usr/bin/python3 bench/torch_fft.py [--n 128] [--reps 7]
(/usr/bin/python3: Debian's python3-torch lives in the system interpreter; `SETUP_WITH_TORCH=1 scripts/setup.sh` installs it.)
Prints per transform: median wall time in ms of `reps` calls, GFLOP/s with bench_fft's
convention (5 N log2 N for c2c, 2.5 N log2 N for r2c, N = n^3), the first call's time, and the
largest difference from numpy.fft on the same data relative to the largest magnitude (a sanity
check that the timed call computes the same transform). torch's CPU FFT backend is reported:
pocketfft unless the build has MKL (Debian's has not).
"""
import argparse
import math
import statistics
import time

import numpy as np
import torch


def bench(name, real_dtype, n, reps):
    shape = (n, n, n)
    cplx = torch.complex128 if real_dtype == torch.float64 else torch.complex64
    i = torch.arange(n ** 3, dtype=torch.float64)
    if name == "c2c":
        # bench_fft fills the interleaved (re, im) reals with sin(0.001 k)
        re = torch.sin(0.001 * (2 * i))
        im = torch.sin(0.001 * (2 * i + 1))
        x = torch.complex(re, im).to(cplx).reshape(shape)
        out = torch.empty(shape, dtype=cplx)
        fn = lambda: torch.fft.fftn(x, dim=(0, 1, 2), out=out)
        ref = np.fft.fftn(x.numpy().astype(np.complex128))
        flops = 5.0 * n ** 3 * math.log2(n ** 3)
    else:
        x = torch.sin(0.001 * i).to(real_dtype).reshape(shape)
        out = torch.empty((n, n, n // 2 + 1), dtype=cplx)
        fn = lambda: torch.fft.rfftn(x, dim=(0, 1, 2), out=out)
        ref = np.fft.rfftn(x.numpy().astype(np.float64))
        flops = 2.5 * n ** 3 * math.log2(n ** 3)
    t0 = time.perf_counter()
    fn()
    first = (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    med = statistics.median(times)
    err = np.max(np.abs(out.numpy().astype(np.complex128) - ref)) / np.max(np.abs(ref))
    print(f"{name:<4} {'f64' if real_dtype == torch.float64 else 'f32':<3} {n:4d}^3  torch {med:8.2f} ms "
          f"({flops / med * 1e-6:5.2f} GFLOP/s)  min {min(times):8.2f} ms  first call {first:.1f} ms  "
          f"rel.err vs numpy {err:.1e}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)
    backend = "mkl" if torch.backends.mkl.is_available() else "pocketfft"
    print(f"# torch_fft: torch {torch.__version__} ({backend}), {torch.get_num_threads()} thread, "
          f"3-D transform of n^3 points, median of {a.reps} calls", flush=True)
    bench("c2c", torch.float64, a.n, a.reps)
    bench("c2c", torch.float32, a.n, a.reps)
    bench("r2c", torch.float64, a.n, a.reps)
    bench("r2c", torch.float32, a.n, a.reps)


if __name__ == "__main__":
    main()
