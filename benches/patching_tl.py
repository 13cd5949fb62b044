"""TransformerLens half of the activation-patching benchmark: TransformerLens 2.18's
`get_act_patch_attn_head_out_all_pos` and `get_act_patch_attn_head_out_by_pos` (denoising: the
corrupted tokens with the clean run's cache patched into hook_z; metric: the logit difference
answer - wrong at the last position) on SmolLM2-135M, fp32, CPU, every core.

Usage: patching_tl.py [--out-dir DIR] [--tokens 20] [--repeat 2] [--skip-by-pos] [--by-pos-layers K]
                      [--seed 0] [--gguf-dir DIR] [--random] [--rebuild]
  -> progress on stderr, one JSON line on stdout; DIR/pair.json (the pair, for headscope's half),
     DIR/tl_results.npz (TL's patching results), DIR/source.txt and the model as an HF
     safetensors directory (config.json, model.safetensors, tokenizer.json) that headscope loads.

The model: SmolLM2-135M-Instruct's GGUF (assets/smollm2, Q4_1) read by transformers' GGUF loader
(dequantised to float32; needs the `gguf` package) and saved with save_pretrained, so both halves
run the same float32 weights. Where the GGUF is missing or does not load (or with --random): a
LlamaForCausalLM of SmolLM2's shape (30 layers, 9 heads, 3 key/value heads, d_model 576, d_mlp
1536, vocab 49152, rope_theta 100000, tied embeddings), random with a fixed seed. An existing
DIR/model.safetensors of the same source is reused (--rebuild to export again).

TransformerLens is loaded offline without from_pretrained (which maps the name to an official
hub model and fetches its config): a HookedTransformerConfig written from the HF config with the
fields of TL's own LlamaForCausalLM conversion, plus rotary_base = rope_theta (TL's Llama branch
leaves it at 10000) and n_ctx capped at 2048 (TL allocates an n_ctx x n_ctx mask per layer; no
effect on short prompts), then TL's convert_llama_weights and load_and_process_state_dict with no
processing (no fold_ln, no centering). TL's logits are checked against the HF model's.

The pair: --tokens seeded random ids in [100, vocab) (clean), the corrupted prompt replaces 3
positions with other random ids; answer = the clean run's top token at the last position, wrong =
the corrupted run's top token there (its second if it equals the answer). Times are wall seconds,
the best of --repeat runs: one plain forward of the corrupted prompt, the clean run_with_cache
(input to TL's patching, timed apart), all_pos and by_pos. by_pos runs n_layers x tokens x
n_heads forwards; --by-pos-layers K times only the first K layers (TL's index_df) and
extrapolates linearly to every layer (by_pos_extrapolated: true in the JSON).
"""
import argparse
import glob
import json
import os
import shutil
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TQDM_DISABLE", "1")  # TL's patching loops draw a progress bar per call

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformer_lens import HookedTransformer, HookedTransformerConfig  # noqa: E402
import transformer_lens.patching as patching  # noqa: E402
from transformer_lens.pretrained.weight_conversions import convert_llama_weights  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOLLM2_SHAPE = dict(
    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576, head_dim=64,
    intermediate_size=1536, vocab_size=49152, rope_theta=100000.0, tie_word_embeddings=True,
    rms_norm_eps=1e-5, max_position_embeddings=8192, hidden_act="silu", bos_token_id=1, eos_token_id=2,
)
SOURCES = {"gguf": "smollm2 gguf", "random": "random of SmolLM2's shape"}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def build_hf(args):
    """(HF model, source key): from DIR if already exported, else the GGUF, else random."""
    want = "random" if args.random else "gguf"
    marker = os.path.join(args.out_dir, "source.txt")
    if not args.rebuild and os.path.exists(os.path.join(args.out_dir, "model.safetensors")) and os.path.exists(marker):
        have = open(marker).read().strip()
        if have == want:
            log(f"reusing {args.out_dir} ({SOURCES[have]})")
            return AutoModelForCausalLM.from_pretrained(args.out_dir, dtype=torch.float32).eval(), have
    model, source = None, "random"
    if not args.random:
        gguf = gguf_path(args)
        if gguf is None:
            log(f"no .gguf in {args.gguf_dir}: using a random model of SmolLM2's shape")
        else:
            try:
                model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf), dtype=torch.float32)
                source = "gguf"
                log(f"loaded {gguf} with transformers' GGUF loader")
            except Exception as e:  # noqa: BLE001 - any failure falls back to the random model
                log(f"could not load {gguf} ({type(e).__name__}: {e}): using a random model of SmolLM2's shape")
    if model is None:
        torch.manual_seed(args.seed)
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE)).to(torch.float32)
    model.eval()
    os.makedirs(args.out_dir, exist_ok=True)
    model.save_pretrained(args.out_dir, safe_serialization=True)
    tok = os.path.join(args.gguf_dir, "tokenizer.json")
    if os.path.exists(tok):
        shutil.copy(tok, os.path.join(args.out_dir, "tokenizer.json"))
    with open(marker, "w") as f:
        f.write(source + "\n")
    log(f"saved {SOURCES[source]} to {args.out_dir}")
    return model, source


