#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into fuzz/corpus/<target>/ (docs/fuzzing.md):
small valid files taken from the repository's fixtures or built here, and a few hostile ones.
Run from the repository root with the project venv: `.venv/bin/python fuzz/make_corpus.py`.
Deterministic; every file stays under 64 KB."""

import json
import shutil
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fuzz" / "corpus"
FIX = ROOT / "tests" / "fixtures"


def put(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) < 64 * 1024, (target, name, len(data))
    (d / name).write_bytes(data)


def copy(target, name, src):
    put(target, name, Path(src).read_bytes())


# --- CoNLL-U -------------------------------------------------------------------------------
W = "{}\t{}\t_\tX\t_\t_\t{}\t{}\t_\t{}\n"
put("conllu", "simple.conllu", "# sent_id = s1\n# text = The cat sleeps.\n" + W.format(1, "The", 2, "det", "_") + W.format(2, "cat", 3, "nsubj", "_") + W.format(3, "sleeps", 0, "root", "SpaceAfter=No") + W.format(4, ".", 3, "punct", "_") + "\n")
put("conllu", "multiword_empty_crlf.conllu", ("# text = Don't go.\n1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_\n" + W.format(1, "Do", 3, "aux", "_") + W.format(2, "n't", 3, "advmod", "_") + W.format(3, "go", 0, "root", "SpaceAfter=No") + "3.1\tgo\t_\tX\t_\t_\t_\t_\t3:conj\t_\n" + W.format(4, ".", 3, "punct", "_") + "\n\n\n").replace("\n", "\r\n"))
put("conllu", "cycle.conllu", "# sent_id = s1\n# text = a b\n" + W.format(1, "a", 2, "dep", "_") + W.format(2, "b", 1, "dep", "_") + "\n")
put("conllu", "bad_head.conllu", "# text = a\n" + W.format(1, "a", 7, "root", "_") + "\n")
pud = (ROOT / "assets" / "pud_en.conllu")
if pud.exists():
    blocks = pud.read_text(encoding="utf-8").split("\n\n")[:2]
    put("conllu", "pud2.conllu", "\n\n".join(blocks) + "\n\n")

# --- safetensors ---------------------------------------------------------------------------
def safetensors(tensors, meta=None, pad=b""):
    header, data = {}, b""
    if meta:
        header["__metadata__"] = meta
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode() + pad
    return struct.pack("<Q", len(h)) + h + data


put("safetensors", "small.safetensors", safetensors({
    "w": ("F32", [2, 3], struct.pack("<6f", *range(6))),
    "b": ("F16", [2], b"\x00\x3c\x00\xc0"),
    "h": ("BF16", [1, 2], b"\x80\x3f\x00\x40"),
    "i": ("I64", [2], struct.pack("<2q", 7, -1)),
    "j": ("I32", [1], struct.pack("<i", 3)),
    "k": ("I8", [3], b"\x01\xff\x02"),
    "e": ("F32", [0, 4], b""),
}, meta={"format": "pt"}, pad=b"  "))
put("safetensors", "huge_shape.safetensors", safetensors({"w": ("F32", [262144, 1048576], b"\0" * 16)}))
put("safetensors", "huge_header.safetensors", struct.pack("<Q", 1 << 40) + b"{}")
put("safetensors", "bad_offsets.safetensors", safetensors({"w": ("F32", [2], b"\0" * 8)}).replace(b"[0, 8]", b"[8, 0]"))


# --- GGUF ----------------------------------------------------------------------------------
def gs(s):
    s = s.encode()
    return struct.pack("<Q", len(s)) + s


def gguf(kvs, tensors, align=32):
    """kvs: [(key, type, payload bytes)]; tensors: [(name, dims, ggml type, raw)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, t, payload in kvs:
        out += gs(k) + struct.pack("<I", t) + payload
    offs, data = [], b""
    for _, _, _, raw in tensors:
        data += b"\0" * (-len(data) % align)
        offs.append(len(data))
        data += raw
    for (name, dims, t, _), off in zip(tensors, offs):
        out += gs(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", t, off)
    out += b"\0" * (-len(out) % align)
    return out + data


half1 = b"\x00\x3c"  # 1.0 in IEEE half
kvs = [
    ("general.architecture", 8, gs("llama")),
    ("general.alignment", 4, struct.pack("<I", 32)),
    ("u8", 0, b"\x07"), ("i8", 1, b"\xff"), ("u16", 2, struct.pack("<H", 9)), ("i16", 3, struct.pack("<h", -9)),
    ("i32", 5, struct.pack("<i", -5)), ("f32", 6, struct.pack("<f", 0.5)), ("bool", 7, b"\x01"),
    ("u64", 10, struct.pack("<Q", 11)), ("i64", 11, struct.pack("<q", -11)), ("f64", 12, struct.pack("<d", 1e-5)),
    ("tokens", 9, struct.pack("<IQ", 8, 2) + gs("<s>") + gs("a")),
    ("nested", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 4, 2) + struct.pack("<2I", 1, 2)),
]
tensors = [
    ("f32", [2, 2], 0, struct.pack("<4f", 1, 2, 3, 4)),
    ("f16", [4], 1, half1 * 4),
    ("q4_0", [32], 2, half1 + bytes(range(16))),
    ("q4_1", [32], 3, half1 + half1 + bytes(range(16))),
    ("q8_0", [32, 1], 8, half1 + bytes(range(32))),
]
put("gguf", "types.gguf", gguf(kvs, tensors))
def garr(t, items):
    """A GGUF array of element type t (8: strings, 6: f32, 5: i32) holding items."""
    enc = {8: gs, 6: lambda x: struct.pack("<f", x), 5: lambda x: struct.pack("<i", x)}[t]
    return struct.pack("<IQ", t, len(items)) + b"".join(enc(x) for x in items)


# The tokenizer in a GGUF's metadata (crates/core/src/model/tokenize/gguf_tokenizer.rs): byte-level BPE and
# sentencepiece BPE, each small and valid.
put("gguf", "tokenizer_bpe.gguf", gguf([
    ("general.architecture", 8, gs("qwen2")), ("tokenizer.ggml.model", 8, gs("gpt2")), ("tokenizer.ggml.pre", 8, gs("qwen2")),
    ("tokenizer.ggml.tokens", 9, garr(8, ["a", "b", "ab", "\u0120", "\u0120ab", "<|end|>"])),
    ("tokenizer.ggml.token_type", 9, garr(5, [1, 1, 1, 1, 1, 3])),
    ("tokenizer.ggml.merges", 9, garr(8, ["a b", "\u0120 ab"])),
    ("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 5)),
], []))
put("gguf", "tokenizer_spm.gguf", gguf([
    ("general.architecture", 8, gs("gemma3")), ("tokenizer.ggml.model", 8, gs("llama")),
    ("tokenizer.ggml.tokens", 9, garr(8, ["<unk>", "<bos>", "<0x63>", "\u2581", "a", "b", "\u2581a", "\u2581ab", "\n\n"])),
    ("tokenizer.ggml.scores", 9, garr(6, [0, 0, 0, -1, -2, -3, -4, -5, -1000])),
    ("tokenizer.ggml.token_type", 9, garr(5, [3, 3, 6, 1, 1, 1, 1, 1, 4])),
    ("tokenizer.ggml.unknown_token_id", 4, struct.pack("<I", 0)), ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1)),
    ("tokenizer.ggml.add_bos_token", 7, b"\x01"), ("tokenizer.ggml.add_space_prefix", 7, b"\x00"),
], []))
put("gguf", "huge_tensor.gguf", gguf([], [("t", [1 << 20, 1 << 18], 0, b"")]))
put("gguf", "huge_array.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gs("a") + struct.pack("<IIQ", 9, 0, 1 << 40))
put("gguf", "huge_count.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 40))


# --- GGUF models (gguf_model: llama_gguf::build_from) --------------------------------------
# One tiny model per architecture family read (hidden 4, one layer, 2 heads, vocab 6), written
# with the gguf package's writer as llama.cpp's converter names things, and an unknown one.
def gguf_model(arch, kvs, tensors):
    import tempfile
    import gguf as gg
    import numpy as np
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        w = gg.GGUFWriter(str(path), arch)
        for k, v in kvs.items():
            (w.add_array if isinstance(v, list) else w.add_bool if isinstance(v, bool) else w.add_uint32 if isinstance(v, int) else w.add_float32)(f"{arch}.{k}", v)
        for name, shape in tensors:
            x = rng.standard_normal(shape).astype(np.float32)
            w.add_tensor(name, np.abs(x) + 1 if name.startswith("rope_factors") else -np.abs(x) - 0.1 if name.endswith("ssm_a") else x)
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        return path.read_bytes()


V, D, F = 6, 4, 8
common_kv = {"block_count": 1, "embedding_length": D, "feed_forward_length": F, "attention.head_count": 2, "context_length": 16}
llama_t = [("token_embd.weight", (V, D)), ("output_norm.weight", (D,)), ("blk.0.attn_norm.weight", (D,)), ("blk.0.ffn_norm.weight", (D,)),
           ("blk.0.attn_q.weight", (D, D)), ("blk.0.attn_k.weight", (D, D)), ("blk.0.attn_v.weight", (D, D)), ("blk.0.attn_output.weight", (D, D)),
           ("blk.0.ffn_gate.weight", (F, D)), ("blk.0.ffn_up.weight", (F, D)), ("blk.0.ffn_down.weight", (D, F))]
put("gguf_model", "llama.gguf", gguf_model("llama", {**common_kv, "attention.layer_norm_rms_epsilon": 1e-5}, llama_t))
put("gguf_model", "phi3.gguf", gguf_model("phi3", {**common_kv, "attention.layer_norm_rms_epsilon": 1e-5, "rope.dimension_count": 2, "rope.scaling.original_context_length": 8, "attention.sliding_window": 3},
    [t for t in llama_t if "attn_q" not in t[0] and "attn_k" not in t[0] and "attn_v" not in t[0] and "ffn_gate" not in t[0] and "ffn_up" not in t[0]]
    + [("blk.0.attn_qkv.weight", (3 * D, D)), ("blk.0.ffn_up.weight", (2 * F, D)), ("rope_factors_short.weight", (1,)), ("rope_factors_long.weight", (1,))]))
put("gguf_model", "gptneox.gguf", gguf_model("gptneox", {**common_kv, "attention.layer_norm_epsilon": 1e-5, "rope.dimension_count": 2, "use_parallel_residual": True},
    [("token_embd.weight", (V, D)), ("output.weight", (V, D))] + [(f"{n}.{s}", (D,)) for n in ["output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"] for s in ["weight", "bias"]]
    + [("blk.0.attn_qkv.weight", (3 * D, D)), ("blk.0.attn_qkv.bias", (3 * D,)), ("blk.0.attn_output.weight", (D, D)), ("blk.0.attn_output.bias", (D,)),
       ("blk.0.ffn_up.weight", (F, D)), ("blk.0.ffn_up.bias", (F,)), ("blk.0.ffn_down.weight", (D, F)), ("blk.0.ffn_down.bias", (D,))]))
t5_att = lambda p: [(f"{p}_{x}.weight", (D, D)) for x in "qkvo"]
put("gguf_model", "t5.gguf", gguf_model("t5", {**common_kv, "attention.key_length": 2, "attention.value_length": 2, "attention.relative_buckets_count": 8,
    "attention.layer_norm_rms_epsilon": 1e-6, "decoder_start_token_id": 0},
    [("token_embd.weight", (V, D)), ("enc.output_norm.weight", (D,)), ("dec.output_norm.weight", (D,)),
     ("enc.blk.0.attn_norm.weight", (D,)), ("enc.blk.0.attn_rel_b.weight", (8, 2)), ("enc.blk.0.ffn_norm.weight", (D,)), ("enc.blk.0.ffn_up.weight", (F, D)), ("enc.blk.0.ffn_down.weight", (D, F)),
     ("dec.blk.0.attn_norm.weight", (D,)), ("dec.blk.0.attn_rel_b.weight", (8, 2)), ("dec.blk.0.cross_attn_norm.weight", (D,)), ("dec.blk.0.ffn_norm.weight", (D,)),
     ("dec.blk.0.ffn_up.weight", (F, D)), ("dec.blk.0.ffn_down.weight", (D, F))] + t5_att("enc.blk.0.attn") + t5_att("dec.blk.0.attn") + t5_att("dec.blk.0.cross_attn")))
# Qwen3-MoE: each layer's experts stacked per projection (E = 3, expert width 4, 2 per token).
E, FE = 3, 4
moe_t = ([t for t in llama_t if not t[0].startswith("blk.0.ffn_") or t[0] == "blk.0.ffn_norm.weight"]
         + [("blk.0.attn_q_norm.weight", (2,)), ("blk.0.attn_k_norm.weight", (2,)), ("blk.0.ffn_gate_inp.weight", (E, D)),
            ("blk.0.ffn_gate_exps.weight", (E, FE, D)), ("blk.0.ffn_up_exps.weight", (E, FE, D)), ("blk.0.ffn_down_exps.weight", (E, D, FE))])
moe_kv = {**common_kv, "attention.layer_norm_rms_epsilon": 1e-6, "attention.key_length": 2, "expert_count": E, "expert_used_count": 2,
          "expert_feed_forward_length": FE}
put("gguf_model", "qwen3moe.gguf", gguf_model("qwen3moe", moe_kv, moe_t))
put("gguf_model", "qwen3moe_bad_experts.gguf", gguf_model("qwen3moe", moe_kv, [t if t[0] != "blk.0.ffn_up_exps.weight" else (t[0], (E, FE, D - 1)) for t in moe_t]))
# DeepSeek-V3 as deepseek2: latent attention (no query latent), k_b / v_b split, sigmoid router
# with its choice bias, one shared expert.
ds_t = ([t for t in moe_t if "attn_q" not in t[0] and "attn_k" not in t[0] and "attn_v" not in t[0]]
        + [("blk.0.attn_q.weight", (2 * 4, D)), ("blk.0.attn_kv_a_mqa.weight", (4, D)), ("blk.0.attn_kv_a_norm.weight", (2,)),
           ("blk.0.attn_k_b.weight", (2, 2, 2)), ("blk.0.attn_v_b.weight", (2, 2, 2)), ("blk.0.exp_probs_b.bias", (E,)),
           ("blk.0.ffn_gate_shexp.weight", (FE, D)), ("blk.0.ffn_up_shexp.weight", (FE, D)), ("blk.0.ffn_down_shexp.weight", (D, FE))])
ds_t = [t if t[0] != "blk.0.attn_output.weight" else (t[0], (D, 2 * 2)) for t in ds_t]
ds_kv = {**common_kv, "attention.layer_norm_rms_epsilon": 1e-6, "rope.dimension_count": 2, "attention.kv_lora_rank": 2,
         "attention.key_length": 4, "attention.value_length": 2, "attention.key_length_mla": 4, "attention.value_length_mla": 2,
         "expert_count": E, "expert_used_count": 2, "expert_feed_forward_length": FE, "expert_shared_count": 1, "expert_gating_func": 2,
         "expert_weights_norm": True, "expert_weights_scale": 2.5, "leading_dense_block_count": 0}
put("gguf_model", "deepseek2.gguf", gguf_model("deepseek2", ds_kv, ds_t))
put("gguf_model", "deepseek2_bad_k_b.gguf", gguf_model("deepseek2", ds_kv, [t if t[0] != "blk.0.attn_k_b.weight" else (t[0], (2, 3, 2)) for t in ds_t]))
# gpt-oss: sinks, a biased router, biased experts (fused back into transformers' layout at load).
go_t = ([t for t in llama_t if not t[0].startswith("blk.0.ffn_")]
        + [("blk.0.post_attention_norm.weight", (D,)), ("blk.0.attn_sinks.weight", (2,)), ("blk.0.ffn_gate_inp.weight", (E, D)), ("blk.0.ffn_gate_inp.bias", (E,))]
        + [(f"blk.0.attn_{x}.bias", (D,)) for x in ["q", "k", "v", "output"]]
        + [(f"blk.0.ffn_{x}_exps.{s}", (E, FE, D) if s == "weight" else (E, FE)) for x in ["gate", "up"] for s in ["weight", "bias"]]
        + [("blk.0.ffn_down_exps.weight", (E, D, FE)), ("blk.0.ffn_down_exps.bias", (E, D))])
go_kv = {**common_kv, "attention.layer_norm_rms_epsilon": 1e-5, "expert_count": E, "expert_used_count": 2, "expert_feed_forward_length": FE,
         "attention.sliding_window": 2}
put("gguf_model", "gptoss.gguf", gguf_model("gpt-oss", go_kv, go_t))
put("gguf_model", "gptoss_bad_bias.gguf", gguf_model("gpt-oss", go_kv, [t if t[0] != "blk.0.ffn_up_exps.bias" else (t[0], (E, FE + 1)) for t in go_t]))
# LFM2: a short-convolution layer (0 key/value heads) and an attention layer; and a file whose
# head_count_kv array is a layer short.
lfm2_t = ([t for t in llama_t if not t[0].startswith("blk.0.attn_") and t[0] != "output_norm.weight"]
          + [("token_embd_norm.weight", (D,)), ("blk.0.attn_norm.weight", (D,)), ("blk.0.shortconv.in_proj.weight", (3 * D, D)),
             ("blk.0.shortconv.conv.weight", (D, 3)), ("blk.0.shortconv.out_proj.weight", (D, D))]
          + [(n.replace("blk.0", "blk.1"), s) for n, s in llama_t if n.startswith("blk.0.")]
          + [("blk.1.attn_q_norm.weight", (2,)), ("blk.1.attn_k_norm.weight", (2,))])
lfm2_kv = {**common_kv, "block_count": 2, "attention.layer_norm_rms_epsilon": 1e-5, "attention.head_count_kv": [0, 2], "shortconv.l_cache": 3}
put("gguf_model", "lfm2.gguf", gguf_model("lfm2", lfm2_kv, lfm2_t))
put("gguf_model", "lfm2_short_kv.gguf", gguf_model("lfm2", {**lfm2_kv, "attention.head_count_kv": [2]}, lfm2_t))
# Granite-4.0-H: a Mamba-2 layer (2 heads of 4, one group, state 2) and an attention layer; and
# a file whose ssm_a has a head too many.
gh_t = ([t for t in llama_t if not t[0].startswith("blk.0.attn_")] + [("blk.0.attn_norm.weight", (D,)),
         ("blk.0.ssm_in.weight", (8 + 12 + 2, D)), ("blk.0.ssm_conv1d.weight", (12, 4)), ("blk.0.ssm_conv1d.bias", (12,)),
         ("blk.0.ssm_dt.bias", (2,)), ("blk.0.ssm_a", (2, 1)), ("blk.0.ssm_d", (2, 1)), ("blk.0.ssm_norm.weight", (1, 8)), ("blk.0.ssm_out.weight", (D, 8))]
        + [(n.replace("blk.0", "blk.1"), s) for n, s in llama_t if n.startswith("blk.0.")])
gh_kv = {**common_kv, "block_count": 2, "attention.layer_norm_rms_epsilon": 1e-5, "attention.head_count_kv": [0, 2], "expert_count": 0,
         "ssm.conv_kernel": 4, "ssm.state_size": 2, "ssm.group_count": 1, "ssm.inner_size": 8, "ssm.time_step_rank": 2,
         "rope.scaling.finetuned": False, "attention.scale": 0.5, "residual_scale": 0.5, "logit_scale": 2.0}
put("gguf_model", "granitehybrid.gguf", gguf_model("granitehybrid", gh_kv, gh_t))
put("gguf_model", "granitehybrid_bad_a.gguf", gguf_model("granitehybrid", gh_kv, [t if t[0] != "blk.0.ssm_a" else (t[0], (3, 1)) for t in gh_t]))
# Jamba: a Mamba layer (inner 8, state 2, dt rank 1) with a dense MLP, then an attention layer
# with experts; and a file whose ssm_a is a state short.
jb_t = ([t for t in llama_t if not t[0].startswith("blk.0.attn_")] + [("blk.0.attn_norm.weight", (D,)),
         ("blk.0.ssm_in.weight", (16, D)), ("blk.0.ssm_conv1d.weight", (8, 4)), ("blk.0.ssm_conv1d.bias", (8,)), ("blk.0.ssm_x.weight", (5, 8)),
         ("blk.0.ssm_dt.weight", (8, 1)), ("blk.0.ssm_dt.bias", (8,)), ("blk.0.ssm_dt_norm.weight", (1,)), ("blk.0.ssm_b_norm.weight", (2,)),
         ("blk.0.ssm_c_norm.weight", (2,)), ("blk.0.ssm_a", (8, 2)), ("blk.0.ssm_d", (8,)), ("blk.0.ssm_out.weight", (D, 8))]
        + [(n.replace("blk.0", "blk.1"), s) for n, s in moe_t if n.startswith("blk.0.") and "_norm" not in n[6:12] and "q_norm" not in n and "k_norm" not in n])
jb_kv = {**common_kv, "block_count": 2, "attention.layer_norm_rms_epsilon": 1e-6, "attention.head_count_kv": [0, 2], "expert_count": E,
         "expert_used_count": 2, "feed_forward_length": FE, "ssm.conv_kernel": 4, "ssm.state_size": 2, "ssm.inner_size": 8, "ssm.time_step_rank": 1}
jb_t = [t if not t[0].startswith("blk.0.ffn_") or t[0] == "blk.0.ffn_norm.weight" else (t[0], (FE, D) if "down" not in t[0] else (D, FE)) for t in jb_t]
put("gguf_model", "jamba.gguf", gguf_model("jamba", jb_kv, jb_t))
put("gguf_model", "jamba_bad_a.gguf", gguf_model("jamba", jb_kv, [t if t[0] != "blk.0.ssm_a" else (t[0], (8, 1)) for t in jb_t]))
# A token table and a query projection of no dimensions (GGUF allows 0 dimensions): found in
# stop 75 to panic the loaders that read the vocabulary as the table's first dimension.
put("gguf_model", "llama_scalar_embd.gguf", gguf_model("llama", {**common_kv, "attention.layer_norm_rms_epsilon": 1e-5},
    [t if t[0] != "token_embd.weight" else (t[0], ()) for t in llama_t]))
put("gguf_model", "granitehybrid_scalar_q.gguf", gguf_model("granitehybrid", gh_kv, [t if t[0] != "blk.1.attn_q.weight" else (t[0], ()) for t in gh_t]))
put("gguf_model", "unknown_arch.gguf", gguf_model("mamba", common_kv, [("token_embd.weight", (V, D))]))
put("gguf_model", "phi3_one_factor.gguf", gguf_model("phi3", {**common_kv, "attention.layer_norm_rms_epsilon": 1e-5},
    [t for t in llama_t if "attn_q" not in t[0] and "attn_k" not in t[0] and "attn_v" not in t[0] and "ffn_gate" not in t[0] and "ffn_up" not in t[0]]
    + [("blk.0.attn_qkv.weight", (3 * D, D)), ("blk.0.ffn_up.weight", (2 * F, D)), ("rope_factors_long.weight", (1,))]))


# --- Marian .bin ---------------------------------------------------------------------------
def marian_bin(items):
    """items: [(name, type, shape, data)]."""
    names = [n.encode() + b"\0" for n, *_ in items]
    out = struct.pack("<QQ", 1, len(items))
    for name, (_, t, shape, data) in zip(names, items):
        out += struct.pack("<4Q", len(name), t, len(shape), len(data))
    out += b"".join(names)
    out += b"".join(struct.pack(f"<{len(s)}i", *s) for _, _, s, _ in items)
    pad = -(len(out) + 8) % 256
    out += struct.pack("<Q", pad) + b"\0" * pad
    return out + b"".join(d for *_, d in items)


yml = b"transformer-heads: 2\n\0"
put("marian_bin", "small.bin", marian_bin([
    ("special:model.yml", 0x0104, [len(yml)], yml),
    ("Wemb", 0x4101, [4, 2], bytes([1, 2, 3, 4, 255, 254, 0, 7]) + struct.pack("<f", 2.0)),
    ("encoder_l1_self_Wq", 0x4101, [2, 2], bytes([1, 2, 3, 4]) + struct.pack("<f", 4.0)),
    ("encoder_l1_self_bq", 0x404, [1, 2], struct.pack("<2f", 0.5, -0.5)),
    ("encoder_l1_self_Wq_QuantMultA", 0x404, [1], struct.pack("<f", 1.0)),
]))
put("marian_bin", "huge_count.bin", struct.pack("<QQ", 1, 1 << 40))
put("marian_bin", "huge_shape.bin", marian_bin([("w", 0x404, [1 << 20, 1 << 20], b"")]))

# --- pytorch_model.bin (zip + pickle) ------------------------------------------------------
for f in sorted((FIX / "torch_bin").glob("*.bin")):
    if f.stat().st_size < 8192:  # deep.bin (30 KB of nesting) is left to tests/readers/torch_pickle.rs
        copy("torch_pickle", f.name, f)

# --- tokenizer.json ------------------------------------------------------------------------
for fam in ["bert", "llama", "marian", "marian_hf"]:
    copy("tokenizer_json", f"lrp_{fam}.json", FIX / "lrp_tiny" / fam / "tokenizer.json")
copy("tokenizer_json", "tiny_gpt2.json", FIX / "tiny_hf" / "gpt2" / "tokenizer.json")

# --- sentencepiece -------------------------------------------------------------------------
def varint(b, i):
    r = s = 0
    while True:
        x = b[i]
        i += 1
        r |= (x & 0x7F) << s
        s += 7
        if x < 0x80:
            return r, i


def spm_head(src, pieces):
    """The ModelProto of `src` with only its first `pieces` pieces (field 1) kept."""
    b, i, out, kept = Path(src).read_bytes(), 0, b"", 0
    while i < len(b):
        start = i
        key, i = varint(b, i)
        assert key & 7 == 2, "every ModelProto field of the fixtures is length-delimited"
        n, i = varint(b, i)
        i += n
        if key >> 3 != 1 or kept < pieces:
            out += b[start:i]
            kept += key >> 3 == 1
    return out


put("spm", "target40.spm", spm_head(FIX / "tiny_spm" / "target.spm", 40))


def small_charsmap_spm():
    """A 30-piece unigram model with a precompiled charsmap of six rules (the fixtures' is
    52 KB, which slows every execution ten times)."""
    import io
    import os
    import tempfile

    import sentencepiece as spm

    rules = [("\uff21", "A"), ("\u3000", " "), ("\ufb01", "fi"), ("\u00c5", "A\u030a"), ("\u2460", "1"), ("\uff21\u0302", "\u00c2")]
    hexes = lambda t: " ".join("%04X" % ord(c) for c in t)
    lines = ["the cat sat on the mat", "a dog barks at the cat", "\ufb01ne \uff21 day", "one two three four five six"] * 5
    cwd, model = os.getcwd(), io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the model records the rule file's name: a relative one is reproducible
        try:
            Path("rules.tsv").write_text("".join(f"{hexes(k)}\t{hexes(v)}\n" for k, v in rules), encoding="utf-8")
            spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, model_type="unigram", vocab_size=30, hard_vocab_limit=False,
                                           num_threads=1, minloglevel=2, normalization_rule_tsv="rules.tsv")
        finally:
            os.chdir(cwd)
    return model.getvalue()


put("spm", "charsmap.spm", small_charsmap_spm())
# M2M100's BPE model (make_tiny_m2m100_spm.py): 200 pieces with a cut nmt_nfkc charsmap.
copy("spm", "m2m100_bpe.spm", FIX / "tiny_hf" / "m2m100_spm" / "sentencepiece.bpe.model")

# --- MarianMT vocab.json -------------------------------------------------------------------
put("marian_vocab", "small.json", json.dumps({"</s>": 0, "<unk>": 1, "<pad>": 2, "\u2581a": 3, "b": 4}))
put("marian_vocab", "twice.json", json.dumps({"</s>": 0, "<unk>": 0, "<pad>": 2}))

# --- pruning checkpoint.json ---------------------------------------------------------------
identity = {"model": "tiny", "family": "bert", "gated": ["enc 2x2"], "dataset": "two.txt", "sentences": 2, "options": {"lambda": "0.01", "seed": "0"}}
state = {"format": "headscope-prune-checkpoint/1", "identity": identity, "step": 3, "log_alpha": [0.1, -0.2, 0.3, 0.0], "adam_m": [0, 0, 0, 0], "adam_v": [0, 0, 0, 1e-9],
         "curve": [{"step": 1, "loss": 2.5, "penalty": 0.1, "expected_open": 3.5, "open": 4, "eval": None}, {"step": 2, "loss": 2.4, "penalty": 0.1, "expected_open": 3.4, "open": 3, "eval": 0.7}]}
put("checkpoint", "valid.json", json.dumps(state))
put("checkpoint", "other_model.json", json.dumps({**state, "identity": {**identity, "model": "other"}}))
put("checkpoint", "short.json", json.dumps({**state, "log_alpha": [1.0]}))
print("corpus written to", OUT)
