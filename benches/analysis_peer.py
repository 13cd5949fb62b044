"""Python peer of benches/analysis.rhai: HF transformers computing the same head statistics.

Usage: analysis_peer.py ASSETS_DIR N_SWEEP   -> JSON lines on stdout

1. The combined analysis pass on all-MiniLM-L6-v2 over the 1000 PUD sentences: confidence,
   positional offsets and rare-word scores per head (docs/methods.md definitions: argmax and confidence
   without [SEP] keys, real queries only, Brown frequencies under the same tokenizer),
   from BertModel(output_attentions=True, eager attention), batches of 32 in corpus order,
   statistics in torch ops per batch. Timed from tokenization to the final numbers.
2. The single-head ablation sweep with the `cosine` metric on the first N_SWEEP sentences:
   the usual HF loop, one `head_mask` per head over the whole data.
"""
import json
import os
import sys
import time
from collections import Counter

os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from tokenizers import Tokenizer
from transformers import BertModel


def batches(ids, size=32):
    for i in range(0, len(ids), size):
        g = ids[i:i + size]
        s = max(len(x) for x in g)
        t = torch.zeros((len(g), s), dtype=torch.long)
        m = torch.zeros((len(g), s), dtype=torch.long)
        for r, x in enumerate(g):
            t[r, : len(x)] = torch.tensor(x)
            m[r, : len(x)] = 1
        yield t, m


def main():
    assets, n_sweep = sys.argv[1], int(sys.argv[2])
    sents = open(os.path.join(assets, "pud_en.txt"), encoding="utf-8").read().splitlines()
    tok = Tokenizer.from_file(os.path.join(assets, "minilm", "tokenizer.json"))
    tok.no_padding(); tok.no_truncation()
    model = BertModel.from_pretrained(os.path.join(assets, "minilm"), attn_implementation="eager").eval()
    # Frequencies (not timed, as headscope's cached table is not).
    counts = Counter()
    for line in open(os.path.join(assets, "brown.txt"), encoding="utf-8"):
        if line.strip():
            counts.update(tok.encode(line.strip(), add_special_tokens=False).ids)
    top = set(i for i, _ in counts.most_common(500))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")

    with torch.no_grad():
        t0 = time.perf_counter()
        ids = [tok.encode(s).ids for s in sents]
        L, H, R = 6, 12, 127
        conf = torch.zeros(L, H, dtype=torch.float64)
        hist = torch.zeros(L, H, 2 * R + 1, dtype=torch.float64)
        rare = torch.zeros(L, H, dtype=torch.float64)
        nq = 0
        nrq = 0
        for t, m in batches(ids):
            special = (t == cls) | (t == sep)
            realq = (m.bool() & ~special).double()  # [B, T]
            keyok = m.bool() & (t != sep)
            rr = []
            for b in range(t.shape[0]):
                real = [(counts.get(int(x), 0), j) for j, x in enumerate(t[b]) if realq[b, j] > 0]
                r = min(real)[1] if real else -1
                rr.append(r if r >= 0 and int(t[b, r]) not in top else -1)
            rr = torch.tensor(rr)
            counted = (rr >= 0).double()[:, None]
            nq += int(realq.sum())
            nrq += int((realq * counted).sum())
            out = model(input_ids=t, attention_mask=m, output_attentions=True)
            pos = torch.arange(t.shape[1])
            for layer, a in enumerate(out.attentions):  # [B, H, T, T]
                am = a.masked_fill(~keyok[:, None, None, :], -1.0)
                mx, arg = am.max(-1)
                conf[layer] += (mx * realq[:, None, :]).sum((0, 2)).double()
                off = (arg - pos).clamp(-R, R) + R
                for h in range(H):
                    hist[layer, h].index_add_(0, off[:, h].reshape(-1), realq.reshape(-1))
                rare[layer] += ((arg == rr[:, None, None]).double() * realq[:, None, :] * counted[:, None, :]).sum((0, 2))
        conf /= nq
        rare /= max(nrq, 1)
        frac = hist.max(-1).values / hist.sum(-1)
        secs = time.perf_counter() - t0
    tokens = sum(len(x) for x in ids)
    print(json.dumps({"bench": "analysis", "model": "minilm", "sentences": len(sents), "tokens": tokens, "seconds": secs,
                      "check": {"conf_0_2": float(conf[0, 2]), "pos_frac_0_2": float(frac[0, 2])}}))

    # Sweep: one head_mask per head.
    with torch.no_grad():
        sub = ids[:n_sweep]
        t0 = time.perf_counter()
        data = list(batches(sub))
        def pooled(hm):
            outs = []
            for t, m in data:
                h = model(input_ids=t, attention_mask=m, head_mask=hm).last_hidden_state
                mm = m[:, :, None].float()
                outs.append((h * mm).sum(1) / mm.sum(1))
            return torch.cat(outs)
        t1 = time.perf_counter()
        full = pooled(None)
        fwd = time.perf_counter() - t1
        res = torch.zeros(6, 12)
        for l in range(6):
            for h in range(12):
                hm = torch.ones(6, 12)
                hm[l, h] = 0
                res[l, h] = (1 - torch.nn.functional.cosine_similarity(pooled(hm), full, dim=-1)).mean()
        secs = time.perf_counter() - t0
    print(json.dumps({"bench": "sweep", "model": "minilm", "sentences": n_sweep, "seconds": secs, "forward_seconds": fwd, "check": {"enc_0_2": float(res[0, 2])}}))


if __name__ == "__main__":
    main()