def gguf_path(args):
    found = sorted(glob.glob(os.path.join(args.gguf_dir, "*.gguf")))
    return found[0] if found else None


def to_tl(hf):
    """A HookedTransformer with the HF Llama's weights, offline, fp32, no weight processing."""
    c = hf.config
    dh = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert getattr(c, "rope_scaling", None) is None
    cfg = HookedTransformerConfig.from_dict(dict(
        d_model=c.hidden_size, d_head=dh, n_heads=c.num_attention_heads, d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers, n_ctx=min(c.max_position_embeddings, 2048), eps=c.rms_norm_eps,
        d_vocab=c.vocab_size, act_fn=c.hidden_act,
        n_key_value_heads=c.num_key_value_heads if c.num_key_value_heads != c.num_attention_heads else None,
        normalization_type="RMS", positional_embedding_type="rotary", rotary_adjacent_pairs=False,
        rotary_dim=dh, rotary_base=c.rope_theta, final_rms=True, gated_mlp=True,
        original_architecture="LlamaForCausalLM", init_weights=False, device="cpu", dtype=torch.float32,
        default_prepend_bos=False,
    ))
    model = HookedTransformer(cfg, None, move_to_device=False)
    model.load_and_process_state_dict(
        convert_llama_weights(hf, cfg), fold_ln=False, center_writing_weights=False, center_unembed=False,
        fold_value_biases=False, refactor_factored_attn_matrices=False,
    )
    return model.eval()


def make_pair(hf, tokens, seed):
    rng = np.random.default_rng(seed)
    vocab = hf.config.vocab_size
    clean = rng.integers(100, vocab, tokens).tolist()
    corrupted = list(clean)
    for p in sorted(rng.choice(tokens, size=min(3, tokens), replace=False).tolist()):
        while corrupted[p] == clean[p]:
            corrupted[p] = int(rng.integers(100, vocab))
    with torch.no_grad():
        answer = int(hf(torch.tensor([clean])).logits[0, -1].argmax())
        top2 = hf(torch.tensor([corrupted])).logits[0, -1].topk(2).indices.tolist()
    wrong = top2[1] if top2[0] == answer else top2[0]
    return dict(clean=clean, corrupted=corrupted, answer=answer, wrong=wrong)


