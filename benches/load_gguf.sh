#!/usr/bin/env bash
# Loading peak memory of a K-quant GGUF (the `qwen25coder` asset: Qwen2.5-Coder-0.5B-Instruct,
# Q4_K_M, 491 MB) in bf16 and in float32: headscope's load_model beside transformers'
# from_pretrained(gguf_file=..., torch_dtype=...) (which dequantises with the gguf package),
# each in its own process, peak RSS from /usr/bin/time, same file, same run. The floor is the
# weights in the chosen dtype (parameters x 2 or 4 bytes) above each side's start-up memory
# (`headscope -e 1`; python importing torch and transformers). docs/methods.md#loading-memory.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
cargo build --release --locked -q
gguf=assets/qwen25coder/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
peak() { /usr/bin/time -f "%M" "$@" 2>&1 >/dev/null | tail -1; }
params=$(target/release/headscope -e 'load_model("qwen25coder", #{dtype: "bf16", device: "cpu"}).params' | tail -1)
base_hs=$(peak target/release/headscope -e "1")
base_hf=$(peak .venv/bin/python -c "import torch, transformers; from transformers import AutoModelForCausalLM")
hf_load() {
  peak timeout 600 .venv/bin/python -c "import torch, transformers, os; m = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname('$gguf'), gguf_file=os.path.basename('$gguf'), torch_dtype=torch.$1); print(m.num_parameters())" || echo 0
}
printf "%s: %d parameters, file %.2f GB\n" "$gguf" "$params" "$(stat -c %s "$gguf" | awk '{print $1 / 1e9}')"
printf "%-6s %-13s %10s %14s %12s %8s\n" dtype "" "peak RSS" "peak - start" "weights" "ratio"
for dt in bf16 f32; do
  bytes=$([ $dt = bf16 ] && echo 2 || echo 4)
  hs=$(peak target/release/headscope -e "load_model(\"qwen25coder\", #{dtype: \"$dt\", device: \"cpu\"}).params")
  hf=$(hf_load "$([ $dt = bf16 ] && echo bfloat16 || echo float32)")
  for side in headscope transformers; do
    if [ $side = headscope ]; then p=$hs; b=$base_hs; else p=$hf; b=$base_hf; fi
    if [ "$p" = 0 ]; then printf "%-6s %-13s %s\n" $dt $side "failed"; continue; fi
    awk -v dt=$dt -v s=$side -v p="$p" -v b="$b" -v w=$((params * bytes)) 'BEGIN {
      printf "%-6s %-13s %7.2f GB %11.2f GB %9.2f GB %7.2fx\n", dt, s, p * 1024 / 1e9, (p - b) * 1024 / 1e9, w / 1e9, (p - b) * 1024 / w }'
  done
done
echo "(start-up: headscope $(awk -v b=$base_hs 'BEGIN {printf "%.2f", b * 1024 / 1e9}') GB, transformers $(awk -v b=$base_hf 'BEGIN {printf "%.2f", b * 1024 / 1e9}') GB)"
