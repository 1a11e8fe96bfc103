#!/usr/bin/env python3
"""The ViT of include/shardtensor/nn/vit.hpp written in PyTorch, trained with AdamW on random
fields: the reference for bench/run_gpu_vit.sh (issue 32 item 4). Prints one line
`torch_vit ... s_per_step=... first_step_s=... infer_ms=... peak_mib=... peak_all_mib=...`.
  python3 bench/torch_vit_gpu.py --grid 1024 --patch 8 --dim 128 --heads 2 --layers 2 --batch 1 \
          --warmup 3 --steps 10 --precision bf16

The model, layer for layer as nn::ViT<T, 2> (vit.hpp) with MultiheadAttention (attention_layers.hpp):
  embed  Conv2d(C_in, D, kernel P, stride P), then channels-last tokens [N, s, s, D]
  pos    + a learned positional embedding [1, s, s, D]
  blocks pre-LN: t += out(SDPA(q(LN(t)), k(LN(t)), v(LN(t)))); t += fc2(GELU(fc1(LN(t))))
         q, v, out: Linear(D, D) with bias; k: Linear(D, D) without bias (a key bias is cancelled
         by the softmax, so the library leaves it out); fc1: D -> 4D, fc2: 4D -> D, exact GELU
  norm   a final LayerNorm, then channels-first
  head   ConvTranspose2d(D, C_out, kernel P, stride P)
Attention is torch.nn.functional.scaled_dot_product_attention over all s*s tokens (ring attention
at one rank is the same full attention): flash / cuDNN in bf16, memory-efficient in f32.

Precision: f32 (TF32 off, as shardtensor by default) or bf16. For bf16 the parameters stay f32
and the step runs under torch.autocast(bfloat16): the counterpart of vit_surrogate --precision
bf16 (bf16 activations, f32 master parameters). Autocast keeps LayerNorm and the loss in f32,
which the library does not; the FLOPs of both are dominated by attention and the linears.

Timing as bench/torch_unet_gpu.py and examples/step_timing.hpp: --warmup K untimed steps (the
first step's time printed on its own), then --steps N steps as one window, synchronised only at
its ends; peak_mib = torch.cuda.max_memory_allocated over the timed window, peak_all_mib over the
whole run. --infer R: afterwards, the median of R forwards under torch.no_grad() in eval mode,
each synchronised (infer_ms; 0 skips it).
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads, hidden, eps):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def attn(self, x):  # x [N, L, D]
        n, l, d = x.shape
        split = lambda t: t.view(n, l, self.heads, d // self.heads).transpose(1, 2)  # [N, H, L, Dh]
        o = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.out(o.transpose(1, 2).reshape(n, l, d))

    def forward(self, t):
        t = t + self.attn(self.ln1(t))
        return t + self.fc2(F.gelu(self.fc1(self.ln2(t))))


class ViT(nn.Module):
    def __init__(self, grid, cin, cout, patch, dim, heads, layers, mlp_ratio=4, eps=1e-5):
        super().__init__()
        s = grid // patch
        self.s = s
        self.embed = nn.Conv2d(cin, dim, patch, stride=patch)
        self.pos = nn.Parameter(0.02 * torch.randn(1, s * s, dim))
        self.blocks = nn.ModuleList([Block(dim, heads, mlp_ratio * dim, eps) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.head = nn.ConvTranspose2d(dim, cout, patch, stride=patch)

    def forward(self, x):
        e = self.embed(x)  # [N, D, s, s]
        n, d = e.shape[0], e.shape[1]
        t = e.flatten(2).transpose(1, 2) + self.pos  # [N, s*s, D], token-major
        for b in self.blocks:
            t = b(t)
        t = self.norm(t).transpose(1, 2).reshape(n, d, self.s, self.s)
        return self.head(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=int, default=1024)
    ap.add_argument("--patch", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10, help="timed steps (after the warm-up)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (0: the first step is timed too)")
    ap.add_argument("--infer", type=int, default=5, help="timed inference forwards afterwards (0: none)")
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.infer < 0:
        ap.error("--steps must be >= 1, --warmup and --infer >= 0")
    if a.grid % a.patch or a.dim % a.heads:
        ap.error("--patch must divide --grid and --heads divide --dim")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    model = ViT(a.grid, 1, 1, a.patch, a.dim, a.heads, a.layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    x = torch.randn(a.batch, 1, a.grid, a.grid, device=dev)
    y = torch.randn(a.batch, 1, a.grid, a.grid, device=dev)
    bf16 = a.precision == "bf16"

    def forward():
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=bf16):
            return model(x)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    peak_before = 0

    def open_window():
        nonlocal peak_before
        sync()
        if cuda:
            peak_before = max(peak_before, torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        return time.perf_counter()

    model.train()
    sync()
    t_first = time.perf_counter()
    t0 = open_window() if a.warmup == 0 else None
    first_s = 0.0
    for i in range(a.warmup + a.steps):
        loss = step()
        if i == 0:
            loss.item()
            sync()
            first_s = time.perf_counter() - t_first
        if i + 1 == a.warmup:
            t0 = open_window()
    loss_v = loss.item()
    sync()
    dt = (time.perf_counter() - t0) / a.steps
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0
    peak_all = max(peak_before, torch.cuda.max_memory_allocated()) / 2**20 if cuda else 0.0
    infer_ms = 0.0
    if a.infer:
        model.eval()
        times = []
        with torch.no_grad():
            forward()  # warm-up of the inference shapes
            for _ in range(a.infer):
                sync()
                t = time.perf_counter()
                forward()
                sync()
                times.append((time.perf_counter() - t) * 1e3)
        infer_ms = statistics.median(times)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    tokens = (a.grid // a.patch) ** 2
    print(f"torch_vit device={name.replace(' ', '_')} torch={torch.__version__} precision={a.precision} "
          f"grid={a.grid} patch={a.patch} tokens={tokens} dim={a.dim} heads={a.heads} layers={a.layers} "
          f"batch={a.batch} warmup={a.warmup} steps={a.steps} s_per_step={dt:.6f} first_step_s={first_s:.4f} "
          f"infer_ms={infer_ms:.3f} peak_mib={peak:.1f} peak_all_mib={peak_all:.1f} loss={loss_v:.6g} "
          f"params={sum(p.numel() for p in model.parameters())}", flush=True)


if __name__ == "__main__":
    main()
