#!/usr/bin/env bash
# Analysis benchmarks: headscope vs HF transformers in Python (benches/analysis_peer.py), same
# machine, same model and data, one run. Prints ratios.
#  1. combined analysis pass (confidence + positional + rare) over the 1000 PUD sentences
#  2. single-head ablation sweep (cosine) vs the HF head_mask loop, on N_SWEEP sentences; also
#     each side's cost in its own plain forward passes over those sentences
#  3. peak memory of an analysis pass on 1000 vs 4000 sentences
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
N_SWEEP=${N_SWEEP:-200}
scripts/setup >/dev/null
cargo build --release --locked -q
hs=$(target/release/headscope run benches/analysis.rhai "$N_SWEEP")
peer=$(.venv/bin/python benches/analysis_peer.py assets "$N_SWEEP" 2>/dev/null)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in 1 2 3 4; do cat assets/pud_en.txt; done > "$tmp/pud_x4.txt"
m1=$(target/release/headscope run benches/memory.rhai assets/pud_en.txt)
m4=$(target/release/headscope run benches/memory.rhai "$tmp/pud_x4.txt")
HS="$hs" PEER="$peer" M1="$m1" M4="$m4" .venv/bin/python - <<'PY'
import json, os
hs = {r["bench"]: r for r in map(json.loads, os.environ["HS"].splitlines())}
peer = {r["bench"]: r for r in map(json.loads, os.environ["PEER"].splitlines())}
for b in ["analysis", "sweep"]:
    h, p = hs[b], peer[b]
    print(f"{b:<9} {h['sentences']:>5} sentences  headscope {h['seconds']:7.2f} s  HF {p['seconds']:7.2f} s  ratio {p['seconds'] / h['seconds']:.2f}x")
    print(f"          check: headscope {h['check']}  HF {p['check']}")
    if b == "sweep":
        print(f"          in forward passes over the same sentences: headscope {h['seconds'] / h['forward_seconds']:.1f} x {h['forward_seconds']:.3f} s, HF {p['seconds'] / p['forward_seconds']:.1f} x {p['forward_seconds']:.3f} s")
m1, m4 = json.loads(os.environ["M1"]), json.loads(os.environ["M4"])
k1, k4 = int(m1["peak"].split()[0]), int(m4["peak"].split()[0])
print(f"memory    peak RSS {k1 / 1024:.0f} MB for {m1['sentences']} sentences, {k4 / 1024:.0f} MB for {m4['sentences']} ({(k4 / k1 - 1) * 100:+.1f}%)")
PY
