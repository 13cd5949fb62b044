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
# The step: three runs of each side, interleaved; the medians are compared.
hs="" peer=""
for i in 1 2 3; do
  hs+=$(target/release/headscope run benches/prune.rhai "$N" step)$'\n'
  peer+=$(.venv/bin/python benches/prune_peer.py assets "$N" 2>/dev/null)$'\n'
done
hs+=$(target/release/headscope run benches/prune.rhai "$N" prune_heads)
HS="$hs" PEER="$peer" .venv/bin/python - <<'PY'
import json, os
rows = lambda v: [json.loads(l) for l in v.splitlines() if l.strip()]
hs_all, peer_all = rows(os.environ["HS"]), rows(os.environ["PEER"])
hs = {r["bench"]: r for r in hs_all}
steps_h = sorted(r["seconds_per_step"] for r in hs_all if r["bench"] == "step")
steps_p = sorted(r["seconds_per_step"] for r in peer_all)
h, p = hs["step"], peer_all[0]
mh, mp = steps_h[len(steps_h) // 2], steps_p[len(steps_p) // 2]
print(f"gate step  {h['batches']} batches, {h['steps']} timed steps, 3 runs each: headscope {' '.join(f'{x * 1e3:.1f}' for x in steps_h)} ms, "
      f"PyTorch {' '.join(f'{x * 1e3:.1f}' for x in steps_p)} ms")
print(f"           medians: headscope {mh * 1e3:.1f} ms  PyTorch {mp * 1e3:.1f} ms  time ratio headscope/PyTorch {mh / mp:.2f}x")
print(f"           mean task loss: headscope {h['mean_loss']:.5f}  PyTorch {p['mean_loss']:.5f}")
q = hs["prune_heads"]
print(f"prune_heads {q['closed']} of {q['of']} heads removed, params {q['params_full']} -> {q['params_pruned']}")
print(f"           encoder over 1000 sentences: masked {q['masked_enc_seconds']:.2f} s  pruned {q['pruned_enc_seconds']:.2f} s  speed-up {q['masked_enc_seconds'] / q['pruned_enc_seconds']:.2f}x")
print(f"           translating {q['sentences']} sentences: masked {q['masked_seconds']:.2f} s  pruned {q['pruned_seconds']:.2f} s  speed-up {q['masked_seconds'] / q['pruned_seconds']:.2f}x  (same first output: {q['same_output']})")
PY
