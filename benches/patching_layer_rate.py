#!/usr/bin/env python3
"""What eager PyTorch reaches on one SmolLM2-shaped layer at the largest batch of exact patching
(270 rows x 16 resumed positions, 4 cached positions), beside the float32 matmul rate the floor
of benches/patching.sh uses ([2048 x 576] x [576 x 1536]): the layer's matmuls alone, and the
whole layer (RMSNorm, grouped-query SDPA over the cached keys, SiLU gate). Both as GFLOP/s of the
layer's matmul FLOPs, so that their ratio to the floor's rate is the best a kernel-by-kernel
implementation (headscope's, TransformerLens's) can do against that floor.

    .venv/bin/python benches/patching_layer_rate.py"""
import time

import torch

torch.set_num_threads(2)
torch.manual_seed(0)
D, F, H, KV, dh = 576, 1536, 9, 3, 64
R, T, P = 270, 16, 4
x = torch.randn(R, T, D)
wq, wo = torch.randn(D, D) * 0.02, torch.randn(D, D) * 0.02
wk, wv = torch.randn(D, KV * dh) * 0.02, torch.randn(D, KV * dh) * 0.02
wg, wu, wd = torch.randn(D, F) * 0.02, torch.randn(D, F) * 0.02, torch.randn(F, D) * 0.02
kp, vp = torch.randn(R, H, P, dh), torch.randn(R, H, P, dh)
g = torch.ones(D)


def rms(x):
    return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


def matmuls(x):
    h = x.reshape(R * T, D)
    u = h @ wu
    return (h @ wq, h @ wk, h @ wv, h @ wo, h @ wg, u, u @ wd)


def layer(x):
    h = rms(x)
    q = (h @ wq).view(R, T, H, dh).transpose(1, 2)
    k = (h @ wk).view(R, T, KV, dh).transpose(1, 2).repeat_interleave(H // KV, 1)
    v = (h @ wv).view(R, T, KV, dh).transpose(1, 2).repeat_interleave(H // KV, 1)
    k, v = torch.cat([kp, k], 2), torch.cat([vp, v], 2)
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(R, T, D) @ wo
    x = x + a
    h = rms(x)
    return x + (torch.nn.functional.silu(h @ wg) * (h @ wu)) @ wd


def rate(f, flops, n=5, trials=8):
    """The best of `trials` timings of `n` calls (this VM's timings vary from run to run)."""
    for _ in range(3):
        f()
    best = 0.0
    for _ in range(trials):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best = max(best, flops * n / (time.perf_counter() - t) / 1e9)
    return best


layer_flops = 2 * R * T * (2 * D * D + 2 * D * KV * dh + 3 * D * F)
a, b = torch.randn(2048, D), torch.randn(D, F)
floor = rate(lambda: a @ b, 2 * 2048 * D * F, 10)
mm = rate(lambda: matmuls(x), 2 * R * T * (2 * D * D + 2 * D * KV * dh + 3 * D * F) + 0 * layer_flops)
full = rate(lambda: layer(x), layer_flops)
print(f"floor rate ([2048x576]x[576x1536]) {floor:.0f} GFLOP/s")
print(f"layer matmuls at 4320 rows        {mm:.0f} GFLOP/s = floor x {floor / mm:.2f}")
print(f"whole layer (eager)               {full:.0f} GFLOP/s = floor x {floor / full:.2f}")
