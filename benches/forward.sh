#!/usr/bin/env bash
# Forward throughput and load time: headscope vs HF transformers (benches/forward_peer.py),
# same machine, same sentences (the 1000 PUD sentences), same run. Prints ratios.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
scripts/setup >/dev/null
cargo build --release --locked -q
hs=$(target/release/headscope run benches/forward.rhai)
peer=$(.venv/bin/python benches/forward_peer.py assets 2>/dev/null)
files=$(.venv/bin/python - <<'PY'
import time
t = {}
for name, f in [("minilm", "assets/minilm/model.safetensors"), ("enpt-encoder", "assets/marian/enpt/model.enpt.intgemm.alphas.bin")]:
    open(f, "rb").read()  # warm the page cache, then time a cold-process read from it
    t0 = time.perf_counter(); open(f, "rb").read(); t[name] = time.perf_counter() - t0
print(t)
PY
)
HS="$hs" PEER="$peer" FILES="$files" .venv/bin/python - <<'PY'
import ast, json, os, platform
hs = {r["model"]: r for r in map(json.loads, os.environ["HS"].splitlines())}
peer = [json.loads(l) for l in os.environ["PEER"].splitlines()]
files = ast.literal_eval(os.environ["FILES"])
import torch
print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads")
print(f"{'model':<14}{'headscope tok/s':>16}{'HF naive tok/s':>16}{'ratio':>7}{'HF bucketed':>13}{'ratio':>7}")
for m, h in hs.items():
    p = {r["batching"]: r for r in peer if r["model"] == m}
    n, b = p["naive"]["tokens_per_second"], p["bucketed"]["tokens_per_second"]
    print(f"{m:<14}{h['tokens_per_second']:>16.0f}{n:>16.0f}{h['tokens_per_second'] / n:>6.2f}x{b:>13.0f}{h['tokens_per_second'] / b:>6.2f}x")
print(f"{'model':<14}{'weights s':>10}{'read file s':>12}{'weights/read':>13}{'tokenizer s':>12}{'total s':>9}{'HF load s':>11}")
for m, h in hs.items():
    hf = [r for r in peer if r["model"] == m][0]["load_seconds"]
    w = h["load_weights_seconds"]
    print(f"{m:<14}{w:>10.3f}{files[m]:>12.3f}{w / files[m]:>12.1f}x{h['load_tokenizer_seconds']:>12.3f}{h['load_seconds']:>9.3f}{hf:>11.3f}")
PY
