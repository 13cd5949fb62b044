# Does fusing q/k/v and gate/up projections raise the matmul rate of a SmolLM2 layer at the
# patching benchmark's largest batch (4320 token rows)? Eager PyTorch, 2 threads, random weights:
#   .venv/bin/python benches/patching_fused_rate.py
# 2026-11-27, this machine, two runs: separate 259 / 283 GFLOP/s, fused 270 / 298 (floor shape
# 576x1536: 322 / 289): about 4-5%, not the way to 1.3x of the floor.
import torch, time
torch.set_num_threads(2)
M, D, KV, F = 4320, 576, 192, 1536
x = torch.randn(M, D); h = torch.randn(M, F)
W = {n: torch.randn(D, o) for n, o in [("q", D), ("k", KV), ("v", KV), ("o", D), ("g", F), ("u", F)]}
Wd = torch.randn(F, D)
Wqkv = torch.cat([W["q"], W["k"], W["v"]], 1); Wgu = torch.cat([W["g"], W["u"]], 1)
def t(f, n=20):
    f(); s = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - s) / n
flops = 2 * M * (D * (D + 2 * KV) + D * D + 2 * D * F + F * D)
sep = t(lambda: [x @ W["q"], x @ W["k"], x @ W["v"], x @ W["o"], x @ W["g"], x @ W["u"], h @ Wd])
fus = t(lambda: [x @ Wqkv, x @ W["o"], x @ Wgu, h @ Wd])
ref = t(lambda: x @ W["g"])
print(f"floor-shape 576x1536: {2*M*D*F/ref/1e9:.0f} GFLOP/s; layer matmuls separate {flops/sep/1e9:.0f}, fused qkv+gate/up {flops/fus/1e9:.0f} GFLOP/s")
