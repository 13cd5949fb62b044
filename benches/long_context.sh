#!/usr/bin/env bash
# Head statistics at long context without the T x T pattern (docs/methods.md#score-tiles):
# headscope's analysis pass (confidence + positional, float32, read tile by tile) over one
# text of T tokens cut from the Brown corpus, beside transformers' eager attention with
# output_attentions=True on the same text under a memory cap (CAP_GB, default 20), each in
# its own process; peak RSS from /usr/bin/time. The floor is the FLOPs an exact pass must do
# (the layers' matmuls and causal attention, no unembedding) at the matmul rate measured in
# the same run. Usage: benches/long_context.sh [MODEL:T ...]  (default smollm2 at 1k-8k)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
cargo build --release --locked -q
CAP_GB=${CAP_GB:-20}
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(smollm2:1024 smollm2:2048 smollm2:4096 smollm2:8192)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
gguf_of() { ls assets/"$1"/*.gguf | head -1; }
printf "%-12s %6s | %9s %9s %8s %9s | %9s %9s %9s\n" model tokens "hs time" "hs peak" "x floor" "floor" "hf time" "hf peak" "conf diff"
for run in "${runs[@]}"; do
  model=${run%%:*}; t=${run##*:}; gguf=$(gguf_of "$model")
  .venv/bin/python benches/long_context_peer.py text "$gguf" "$t" "$tmp/text.txt" 2>/dev/null
  shape=$(.venv/bin/python benches/long_context_peer.py shape "$gguf" "$t" 2>/dev/null)
  /usr/bin/time -f "%M" -o "$tmp/hs.peak" target/release/headscope run benches/long_context.rhai "$model" "$tmp/text.txt" > "$tmp/hs.json"
  if prlimit --as=$((CAP_GB * 1024 * 1024 * 1024)) /usr/bin/time -f "%M" -o "$tmp/hf.peak" \
      .venv/bin/python benches/long_context_peer.py hf "$gguf" "$tmp/text.txt" > "$tmp/hf.json" 2>"$tmp/hf.err"; then :; else
    echo '{}' > "$tmp/hf.json"; fi
  HS=$(tail -1 "$tmp/hs.json") HSP=$(tail -1 "$tmp/hs.peak") HF=$(tail -1 "$tmp/hf.json") HFP=$(tail -1 "$tmp/hf.peak" 2>/dev/null || echo 0) \
  SHAPE="$shape" MODEL=$model .venv/bin/python - <<'PY'
import json, os
hs, hf, sh = json.loads(os.environ["HS"]), json.loads(os.environ["HF"] or "{}"), json.loads(os.environ["SHAPE"])
floor = (sh["flops_matmul"] + sh["flops_attention"]) / sh["rate"]
hsp = int(os.environ["HSP"]) * 1024 / 1e9
hf_t = f"{hf['seconds']:8.1f}s" if hf else "   failed"
try:
    hf_p = f"{int(os.environ['HFP']) * 1024 / 1e9:7.2f}GB" if hf else "   (cap)"
except ValueError:
    hf_p = "   (cap)"
diff = f"{abs(hs['conf_0_0'] - hf['conf_0_0']):9.1e}" if hf else "        -"
print(f"{os.environ['MODEL']:<12} {hs['tokens']:>6} | {hs['seconds']:8.1f}s {hsp:7.2f}GB {hs['seconds'] / floor:7.2f}x {floor:8.1f}s | {hf_t} {hf_p} {diff}")
PY
done
rate=$(.venv/bin/python benches/long_context_peer.py shape "$(gguf_of smollm2)" 1 2>/dev/null | .venv/bin/python -c 'import json, sys; r = json.load(sys.stdin); print("%.0f GFLOP/s, %d threads" % (r["rate"] / 1e9, r["threads"]))')
echo "(floor: the layers' matmuls + causal attention FLOPs at $rate, measured now; transformers eager output_attentions under a ${CAP_GB} GB address-space cap)"
