"""The HF transformers peer of benches/gpu_bench.rhai on the same device: confidence (each head's
mean over query positions of its largest attention weight, averaged over sentences) from one
eager forward per sentence with output_attentions, and the single-head ablation sweep as one
forward per head over the sweep's sentences (batched, padded), the head zeroed at the output
projection's input by a forward pre-hook (transformers 5 has no head_mask), next-token loss.

    python benches/gpu_peer.py DIR DEVICE PUD_TXT N_CONFIDENCE N_SWEEP
"""
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def sync(dev):
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def main():
    d, dev, pud, n, ns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    tok = AutoTokenizer.from_pretrained(d)
    m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", torch_dtype=torch.float32).to(dev).eval()
    texts = [l.strip() for l in open(pud) if l.strip()]
    cfg = m.config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    with torch.no_grad():
        for t in texts[:4]:
            m(**tok(t, return_tensors="pt").to(dev), output_attentions=True)
        sync(dev)
        t0 = time.perf_counter()
        acc = torch.zeros(L, H, device=dev)
        for t in texts[:n]:
            out = m(**tok(t, return_tensors="pt").to(dev), output_attentions=True)
            acc += torch.stack([a[0].max(-1).values.mean(-1) for a in out.attentions])
        acc /= n
        sync(dev)
        s = time.perf_counter() - t0
        top = int(acc.flatten().argmax())
        print(json.dumps({"bench": "confidence", "sentences": n, "seconds": s, "top": f"dec.{top // H}.{top % H}"}))

        tok.padding_side = "right"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token or tok.unk_token
        b = tok(texts[:ns], return_tensors="pt", padding=True).to(dev)
        labels = b["input_ids"].masked_fill(b["attention_mask"] == 0, -100)
        cur = {"head": None}

        def pre(layer):
            def hook(mod, args):
                if cur["head"] is None or cur["head"][0] != layer:
                    return None
                x = args[0].clone()
                h = cur["head"][1]
                x[..., h * dh:(h + 1) * dh] = 0
                return (x,) + args[1:]
            return hook

        for i, layer in enumerate(m.model.layers):
            layer.self_attn.o_proj.register_forward_pre_hook(pre(i))
        sync(dev)
        t0 = time.perf_counter()
        base = float(m(**b, labels=labels).loss)
        best, arg = -1e9, None
        for l in range(L):
            for h in range(H):
                cur["head"] = (l, h)
                v = float(m(**b, labels=labels).loss) - base
                if v > best:
                    best, arg = v, f"dec.{l}.{h}"
        sync(dev)
        s = time.perf_counter() - t0
        print(json.dumps({"bench": "sweep", "sentences": ns, "seconds": s, "metric": "loss", "top": arg}))


if __name__ == "__main__":
    main()
