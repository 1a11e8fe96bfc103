#!/usr/bin/env python3
"""PyTorch twin of bench/bench_norm_gpu.cpp: torch.nn.functional.group_norm (affine, fp32) forward
(and layer_norm over the last dim of [N, H, W, C] tokens for the ln_tok_* cases)
and backward on the same shapes, medians over --reps after 3 warm-up reps, each rep timed between
torch.cuda.synchronize() calls. Prints the same RESULT lines (GB/s: 2 x bytes(x) forward, 3 x
backward). The gn_silu_* cases time silu(group_norm(x)), two ops (ours fuses them); gn_res_silu_*
silu(group_norm(x) + r) with r's gradient, three ops (GB/s: 3 x forward, 5 x backward). Without a
GPU it prints SKIP and exits 0."""
import argparse
import statistics
import time

try:
    import torch
except ImportError:  # no torch on this machine
    print("SKIP torch_norm_gpu: no torch")
    raise SystemExit(0)

SHAPES = [("4x32x1024^2_G8", 4, 32, 1024, 1024, 8), ("4x64x512^2_G8", 4, 64, 512, 512, 8),
          ("4x128x256^2_G8", 4, 128, 256, 256, 8)]
CASES = [(p + "_" + n, silu, res, *rest) for p, silu, res in (("gn", False, False), ("gn_silu", True, False),
                                                                 ("gn_res_silu", True, True)) for n, *rest in SHAPES]
# layer_norm over the last dim of tokens [N, H, W, C] (bench_norm_gpu.cpp's ln_tok_* cases): g = 0
CASES += [("ln_tok_1x256^2x384", False, False, 1, 384, 256, 256, 0),
          ("ln_tok_1x256^2x768", False, False, 1, 768, 256, 256, 0),
          ("ln_tok_4x256^2x64", False, False, 4, 64, 256, 256, 0)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP torch_norm_gpu: no CUDA device")
        return
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda:0")
    print(f"torch_norm_gpu: torch {torch.__version__}, group_norm fp32, affine, {a.reps} timed reps after 3 warm-up")
    for name, silu, res, n, c, h, w, g in CASES:
        shape = (n, h, w, c) if g == 0 else (n, c, h, w)
        x = torch.randn(*shape, device=dev, requires_grad=True)
        gy = torch.randn(*shape, device=dev)
        wt = torch.randn(c, device=dev, requires_grad=True)
        bs = torch.randn(c, device=dev, requires_grad=True)
        rr = torch.randn(*shape, device=dev, requires_grad=True)
        fwd, bwd = [], []
        for r in range(a.reps + 3):
            x.grad = wt.grad = bs.grad = rr.grad = None
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if g == 0:
                y = torch.nn.functional.layer_norm(x, (c,), wt, bs, 1e-5)
            else:
                y = torch.nn.functional.group_norm(x, g, wt, bs, 1e-5)
            if res:
                y = y + rr
            if silu:
                y = torch.nn.functional.silu(y)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            y.backward(gy)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if r >= 3:
                fwd.append((t1 - t0) * 1e3)
                bwd.append((t2 - t1) * 1e3)
        f, b = statistics.median(fwd), statistics.median(bwd)
        nbytes = x.numel() * 4
        fm, bm = (3, 5) if res else (2, 3)
        print(f"RESULT {name} fwd_ms {f:.4f} bwd_ms {b:.4f} fwd_gbs {fm * nbytes / f / 1e6:.1f} "
              f"bwd_gbs {bm * nbytes / b / 1e6:.1f}")


if __name__ == "__main__":
    main()
