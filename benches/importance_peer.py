"""Python peer of benches/importance.rhai: the bertology recipe in HF transformers on the same
model and sentences (SmolLM2-135M exported from its GGUF by tests/fixtures/export_smollm2_hf.py,
float32, eager attention): per sentence a head_mask of ones requiring grad, the model's own
next-token loss, backward, |grad| accumulated (docs/methods.md#gradient-head-importance). The
head_mask of LlamaForCausalLM is not consulted by its attention, so the mask multiplies each
head's attention output through a forward pre-hook on o_proj (the same gate headscope applies).

Usage: importance_peer.py HF_DIR PUD_TXT N   -> one JSON line on stdout
"""
import json
import os
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast


def main():
    d, pud, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(os.cpu_count())
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
    cfg = model.config
    heads, dh = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    gate = {}

    def hook(layer):
        def pre(mod, args):
            x = args[0]
            b, t, _ = x.shape
            return ((x.view(b, t, heads, dh) * gate["g"][layer].view(1, 1, heads, 1)).view(b, t, heads * dh),)
        return pre

    for l, layer in enumerate(model.model.layers):
        layer.self_attn.o_proj.register_forward_pre_hook(hook(l))
    sents = [l.strip() for l in open(pud, encoding="utf-8") if l.strip()][:n]
    total = torch.zeros(cfg.num_hidden_layers, heads, dtype=torch.float64)
    start = time.perf_counter()
    for s in sents:
        ids = torch.tensor([tok(s)["input_ids"]])
        gate["g"] = torch.ones(cfg.num_hidden_layers, heads, requires_grad=True)
        loss = model(ids, labels=ids).loss
        loss.backward()
        total += gate["g"].grad.abs().double()
        model.zero_grad(set_to_none=True)
    secs = time.perf_counter() - start
    imp = (total / n).tolist()
    print(json.dumps({"bench": "importance_peer", "sentences": n, "seconds": secs, "check": {"dec_0_0": imp[0][0], "dec_10_3": imp[10][3]}}))


if __name__ == "__main__":
    main()
