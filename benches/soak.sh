#!/usr/bin/env bash
# Soak benchmark of the Jupyter kernel (not a CI test): one kernel session driven by the real
# Jupyter client for MINUTES (default 30) by benches/soak_driver.py: models loaded again and
# again, analyses, sweeps, short pruning runs, results written, long cells interrupted at
# random moments, the same cells re-run, hostile traffic on the side. Prints the figures
# (cells, latency percentiles, memory over time, fds, threads, interrupt response times,
# hostile traffic) and writes them with every sample to OUT/soak.json.
#   benches/soak.sh [OUT]        (MINUTES=30 by default; OUT a fresh temporary directory)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
MINUTES=${MINUTES:-30}
out=${1:-$(mktemp -d -t headscope-soak-XXXXXX)}
cargo build --release --locked -q
mkdir -p "$out"
# A copy: a rebuild during the soak replaces target/release/headscope (and a kernelspec
# installed from it would name a deleted file).
cp target/release/headscope "$out/headscope"
echo "soak: $MINUTES min, results in $out"
HEADSCOPE_BIN="$out/headscope" .venv/bin/python benches/soak_driver.py --minutes "$MINUTES" --out "$out"
