"""Python peer of benches/forward.rhai: HF transformers forward passes over the same sentences.

Usage: forward_peer.py ASSETS_DIR   -> one JSON line per measurement on stdout

- minilm: transformers.BertModel (default attention implementation) on the asset.
- enpt encoder: transformers' MarianEncoder with the Firefox-Translations weights (read with
  the fixture's numpy reader). HF's sinusoid frequencies differ slightly from Marian's, which
  does not change the amount of work.
Two batchings: "naive" (32 sentences per batch in corpus order, padded to the longest: what a
notebook usually does) and "bucketed" (sorted by length, batches of at most 4096 padded tokens:
what headscope does). Timings exclude loading and tokenization; torch runs with its default
threads, like headscope.
"""
import json
import os
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
import numpy as np
import torch
from tokenizers import Tokenizer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))


def batches_naive(ids, size=32):
    return [list(range(i, min(i + size, len(ids)))) for i in range(0, len(ids), size)]


def batches_bucketed(ids, max_tokens=4096):
    order = sorted(range(len(ids)), key=lambda i: (len(ids[i]), i))
    out, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * len(ids[i]) > max_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def run(forward, ids, groups, pad):
    tokens = sum(len(x) for x in ids)
    tensors = []
    for g in groups:
        s = max(len(ids[i]) for i in g)
        t = torch.full((len(g), s), pad, dtype=torch.long)
        m = torch.zeros((len(g), s), dtype=torch.long)
        for r, i in enumerate(g):
            t[r, : len(ids[i])] = torch.tensor(ids[i])
            m[r, : len(ids[i])] = 1
        tensors.append((t, m))
    with torch.no_grad():
        forward(*tensors[0])  # warm-up
        t0 = time.perf_counter()
        for t, m in tensors:
            forward(t, m)
        secs = time.perf_counter() - t0
    return tokens, secs


def main():
    assets = sys.argv[1]
    sentences = open(os.path.join(assets, "pud_en.txt"), encoding="utf-8").read().splitlines()
    results = []

    from transformers import BertModel
    t0 = time.perf_counter()
    bert = BertModel.from_pretrained(os.path.join(assets, "minilm")).eval()
    load = time.perf_counter() - t0
    tok = Tokenizer.from_file(os.path.join(assets, "minilm", "tokenizer.json"))
    tok.no_padding(); tok.no_truncation()
    ids = [tok.encode(s).ids for s in sentences]
    fwd = lambda t, m: bert(input_ids=t, attention_mask=m)
    for name, groups in [("naive", batches_naive(ids)), ("bucketed", batches_bucketed(ids))]:
        tokens, secs = run(fwd, ids, groups, 0)
        results.append({"model": "minilm", "batching": name, "tokens": tokens, "seconds": secs, "tokens_per_second": tokens / secs, "load_seconds": load})

    from marian_reference import load_bin
    from transformers import MarianConfig
    from transformers.models.marian.modeling_marian import MarianEncoder
    t0 = time.perf_counter()
    p = load_bin(os.path.join(assets, "marian", "enpt", "model.enpt.intgemm.alphas.bin"))
    cfg = MarianConfig(vocab_size=32000, d_model=256, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=1536,
                       activation_function="relu", scale_embedding=True, max_position_embeddings=512, pad_token_id=0)
    enc = MarianEncoder(cfg).eval()
    sd = {"embed_tokens.weight": p["Wemb"]}
    for l in range(6):
        pre, hp = f"encoder_l{l + 1}_", f"layers.{l}."
        for a, b in [("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")]:
            sd[hp + f"self_attn.{b}.weight"] = p[pre + f"self_W{a}"].T
            sd[hp + f"self_attn.{b}.bias"] = p[pre + f"self_b{a}"].reshape(-1)
        sd[hp + "self_attn_layer_norm.weight"] = p[pre + "self_Wo_ln_scale"].reshape(-1)
        sd[hp + "self_attn_layer_norm.bias"] = p[pre + "self_Wo_ln_bias"].reshape(-1)
        sd[hp + "fc1.weight"] = p[pre + "ffn_W1"].T
        sd[hp + "fc1.bias"] = p[pre + "ffn_b1"].reshape(-1)
        sd[hp + "fc2.weight"] = p[pre + "ffn_W2"].T
        sd[hp + "fc2.bias"] = p[pre + "ffn_b2"].reshape(-1)
        sd[hp + "final_layer_norm.weight"] = p[pre + "ffn_ffn_ln_scale"].reshape(-1)
        sd[hp + "final_layer_norm.bias"] = p[pre + "ffn_ffn_ln_bias"].reshape(-1)
    enc.load_state_dict({k: torch.tensor(np.ascontiguousarray(v), dtype=torch.float32) for k, v in sd.items()}, strict=False)
    load = time.perf_counter() - t0
    mtok = Tokenizer.from_file(os.path.join(assets, "marian", "enpt", "tokenizer.json"))
    mtok.no_padding(); mtok.no_truncation()
    mids = [mtok.encode(s, add_special_tokens=False).ids + [0] for s in sentences]
    fwd = lambda t, m: enc(input_ids=t, attention_mask=m)
    for name, groups in [("naive", batches_naive(mids)), ("bucketed", batches_bucketed(mids))]:
        tokens, secs = run(fwd, mids, groups, 1)
        results.append({"model": "enpt-encoder", "batching": name, "tokens": tokens, "seconds": secs, "tokens_per_second": tokens / secs, "load_seconds": load})

    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
