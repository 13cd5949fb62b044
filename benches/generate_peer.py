"""Peer of benches/generate.rhai: transformers' `generate` (greedy, its own key/value cache) on
the same SmolLM2 GGUF, dequantised by transformers' GGUF loader, float32, the same prompt and
token counts. One JSON line per new-token count; `ids` lets the bench compare the tokens.

Usage: generate_peer.py MODEL_DIR PROMPT"""
import glob
import json
import os
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

d, prompt = sys.argv[1:3]
torch.set_num_threads(int(os.environ.get("THREADS", torch.get_num_threads())))
gguf = os.path.basename(glob.glob(os.path.join(d, "*.gguf"))[0])
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=gguf, torch_dtype=torch.float32).eval()
tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
ids = torch.tensor([tok.encode(prompt).ids])
mask = torch.ones_like(ids)
with torch.no_grad():
    model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)  # warm-up
    for n in [32, 64, 128]:
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False)
        secs = time.perf_counter() - t
        new = out[0, ids.shape[1]:].tolist()
        print(json.dumps({"mode": "transformers", "new_tokens": n, "generated": len(new), "seconds": secs, "ids": new}))
