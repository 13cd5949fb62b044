#!/usr/bin/env bash
# Loading peak memory of a Llama-3.2-1B-shaped bf16 checkpoint (random weights, written by
# benches/make_llama8b_bf16.py ... 1b into a temporary directory): headscope's load_model in
# bf16 beside transformers' from_pretrained(torch_dtype=bfloat16), each in its own process,
# peak RSS from /usr/bin/time, after loading and after loading and one 3-token forward (which
# touches every weight: transformers maps a bf16 file into memory without copying, so its
# resident size grows only as weights are read). Same run, same files.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
cargo build --release --locked -q
.venv/bin/python benches/make_llama8b_bf16.py "$dir" assets/smollm2/tokenizer.json 1b > /dev/null
size=$(du -sb "$dir" | cut -f1)
peak() { /usr/bin/time -f "%M" "$@" 2>&1 >/dev/null | tail -1; }
hs=$(peak target/release/headscope -e "let m = load_model(\"$dir\", #{dtype: \"bf16\", device: \"cpu\"}); m.params")
hf=$(peak .venv/bin/python -c "import torch, transformers; m = transformers.AutoModelForCausalLM.from_pretrained('$dir', torch_dtype=torch.bfloat16); print(m.num_parameters())")
hs_fwd=$(peak target/release/headscope -e "let m = load_model(\"$dir\", #{dtype: \"bf16\", device: \"cpu\"}); m.logits(\"a b c\").len()")
hf_fwd=$(peak .venv/bin/python -c "import torch, transformers; m = transformers.AutoModelForCausalLM.from_pretrained('$dir', torch_dtype=torch.bfloat16); print(m(torch.tensor([[1, 2, 3]])).logits.shape)")
base_hs=$(peak target/release/headscope -e "1")
base_hf=$(peak .venv/bin/python -c "import torch, transformers; from transformers import AutoModelForCausalLM")
awk -v s="$size" -v hs="$hs" -v hf="$hf" -v bhs="$base_hs" -v bhf="$base_hf" -v hsf="$hs_fwd" -v hff="$hf_fwd" 'BEGIN {
  printf "checkpoint %.2f GB (bf16)\n", s / 1e9;
  printf "%-13s %10s %12s %14s\n", "", "peak RSS", "start-up", "peak - start";
  printf "%-13s %8.2f GB %9.2f GB %11.2f GB\n", "headscope", hs / 1048576 * 1.048576, bhs / 1048576 * 1.048576, (hs - bhs) / 1048576 * 1.048576;
  printf "%-13s %8.2f GB %9.2f GB %11.2f GB\n", "transformers", hf / 1048576 * 1.048576, bhf / 1048576 * 1.048576, (hf - bhf) / 1048576 * 1.048576;
  printf "after loading and one 3-token forward:\n";
  printf "%-13s %8.2f GB %9.2f GB %11.2f GB\n", "headscope", hsf / 1048576 * 1.048576, bhs / 1048576 * 1.048576, (hsf - bhs) / 1048576 * 1.048576;
  printf "%-13s %8.2f GB %9.2f GB %11.2f GB\n", "transformers", hff / 1048576 * 1.048576, bhf / 1048576 * 1.048576, (hff - bhf) / 1048576 * 1.048576;
  printf "headscope / transformers, peak - start after one forward: %.2fx; headscope against the checkpoint: %.2fx\n", (hsf - bhs) / (hff - bhf), (hsf - bhs) * 1024 / s }'
