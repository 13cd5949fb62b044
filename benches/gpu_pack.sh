#!/usr/bin/env bash
# Packs what benches/gpu_check.sh needs on a lent GPU machine into gpu/pack.tar.xz (about 31 MB;
# the machine has torch and transformers but no Rust, and 64 MiB travel): the stripped release
# binary, the models and analyses test binaries, the EN->PT model, PUD, Brown and SmolLM2's
# tokenizer.json. gpu/ is git-ignored through .git/info/exclude. Then, with the device tool:
#   run(command: "bash benches/gpu_check.sh", carry: ["gpu"], timeout_s: 560)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
mkdir -p .git/info && { grep -qx '/gpu/' .git/info/exclude 2>/dev/null || echo '/gpu/' >> .git/info/exclude; }
cargo build --release --locked -q
# NO_TESTS=1: the binary alone (run gpu_check.sh with SKIP_TESTS=1).
bins=$([ -n "${NO_TESTS:-}" ] || cargo test --release --locked --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("models", "analyses"):
        print(m["target"]["name"], m["executable"])')
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/assets/marian" "$stage/assets/smollm2"
cp target/release/headscope "$stage/bin/"
while read -r name exe; do [ -n "$name" ] && cp "$exe" "$stage/bin/$name"; done <<< "$bins"
strip "$stage"/bin/*
cp -r assets/marian/enpt "$stage/assets/marian/"
cp assets/pud_en.conllu assets/pud_en.txt assets/brown.txt "$stage/assets/"
cp assets/smollm2/tokenizer.json "$stage/assets/smollm2/"
rm -rf gpu && mkdir gpu
tar cJf gpu/pack.tar.xz -C "$stage" .
ls -la gpu/pack.tar.xz
