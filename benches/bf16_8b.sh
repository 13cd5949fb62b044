#!/usr/bin/env bash
# An 8B-shaped bf16 checkpoint on this CPU (issue #28): Llama 3.1 8B's config with random bf16
# weights, sharded as transformers writes it, made by benches/make_llama8b_bf16.py in a
# temporary directory (16 GB; deleted at the end, never in the repository), then loaded by
# headscope in bf16 and m.confidence run on N PUD sentences (default 10). Prints the
# checkpoint's size, its largest shard, load time, confidence time and peak RSS.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
N=${N:-10}
dir=${DIR:-$(mktemp -d)}
trap 'rm -rf "$dir"' EXIT
cargo build --release --locked -q
[ -f "$dir/model.safetensors.index.json" ] || .venv/bin/python benches/make_llama8b_bf16.py "$dir" assets/smollm2/tokenizer.json
echo "checkpoint: $(du -sb "$dir" | cut -f1 | awk '{printf "%.2f GB", $1 / 1e9}'), largest shard $(ls -S "$dir"/*.safetensors | head -1 | xargs du -b | cut -f1 | awk '{printf "%.2f GB", $1 / 1e9}'), machine memory $(free -g | awk '/Mem:/ {print $2}') GB"
target/release/headscope run benches/bf16_8b.rhai "$dir" "$N"
