#!/usr/bin/env python3
"""The U-Net of include/shardtensor/nn/unet.hpp (Downsample::avg_pool, Upsample::nearest_conv,
GroupNorm + SiLU residual blocks, 1x1 head) written in PyTorch, trained with AdamW on random
fields: the reference for bench/run_gpu_unet.sh. Prints one line
`torch_unet ... s_per_step=... first_step_s=... samples_per_s=... peak_mib=... peak_all_mib=...`.

  python3 bench/torch_unet_gpu.py --grid 1024 --width 32 --depth 3 --batch 4 --warmup 3 --steps 20 --device cuda

Timing, the same as examples/unet_surrogate's `steady state:` line (examples/step_timing.hpp):
--warmup K steps run first and are not timed (0: the first step is timed too); the first step's
time (cudnn.benchmark's algorithm search, the caching allocator's first cudaMallocs) is measured
on its own; then --steps N steps are timed as one window, synchronised only at its ends (loss.item()
and torch.cuda.synchronize()). Note: --steps here counts the timed steps only; unet_surrogate's
--steps counts the warm-up too (bench/run_gpu_unet.sh passes N + K there).
peak_mib: torch.cuda.max_memory_allocated over the timed window (the counter is reset when it
opens, as unet_surrogate resets its device high-water mark); peak_all_mib: over the whole run.
--profile: after the timed window, one more (steady-state) step under torch.profiler, whose
key_averages table (sorted by device time, 40 rows) is printed after the result line, between
`=== torch.profiler ...` and `=== end torch.profiler` lines.
TF32 is off (fp32 comparisons against shardtensor, which keeps TF32 off by default).
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def groups_for(width, max_groups):
    g = min(width, max_groups)
    while width % g:
        g -= 1
    return g


class ResidualBlock(nn.Module):
    def __init__(self, cin, cout, k, groups):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, k, padding=k // 2, bias=False)
        self.norm1 = nn.GroupNorm(groups_for(cout, groups), cout)
        self.conv2 = nn.Conv2d(cout, cout, k, padding=k // 2, bias=False)
        self.norm2 = nn.GroupNorm(groups_for(cout, groups), cout)
        self.proj = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x):
        h = F.silu(self.norm1(self.conv1(x)))
        h = self.norm2(self.conv2(h))
        s = self.proj(x) if self.proj is not None else x
        return F.silu(h + s)


class UNet(nn.Module):
    def __init__(self, cin, cout, depth, width, mult=2, k=3, groups=8):
        super().__init__()
        w = [width * mult**l for l in range(depth + 1)]
        self.depth = depth
        self.stem = nn.Conv2d(cin, w[0], k, padding=k // 2)
        self.enc = nn.ModuleList([ResidualBlock(w[0] if l == 0 else w[l - 1], w[l], k, groups) for l in range(depth)])
        self.mid = ResidualBlock(w[depth - 1] if depth else w[0], w[depth], k, groups)
        self.up = nn.ModuleList([nn.Conv2d(w[l + 1], w[l], k, padding=k // 2) for l in range(depth)])
        self.dec = nn.ModuleList([ResidualBlock(2 * w[l], w[l], k, groups) for l in range(depth)])
        self.head = nn.Conv2d(w[0], cout, 1)

    def forward(self, x):
        h = self.stem(x)
        skips = []
        for l in range(self.depth):
            h = self.enc[l](h)
            skips.append(h)
            h = F.avg_pool2d(h, 2)
        h = self.mid(h)
        for l in reversed(range(self.depth)):
            h = self.up[l](F.interpolate(h, scale_factor=2, mode="nearest"))
            h = self.dec[l](torch.cat([h, skips[l]], dim=1))
        return self.head(h)


def profile_step(step, dev, row_limit):
    """One step under torch.profiler; prints key_averages() sorted by device time."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    if dev.type == "cuda":
        torch.cuda.synchronize()
    with profile(activities=acts) as prof:
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    ka = prof.key_averages()
    sort = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
    try:
        table = ka.table(sort_by=sort, row_limit=row_limit)
    except (AttributeError, KeyError, ValueError):  # newer torch names it device_time_total
        table = ka.table(sort_by="device_time_total" if dev.type == "cuda" else sort, row_limit=row_limit)
    print(f"=== torch.profiler: one steady-state step, key_averages sorted by {sort}, {row_limit} rows")
    print(table)
    # The same rows, one per line, for scripts (gpu_check.sh profile): device ms, calls, name.
    def dev_us(e):
        for attr in ("device_time_total", "cuda_time_total"):
            v = getattr(e, attr, None)
            if v is not None:
                return float(v)
        return 0.0
    rows = sorted(ka, key=dev_us if dev.type == "cuda" else (lambda e: float(e.cpu_time_total)), reverse=True)
    for e in rows[:row_limit]:
        print(f"TORCH_PROF device_ms {dev_us(e) / 1e3:.3f} cpu_ms {float(e.cpu_time_total) / 1e3:.3f} "
              f"calls {e.count} name {e.key}")
    print("=== end torch.profiler")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=int, default=1024)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20, help="timed steps (after the warm-up)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (0: the first step is timed too)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler's table of one more steady-state step")
    ap.add_argument("--profile-rows", type=int, default=40)
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    model = UNet(1, 1, a.depth, a.width).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    x = torch.randn(a.batch, 1, a.grid, a.grid, device=dev)
    y = torch.randn(a.batch, 1, a.grid, a.grid, device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def open_window():
        sync()
        if cuda:
            nonlocal peak_before
            peak_before = max(peak_before, torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        return time.perf_counter()

    peak_before = 0
    sync()
    t_first = time.perf_counter()
    t0 = open_window() if a.warmup == 0 else None
    total = a.warmup + a.steps
    for i in range(total):
        loss = step()
        if i == 0:
            loss.item()
            sync()
            first_s = time.perf_counter() - t_first
        if i + 1 == a.warmup:
            t0 = open_window()
    loss.item()
    sync()
    dt = (time.perf_counter() - t0) / a.steps
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0
    peak_all = max(peak_before, torch.cuda.max_memory_allocated()) / 2**20 if cuda else 0.0
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"torch_unet device={name} torch={torch.__version__} grid={a.grid} width={a.width} depth={a.depth} "
          f"batch={a.batch} warmup={a.warmup} steps={a.steps} s_per_step={dt:.6f} first_step_s={first_s:.4f} "
          f"samples_per_s={a.batch / dt:.3f} peak_mib={peak:.1f} peak_all_mib={peak_all:.1f} "
          f"params={sum(p.numel() for p in model.parameters())}", flush=True)
    if a.profile:
        profile_step(step, dev, a.profile_rows)


if __name__ == "__main__":
    main()
