"""Python peer of benches/prune.rhai (1): the same gate-training step in PyTorch.

Usage: prune_peer.py ASSETS_DIR N_SENTENCES   -> one JSON line on stdout

all-MiniLM-L6-v2 from HF transformers (eager attention: head_mask multiplies each head's
attention probabilities, which is the same as gating its context); Hard Concrete gates
(beta 0.33, l -0.1, r 1.1), one sample per head per batch; loss = mean over real tokens of
1 - cos(final hidden state, the unpruned model's) + lambda * sum P(g != 0);
torch.optim.Adam on log_alpha. The same sentences in the same length buckets (sorted by
token count, groups of at most 1000 padded tokens). Timed: epochs 2 and 3, per step (the
unpruned targets are computed before timing, as headscope caches them in epoch 1).
"""
import json
import math
import os
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from tokenizers import Tokenizer
from transformers import BertModel


def buckets(lengths, max_tokens):
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    groups, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > max_tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups


def main():
    assets, n = sys.argv[1], int(sys.argv[2])
    sents = open(os.path.join(assets, "pud_en.txt"), encoding="utf-8").read().splitlines()[:n]
    tok = Tokenizer.from_file(os.path.join(assets, "minilm", "tokenizer.json"))
    tok.no_padding(); tok.no_truncation()
    ids = [tok.encode(s).ids for s in sents]
    model = BertModel.from_pretrained(os.path.join(assets, "minilm"), attn_implementation="eager").eval()
    for p in model.parameters():
        p.requires_grad_(False)
    batches = []
    for g in buckets([len(x) for x in ids], 1000):
        s = max(len(ids[i]) for i in g)
        t = torch.zeros((len(g), s), dtype=torch.long)
        m = torch.zeros((len(g), s), dtype=torch.long)
        for r, i in enumerate(g):
            t[r, : len(ids[i])] = torch.tensor(ids[i])
            m[r, : len(ids[i])] = 1
        with torch.no_grad():
            full = model(input_ids=t, attention_mask=m).last_hidden_state
        batches.append((t, m, full))
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    beta, lo, hi, eps, lam = 0.33, -0.1, 1.1, 1e-6, 0.05
    torch.manual_seed(1)
    log_alpha = (torch.rand(L, H) * 1.22 - 0.61).requires_grad_(True)
    opt = torch.optim.Adam([log_alpha], lr=0.01)

    def step(b):
        t, m, full = b
        u = torch.rand(L, H) * (1 - 2 * eps) + eps
        s = torch.sigmoid((torch.log(u) - torch.log(1 - u) + log_alpha) / beta)
        g = torch.clamp(s * (hi - lo) + lo, 0, 1)
        h = model(input_ids=t, attention_mask=m, head_mask=g).last_hidden_state
        mf = m.float()
        task = ((1 - torch.nn.functional.cosine_similarity(h, full, dim=-1, eps=1e-8)) * mf).sum() / mf.sum()
        pen = torch.sigmoid(log_alpha - beta * math.log(-lo / hi)).sum()
        loss = task + lam * pen
        opt.zero_grad()
        loss.backward()
        opt.step()
        return task.item()

    nb = len(batches)
    for b in batches:  # epoch 1: warm-up
        step(b)
    t0 = time.perf_counter()
    losses = [step(batches[k % nb]) for k in range(2 * nb)]
    dt = time.perf_counter() - t0
    print(json.dumps({"bench": "step", "model": "minilm", "batches": nb, "steps": 2 * nb, "seconds_per_step": dt / (2 * nb), "mean_loss": sum(losses) / len(losses)}))


if __name__ == "__main__":
    main()
