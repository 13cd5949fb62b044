#!/usr/bin/env bash
# Decoder-LM benchmark (issue: decoder LMs at the floor; docs/benchmarks.md#decoder-lms): a
# forward, the loss, one head ablated and the single-head sweep, by headscope
# (benches/lm.rhai) and by transformers on the same GGUF, tokens and batches
# (benches/lm_peer.py), same machine, same run. Prints each against its matmul floor (the
# FLOPs of the products that must be done, at the matmul rates the peer measures in the same
# run) and against transformers.
#   benches/lm.sh [MODEL N SWEEP_N]   (default: smollm2 20 20; the qwen25coder asset: 5 5)
# HS_BEFORE=path/to/an/older/headscope adds its column (the same script, the same run).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
MODEL=${1:-smollm2}
N=${2:-20}
SWEEP_N=${3:-$N}
scripts/setup >/dev/null
cargo build --release --locked -q
ids=$(mktemp)
trap 'rm -f "$ids"' EXIT
hs=$(target/release/headscope run benches/lm.rhai "$MODEL" "$N" "$ids" "$SWEEP_N")
before=""
if [ -n "${HS_BEFORE:-}" ]; then
  before=$("$HS_BEFORE" run benches/lm.rhai "$MODEL" "$N" "$ids.before" "$SWEEP_N")
  rm -f "$ids.before"
fi
peer=$(.venv/bin/python benches/lm_peer.py "assets/$MODEL" "$ids" "$SWEEP_N" 2>/dev/null)
BEFORE="$before" HS="$hs" PEER="$peer" IDS="$ids" MODEL="$MODEL" SWEEP_N="$SWEEP_N" .venv/bin/python - <<'PY'
import json, os, platform
hs = {r["op"]: r for r in map(json.loads, os.environ["HS"].splitlines())}
pe = {r["op"]: r for r in map(json.loads, os.environ["PEER"].splitlines())}
s = pe["shapes"]
lens = [len(x) for x in json.load(open(os.environ["IDS"]))]
L, H, KV, dh, D, F, V = (s[k] for k in ("layers", "heads", "kv_heads", "head_dim", "d_model", "ffn", "vocab"))
rl, rh = s["rate_layer"], s["rate_head"]
# FLOPs per token: a layer's products (Q, K, V, O, gate, up, down), attention (QK^T and AV
# over the causal prefix, added per sentence below), the output head.
qkv = 2 * D * (H * dh + 2 * KV * dh)
o_mlp = 2 * (H * dh * D + 3 * D * F)
layer = qkv + o_mlp
head = 2 * D * V
def attn(t):  # one layer's QK^T and AV over a causal sentence of t tokens
    return 2 * 2 * H * dh * t * (t + 1) / 2
def secs(layer_flops, head_flops):
    return layer_flops / rl + head_flops / rh
T = sum(lens)
floor = {
    "forward": secs(T * L * layer + L * sum(map(attn, lens)), 0),
    "loss": secs(T * L * layer + L * sum(map(attn, lens)), T * head),
}
# One head at layer 5 ablated, value and base: the unmasked pass, then the layers from 5 up
# (layer 5's attention kept: its heads' contexts are those of the unmasked pass) and the head.
floor["ablate"] = floor["loss"] + secs(T * (o_mlp + (L - 6) * layer) + (L - 6) * sum(map(attn, lens)), T * head)
# The sweep: every head, the layers at and above it over every row (each row of a causal
# sentence changes), its own layer's attention kept; plus one unmasked pass.
ts = lens[: int(os.environ["SWEEP_N"])]
Ts = sum(ts)
sweep_layers = sum(H * (Ts * (o_mlp + (L - l - 1) * layer) + (L - l - 1) * sum(map(attn, ts))) for l in range(L))
floor["sweep"] = secs(sweep_layers + Ts * L * layer, L * H * Ts * head)
print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {s['threads']} threads; "
      f"matmul {rl / 1e9:.0f} GFLOP/s (layer products), {rh / 1e9:.0f} GFLOP/s (output head)")
print(f"model {os.environ['MODEL']}: {L} layers x {H} heads, d {D}, vocab {V}; {len(lens)} sentences, {T} tokens "
      f"(headscope padded {hs['forward']['padded']} in {hs['forward']['batches']} batches); sweep over {len(ts)} sentences, {Ts} tokens")
be = {r["op"]: r for r in map(json.loads, os.environ["BEFORE"].splitlines())}
if be:
    print(f"{'op':<9}{'floor s':>9}{'before s':>10}{'/floor':>8}")
    for op in ["forward", "loss", "ablate", "sweep"]:
        print(f"{op:<9}{floor[op]:>9.2f}{be[op]['seconds']:>10.2f}{be[op]['seconds'] / floor[op]:>7.2f}x")
print(f"{'op':<9}{'floor s':>9}{'headscope s':>13}{'/floor':>8}{'transformers s':>16}{'/floor':>8}{'tf/hs':>7}   values (headscope | transformers)")
for op in ["forward", "loss", "ablate", "sweep"]:
    h, p, f = hs[op]["seconds"], pe[op]["seconds"], floor[op]
    vals = {"forward": "", "loss": f"{hs['loss']['value']:.6f} | {pe['loss']['value']:.6f}",
            "ablate": f"{hs['ablate']['value']:.6f} | {pe['ablate']['value']:.6f}",
            "sweep": f"dec.5.3 {hs['sweep']['dec.5.3']:.6f} | {pe['sweep']['dec.5.3']:.6f}"}[op]
    print(f"{op:<9}{f:>9.2f}{h:>13.2f}{h / f:>7.2f}x{p:>16.2f}{p / f:>7.2f}x{p / h:>6.2f}x   {vals}")
PY
