#!/usr/bin/env bash
# Pruning benchmarks: headscope vs the same step in PyTorch (benches/prune_peer.py), same
# machine, same model and data, one run. Prints ratios.
#  1. a gate-training step (MiniLM, distillation, Hard Concrete gates, Adam on log_alpha)
#  2. the physically pruned EN->PT model (prune_heads) vs the same heads masked by gates
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
N=${N:-256}
scripts/setup >/dev/null
cargo build --release --locked -q
hs=$(target/release/headscope run benches/prune.rhai "$N")
peer=$(.venv/bin/python benches/prune_peer.py assets "$N" 2>/dev/null)
HS="$hs" PEER="$peer" .venv/bin/python - <<'PY'
import json, os
hs = {r["bench"]: r for r in map(json.loads, os.environ["HS"].splitlines())}
peer = {r["bench"]: r for r in map(json.loads, os.environ["PEER"].splitlines())}
h, p = hs["step"], peer["step"]
print(f"gate step  {h['batches']} batches, {h['steps']} timed steps  headscope {h['seconds_per_step'] * 1e3:7.1f} ms  PyTorch {p['seconds_per_step'] * 1e3:7.1f} ms  "
      f"time ratio headscope/PyTorch {h['seconds_per_step'] / p['seconds_per_step']:.2f}x")
print(f"           mean task loss: headscope {h['mean_loss']:.5f}  PyTorch {p['mean_loss']:.5f}")
q = hs["prune_heads"]
print(f"prune_heads {q['closed']} of {q['of']} heads removed, params {q['params_full']} -> {q['params_pruned']}")
print(f"           encoder over 1000 sentences: masked {q['masked_enc_seconds']:.2f} s  pruned {q['pruned_enc_seconds']:.2f} s  speed-up {q['masked_enc_seconds'] / q['pruned_enc_seconds']:.2f}x")
print(f"           translating {q['sentences']} sentences: masked {q['masked_seconds']:.2f} s  pruned {q['pruned_seconds']:.2f} s  speed-up {q['masked_seconds'] / q['pruned_seconds']:.2f}x  (same first output: {q['same_output']})")
PY
