"""A random Llama of SmolLM2-135M's shape (30 layers, 9 query and 3 key/value heads of 64,
hidden 576, vocabulary 49152, tied embeddings) written by transformers beside a given
tokenizer.json, for benchmarks on a machine where the real checkpoint cannot travel. Seeded.

    python benches/make_random_llama.py OUT_DIR TOKENIZER_JSON [LAYERS]
"""
import json
import os
import shutil
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    out, tok = sys.argv[1], sys.argv[2]
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    m = LlamaForCausalLM(cfg)
    m.save_pretrained(out, safe_serialization=True)
    shutil.copy(tok, os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}, f)
    print(f"wrote {out}: {m.num_parameters()} parameters")


if __name__ == "__main__":
    main()
