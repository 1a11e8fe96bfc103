#!/usr/bin/env python3
"""The U-Net of include/shardtensor/nn/unet.hpp (Downsample::avg_pool, Upsample::nearest_conv,
GroupNorm + SiLU residual blocks, 1x1 head) written in PyTorch, trained with AdamW on random
fields: the reference for bench/run_gpu_unet.sh. Prints one line `torch_unet s_per_step=... peak_mib=...`.

  python3 bench/torch_unet_gpu.py --grid 1024 --width 32 --depth 3 --batch 4 --steps 20 --device cuda
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=int, default=1024)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dev = torch.device(a.device)
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

    for _ in range(a.warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    loss.item()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / a.steps
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else 0.0
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    print(f"torch_unet device={name} grid={a.grid} width={a.width} depth={a.depth} batch={a.batch} "
          f"s_per_step={dt:.6f} peak_mib={peak:.1f} params={sum(p.numel() for p in model.parameters())}")


if __name__ == "__main__":
    main()
