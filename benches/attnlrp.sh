#!/usr/bin/env bash
# AttnLRP: headscope vs LXT 2.1 (benches/attnlrp_peer.py) on the same model, sentences and
# seeds, in one run; prints times, the ratio and the first heads' shares from both sides.
#   N (default 100) PUD sentences, MiniLM and SmolLM2.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
N=${N:-100}
scripts/setup >/dev/null
cargo build --release --locked -q
for model in minilm smollm2; do
  hs=$(target/release/headscope run benches/attnlrp.rhai "$model" "$N")
  peer=$(.venv/bin/python benches/attnlrp_peer.py "$model" "$N" 2>/dev/null | tail -1)
  HS="$hs" PEER="$peer" .venv/bin/python - <<'PY'
import json, os
h, p = json.loads(os.environ["HS"]), json.loads(os.environ["PEER"])
print(f"{h['model']:8s} {h['sentences']} sentences: headscope {h['seconds']:.2f} s, LXT {p['seconds']:.2f} s, "
      f"time ratio headscope/LXT {h['seconds'] / p['seconds']:.2f}")
print(f"         layer 0 heads 0-2 share: headscope {[round(x, 5) for x in h['check']]}, LXT {[round(x, 5) for x in p['check']]}")
PY
done
