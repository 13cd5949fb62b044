#!/usr/bin/env bash
# bf16 on the CPU against float32 (issue #28): the analysis pass of MiniLM and SmolLM2 in each
# dtype, each in its own process (so each peak RSS is its own), on the same N PUD sentences
# (default 200). Prints time and peak memory of both and how far bf16's confidence is from
# float32's: the largest absolute difference over every head and whether the top 5 heads agree.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
N=${N:-200}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cargo build --release --locked -q
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), flags: $(grep -o -w -m1 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | xargs)"
for model in minilm smollm2; do
    for dt in f32 bf16; do
        target/release/headscope run benches/bf16.rhai "$model" "$dt" "$N" "$tmp/$model.$dt.json" > "$tmp/$model.$dt.line"
    done
done
.venv/bin/python - "$tmp" <<'PY'
import json, sys
import numpy as np
tmp = sys.argv[1]
print(f"{'model':<8} {'dtype':<5} {'load s':>7} {'pass s':>7} {'RSS loaded':>10} {'peak load':>10} {'peak':>10}   bf16 vs f32: confidence")
for model in ["minilm", "smollm2"]:
    runs = {dt: json.loads(open(f"{tmp}/{model}.{dt}.line").read()) for dt in ["f32", "bf16"]}
    res = {dt: json.load(open(f"{tmp}/{model}.{dt}.json")) for dt in ["f32", "bf16"]}
    def conf(r):
        k = r["kinds"][0]
        return k["kind"], np.array(k["confidence"], dtype=float)
    kind, c32 = conf(res["f32"])
    _, c16 = conf(res["bf16"])
    diff = np.abs(c32 - c16)
    top = lambda c: [f"{kind}.{i // c.shape[1]}.{i % c.shape[1]}" for i in np.argsort(-c.ravel(), kind="stable")[:5]]
    for dt in ["f32", "bf16"]:
        r = runs[dt]
        note = ""
        if dt == "bf16":
            l, h = np.unravel_index(diff.argmax(), diff.shape)
            note = (f"max |diff| {diff.max():.2e} at {kind}.{l}.{h}, mean {diff.mean():.2e}; top 5 "
                    f"{'the same' if top(c32) == top(c16) else 'differ: ' + str(top(c32)) + ' vs ' + str(top(c16))}"
                    f"; time x{runs['f32']['seconds'] / r['seconds']:.2f}, peak x{int(r['peak'].split()[0]) / int(runs['f32']['peak'].split()[0]):.2f}")
        mb = lambda k: f"{int(r[k].split()[0]) / 1024:7.0f} MB"
        print(f"{model:<8} {dt:<5} {r['load_seconds']:7.2f} {r['seconds']:7.2f} {mb('rss_loaded'):>10} {mb('peak_loaded'):>10} {mb('peak'):>10}   {note}")
PY
