#!/usr/bin/env bash
# The checks run on a lent GPU machine (../shared/notes/gpu.md; README "On a GPU"): the binary and
# test binaries are built on the CPU machine and travel in gpu/pack.tar.xz (benches/gpu_pack.sh)
# with the EN->PT model, PUD, Brown and SmolLM2's tokenizer; the machine has torch 2.11.0+cu130
# and transformers but no Rust. Writes everything under $OUT (default /tmp/gpu_out).
#  1. doctor: CUDA visible through the linked libtorch_cuda
#  2. every analysis on the CPU and on CUDA (benches/gpu_parity.rhai), compared number by number
#     (benches/gpu_parity.py), for EN->PT and each tiny HF checkpoint; bf16 and f16 on CUDA
#     against f32 on CUDA (reported, not asserted)
#  3. the test binaries' CUDA halves (models::parity::marian, analyses::importance::cuda_equals_cpu)
#  4. a random SmolLM2-shaped Llama: confidence and the exact sweep, headscope against HF on
#     the same GPU (benches/gpu_bench.rhai, benches/gpu_peer.py), GPU memory sampled
# Environment: TINY (the tiny checkpoints, default all 30: the 2025 families' experts, latent
# attention and Llama 4 included), BENCH_DEVICES (default "cuda cpu"),
# N_CONF (confidence sentences, default 200), SKIP_TESTS=1 (step 3 left out), SKIP_BENCH=1 (step 4
# left out).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
tar xJf gpu/pack.tar.xz -C gpu && mkdir -p assets && cp -r gpu/assets/. assets/
export LD_LIBRARY_PATH=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
hs=gpu/bin/headscope
nvidia-smi -L; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
stamp doctor; $hs doctor | tee "$OUT/doctor.txt"
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 250 > "$OUT/gpu_mem.csv" &
smi=$!

par() {  # name dir n
    local d="$OUT/parity/$1"; mkdir -p "$d/cpu" "$d/cuda"
    timeout 120 $hs run benches/gpu_parity.rhai "$2" cpu "$d/cpu" "$3" > "$d/cpu.log" 2>&1 &
    local cpu=$!
    timeout 120 $hs run benches/gpu_parity.rhai "$2" cuda "$d/cuda" "$3" > "$d/cuda.log" 2>&1
    wait $cpu
    tail -1 "$d/cpu.log"; tail -1 "$d/cuda.log"
    python3 benches/gpu_parity.py "$d/cpu" "$d/cuda" --tol 1e-4 | tee "$d/compare.txt"
}
stamp parity
par enpt enpt 8
for f in ${TINY:-llama gpt2 qwen2 qwen3 mistral gemma2 gemma3 pythia phi3 olmo2 bart marian roberta qwen3_gguf m2m100 mbart t5 flan_t5 mt5 mixtral olmoe qwen2_moe qwen3_moe gpt_oss smollm3 olmo3 deepseek_v3 deepseek_v2 llama4_text qwen3_moe_gguf}; do
    par "$f" "tests/fixtures/tiny_hf/$f" 4
done
stamp dtypes
for dt in bf16 f16; do
    d="$OUT/dtype/enpt_$dt"; mkdir -p "$d"
    timeout 120 $hs run benches/gpu_parity.rhai enpt cuda "$d" 8 "$dt" > "$d.log" 2>&1; tail -1 "$d.log"
    python3 benches/gpu_parity.py "$OUT/parity/enpt/cuda" "$d" --tol 1e-2 | tee "$d.compare.txt"
done

stamp tests
if [ -z "${SKIP_TESTS:-}" ]; then
mkdir -p .venv/bin && ln -sf "$(command -v python3)" .venv/bin/python
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
# Only the parity tests whose assets travel (MiniLM and the SmolLM2 GGUF exceed the 64 MiB).
timeout 150 gpu/bin/models parity::marian --test-threads 2 2>&1 | tail -25 | tee "$OUT/test_models_parity.txt"
timeout 90 gpu/bin/analyses importance::cuda --nocapture 2>&1 | tail -8 | tee "$OUT/test_importance_cuda.txt"
fi

stamp bench
if [ -z "${SKIP_BENCH:-}" ]; then
python3 benches/make_random_llama.py /tmp/smol assets/smollm2/tokenizer.json 30
for dev in ${BENCH_DEVICES:-cuda cpu}; do
    echo "== $dev"; timeout $([ $dev = cpu ] && echo 100 || echo 150) $hs run benches/gpu_bench.rhai /tmp/smol $dev ${N_CONF:-200} 20 | tee "$OUT/bench_hs_$dev.jsonl"
    timeout $([ $dev = cpu ] && echo 100 || echo 150) python3 benches/gpu_peer.py /tmp/smol $dev assets/pud_en.txt ${N_CONF:-200} 20 2>/dev/null | tee "$OUT/bench_hf_$dev.jsonl"
done
fi
kill $smi
stamp done