def best_of(n, fn):
    times, out = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "target", "patching-smollm2-hf"))
    ap.add_argument("--gguf-dir", default=os.path.join(ROOT, "assets", "smollm2"))
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-by-pos", action="store_true")
    ap.add_argument("--by-pos-layers", type=int, default=None, help="time by_pos on the first K layers only and extrapolate")
    ap.add_argument("--random", action="store_true", help="a random model of SmolLM2's shape, not the GGUF")
    ap.add_argument("--rebuild", action="store_true", help="export the model to --out-dir again")
    args = ap.parse_args()
    args.out_dir = os.path.abspath(args.out_dir)
    torch.set_num_threads(os.cpu_count())
    torch.set_grad_enabled(False)

    hf, source = build_hf(args)
    model = to_tl(hf)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    pair = make_pair(hf, args.tokens, args.seed)
    clean = torch.tensor([pair["clean"]])
    corrupted = torch.tensor([pair["corrupted"]])
    tl_vs_hf = max((model(t) - hf(t).logits).abs().max().item() for t in (clean, corrupted))
    assert tl_vs_hf < 1e-3, f"TL's logits differ from HF's by {tl_vs_hf}"
    del hf
    with open(os.path.join(args.out_dir, "pair.json"), "w") as f:
        json.dump(pair, f)
        f.write("\n")

    a, w = pair["answer"], pair["wrong"]

    def metric(logits):
        return (logits[:, -1, a] - logits[:, -1, w]).mean()

    model(corrupted)  # warm-up
    forward_s, logits = best_of(args.repeat, lambda: model(corrupted))
    corrupted_diff = metric(logits).item()
    cache_s, (clean_logits, cache) = best_of(args.repeat, lambda: model.run_with_cache(clean))
    clean_diff = metric(clean_logits).item()
    log(f"forward {forward_s:.3f} s, clean run_with_cache {cache_s:.3f} s; logit diff clean {clean_diff:.4f}, corrupted {corrupted_diff:.4f}")

    all_pos_s, all_pos = best_of(args.repeat, lambda: patching.get_act_patch_attn_head_out_all_pos(model, corrupted, cache, metric))
    log(f"all_pos ({n_layers * n_heads} patched runs) {all_pos_s:.2f} s")
    results = {"all_pos": all_pos.double().numpy()}

    by_pos_s, extrapolated, k = None, False, None
    if not args.skip_by_pos:
        k = n_layers if args.by_pos_layers is None else max(1, min(args.by_pos_layers, n_layers))
        if k == n_layers:
            t, by_pos = best_of(args.repeat, lambda: patching.get_act_patch_attn_head_out_by_pos(model, corrupted, cache, metric))
        else:
            index_df = patching.make_df_from_ranges([k, args.tokens, n_heads], ["layer", "pos", "head"])
            t, by_pos = best_of(args.repeat, lambda: patching.get_act_patch_attn_head_out_by_pos(
                model, corrupted, cache, metric, index_axis_names=None, index_df=index_df))
            by_pos = by_pos.reshape(k, args.tokens, n_heads)
        extrapolated = k != n_layers
        by_pos_s = t * n_layers / k
        results["by_pos"] = by_pos.double().numpy()
        log(f"by_pos: {k} of {n_layers} layers ({k * args.tokens * n_heads} patched runs) {t:.2f} s"
            + (f", extrapolated to {by_pos_s:.2f} s" if extrapolated else ""))
    np.savez(os.path.join(args.out_dir, "tl_results.npz"), **results)

    print(json.dumps(dict(
        impl="transformer_lens", version=transformer_lens_version(), model=SOURCES[source],
        n_layers=n_layers, n_heads=n_heads, tokens=args.tokens, threads=torch.get_num_threads(),
        forward_s=forward_s, clean_cache_s=cache_s, all_pos_s=all_pos_s, by_pos_s=by_pos_s,
        by_pos_layers_timed=k, by_pos_extrapolated=extrapolated, repeat=args.repeat,
        clean_logit_diff=clean_diff, corrupted_logit_diff=corrupted_diff, tl_vs_hf_max_abs=tl_vs_hf,
        clean=pair["clean"], corrupted=pair["corrupted"], answer=a, wrong=w, out_dir=args.out_dir,
    )))


def transformer_lens_version():
    import importlib.metadata
    return importlib.metadata.version("transformer-lens")


if __name__ == "__main__":
    main()
