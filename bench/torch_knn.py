#!/usr/bin/env python3
"""PyTorch brute force on the points of bench_dist_neighbors (--dump FILE): torch.cdist + topk in
query chunks (k nearest, or the nearest --max within --radius), CPU, float32. Prints the median
time over --reps (after one warm-up) and the same checksums bench_dist_neighbors prints
(check_dist: sum over queries of the last kept distance; check_cnt: sum of counts), so the two
runs are known to answer the same question (with --queries Q: over the first Q queries only, and
the times are extrapolated to all N).

  OMP_NUM_THREADS=1 /usr/bin/python3 bench/torch_knn.py points.f32 [--k 16] [--radius 0.01]
      [--max 32] [--reps 3] [--chunk 512] [--query knn|radius|both] [--device cpu|cuda]
--device cuda (issue 31: kNN at 1M points on one GPU against this twin, bench/run_gpu_knn.sh): the
points live on the GPU, chunks of --chunk queries (default there 4096), the clock stops after a
torch.cuda.synchronize(), and the peak of torch's allocated GPU memory is printed.
Needs python3-torch (scripts/setup.sh with SETUP_WITH_TORCH=1)."""
import argparse
import os
import statistics
import time

import numpy as np
import torch


def run(pts, knn, k, radius, maxn, chunk, nq):
    n = nq
    w = k if knn else maxn
    last = torch.empty(n, dtype=torch.float64, device=pts.device)
    counts = torch.empty(n, dtype=torch.int64, device=pts.device)
    for s in range(0, n, chunk):
        q = pts[s:min(s + chunk, nq)]
        d = torch.cdist(q, pts)  # [c, n], Euclidean
        vals, _ = torch.topk(d, min(w, pts.shape[0]), dim=1, largest=False, sorted=True)
        if knn:
            last[s:s + chunk] = vals[:, -1].double()
            counts[s:s + chunk] = vals.shape[1]
        else:
            ok = vals <= radius
            c = ok.sum(dim=1)
            counts[s:s + chunk] = c
            idx = (c - 1).clamp(min=0)
            lv = vals.gather(1, idx[:, None])[:, 0].double()
            last[s:s + chunk] = torch.where(c > 0, lv, torch.zeros_like(lv))
    if pts.is_cuda:
        torch.cuda.synchronize()
    return float(last.sum()), int(counts.sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("points")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--radius", type=float, default=0.01)
    ap.add_argument("--max", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=0, help="queries per cdist (default 512 cpu, 4096 cuda)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--query", default="both")
    ap.add_argument("--queries", type=int, default=0,
                    help="time only the first Q points as queries (against all N) and extrapolate x N/Q "
                         "(brute force over 1M x 1M takes hours); 0: all")
    a = ap.parse_args()
    pts = torch.from_numpy(np.fromfile(a.points, dtype=np.float32).reshape(-1, 3).copy())
    if a.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("torch_knn.py: --device cuda but torch sees no GPU")
        pts = pts.cuda()
        torch.cuda.reset_peak_memory_stats()
    if a.chunk <= 0:
        a.chunk = 4096 if a.device == "cuda" else 512
    n = pts.shape[0]
    nq = a.queries if 0 < a.queries < n else n
    print(f"# torch {torch.__version__} brute force (cdist + topk, chunk {a.chunk}), N={n}, queries {nq}"
          f"{' (times extrapolated x N/Q)' if nq < n else ''}, device {a.device}"
          f"{' ' + torch.cuda.get_device_name() if a.device == 'cuda' else ''}, threads {torch.get_num_threads()}, "
          f"load {os.getloadavg()[0]:.2f}")
    for knn in (True, False):
        if a.query != "both" and a.query != ("knn" if knn else "radius"):
            continue
        times = []
        for r in range(a.reps + 1):
            t0 = time.perf_counter()
            cd, cc = run(pts, knn, a.k, a.radius, a.max, a.chunk, nq)
            if r > 0:
                times.append((time.perf_counter() - t0) * 1e3 * n / nq)
        print(f"{'knn' if knn else 'radius':6s} torch median_ms {statistics.median(times):.1f} "
              f"min {min(times):.1f} max {max(times):.1f} check_dist {cd:.6f} check_cnt {cc}"
              + (f" gpu_peak_mib {torch.cuda.max_memory_allocated() / 2**20:.1f}" if a.device == "cuda" else ""))


if __name__ == "__main__":
    main()
