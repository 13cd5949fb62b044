#!/usr/bin/env bash
# Gradient head importance: headscope vs the exact single-head sweep (same model, data and
# run), and vs the bertology recipe in HF transformers (benches/importance_peer.py) on
# SmolLM2. Prints times, ratios and the importance-vs-exact agreement.
#   N_ENPT (default 200) sentences for EN->PT, N_SMOL (default 16: its exact sweep takes about
#   50 s per sentence on 2 cores) for SmolLM2.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
N_ENPT=${N_ENPT:-200}
N_SMOL=${N_SMOL:-16}
scripts/setup >/dev/null
cargo build --release --locked -q
hf=target/bench-smollm2-hf
[ -s "$hf/model.safetensors" ] || .venv/bin/python tests/fixtures/export_smollm2_hf.py assets/smollm2 "$hf" >&2
enpt=$(target/release/headscope run benches/importance.rhai enpt "$N_ENPT")
smol=$(target/release/headscope run benches/importance.rhai smollm2 "$N_SMOL")
smol_imp=$(target/release/headscope -e "let m = load_model(\"smollm2\", #{device: \"cpu\"}); let d = corpus(asset(\"pud_en.txt\")).take($N_SMOL); m.head_importance(d.take(2)); let g = m.head_importance(d); print(\`{\"seconds\": \${g.options.seconds}, \"dec_0_0\": \${g[\"dec\"][0][0]}, \"dec_10_3\": \${g[\"dec\"][10][3]}}\`);")
peer=$(.venv/bin/python benches/importance_peer.py "$hf" assets/pud_en.txt "$N_SMOL" 2>/dev/null)
ENPT="$enpt" SMOL="$smol" SMOL_IMP="$smol_imp" PEER="$peer" .venv/bin/python - <<'PY'
import json, os
for key in ["ENPT", "SMOL"]:
    r = json.loads(os.environ[key])
    print(f"{r['model']:8s} {r['sentences']} sentences: importance {r['seconds']:.2f} s, exact sweep {r['exact_seconds']:.1f} s, "
          f"speed-up {r['exact_seconds'] / r['seconds']:.0f}x")
    for kind, a in r["agreement"].items():
        print(f"         {kind}: {a['heads']} heads, Spearman {a['spearman']:.3f}, {a['overlap']} of the {a['k']} least important shared")
h, p = json.loads(os.environ["SMOL_IMP"]), json.loads(os.environ["PEER"])
print(f"smollm2  vs HF bertology (one sentence per backward): headscope {h['seconds']:.2f} s, HF {p['seconds']:.2f} s, "
      f"time ratio headscope/HF {h['seconds'] / p['seconds']:.2f}")
print(f"         check dec.0.0 {h['dec_0_0']:.6g} vs {p['check']['dec_0_0']:.6g}, dec.10.3 {h['dec_10_3']:.6g} vs {p['check']['dec_10_3']:.6g}")
PY
