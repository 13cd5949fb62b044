"""The Python side of benches/long_context.sh.

  text  GGUF T OUT   writes a one-line text of T tokens (the model's tokenizer, BOS included)
                     cut from the Brown corpus to OUT
  shape GGUF T       prints the model's shapes, the FLOPs of one pass over T tokens (matmuls
                     of the layers; causal attention) and this machine's matmul rate
  hf    GGUF TEXT    transformers eager with output_attentions=True over the text: each head's
                     confidence as headscope computes it (max weight over non-BOS keys, mean
                     over non-BOS queries), one JSON line
"""
import json, os, sys, time

import torch
import transformers

def load_tok(gguf):
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))

def cfg_of(gguf):
    return transformers.AutoConfig.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))

mode, gguf = sys.argv[1], sys.argv[2]
if mode == "text":
    t, out = int(sys.argv[3]), sys.argv[4]
    tok = load_tok(gguf)
    words = open(os.path.join(os.path.dirname(__file__), "..", "assets", "brown.txt")).read().split()
    text = " ".join(words[: 2 * t])
    ids = tok(text, add_special_tokens=False)["input_ids"]
    # BOS where the model adds one: T tokens in all.
    bos = 1 if tok.bos_token_id is not None and tok("a")["input_ids"][0] == tok.bos_token_id else 0
    cut = tok.decode(ids[: t - bos]).replace("\n", " ")
    open(out, "w").write(cut + "\n")
elif mode == "shape":
    t = int(sys.argv[3])
    c = cfg_of(gguf)
    d, f, h, l = c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_hidden_layers
    kv = getattr(c, "num_key_value_heads", h)
    dh = getattr(c, "head_dim", None) or d // h
    per_layer = d * h * dh + 2 * d * kv * dh + h * dh * d + 3 * d * f
    matmul = 2.0 * t * per_layer * l
    attention = 2.0 * 2.0 * (t * (t + 1) / 2) * dh * h * l
    def rate(m, k, n):
        a, w = torch.randn(m, k), torch.randn(n, k)
        torch.nn.functional.linear(a, w)
        best = min(timed(lambda: torch.nn.functional.linear(a, w)) for _ in range(5))
        return 2 * m * k * n / best
    def timed(fn):
        s = time.perf_counter(); fn(); return time.perf_counter() - s
    r = (rate(1024, d, f) + rate(1024, f, d) + rate(1024, d, d)) / 3
    print(json.dumps({"layers": l, "heads": h, "kv_heads": kv, "head_dim": dh, "d_model": d, "ffn": f,
                      "flops_matmul": matmul, "flops_attention": attention, "rate": r, "threads": torch.get_num_threads()}))
elif mode == "hf":
    text = open(sys.argv[3]).read().strip()
    tok = load_tok(gguf)
    m = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf), gguf_file=os.path.basename(gguf), torch_dtype=torch.float32, attn_implementation="eager")
    m.eval()
    ids = tok(text, return_tensors="pt")["input_ids"]
    s = time.perf_counter()
    with torch.no_grad():
        out = m.model(ids, output_attentions=True)
    conf = []
    for a in out.attentions:
        a = a[0, :, 1:, 1:]  # non-BOS queries and keys
        conf.append(a.max(-1).values.mean(-1).tolist())
    print(json.dumps({"tokens": ids.shape[1], "seconds": time.perf_counter() - s, "conf_0_0": conf[0][0], "conf_last_0": conf[-1][0]}))
