#!/usr/bin/env python3
"""PyTorch reference for bench_overhead: Python eager `a + b` of two 8x8 fp32 tensors (CPU,
one thread), with and without requires_grad, and forward + backward. Prints microseconds per op.
Usage: python3 bench/torch_overhead_ref.py   (needs torch; Debian: python3-torch)"""
import timeit

import torch

torch.set_num_threads(1)


def per_op_us(stmt, n=200000, repeat=5):
    best = min(timeit.repeat(stmt, number=n, repeat=repeat))
    return best / n * 1e6


a0, b0 = torch.rand(8, 8), torch.rand(8, 8)
a1, b1 = a0.clone().requires_grad_(), b0.clone().requires_grad_()
seed = torch.ones(8, 8)


def fwd_bwd():
    c = a1 + b1
    c.backward(seed)
    a1.grad = None
    b1.grad = None


print(f"torch {torch.__version__}")
print(f"a+b no grad        : {per_op_us(lambda: a0 + b0):.3f} us")
print(f"a+b recorded       : {per_op_us(lambda: a1 + b1):.3f} us")
with torch.no_grad():
    print(f"a+b under no_grad  : {per_op_us(lambda: a1 + b1):.3f} us")
print(f"a+b fwd + backward : {per_op_us(fwd_bwd, n=20000):.3f} us")
