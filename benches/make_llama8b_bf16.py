"""A Llama-3-8B-shaped checkpoint with random bf16 weights, sharded as transformers writes it
(model-0000K-of-0000N.safetensors + model.safetensors.index.json, shards of at most ~5 GB),
with Llama 3.1 8B's config.json (rope_scaling llama3) and a given tokenizer.json. For
benches/bf16_8b.sh: write it into a temporary directory, never into the repository (16 GB).
One shard's tensors are held at a time. Seeded.

    python benches/make_llama8b_bf16.py OUT_DIR TOKENIZER_JSON [LAYERS | 1b]

`1b` writes Llama 3.2 1B's shape instead (16 layers, hidden 2048, 32 query and 8 key/value
heads of 64, tied embeddings; 2.5 GB).
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
    "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16",
}
SHARD_BYTES = 5 * 1000**3


def tensors(cfg):
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    dh, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    yield "model.embed_tokens.weight", (v, h)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (nh * dh, h)
        yield p + "self_attn.k_proj.weight", (nkv * dh, h)
        yield p + "self_attn.v_proj.weight", (nkv * dh, h)
        yield p + "self_attn.o_proj.weight", (h, nh * dh)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (i, h)
        yield p + "mlp.up_proj.weight", (i, h)
        yield p + "mlp.down_proj.weight", (h, i)
    yield "model.norm.weight", (h,)
    if not cfg["tie_word_embeddings"]:
        yield "lm_head.weight", (v, h)


def main():
    out, tok = sys.argv[1], sys.argv[2]
    cfg = dict(CONFIG)
    if len(sys.argv) > 3 and sys.argv[3] == "1b":
        cfg.update(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64, tie_word_embeddings=True,
                   rope_scaling=dict(CONFIG["rope_scaling"], factor=32.0))
    elif len(sys.argv) > 3:
        cfg["num_hidden_layers"] = int(sys.argv[3])
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    specs = list(tensors(cfg))
    shards, cur, size = [], [], 0
    for name, shape in specs:
        n = 2 * int(torch.tensor(shape).prod())
        if cur and size + n > SHARD_BYTES:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += n
    shards.append(cur)
    index, total = {}, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        data = {}
        for name, shape in shard:
            data[name] = torch.ones(shape, dtype=torch.bfloat16) if len(shape) == 1 else (torch.randn(shape, dtype=torch.bfloat16) * 0.02)
            index[name] = fname
            total += data[name].numel() * 2
        save_file(data, os.path.join(out, fname), metadata={"format": "pt"})
        del data
        print(f"wrote {fname}", flush=True)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": index}, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    shutil.copy(tok, os.path.join(out, "tokenizer.json"))
    print(f"{out}: {total / 1e9:.2f} GB in {len(shards)} shards")


if __name__ == "__main__":
    main()
