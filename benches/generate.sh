#!/usr/bin/env bash
# Generation benchmark (docs/methods.md#hook-points, "Generation"): SmolLM2-135M greedy
# continuation of one prompt by headscope with its key/value cache, by headscope recomputing
# the prefix for every token (the path before the cache existed), and by transformers'
# `generate` on the same GGUF, same machine, one run. Prints times for 32, 64 and 128 new
# tokens, the per-token time of the last 64 tokens against the first 32 (growth with the
# prefix), the ratios, and the FLOP floor of the cached path.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
PROMPT=${PROMPT:-"Once upon a time, in a small village at the edge of a large forest, there lived an old"}
scripts/setup >/dev/null
cargo build --release --locked -q
hs=$(target/release/headscope run benches/generate.rhai "$PROMPT")
peer=$(.venv/bin/python benches/generate_peer.py assets/smollm2 "$PROMPT" 2>/dev/null)
HS="$hs" PEER="$peer" .venv/bin/python - <<'PY'
import json, os
rows = [json.loads(l) for l in os.environ["HS"].splitlines() + os.environ["PEER"].splitlines()]
by = {(r["mode"], r["new_tokens"]): r for r in rows}
# SmolLM2-135M: a new token costs 2 x (matrix parameters) FLOPs plus attention over the prefix.
layers, d, heads, kv, dh, ffn, vocab = 30, 576, 9, 3, 64, 1536, 49152
per_tok = 2 * layers * (d * d * 2 + d * kv * dh * 2 + 3 * d * ffn) + 2 * d * vocab
rate = float(os.environ.get("GFLOPS", "150")) * 1e9  # this machine's measured float32 matmul rate (docs)
for mode in ["cache", "no-cache", "transformers"]:
    t = {n: by[(mode, n)]["seconds"] for n in (32, 64, 128)}
    first = t[32] / 32
    last = (t[128] - t[64]) / 64
    print(f"{mode:<13} 32: {t[32]:6.2f} s  64: {t[64]:6.2f} s  128: {t[128]:6.2f} s   per token: first 32 {first * 1e3:6.1f} ms, last 64 {last * 1e3:6.1f} ms (x{last / first:.2f})")
hc, hn, tf = (by[(m, 128)]["seconds"] for m in ("cache", "no-cache", "transformers"))
print(f"128 tokens: transformers / headscope (cache) = {tf / hc:.2f}x; no-cache / cache = {hn / hc:.2f}x")
print(f"FLOP floor of 128 cached tokens at {rate / 1e9:.0f} GFLOP/s: {128 * per_tok / rate:.2f} s (headscope at {hc / (128 * per_tok / rate):.1f}x the floor; batch-1 decoding reads every weight per token, so memory bandwidth, not FLOPs, bounds it)")
same = by[("cache", 128)]["text"] == by[("no-cache", 128)]["text"]
print(f"cache and no-cache texts equal: {same}; transformers generated {by[('transformers', 128)]['generated']} tokens")
PY
