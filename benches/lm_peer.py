"""Peer of benches/lm.rhai: transformers on the same GGUF (dequantised by its GGUF loader),
float32, inference mode, the same threads, the same token ids, in headscope's padded batches
(its length-sorted cut, crates/core/src/model/batch.rs `by_length`, restated below; headscope
itself packs a language model's sentences where it can, docs/methods.md#packing); then the
matmul rates of this machine measured in the same process, for the floor.

Ops: a forward of the stack (no output head, as `m.forward`), the mean next-token loss, one
head ablated (the loss with and without it: two passes) and the single-head sweep (a forward
per head with a pre-hook zeroing the head's slice at the output projection, as TransformerLens
users and the transformers docs mask a head). One JSON line each, then one with the model's
shapes and the measured rates.

Usage: lm_peer.py MODEL_DIR IDS_JSON SWEEP_N"""
import glob
import json
import os
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from transformers import AutoModelForCausalLM

d, ids_path, sweep_n = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(int(os.environ.get("THREADS", torch.get_num_threads())))
gguf = os.path.basename(glob.glob(os.path.join(d, "*.gguf"))[0])
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=gguf, torch_dtype=torch.float32).eval()
cfg = model.config
sents = json.load(open(ids_path))
BATCH_COST = 64  # headscope's BATCH_COST


def by_length(lengths, max_tokens):
    """headscope's cut: sorted by (length, index), runs minimising padded tokens + BATCH_COST."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    n = len(order)
    best, cut = [0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        for i in range(j - 1, -1, -1):
            rows = j - i
            if rows > 1 and rows * longest > max_tokens:
                break
            c = best[i] + rows * longest + BATCH_COST
            if c < best[j]:
                best[j], cut[j] = c, i
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]


def batches(rows, max_tokens):
    out = []
    for g in by_length([len(rows[i]) for i in range(len(rows))], max_tokens):
        t = max(len(rows[i]) for i in g)
        ids = torch.zeros(len(g), t, dtype=torch.long)
        mask = torch.zeros(len(g), t, dtype=torch.long)
        for r, i in enumerate(g):
            ids[r, : len(rows[i])] = torch.tensor(rows[i])
            mask[r, : len(rows[i])] = 1
        out.append((ids, mask))
    return out


def loss_sum(bs):
    total, count = 0.0, 0
    for ids, mask in bs:
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        tm = mask[:, 1:].bool()
        lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        total += -lp[tm].double().sum().item()
        count += tm.sum().item()
    return total / count


def best(f, n=3):
    b = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        f()
        b = min(b, time.perf_counter() - t)
    return b


heads, dh = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
dh = getattr(cfg, "head_dim", None) or dh
layers = model.model.layers


def masked(layer, head):
    def pre(_, args):
        x = args[0].clone()
        x[..., head * dh:(head + 1) * dh] = 0
        return (x,) + args[1:]
    return layers[layer].self_attn.o_proj.register_forward_pre_hook(pre)


with torch.inference_mode():
    b1024 = batches(sents, 1024)
    model.model(input_ids=b1024[0][0][:2], attention_mask=b1024[0][1][:2])  # warm-up
    s = best(lambda: [model.model(input_ids=i, attention_mask=m) for i, m in b1024])
    print(json.dumps({"op": "forward", "seconds": s, "batches": len(b1024), "padded": sum(i.numel() for i, _ in b1024)}))
    value = loss_sum(b1024)
    print(json.dumps({"op": "loss", "seconds": best(lambda: loss_sum(b1024)), "value": value}))

    def ablate():
        base = loss_sum(b1024)
        h = masked(5, 3)
        try:
            return loss_sum(b1024), base
        finally:
            h.remove()
    v, base = ablate()
    print(json.dumps({"op": "ablate", "seconds": best(ablate), "value": v, "base": base}))
    b256 = batches(sents[:sweep_n], 256)
    t = time.perf_counter()
    grid = []
    for l in range(len(layers)):
        row = []
        for h in range(heads):
            hook = masked(l, h)
            row.append(loss_sum(b256))
            hook.remove()
        grid.append(row)
    print(json.dumps({"op": "sweep", "seconds": time.perf_counter() - t, "sentences": sweep_n, "dec.5.3": grid[5][3], "dec.0.0": grid[0][0], "base": loss_sum(b256)}))

    # The matmul rates of this machine, same process and threads: the layer products at the
    # sweep's and the forward's row counts, and the output head's.
    def rate(m, k, n):
        a, w = torch.randn(m, k), torch.randn(n, k)
        torch.nn.functional.linear(a, w)
        s = best(lambda: torch.nn.functional.linear(a, w), 5)
        return 2 * m * k * n / s
    D, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    rows = max(256, sum(len(r) for r in sents) // max(1, len(b1024)))
    print(json.dumps({
        "op": "shapes", "layers": len(layers), "heads": heads, "kv_heads": cfg.num_key_value_heads, "head_dim": dh,
        "d_model": D, "ffn": F, "vocab": V, "tied": bool(getattr(cfg, "tie_word_embeddings", False)),
        "rate_layer": (rate(rows, D, F) + rate(rows, F, D) + rate(rows, D, D)) / 3,
        "rate_head": rate(rows, D, V), "threads": torch.get_num_threads(),
    }))
