#!/usr/bin/env bash
# Activation patching, every head of SmolLM2 (30 x 9) at all positions and per position:
# headscope vs TransformerLens 2.18 (benches/patching_tl.py), same weights (the SmolLM2 GGUF
# through transformers, exported to safetensors for both), same 20-token pair, same run.
# Prints both ratios: to TransformerLens and to the floor (docs/methods.md#activation-patching:
# the FLOPs of the layers above each patched head over the positions the patch can change, at
# this machine's measured float32 matmul rate). TransformerLens's per-position time is measured
# on its first BY_POS_LAYERS layers and extrapolated (it runs heads x positions forwards).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
cargo build --release --locked -q
out=target/patching-smollm2-hf
tl=$(.venv/bin/python benches/patching_tl.py --out-dir "$out" --tokens "${TOKENS:-20}" --repeat 1 --by-pos-layers "${BY_POS_LAYERS:-1}" 2>/dev/null | tail -1)
pair=$(cat "$out/pair.json")
cat > "$out/bench.rhai" <<RHAI
let m = load_model("$out");
let j = #$pair;
let p = pairs([#{clean: j.clean, corrupted: j.corrupted, answer: j.answer, wrong: j.wrong}]);
m.patch(p, #{site: "resid_pre"}); // warm-up
// The best of three calls (this 2-core VM's timings vary by 10-20% from run to run).
let t_all = 1e9;
let all = ();
for i in 0..3 {
    let t = timestamp();
    all = m.patch(p);
    t_all = min(t_all, t.elapsed);
}
let t_each = 1e9;
for i in 0..2 {
    let t2 = timestamp();
    let each = m.patch(p, #{positions: "each"});
    t_each = min(t_each, t2.elapsed);
}
let t3 = timestamp();
let attr = m.patch(p, #{method: "attribution"});
let t_attr = t3.elapsed;
print(\`{"all_pos_s": \${t_all}, "by_pos_s": \${t_each}, "attribution_s": \${t_attr}, "clean": \${all.clean}, "corrupted": \${all.corrupted}}\`);
all.patched.to_json("$out/hs_all.json");
RHAI
hs=$(target/release/headscope run "$out/bench.rhai" | tail -1)
TL="$tl" HS="$hs" OUT="$out" .venv/bin/python - <<'PY'
import json, os, platform, time
import numpy as np, torch
tl, hs = json.loads(os.environ["TL"]), json.loads(os.environ["HS"])
out = os.environ["OUT"]
cfg = json.load(open(os.path.join(out, "config.json")))
pair = json.load(open(os.path.join(out, "pair.json")))
L, H, D, F, V = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
KV = cfg["num_key_value_heads"]
dh = D // H
T = len(pair["clean"])
p0 = next(i for i, (a, b) in enumerate(zip(pair["clean"], pair["corrupted"])) if a != b)
# FLOPs per token: a whole layer, and what follows hook_z in the patched layer (W^O and the MLP).
layer = 2 * (D * D + 2 * D * KV * dh + D * D + 3 * D * F)
after_z = 2 * (D * D + 3 * D * F)
# The metric (the logit difference) reads two logits of the last position per patched run: an
# exact computation needs those two, not all V (headscope computes the two,
# Transformer::logits_of; TransformerLens all V). `full_logits` is the floor counting all V, as
# this bench did until 2026-11-27.
logits = 2 * D * 2
full_logits = 2 * D * V
def attn(tokens, keys):  # scores and A V for `tokens` queries over `keys` keys, every head
    return 2 * 2 * tokens * keys * D
def above(l, first):  # the layers above head (l, h) over positions first..T-1
    n = T - first
    return after_z * n + (L - l - 1) * (layer * n + attn(n, T)) + logits
floor_all = sum(H * above(l, p0) for l in range(L))
floor_each = sum(H * above(l, p) for l in range(L) for p in range(p0, T))
# A tighter floor: only the last position's logits are read, so the top layer needs every
# position's keys and values but the last position's query, W^O and MLP alone (headscope
# computes it so, docs/methods.md#activation-patching).
kv = 2 * 2 * D * KV * dh
def above_last(l, first):
    n = T - first
    top = kv * n + (layer - kv) + attn(1, T)
    if l == L - 1:
        return after_z + logits
    return after_z * n + (L - l - 2) * (layer * n + attn(n, T)) + top + logits
tight_all = sum(H * above_last(l, p0) for l in range(L))
tight_each = sum(H * above_last(l, p) for l in range(L) for p in range(p0, T))
# This machine's float32 matmul rate at the patching's shapes (rows x D @ D x F).
torch.set_num_threads(os.cpu_count())
a, b = torch.randn(2048, D), torch.randn(D, F)
for _ in range(3): a @ b
# The best of 10 trials of 10 products: the machine's rate, not its neighbours' load.
def trial(n=10):
    t0 = time.perf_counter()
    for _ in range(n): a @ b
    return 2 * 2048 * D * F * n / (time.perf_counter() - t0)
rate = max(trial() for _ in range(10))
print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; float32 matmul {rate / 1e9:.1f} GFLOP/s")
print(f"model: {tl['model']} ({L} x {H} heads), pair of {T} tokens, first difference at position {p0}")
print(f"clean/corrupted logit diff: headscope {hs['clean']:.4f}/{hs['corrupted']:.4f}, TransformerLens {tl.get('clean_logit_diff', float('nan')):.4f}/{tl.get('corrupted_logit_diff', float('nan')):.4f}")
tl_all = np.load(os.path.join(out, "tl_results.npz"))
ours = json.load(open(os.path.join(out, "hs_all.json")))
print(f"{'patching':<22}{'headscope s':>12}{'TransformerLens s':>19}{'speed-up':>10}{'floor s':>9}{'hs/floor':>10}{'tight s':>9}{'hs/tight':>10}")
for name, h, t, f, g in [("all positions", hs["all_pos_s"], tl["all_pos_s"], floor_all, tight_all), ("per position", hs["by_pos_s"], tl["by_pos_s"], floor_each, tight_each)]:
    print(f"{name:<22}{h:>12.2f}{t:>19.2f}{t / h:>9.1f}x{f / rate:>9.2f}{h / (f / rate):>9.2f}x{g / rate:>9.2f}{h / (g / rate):>9.2f}x")
print(f"{'attribution (all pos)':<22}{hs['attribution_s']:>12.2f}")
full_all = floor_all + H * L * (full_logits - logits)
print(f"(floor counting all {V} logits per patched run, all positions: {full_all / rate:.2f} s, hs/that {hs['all_pos_s'] / (full_all / rate):.2f}x)")
if tl.get("by_pos_extrapolated"):
    k = tl["by_pos_layers_timed"]
    print(f"(TransformerLens per position: measured on {k} of {L} layers, times {L / k:g})")
g = np.array(ours["kinds"]["dec"])
print(f"headscope vs TransformerLens, all positions: max |difference| of the patched logit diffs {np.abs(g - tl_all['all_pos']).max():.2e}")
PY
